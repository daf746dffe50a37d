"""The batch job: predictions, greedy identity, metrics, resuming after a kill, bad input."""

import dataclasses
import json
import os
from pathlib import Path
import subprocess
import sys

import model_utils
from model_utils import save_tiny_pair
from model_utils import tiny_t5_config
import pytest

from speculative import infer
from speculative.data import metrics as data_metrics
from speculative.data import tasks
from speculative.decode import batching
from speculative.decode import loops as decoding
from speculative.infer import inputs as infer_inputs
from speculative.infer import outputs as infer_outputs
from speculative.infer import report as infer_report
from speculative.infer import settings as infer_settings
from speculative.jobs import runtime

REPO = Path(__file__).resolve().parents[2]
SOURCES = model_utils.JOB_SOURCES


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("infer")
  kwargs = model_utils.tiny_job(root, batch_size=2, gamma=3)
  return root, kwargs


def _records(out, mode):
  return [json.loads(line) for line in (out / f"predictions-{mode}.jsonl").open()]


def test_predictions_metrics_and_greedy_identity(setup, monkeypatch):
  """The job on the correlated pair (model_utils.correlated_tiny_pair) at batch 2 with 'auto'
  kernels (on CPU: the kernels): identical greedy outputs of rows that accepted and rejected
  drafts, got bonus tokens, accepted blocks in part and ended at EOS or at the cap; and a job that
  reports the kernels executes them: both modes' compiled programs call all three of them."""
  root, kwargs = setup
  out = root / "run1"
  compiled_hlo = model_utils.record_decode_programs(monkeypatch)
  summary = infer.infer(output_dir=str(out), **kwargs)
  assert summary["identical_outputs"] == len(SOURCES)
  for mode in infer_settings.MODES:
    records = _records(out, mode)
    assert [r["index"] for r in records] == list(range(len(SOURCES)))
    assert all(1 <= r["num_tokens"] <= 12 for r in records)
    assert all(r["reference"] == f"Ref {r['index']}" for r in records)
  model_utils.assert_speculation_exercised(_records(out, "speculative"), 3, 12)
  model_utils.assert_path_ran(out, summary, compiled_hlo())
  if model_utils.kernels_cannot_run_here() is None:  # a library that did not load fails here
    assert json.loads((out / "manifest.json").read_text())["decode_path"] == "kernels"
  spec = summary["speculative"]
  assert spec["generated_tokens"] == summary["baseline"]["generated_tokens"]
  # Every target call emits at least one token, so block efficiency is in [1, gamma + 1].
  assert 1.0 <= spec["block_efficiency"] <= 4.0
  assert 0.0 <= spec["alpha"] <= 1.0 and 0.0 <= spec["acceptance_rate"] <= 1.0
  assert summary["baseline"]["block_efficiency"] == 1.0
  # One program per mode: 3 batches of 2, every one padded to the same shape, so the calls after
  # the first compile nothing (a recompile per batch would show here).
  for mode in infer_settings.MODES:
    assert summary[mode]["compiles_warm"] == 0
  # Measured where /proc/self/status exists (Linux: here and in CI), None elsewhere.
  if os.path.exists("/proc/self/status"):
    assert summary["peak_rss_mib"] > 0
  else:
    assert summary["peak_rss_mib"] is None
  assert json.loads((out / "metrics.json").read_text())["examples"] == len(SOURCES)
  # The load average when the job's decoding started and ended (1, 5, 15 minutes), by the speedup.
  load = json.loads((out / "metrics.json").read_text())["load_average"]
  assert [len(load["start"]), len(load["end"])] == [3, 3]
  speedup_line = next(
    line for line in (out / "report.md").read_text().splitlines() if "Walltime speedup" in line
  )
  assert f"(load average {load['start'][0]:.2f} when this process started decoding," in speedup_line
  assert "XLA compiles: baseline" in (out / "report.md").read_text()
  # The machine: its CPU with the features and L3 the figures depend on (jobs/runtime.py).
  assert f"machine: {runtime.cpu_line(runtime.machine())}, " in (out / "report.md").read_text()
  assert not [p for p in os.listdir(out) if ".tmp-" in p]
  # The report's header names every setting that can change an output, as the manifest has it.
  manifest = json.loads((out / "manifest.json").read_text())
  assert summary["settings"] == {k: manifest[k] for k in summary["settings"]}
  assert (
    "Settings that change the outputs: batch_size = 2, drafter = 'model', gamma = 3, "
    "draft_stop_below = 0.0, adaptive_verify = False, lenience = 1.0, temperature = 0.0, "
    f"top_k = 0, top_p = 1.0, seed = 0, decode_path = '{manifest['decode_path']}', "
    "param_dtype = 'float32', dtype = 'float32'\n"
  ) in (out / "report.md").read_text()


