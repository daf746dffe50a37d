"""The small-data NMT recipe of speculative/train/run.py: label smoothing, the schedules, the optimizers,
held-out exclusion (speculative/data/overlap.py) and best-validation export."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import checkpoints
from speculative import train
from speculative.data import overlap
from speculative.infer import outputs as infer_outputs
from speculative.train import distill_data
from speculative.train import draft_agreement
from speculative.train import learning_curve
from speculative.train import steps as train_steps


def test_label_smoothing_matches_explicit_soft_targets():
  rng = np.random.default_rng(0)
  logits = jnp.asarray(rng.normal(size=(2, 3, 7)), jnp.float32)  # [batch, length, vocab]
  targets = jnp.asarray(rng.integers(0, 7, size=(2, 3)))
  weights = jnp.ones((2, 3))
  ls = 0.1
  loss, nll = train_steps.cross_entropy_loss(
    logits, targets, weights, z_loss=0.0, label_smoothing=ls
  )
  soft = np.full((2, 3, 7), ls / 6)
  np.put_along_axis(soft, np.asarray(targets)[..., None], 1 - ls, axis=-1)
  entropy = -np.sum(soft[0, 0] * np.log(soft[0, 0]))
  expected, _ = train_steps.cross_entropy_loss(logits, targets, weights, 0.0, soft_targets=soft)
  np.testing.assert_allclose(loss, expected - entropy, rtol=1e-5)
  _, plain_nll = train_steps.cross_entropy_loss(logits, targets, weights, z_loss=0.0)
  np.testing.assert_allclose(nll, plain_nll, rtol=1e-6)  # reported NLL is never smoothed
  # A perfect fit to the smoothed distribution has loss 0.
  perfect = jnp.asarray(np.log(soft), jnp.float32)
  zero, _ = train_steps.cross_entropy_loss(perfect, targets, weights, 0.0, label_smoothing=ls)
  assert abs(float(zero)) < 1e-5


def test_rsqrt_schedule_warms_up_then_decays_and_unknown_kind_is_refused():
  s = train_steps.make_schedule("rsqrt", 1e-3, warmup_steps=100, num_steps=10)
  values = [float(s(i)) for i in (0, 49, 99, 399, 9999)]
  np.testing.assert_allclose(values, [1e-5, 5e-4, 1e-3, 5e-4, 1e-4], rtol=1e-5)
  with pytest.raises(ValueError, match="schedule must be one of"):
    train_steps.make_schedule("linear", 1e-3, 10, 10)


def test_cosine_schedule_starts_warm_and_ends_at_a_tenth():
  """Step 0, the first update, has peak / warmup (as 'rsqrt' and 'constant'), not optax's 0, which
  spent a step on an update of 0; the last step of the run has 0.1x the peak."""
  s = train_steps.make_schedule("cosine", 1e-3, warmup_steps=10, num_steps=100)
  values = [float(s(i)) for i in (0, 4, 9, 99)]
  np.testing.assert_allclose(values, [1e-4, 5e-4, 1e-3, 1e-4], rtol=1e-5)
  assert 1e-4 < float(s(50)) < 1e-3
  params, grads = {"w": jnp.ones(3)}, {"w": jnp.full(3, 0.5)}
  for kind in train_steps.OPTIMIZERS:
    opt = train_steps.make_optimizer(1e-3, 10, 100, 0.0, 1.0, "cosine", kind)
    updates, _ = opt.update(grads, opt.init(params), params)
    assert float(jnp.abs(updates["w"]).min()) > 0, kind  # the first step moves the weights


def test_overlap_finds_exact_and_near_duplicates_on_either_side():
  heldout = [
    ("Click the OK button to close the dialog.", "Klicken Sie auf OK."),
    ("Select 3 cells in column A.", "Wählen Sie drei Zellen aus."),
  ]
  train_pairs = [
    ("click the ok button, to close the dialog", "anders"),  # exact after normalizing
    ("Select 12 cells in column A!", "Etwas"),  # digits normalized: exact
    ("Select the cells in the column A now.", "x"),  # unrelated enough
    ("Something else", "Klicken Sie auf OK."),  # target side exact
    ("Click the OK button to close the dialog box.", "y"),  # near duplicate
    ("Open a new spreadsheet document.", "Öffnen Sie ein neues Tabellendokument."),
  ]
  drop, report = overlap.find_overlap(train_pairs, heldout)
  assert drop.tolist() == [True, True, False, True, True, False]
  assert report["source_exact"] == 2 and report["source_near"] == 1
  assert report["target_exact"] == 1 and report["dropped"] == 4


def test_best_validation_params_are_exported(tmp_path):
  params = {"w": np.arange(4, dtype=np.float32)}
  best = tmp_path / "best.msgpack"
  checkpoints.save_params(params, best, dtype="float32")
  (tmp_path / "best.json").write_text(json.dumps({"step": 7, "val_nll": 1.0}))
  out = tmp_path / "export.msgpack"
  train.export_params(
    {"w": np.zeros(4, np.float32)},
    str(out),
    "float32",
    True,
    str(best),
    str(tmp_path / "best.json"),
    step=99,
  )
  np.testing.assert_array_equal(checkpoints.load_params(out)["w"], params["w"])
  with pytest.raises(FileNotFoundError, match="no evaluation"):
    train.export_params(
      params,
      str(out),
      "float32",
      True,
      str(tmp_path / "none.msgpack"),
      str(tmp_path / "none.json"),
      step=1,
    )


def test_export_records_its_training_and_never_silently_replaces_better_weights(tmp_path):
  out = tmp_path / "export.msgpack"

  def export(val_nll, value, **kwargs):
    run = tmp_path / f"run_{value}"
    run.mkdir()
    checkpoints.save_params({"w": np.full(2, value, np.float32)}, run / "best.msgpack", "float32")
    (run / "best.json").write_text(json.dumps({"step": 400, "val_nll": val_nll}))
    train.export_params(
      None,
      str(out),
      "float32",
      True,
      str(run / "best.msgpack"),
      str(run / "best.json"),
      step=9,
      provenance={"seed": value},
      **kwargs,
    )

  export(2.5, 1)
  training = checkpoints.read_metadata(out)["training"]
  assert training == {"step": 400, "val_nll": 2.5, "seed": 1}
  with pytest.raises(ValueError, match="records validation NLL 2.5000, lower than the 2.7000"):
    export(2.7, 2)
  np.testing.assert_array_equal(checkpoints.load_params(out)["w"], [1, 1])  # untouched
  export(2.7, 3, replaces_better=True)
  assert checkpoints.read_metadata(out)["training"]["val_nll"] == 2.7
  export(2.6, 4)  # better than what is there: replaced without being asked
  np.testing.assert_array_equal(checkpoints.load_params(out)["w"], [4, 4])


def test_an_export_of_the_last_weights_never_silently_replaces_better_weights(tmp_path):
  """Without export_best the sidecar records the deterministic validation entries of the exported
  weights' evaluation, and the guard holds: a higher NLL, or none (never evaluated), is refused."""
  out = tmp_path / "export.msgpack"

  def export(value, metrics, **kwargs):
    train.export_params(
      {"w": np.full(2, value, np.float32)},
      str(out),
      "float32",
      False,
      str(tmp_path / "none.msgpack"),
      str(tmp_path / "none.json"),
      step=value,
      metrics=metrics,
      **kwargs,
    )

  export(1, {"step": 1, "val_nll": 2.5, "val_accuracy": 0.5, "tokens_per_s": 9.0})
  training = checkpoints.read_metadata(out)["training"]
  assert training == {"step": 1, "val_nll": 2.5, "val_accuracy": 0.5}  # no wall-clock entries
  with pytest.raises(ValueError, match="records validation NLL 2.5000, lower than the 2.7000"):
    export(2, {"step": 2, "val_nll": 2.7})
  with pytest.raises(
    ValueError, match=r"weights to export \(step 3\) were never evaluated"
  ) as info:
    export(3, None)
  assert "\n" not in str(info.value)
  np.testing.assert_array_equal(checkpoints.load_params(out)["w"], [1, 1])  # untouched
  export(4, {"step": 4, "val_nll": 2.4})  # better than what is there: replaced without being asked
  np.testing.assert_array_equal(checkpoints.load_params(out)["w"], [4, 4])
  export(5, None, replaces_better=True)
  assert checkpoints.read_metadata(out)["training"] == {"step": 5}


