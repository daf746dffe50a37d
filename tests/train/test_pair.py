"""The device recipe (speculative/train/pair.py): its wall-clock learning rate, its distillation
set's filters, and (slow) the whole recipe at toy shapes, as its CPU dry run, then its continuation
from what it returned, carried over in upload parts."""

import dataclasses
import json
import subprocess
import types

import jax.numpy as jnp
import numpy as np
import pytest

from speculative import checkpoints
from speculative.data import tasks
from speculative.train import data as train_data
from speculative.train import pair
from speculative.train import transport


def _trainee_stub(steps_done, peak=1e-2, scale=1.0):
  return type("T", (), {"steps_done": steps_done, "peak_lr": peak, "lr_scale": scale})()


def test_learning_rate_warms_up_holds_and_cools_down_with_the_clock():
  recipe = pair.Recipe(warmup_steps=100, cooldown_fraction=0.3)
  lr = lambda steps, fraction, scale=1.0: pair.learning_rate(  # noqa: E731
    _trainee_stub(steps, scale=scale), fraction, recipe
  )
  assert lr(0, 0.0) == pytest.approx(1e-4)  # step 1 of 100
  assert lr(49, 0.1) == pytest.approx(5e-3)
  assert lr(500, 0.5) == pytest.approx(1e-2)  # constant until 70% of the seconds
  assert lr(500, 0.7) == pytest.approx(1e-2)
  assert lr(500, 0.85) == pytest.approx(5e-3)  # halfway down the cooldown
  assert lr(500, 1.0) == 0.0 and lr(500, 1.2) == 0.0
  assert lr(500, 0.5, scale=0.5) == pytest.approx(5e-3)  # after a blow-up


def _scored_trainee(monkeypatch, scores):
  """A stand-in trainee whose validations score `scores` in turn (`pair.evaluate` replaced) and
  whose train step leaves everything as it is."""
  scores = iter(scores)
  monkeypatch.setattr(pair, "evaluate", lambda t, val_sets, buckets: {"val_score": next(scores)})
  hyperparams = types.SimpleNamespace(hyperparams={"learning_rate": jnp.asarray(1e-3)})
  return types.SimpleNamespace(
    name="target",
    params=None,
    opt_state=(None, hyperparams),
    steps_done=0,
    peak_lr=1e-2,
    lr_scale=1.0,
    best=None,
    history=[],
    train_step=lambda params, opt_state, *_: (params, opt_state, {"loss": jnp.asarray(1.0)}),
  )


def test_a_validation_that_is_not_finite_is_never_the_best(monkeypatch, capsys):
  """A NaN first validation is not kept (NaN compares False with every later score, so it stayed
  the best for good) and says so in the log and the history; a later NaN goes back to the best."""
  t = _scored_trainee(monkeypatch, [float("nan"), 3.0, float("nan"), 2.5])
  for step in (10, 20, 30, 40):
    t.steps_done, t.params = step, f"params of step {step}"
    pair._evaluate_and_keep(t, {}, (), float(step), 1.0)
    if step == 10:
      assert t.best is None and t.history[-1]["not_finite"] is True
      assert '"not_finite": true' in capsys.readouterr().out
    elif step == 20:
      assert t.best[0] == 3.0 and t.best[1] == "params of step 20"
  assert t.history[2]["not_finite"] and t.lr_scale == 0.5  # step 30: back to step 20's params
  assert t.best[0] == 2.5 and t.best[1] == "params of step 40"
  assert [m.get("not_finite", False) for m in t.history] == [True, False, True, False]
  # No finite validation at all: nothing to export, said in one line instead of a TypeError later.
  t = _scored_trainee(monkeypatch, [float("nan")] * 3)
  examples = [(np.ones(4, np.int32), np.ones(4, np.int32))] * 32
  buckets = train_data.make_buckets(((32, 32),), 1024)
  with pytest.raises(FloatingPointError, match="target: every validation to step 1 was not finite"):
    pair.train_for([t], examples, {}, 1e-9, pair.TOY, buckets)