# 'on' needs the built kernels and a job that computes on CPU (the kernels' FFI handlers are CPU's).
KERNELS_RUN_HERE = model_utils.kernels_run_here_mark()


@pytest.mark.slow  # 8 programs to compile per case: 25 to 40 s each on a loaded 2-core machine
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kernels", [pytest.param("on", marks=KERNELS_RUN_HERE), "off"])
def test_greedy_identity_on_both_paths_and_dtypes_at_batch_1_and_3(
  tmp_path, monkeypatch, kernels, dtype
):
  """Greedy identity on the correlated pair (every row's speculation exercised as in the test
  above) with KERNELS 'on' and 'off', float32 and bfloat16 activations (the T5Config dtype), at
  batch 1 and batch 3 (rows of ragged input lengths in one batch; rows ending at EOS beside rows
  running to the cap): both batch sizes give the same tokens, and the compiled decodes run the path
  the manifest names (the fast tier's case: 'on' with float32 at batch 2, the test above)."""
  pair = save_tiny_pair(tmp_path, SOURCES, record_config=False, dtype=dtype)
  kwargs = dict(
    **pair,
    input_prefix="translate English to German: ",
    task_feature_lengths={"inputs": 24, "targets": 12},
    gamma=3,
    kernels=kernels,
    progress=False,
  )
  compiled_hlo = model_utils.record_decode_programs(monkeypatch)
  tokens = {}
  for batch in (1, 3):
    out = tmp_path / f"batch{batch}"
    summary = infer.infer(output_dir=str(out), batch_size=batch, **kwargs)
    assert summary["identical_outputs"] == len(SOURCES), summary.get("divergences")
    spec = _records(out, "speculative")
    model_utils.assert_speculation_exercised(spec, 3, 12)
    assert json.loads((out / "manifest.json").read_text())["decode_path"] == (
      "kernels" if kernels == "on" else "xla"
    )
    model_utils.assert_path_ran(out, summary, compiled_hlo())
    tokens[batch] = [r["tokens"] for r in spec]
  assert tokens[1] == tokens[3]


def test_length_sorted_batches_keep_input_order_and_outputs(setup):
  """Batching sorts by input length; predictions come back in input order, equal to batch 1's
  (rows of the correlated pair end at EOS or at the length cap: cap % counts the latter)."""
  root, kwargs = setup
  one = infer.infer(
    output_dir=str(root / "b1"), **{**kwargs, "batch_size": 1, "modes": ("baseline",)}
  )
  four = infer.infer(
    output_dir=str(root / "b4"), **{**kwargs, "batch_size": 4, "modes": ("baseline",)}
  )
  rec = lambda d: [json.loads(x) for x in (root / d / "predictions-baseline.jsonl").open()]  # noqa: E731
  assert [r["index"] for r in rec("b4")] == list(range(len(SOURCES)))
  assert [r["tokens"] for r in rec("b4")] == [r["tokens"] for r in rec("b1")]
  batches = batching.length_sorted_batches(
    infer_inputs.examples_from_file(str(root / "in.tsv"), tasks.get_vocabulary(), 24), 4
  )
  lengths = [len(e.input_tokens) for b in batches for e in b]
  assert lengths == sorted(lengths, reverse=True) and [len(b) for b in batches] == [4, 2]
  for summary in (one, four):
    base = summary["baseline"]
    assert base["sentences_per_s"] > 0 and "chrf" in base and "loop_pct" in base
    capped = [infer_report.hit_length_cap(r, 12) for r in rec("b1")]
    assert base["cap_pct"] == pytest.approx(100.0 * sum(capped) / len(capped))
  report = (root / "b4" / "report.md").read_text()
  assert "chrF" in report and "sentences/s" in report and "source:" in report