def test_constant_schedule_and_adafactor_steps_scale_with_each_parameter():
  s = train_steps.make_schedule("constant", 1e-2, warmup_steps=10, num_steps=10)
  np.testing.assert_allclose(
    [float(s(i)) for i in (0, 4, 9, 500)], [1e-3, 5e-3, 1e-2, 1e-2], rtol=1e-5
  )
  # Adafactor moves each parameter by a fraction of its own RMS (T5X's parameter-scaled update), so a
  # stddev-1 embedding and a small query kernel both move; AdamW moves both by the same amount.
  params = {"embedding": jnp.ones((4, 8)), "query": jnp.full((4, 8), 0.01)}
  grads = {"embedding": jnp.full((4, 8), 0.5), "query": jnp.full((4, 8), 0.5)}
  sizes = {}
  for kind in train_steps.OPTIMIZERS:
    opt = train_steps.make_optimizer(1e-2, 1, 10, 0.0, 1e9, "constant", kind)
    updates, _ = opt.update(grads, opt.init(params), params)
    sizes[kind] = {k: float(jnp.abs(v).mean()) for k, v in updates.items()}
  assert sizes["adamw"]["embedding"] == pytest.approx(sizes["adamw"]["query"])
  assert sizes["adafactor"]["embedding"] / sizes["adafactor"]["query"] == pytest.approx(
    100, rel=1e-3
  )
  with pytest.raises(ValueError, match="optimizer must be one of"):
    train_steps.make_optimizer(1e-2, 1, 10, 0.0, 1.0, "constant", "sgd")