def test_distillation_set_drops_loops_caps_empties_and_heldout_sentences():
  test_pair = train_data.read_tsv(pair.HELDOUT["translate"][1])[0]  # a held-out (test) pair
  pairs = [
    ("Open the file.", "x"),
    ("Click OK.", "x"),
    ("Save the document.", "x"),
    ("Close the window.", "x"),
    test_pair,
  ]
  data = pair.TaskData(
    train_pairs=pairs,
    train=train_data.tokenize_pairs(pairs, pair.SPM_MODEL),
    validation=[],
    test_pairs=[],
    test_inputs=[],
  )
  import sentencepiece as spm

  sp = spm.SentencePieceProcessor(model_file=pair.SPM_MODEL)
  eos = [tasks.EOS_ID]
  outputs = [
    np.array(sp.encode("Öffnen Sie die Datei.") + eos),  # kept
    np.array(sp.encode("die Tabelle " * 6) + eos),  # looping
    np.array(sp.encode("Speichern Sie das Dokument")),  # no EOS: stopped at the cap
    np.array(eos),  # empty
    np.array(sp.encode(test_pair[1]) + eos),  # the held-out reference itself
  ]
  examples, counts = pair.distillation_set("translate", data, outputs)
  assert counts["looping"] == counts["no_eos"] == counts["empty"] == 1
  assert counts["heldout_dropped"] == 1 and counts["kept"] == 1
  assert len(examples) == 1
  assert list(examples[0][0]) == list(data.train[0][0])  # its input tokens, prefix included
  assert list(examples[0][1]) == list(outputs[0])  # the target's own output tokens