@pytest.mark.slow
def test_adaptive_gamma_stays_exact_and_lenience_is_marked_approximate(setup):
  root, kwargs = setup
  adaptive = infer.infer(
    output_dir=str(root / "adaptive"), draft_stop_below=0.5, adaptive_verify=True, **kwargs
  )
  assert adaptive["identical_outputs"] == len(SOURCES)  # exact: same greedy tokens
  assert "adaptive gamma" in (root / "adaptive" / "report.md").read_text()
  # Lenience changes the output, so greedy identity is not asserted, and the report says so.
  with pytest.warns(UserWarning, match="APPROXIMATE"):
    lenient = infer.infer(output_dir=str(root / "lenient"), lenience=0.3, **kwargs)
  assert lenient["lenience"] == 0.3
  assert "APPROXIMATE" in (root / "lenient" / "report.md").read_text()
  with pytest.raises(ValueError, match="lenience"):
    infer.infer(output_dir=str(root / "bad"), lenience=0.0, **kwargs)


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["prompt_lookup", "prompt_lookup+model"])
def test_copy_drafters_stay_exact(setup, drafter):
  root, kwargs = setup
  if drafter == "prompt_lookup":  # needs no draft model
    kwargs = {**kwargs, "draft_config": None, "draft_checkpoint": None}
  summary = infer.infer(output_dir=str(root / drafter), drafter=drafter, **kwargs)
  assert summary["identical_outputs"] == len(SOURCES) and summary["drafter"] == drafter
  assert f"drafter {drafter}" in (root / drafter / "report.md").read_text()
  with pytest.raises(ValueError, match="unknown drafter"):
    infer.infer(output_dir=str(root / "bad"), drafter="trigram", **kwargs)


def test_resume_under_sampling_redoes_only_what_is_missing_byte_identical(setup, monkeypatch):
  """Temperature 1 at batch 2: a run interrupted while its speculative mode decodes example 2's
  batch (that batch's baseline rows are written) resumes decoding only what each mode is missing,
  and its predictions are byte-identical to an uninterrupted run's with the same seed: a batch's
  sampling key comes from the batch, not from the order the resumed run reaches it."""
  root, kwargs = setup
  kwargs = {**kwargs, "temperature": 1.0, "seed": 5}
  out = root / "run2"
  original = infer_outputs.record
  seen = []

  def interrupted(example, *args):
    seen.append(example.index)
    if seen.count(2) == 2:  # the modes run in order: the second record of example 2 is speculative
      raise KeyboardInterrupt  # stands in for a kill
    return original(example, *args)

  monkeypatch.setattr(infer_outputs, "record", interrupted)
  # Two of the three batches done by both modes; the third's baseline rows written, not its
  # speculative ones: the interrupt says so.
  with pytest.raises(
    KeyboardInterrupt, match="^interrupted after 4 of 6 examples; the same command resumes$"
  ):
    infer.infer(output_dir=str(out), **kwargs)
  done = {m: {r["index"] for r in _records(out, m)} for m in infer_settings.MODES}
  assert 2 in done["baseline"] and 2 not in done["speculative"]
  assert done["speculative"] < done["baseline"]
  calls = []
  monkeypatch.setattr(
    infer_outputs,
    "record",
    lambda example, *a: calls.append(example.index) or original(example, *a),
  )
  infer.infer(output_dir=str(out), **kwargs)
  # Each mode decodes only the examples it had not finished (example 2's baseline row is not redone).
  missing = [i for m in infer_settings.MODES for i in range(len(SOURCES)) if i not in done[m]]
  assert sorted(calls) == sorted(missing)
  reference = infer.infer(output_dir=str(root / "run3"), **kwargs)
  for mode in infer_settings.MODES:  # byte-identical to an uninterrupted run (timings kept apart)
    name = f"predictions-{mode}.jsonl"
    assert (out / name).read_bytes() == (root / "run3" / name).read_bytes()
  assert reference["examples"] == len(SOURCES) and reference["temperature"] == 1.0