def test_distillation_data_keeps_clean_translations_in_input_order(tmp_path):
  prefix = "translate English to German: "

  def record(index, source, prediction, eos=True):
    return dict(
      index=index, inputs=prefix + source, prediction=prediction, tokens=[5, 1 if eos else 7]
    )

  records = [
    record(2, "Open the file.", "Öffnen Sie die Datei."),
    record(0, "Close it.", "Schließen Sie es."),
    record(1, "Save.", "die die die die die die die die", eos=True),  # loops
    record(3, "Print.", "Drucken Sie", eos=False),  # stopped at the length cap
    record(4, "Undo.", " "),  # empty
  ]
  pairs, counts = distill_data.distill_pairs(records, prefix)
  assert pairs == [("Close it.", "Schließen Sie es."), ("Open the file.", "Öffnen Sie die Datei.")]
  assert counts == {"records": 5, "kept": 2, "looping": 1, "no_eos": 1, "empty": 1}
  bad = tmp_path / "predictions.jsonl"
  bad.write_text(json.dumps(records[0]) + "\n" + '{"index": 1}\n')
  with pytest.raises(ValueError, match=r"predictions.jsonl:2: not a predictions record"):
    infer_outputs.load_predictions(str(bad))
  with pytest.raises(ValueError, match=r"predictions.jsonl:2: not a predictions record.*delete"):
    infer_outputs.read_predictions(str(bad))  # a resumed job names the way out
  with pytest.raises(ValueError, match=r"no manifest.json beside it"):
    infer_outputs.load_job_manifest(str(bad))


def test_learning_curve_table_and_figure(tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  with pytest.raises(ValueError, match="no evaluations logged yet"):
    (run / "train_log.jsonl").write_text("")
    learning_curve.read_log(str(run))
  with pytest.raises(FileNotFoundError, match="no training log"):
    learning_curve.read_log(str(tmp_path / "missing"))
  old = {"step": 800, "val_nll": 4.5, "val_accuracy": 0.25}  # logged before the entropy metrics
  new = {"step": 400, "val_nll": 5.0, "val_accuracy": 0.2, "train_nll": 4.9}
  new.update({f"val_attention_entropy_{k}": 0.9 for k in learning_curve.KINDS})
  (run / "train_log.jsonl").write_text(json.dumps(old) + "\n" + json.dumps(new) + "\n")
  rows = learning_curve.read_log(str(run))
  assert [r["step"] for r in rows] == [400, 800]  # step order
  table = learning_curve.markdown_table(rows).splitlines()
  assert table[2] == "| 400 | 5.000 | 0.200 | 4.900 | 0.90 / 0.90 / 0.90 |"
  assert table[3] == "| 800 | 4.500 | 0.250 | - | - / - / - |"
  png = tmp_path / "learning_curve.png"
  learning_curve.plot({"run": rows}, str(png))
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert sorted(p.name for p in tmp_path.iterdir()) == [
    "learning_curve.png",
    "run",
  ]  # no temporary left


@pytest.mark.slow
def test_draft_agreement_is_exact_on_a_models_own_greedy_output():
  from model_utils import random_params
  from model_utils import tiny_t5_config

  from speculative.models import t5 as t5_lib

  agree = np.array([True, True, False, True, True, True, True, False])
  # gamma 3: blocks [0,1 accepted | 2 corrected], [3,4,5 | 6 bonus], [7 corrected]
  assert draft_agreement.greedy_target_calls(agree, 3) == 3
  assert draft_agreement.greedy_target_calls(agree, 1) == 5
  assert draft_agreement.greedy_target_calls(np.ones(6, bool), 7) == 1

  model = t5_lib.T5(tiny_t5_config(2))
  params = random_params(model, seed=0, logit_scale=4.0)
  other = random_params(model, seed=1, logit_scale=4.0)
  examples = []
  forward = jax.jit(model.forward)  # one compile per shape, not one per op and shape
  for n, source in ((5, [7, 8, 9, 1]), (9, [20, 21, 1]), (3, [300, 1])):
    enc = jnp.asarray([source], jnp.int32)
    tokens = []
    for _ in range(n):  # greedy by full forwards: the reference the batched check must match
      dec_in = jnp.asarray([[0] + tokens], jnp.int32)
      tokens.append(int(jnp.argmax(forward(params, enc, dec_in)[0, -1])))
    examples.append((np.asarray(source, np.int32), np.asarray(tokens, np.int32)))
  own = draft_agreement.agreement(model, params, examples, batch_size=2)
  assert [len(a) for a in own] == [5, 9, 3]
  assert all(a.all() for a in own)
  assert not np.concatenate(draft_agreement.agreement(model, other, examples)).all()


def test_distill_data_refuses_a_missing_or_malformed_file_in_one_line(
  tmp_path, monkeypatch, capsys
):
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"x": 1}\n')
  for path, message in [
    (tmp_path / "missing.jsonl", "No such file or directory"),
    (bad, "bad.jsonl:1: not a predictions record"),
  ]:
    monkeypatch.setattr("sys.argv", ["distill_data", str(path), str(tmp_path / "out.tsv.gz")])
    with pytest.raises(SystemExit) as exit_info:
      distill_data.main()
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1
  assert not (tmp_path / "out.tsv.gz").exists()