@pytest.mark.slow
def test_the_recipe_runs_end_to_end_at_toy_shapes(tmp_path, monkeypatch):
  """The CPU dry run: random small-draft-shaped sources stand in for the small pair, toy budgets;
  what the two device calls would return joins and verifies here."""
  monkeypatch.chdir(pair.__file__.rsplit("/speculative/", 1)[0])
  configs = pair.load_configs(toy=True)

  from speculative.models import t5 as t5_lib

  sources = tmp_path / "sources"
  # The real small draft (a random one never emits EOS, so it leaves no distillation set), read
  # from git history: a checkout without that commit (a shallow clone, an archive) cannot run this;
  # any other failure of fetch_sources is a failure.
  have_commit = subprocess.run(
    ["git", "cat-file", "-e", f"{pair.SMALL_PAIR_COMMIT}^{{commit}}"], capture_output=True
  )
  if have_commit.returncode:
    pytest.skip(
      f"needs the small pair from git history, commit {pair.SMALL_PAIR_COMMIT[:7]}, which this "
      "checkout lacks (a shallow clone: git fetch --unshallow)"
    )
  pair.fetch_sources(str(sources))
  # One bucket (TOY has two): every phase runs as in TOY, with one train step and one eval step to
  # compile per model instead of two (with two buckets this test compiled ten train steps, ~146 s
  # of CPU in threads); batching over several buckets is test_train's. Short clocks, likewise.
  recipe = dataclasses.replace(
    pair.TOY,
    target_seconds=4.0,
    draft_seconds=3.0,
    eval_every_seconds=4.0,
    buckets=((64, 32),),
  )
  out, first = tmp_path / "out", tmp_path / "first"
  for d in (out, first, out / "second"):
    d.mkdir(parents=True, exist_ok=True)
  report = pair.run(str(out), str(first), recipe, True, str(sources))
  assert report["target"]["steps"] > 0 and report["target"]["history"]
  for name in ("small_draft", "embedded_draft"):
    assert report[name]["steps"] == report["small_draft"]["steps"]  # the same batches
    assert 0.0 <= report["test"]["translate"][f"{name}_alpha"] <= 1.0
  assert report["test"]["translate"]["examples"] == recipe.test_examples
  assert json.loads((first / "report.json").read_text())["seconds"] == report["seconds"]
  written = transport.collect(str(first), str(out / "second"), str(tmp_path / "here"))
  assert {p.rsplit("/", 1)[1] for p in written} == {
    "target.msgpack",
    "small_draft.msgpack",
    "embedded_draft.msgpack",
  }
  trained = checkpoints.load_params(str(tmp_path / "here" / "target.msgpack"))
  grown_shape = t5_lib.T5(configs["target"]).param_shapes()
  checkpoints.validate_params(trained, grown_shape, name="target")

  # The continuation (`--continue_from`): the returned pair, uploaded in two parts, trained on.
  pair_dir = tmp_path / "pair"
  pair_dir.mkdir()
  for name, saved in (("target", "target"), ("draft", "embedded_draft")):
    for suffix in ("", ".json"):
      (pair_dir / f"{name}.msgpack{suffix}").write_bytes(
        (tmp_path / "here" / f"{saved}.msgpack{suffix}").read_bytes()
      )
  packed = transport.pack_upload(
    [str(pair_dir / "target.msgpack"), str(pair_dir / "draft.msgpack")], str(tmp_path / "up"), 2
  )
  assert len(packed["chunks"]) == 2
  transport.unpack_upload([str(tmp_path / "up")], str(tmp_path / "seed"))
  out2, first2 = tmp_path / "out2", tmp_path / "first2"
  for d in (out2, first2, out2 / "second"):
    d.mkdir(parents=True, exist_ok=True)
  again = pair.run(str(out2), str(first2), recipe, True, str(sources), str(tmp_path / "seed"))
  assert again["continued_from"] == {
    "target": checkpoints.verify_weights(str(pair_dir / "target.msgpack")),
    "draft": checkpoints.verify_weights(str(pair_dir / "draft.msgpack")),
  }
  start = again["target"]["history"][0]
  assert start["step"] == 0 and start["seconds"] == 0.0  # the starting point is evaluated first
  # The first validation is the returned target's: its weights (through bfloat16), the same sets.
  assert start["val_score"] == pytest.approx(report["target"]["best"]["val_score"], rel=2e-2)
  assert "small_draft" not in again and again["embedded_draft"]["steps"] > 0
  assert again["embedded_draft"]["history"][0]["step"] == 0
  written = transport.collect(str(first2), str(out2 / "second"), str(tmp_path / "here2"))
  assert {p.rsplit("/", 1)[1] for p in written} == {"target.msgpack", "embedded_draft.msgpack"}
  sidecar = json.loads((tmp_path / "here2" / "target.msgpack.json").read_text())
  assert sidecar["training"]["started_from"] == str(tmp_path / "seed" / "target.msgpack")


def test_continue_from_refuses_a_missing_or_mismatched_pair_before_any_compute(
  tmp_path, capsys, monkeypatch
):
  monkeypatch.chdir(pair.__file__.rsplit("/speculative/", 1)[0])
  configs = pair.load_configs(toy=False)
  seed = tmp_path / "seed"
  seed.mkdir()
  w = {"w": np.ones(4, np.float32)}
  checkpoints.save_params(w, seed / "target.msgpack", "float32", configs["target"])
  args = ["--continue_from", str(seed), "--out_dir", str(tmp_path / "out")]
  args += ["--first_dir", str(tmp_path / "first")]
  with pytest.raises(SystemExit) as exit_info:
    pair.main(args)
  assert exit_info.value.code == 2
  assert capsys.readouterr().err.strip().endswith(f"{seed}/draft.msgpack is missing")
  # A draft of another shape (the small draft's, not the embedded draft's) is named and refused.
  checkpoints.save_params(w, seed / "draft.msgpack", "float32", configs["small_draft"])
  with pytest.raises(SystemExit):
    pair.main(args)
  err = capsys.readouterr().err
  assert f"error: {seed}/draft.msgpack was saved with a different model config" in err
  assert not (tmp_path / "out").exists() and not (tmp_path / "first").exists()