def test_a_finished_job_grows_to_more_examples_and_refuses_a_shrink(setup, monkeypatch, tmp_path):
  """NUM_EXAMPLES 2 -> 3 on the same output directory: the two finished records stay byte-identical
  and are not decoded again, the third is added, the manifest and metrics say 3. A shrink (3 -> 2),
  a grow with another setting changed, or a grow over edited inputs are refused as before."""
  root, kwargs = setup
  out = tmp_path / "grow"
  infer.infer(output_dir=str(out), **{**kwargs, "num_examples": 2})
  before = {m: (out / f"predictions-{m}.jsonl").read_bytes() for m in infer_settings.MODES}
  timings_before = json.loads((out / "timings.json").read_text())
  original = infer_outputs.record
  calls = []
  monkeypatch.setattr(
    infer_outputs,
    "record",
    lambda example, *a: calls.append(example.index) or original(example, *a),
  )
  summary = infer.infer(output_dir=str(out), **{**kwargs, "num_examples": 3})
  assert calls == [2, 2]  # only the new example, once per mode
  for mode in infer_settings.MODES:
    after = (out / f"predictions-{mode}.jsonl").read_bytes()
    assert after.startswith(before[mode]) and after.count(b"\n") == 3
    assert [r["index"] for r in _records(out, mode)] == [0, 1, 2]
    timings = json.loads((out / "timings.json").read_text())["decode_s"][mode]
    assert {i: timings[i] for i in ("0", "1")} == timings_before["decode_s"][mode]  # not re-timed
  manifest = json.loads((out / "manifest.json").read_text())
  assert (manifest["num_examples"], manifest["examples"]) == (3, 3)
  assert summary["examples"] == 3
  assert json.loads((out / "metrics.json").read_text())["examples"] == 3
  assert not list(out.glob("*.tmp*"))  # the manifest was replaced atomically
  # Anything but a grow is refused, naming the changed fields; nothing is decoded.
  calls.clear()
  with pytest.raises(ValueError, match=r"(?s)different settings.*num_examples: was 3, now 2"):
    infer.infer(output_dir=str(out), **{**kwargs, "num_examples": 2})
  with pytest.raises(ValueError, match=r"(?s)different settings.*gamma: was 3, now 2"):
    infer.infer(output_dir=str(out), **{**kwargs, "num_examples": 4, "gamma": 2})
  edited = tmp_path / "edited.tsv"
  edited.write_text("Something else.\tRef 0\n" + Path(kwargs["input_file"]).read_text())
  with pytest.raises(ValueError, match=r"(?s)different settings.*inputs: was"):
    infer.infer(output_dir=str(out), **{**kwargs, "num_examples": 4, "input_file": str(edited)})
  same_name = tmp_path / "same"  # the same file name, its first line edited: the prefix differs
  infer.infer(output_dir=str(same_name), **{**kwargs, "num_examples": 1})
  text = Path(kwargs["input_file"]).read_text()
  monkeypatch.setattr(
    infer_inputs, "read_lines", lambda path: ["Edited.\tRef 0"] + text.splitlines()[1:]
  )
  with pytest.raises(ValueError, match=r"(?s)different settings.*inputs_sha256: was"):
    infer.infer(output_dir=str(same_name), **{**kwargs, "num_examples": 2})
  assert calls == [0, 0]  # only the fresh one-example job decoded (once per mode)


@pytest.mark.slow
def test_killed_job_resumes_without_losing_or_duplicating(setup, tmp_path, kill_soak):
  """SIGKILL the real CLI while it writes its third speculative predictions (kill_soak.kill_at_write:
  the run stops itself there, so the kill lands at that point on any machine); the rerun removes
  the temporary and completes every example exactly once, byte-identical to an uninterrupted run."""
  root, kwargs = setup
  out = tmp_path / "killed"
  sources = [f"{s} ({i})" for i in range(2) for s in SOURCES]
  inputs = tmp_path / "in.tsv"
  inputs.write_text("".join(f"{s}\tRef {i}\n" for i, s in enumerate(sources)))
  bindings = [
    "infer.target_config = @target/t5.T5Config()",
    "infer.draft_config = @draft/t5.T5Config()",
    f"infer.target_checkpoint = '{root / 't.msgpack'}'",
    f"infer.draft_checkpoint = '{root / 'd.msgpack'}'",
    f"infer.input_file = '{inputs}'",
    f"infer.output_dir = '{out}'",
    "infer.task_feature_lengths = {'inputs': 24, 'targets': 12}",
    "infer.batch_size = 1",
    "infer.gamma = 3",
    "infer.progress = False",
  ]
  for scope, layers in (("target", 2), ("draft", 1)):
    bindings += [
      f"{scope}/t5.T5Config.{k} = {v}"
      for k, v in dict(
        vocab_size=8000,
        emb_dim=16,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=layers,
        head_dim=8,
        mlp_dim=32,
      ).items()
    ]
  gin_file = tmp_path / "job.gin"
  gin_file.write_text("\n".join(bindings) + "\n")
  cmd = [sys.executable, "-m", "speculative.infer", f"--gin_file={gin_file}"]
  spec_file = out / "predictions-speculative.jsonl"
  kill_soak.kill_at_write(cmd, out, spec_file.name, 3, mid_write=True, log=tmp_path / "killed.log")
  assert spec_file.read_text().count("\n") == 2  # batch 1: one example a write
  assert list(out.glob(spec_file.name + ".tmp-*"))  # the third write's temporary, left
  subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  assert not kill_soak.leftovers(out)  # the rerun removed the killed write's temporary
  for mode in infer_settings.MODES:
    indices = [json.loads(line)["index"] for line in (out / f"predictions-{mode}.jsonl").open()]
    assert indices == list(range(len(sources)))
  metrics = json.loads((out / "metrics.json").read_text())
  assert metrics["identical_outputs"] == len(sources)
  # Byte-identical to an uninterrupted run with the same settings (tests/kill_soak.py repeats
  # this at random kill points).
  fresh = tmp_path / "fresh"
  infer.infer(
    **{
      **kwargs,
      "input_file": str(inputs),
      "output_dir": str(fresh),
      "input_prefix": "",
      "batch_size": 1,
    }
  )
  for mode in infer_settings.MODES:
    name = f"predictions-{mode}.jsonl"
    assert (out / name).read_bytes() == (fresh / name).read_bytes()


def test_bad_inputs_raise_clear_errors(setup, tmp_path):
  root, kwargs = setup
  with pytest.raises(FileNotFoundError, match="checkpoint does not exist"):
    infer.infer(output_dir=str(tmp_path / "a"), **{**kwargs, "target_checkpoint": "/nope"})
  with pytest.raises(ValueError, match="gamma"):
    infer.infer(output_dir=str(tmp_path / "b"), **{**kwargs, "gamma": 0})
  with pytest.raises(ValueError, match="temperature"):
    infer.infer(output_dir=str(tmp_path / "c"), **{**kwargs, "temperature": -1.0})
  empty = tmp_path / "empty.tsv"
  empty.write_text("Click OK.\n\n")
  with pytest.raises(ValueError, match="empty input line"):
    infer.infer(output_dir=str(tmp_path / "d"), **{**kwargs, "input_file": str(empty)})
  corrupt = tmp_path / "corrupt.msgpack"
  corrupt.write_bytes(b"\x00garbage")
  with pytest.raises(ValueError, match="corrupt.msgpack is not a weights file"):
    infer.infer(output_dir=str(tmp_path / "e"), **{**kwargs, "draft_checkpoint": str(corrupt)})
  # Well-formed msgpack whose array is no flax array: its shape cannot be read, so the settings'
  # check refuses it in one line naming the setting, before anything is written.
  import msgpack

  garbage = tmp_path / "garbage.msgpack"
  garbage.write_bytes(msgpack.packb({"kernel": msgpack.ExtType(1, b"garbage")}))
  with pytest.raises(
    ValueError, match=r"^draft_checkpoint: \S+garbage.msgpack is not valid msgpack"
  ):
    infer.infer(output_dir=str(tmp_path / "e1"), **{**kwargs, "draft_checkpoint": str(garbage)})
  assert not (tmp_path / "e1").exists()
  # The draft's own arrays, without its sidecar, one of them of a dtype numpy does not know: every
  # shape is right, so it passes the checks and fails to parse at load, with one line naming it,
  # and before anything is written (no output directory left).
  data = Path(kwargs["draft_checkpoint"]).read_bytes()
  assert data.count(b"\xa7float32") > 1
  unparsable = tmp_path / "unparsable.msgpack"
  unparsable.write_bytes(data.replace(b"\xa7float32", b"\xa7float99", 1))
  with pytest.raises(ValueError, match=r"^corrupt params file \S+unparsable.msgpack: "):
    infer.infer(output_dir=str(tmp_path / "e2"), **{**kwargs, "draft_checkpoint": str(unparsable)})
  assert not (tmp_path / "e2").exists()
  found = tmp_path / "e3"  # an empty directory that exists: left empty, no lock file in it
  found.mkdir()
  with pytest.raises(ValueError, match="corrupt params file"):
    infer.infer(output_dir=str(found), **{**kwargs, "draft_checkpoint": str(unparsable)})
  assert os.listdir(found) == []
  mismatched = dataclasses.replace(tiny_t5_config(1), vocab_size=4000)
  with pytest.raises(ValueError, match="vocab"):
    infer.infer(output_dir=str(tmp_path / "f"), **{**kwargs, "draft_config": mismatched})


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_kernels_on_off_cpu_is_refused_before_any_weights_load(
  setup, tmp_path, monkeypatch, platform
):
  """On a GPU or TPU backend (faked: `kernels.policy.backend`) 'on' is one ValueError from the
  settings' checks, before any weights load or the output directory exists; 'auto' is XLA's dot,
  and the line the manifest and report record says why."""
  from speculative import checkpoints
  from speculative.kernels import policy

  _, kwargs = setup
  monkeypatch.setattr(policy, "backend", lambda given=None: platform)

  def load_model(*args, **kw):
    raise AssertionError("weights loaded before the kernels setting was refused")

  monkeypatch.setattr(checkpoints, "load_model", load_model)
  out = tmp_path / "job"
  with pytest.raises(ValueError, match=rf"^kernels = on, but this job computes on {platform}: "):
    infer.infer(output_dir=str(out), kernels="on", **kwargs)
  assert not out.exists()
  path = infer_settings.InferSettings(output_dir=str(out), kernels="auto", **kwargs).decode_path()
  assert path.name == "xla" and f"the job computes on {platform}" in path.line


def test_greedy_divergence_is_audited_and_a_real_mismatch_fails(setup, monkeypatch):
  """A test double whose speculative decode is deliberately wrong (row 0's first token replaced):
  in float32 no rounding explains it, so the audit says 'mismatch' and the job fails naming it."""
  root, kwargs = setup
  real = decoding.speculative_decode

  def broken(*args, **kw):
    result = real(*args, **kw)
    tokens = result.tokens.at[0, 0].set((result.tokens[0, 0] + 7) % 8000)
    return (
      result.replace(tokens=tokens)
      if hasattr(result, "replace")
      else dataclasses.replace(result, tokens=tokens)
    )

  monkeypatch.setattr(decoding, "speculative_decode", broken)
  with pytest.raises(AssertionError, match="audit verdict 'mismatch'"):
    infer.infer(output_dir=str(root / "broken"), **{**kwargs, "batch_size": 1})
  metrics = json.loads((root / "broken" / "metrics.json").read_text())
  assert metrics["audit"]["mismatch"] >= 1
  first = metrics["divergences"][0]
  assert first["position"] == 0 and first["verdict"] == "mismatch" and first["dtype"] == "float32"


def test_reading_a_seqio_task_prints_nothing_to_stderr():
  """No SentencePiece INFO line from TF's tokenizer ops and no partially-read-cache warning: a job
  shows its progress bar and report only (with stderr muted only around the first record)."""
  code = (
    "from speculative.jobs import gin_utils; gin_utils.quiet_native_logs();"
    "from speculative.infer import inputs;"
    "examples = inputs.examples_from_task('libreoffice_ende', 'test', 64, 3);"
    "print(len(examples), examples[2].inputs)"
  )
  out = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith("3 translate English to German: ")
  assert not out.stderr.strip(), out.stderr[-2000:]


def test_loop_rate_needs_no_references():
  """'loop %' reads the outputs only: a job over a file without references reports it (the quality
  scores, which need references, stay '-')."""
  records = [
    {
      "index": i,
      "num_tokens": 3,
      "target_calls": 3,
      "drafted": 0,
      "decode_s": 0.1,
      "tokens": [5, 6, 1],
      "reference": None,
      "prediction": prediction,
    }
    for i, prediction in enumerate(["die Tabelle die Tabelle die Tabelle", "Klicken Sie auf OK."])
  ]
  summary = infer_report.summarize(records, [data_metrics.translation_metrics], 12)
  assert summary["loop_pct"] == 50.0 and "bleu" not in summary
  (row,) = [line for line in infer_report._mode_table({"baseline": summary}) if "baseline" in line]
  assert row.startswith("| baseline | - | - | 50.0 | 0.0 | 6 | ")  # BLEU, chrF, loop %, cap %
