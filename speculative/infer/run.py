"""Gin-configured batch inference: speculative decoding (and the baseline) over a task or input file.

The main job (README quickstart, `make run`):
  python -m speculative.infer --gin_file=configs/local/run.gin

translates the first 200 sentences of the LibreOffice help En-De test split with the embedded
target/draft pair, greedily, once with plain autoregressive decoding and once with speculative
decoding (interleaved batch by batch in one process, same inputs and weights), checks that the two
outputs are token-identical, and prints BLEU, alpha, acceptance rate, block efficiency, tokens/s and
the walltime speedup. It writes, atomically, under `output_dir`:
  manifest.json             everything that determines the outputs (inputs hash, checkpoint
                            hashes, model configs, drafter, gamma, sampling, seed, ...)
  predictions-<mode>.jsonl  one JSON object per example (input, reference, prediction, tokens,
                            target calls, drafted/accepted drafts); identical across re-runs
  timings.json              per-example decode seconds of each mode (and 'auto's stepless calls)
  metrics.json / report.md  the summary
An interrupted job resumes: finished examples are read back and not decoded again, but only if
the manifest matches. A finished job grows: a larger NUM_EXAMPLES (or None) over the same inputs
and settings keeps the finished records and decodes only the new examples. A re-run with any other
change is refused before a model loads (use a new output directory, or `infer.overwrite = True` /
OVERWRITE = True to delete the old outputs).
One run at a time may write to an output directory (an OS lock, `.lock`). Every knob, path and
the output directory are checked in the first seconds, before any weights load (docs/batch_jobs.md).

In the T5X style, the run file names the task (`MIXTURE_OR_TASK_NAME`, a seqio task; or
`INPUT_FILE`, a TSV `source<TAB>reference` / plain text file, one segment a line, UTF-8 with or
without BOM, '-' = stdin, each line put after `input_prefix` ('' unless given; the run files'
INPUT_PREFIX gives the task's prefix), tokenized with `vocabulary_path`, default the shipped 8k
vocabulary; inputs longer than the inputs feature length are truncated and counted in the report),
`TASK_FEATURE_LENGTHS`, the target and draft model configs and checkpoints (a T5X checkpoint
directory or a `.msgpack` params file), `GAMMA`, `TEMPERATURE` and `INFER_OUTPUT_DIR`.
`python -m speculative.infer --help` lists the run file's macros with their values.

The job's parts, one module each of speculative/infer/: settings (InferSettings, the checks),
inputs (task or file examples), outputs (manifest, predictions, timings), report (summary and
report.md), auto_gamma (GAMMA = 'auto') and batches (the modes over the batches); this module runs
the job, from its checks to its summary.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
from typing import Any
from typing import Sequence

import jax.numpy as jnp

from speculative import checkpoints
from speculative import drafters as drafters_lib
from speculative.checkpoints import files
from speculative.decode import audit
from speculative.decode import batching
from speculative.decode import modes
from speculative.decode import state as decode_state
from speculative.infer import auto_gamma
from speculative.infer import batches
from speculative.infer import inputs as infer_inputs
from speculative.infer import outputs
from speculative.infer import report as infer_report
from speculative.infer import settings as infer_settings
from speculative.jobs import checks
from speculative.jobs import interrupts
from speculative.jobs import lock
from speculative.jobs import resources
from speculative.models import grow
from speculative.models import memory
from speculative.models import t5 as t5_lib

__all__ = [
  'Models',
  'infer',
  'load_models',
  'main',
]


@checks.settings_entry(infer_settings.InferSettings)
def infer(settings: infer_settings.InferSettings) -> dict[str, Any]:
  """Runs the job; returns the metrics dict also written to `output_dir/metrics.json`. Called with
  `InferSettings`' fields as keyword arguments (`checks.settings_entry`; gin: `infer.*`).

  Before anything is loaded, every knob's type and range (`InferSettings`), every path (the
  weights: `checkpoints.check_weights`) and the output directory's writability are checked; then
  the output directory is locked (one writer) and its manifest compared (a re-run resumes only
  outputs of identical settings, or of the same settings with fewer examples of the same inputs: a
  larger `num_examples` grows a finished job; `overwrite` deletes outputs of other settings instead
  of refusing). Nothing is written before the first batch's records are: the manifest (and
  `overwrite`'s deletions) come with them, so a job that fails or is interrupted before then
  leaves the output directory as it found it (no lock file, no directory it created). `num_examples`: how many examples (>= 1) from the
  start of the task split / input file; None = all. `gamma` in GAMMA_RANGE; `temperature` >= 0;
  `top_k` >= 0 (0 = off); `top_p` in (0, 1]; `lenience` in (0, 1]; `batch_size` >= 1.

  Speculative knobs (speculative mode only): `drafter` (one of DRAFTERS); `draft_stop_below` > 0
  is adaptive gamma (the draft stops proposing once its confidence falls below it; exact);
  `adaptive_verify` narrows the target's verify call to the longest proposal (exact); `lenience`
  < 1 accepts more drafts and CHANGES the output (Appendix A.5; greedy outputs are then not
  required to match the baseline).

  `grow_target_to` (None or a T5Config): the target checkpoint's model grown in memory to that
  shape before decoding (function-preserving, speculative/models/grow.py; stored in the shape's
  dtype): the paper-shape job's T5 1.1 XXL target (configs/benchmark/paper_shape_job.gin).

  `kernels` ('auto', 'on', 'off'): whether both models' decoder steps run on the CPU kernels
  (`speculative.kernels.policy`); chosen once for the job and recorded in its manifest. Where jax
  computes on a GPU or TPU, 'auto' is XLA's dot and 'on' is refused with the settings' checks.
  """
  with checks.user_errors():
    created = checks.probe_writable(settings.output_dir)
    try:
      output_lock = lock.OutputLock(settings.output_dir).acquire()
    except BaseException:
      checks.remove_created(settings.output_dir, created)
      raise
  claim = _Claim(settings.output_dir, settings.overwrite)
  try:
    return _run(settings, claim)
  except BaseException:
    if not claim.done:  # failed before its first write: the directory as it was found
      output_lock.release(remove=output_lock.created)
      checks.remove_created(settings.output_dir, created)
    raise
  finally:
    output_lock.release()


class _Claim:
  """The output directory made this job's (`outputs.claim_output_dir`: old outputs deleted where
  `overwrite`, the manifest written) once, just before the job's first write, so that a job that
  fails or is interrupted before it leaves the directory as it found it."""

  def __init__(self, output_dir: str, overwrite: bool):
    self.output_dir, self.overwrite = output_dir, overwrite
    self.manifest: dict[str, Any] | None = None
    self.done = False

  def __call__(self) -> None:
    if not self.done:
      outputs.claim_output_dir(self.output_dir, self.manifest, self.overwrite)
      self.done = True


@dataclasses.dataclass(frozen=True)
class Models:
  """The loaded target and the speculative mode's drafter (None without that mode)."""

  target: t5_lib.T5
  target_params: Any
  drafter: Any
  draft_params: Any
  draft: t5_lib.T5 | None = None  # the draft model the drafter runs (None: a drafter without one)
  draft_model_params: Any = None  # its params (packed on the kernels' path)


def _run(settings: infer_settings.InferSettings, claim: _Claim) -> dict[str, Any]:
  """`infer` after its checks, holding the output directory's lock; `claim` is called before the
  first write."""
  with checks.user_errors():  # a bad input file, or outputs of other settings: refused
    inputs = infer_inputs.load_inputs(settings)
    if settings.batch_size > len(inputs.examples):  # padded rows are decoded too
      logging.warning(
        "BATCH_SIZE = %d for %d inputs: the batch is padded to %d rows, which are decoded (and "
        "timed) as the real ones are",
        settings.batch_size,
        len(inputs.examples),
        settings.batch_size,
      )
    claim.manifest = outputs.build_manifest(settings, inputs)
    resume = outputs.check_output_dir(
      settings.output_dir, claim.manifest, settings.overwrite, inputs.examples
    )
    runs = outputs.resume_runs(settings.output_dir, settings.job_modes, resume)  # files it resumes
  done_before = sum(all(x.index in run.records for run in runs) for x in inputs.examples)
  metrics_path = os.path.join(settings.output_dir, "metrics.json")
  if done_before == len(inputs.examples) and os.path.exists(metrics_path):
    # A finished job run again: its summary stays the one of the process that decoded it (this
    # one would put its own load, memory and compiles beside those times).
    print(
      f"all {done_before} examples were done already: the outputs are unchanged (their report: "
      f"{os.path.join(settings.output_dir, 'report.md')}); to decode and time them again, bind "
      "OVERWRITE = True or use a new INFER_OUTPUT_DIR"
    )
    with open(metrics_path, encoding="utf-8") as f:
      return json.load(f)
  recorded = (lock.read_manifest(settings.output_dir) or {}).get("calibration") if resume else None
  try:
    models = load_models(settings)
    fns = _decode_fns(settings, models)
    if settings.auto_gamma and settings.speculative:
      fns[modes.SPECULATIVE] = _auto_gamma(settings, models, claim, recorded)
    for run in runs:
      run.decode = fns[run.name]
    load_start = infer_report.load_average()
    batches.decode_all(settings, inputs, runs, claim)
  except KeyboardInterrupt as e:  # SIGINT/SIGTERM: the batch in flight is discarded
    done = sum(all(x.index in run.records for run in runs) for x in inputs.examples)
    raise interrupts.Interrupted(
      getattr(e, "signum", signal.SIGINT),
      f"interrupted after {done} of {len(inputs.examples)} examples; the same command resumes",
    ) from None
  summary = _summary(settings, inputs, runs, models)
  summary["load_average"] = {"start": load_start, "end": infer_report.load_average()}
  summary["resumed_examples"] = done_before  # decoded, and timed, by an earlier process
  claim()  # every example was done already: the manifest of a grown or identical job
  files.write_atomic(
    os.path.join(settings.output_dir, "metrics.json"), json.dumps(summary, indent=2) + "\n"
  )
  report = infer_report.format_report(summary)
  files.write_atomic(os.path.join(settings.output_dir, "report.md"), report)
  print(report)
  return summary


def load_models(settings: infer_settings.InferSettings) -> Models:
  """The job's target and drafter with their params, on the decode path the settings choose (the
  CPU kernels' packed weights where `settings.decode_path().kernels`); shared with
  `speculative.bench.ceiling`, which measures on the job's own models."""
  draft = drafter = draft_params = None
  if settings.grow_target_to is not None:
    with checks.user_errors():  # a grown shape that does not fit: one line, before anything loads
      memory.check_fits(
        "grow_target_to's shape",
        _grown_need(settings),
        memory.device_memory(),
        "bind a smaller shape (configs/benchmark/paper_shape_job_small.gin) or use a device with "
        "more memory",
      )
  # A file that passed the settings' checks but fails to parse: one line naming it, no traceback.
  with checks.user_errors(checkpoints.LOAD_ERRORS):
    target, target_params = checkpoints.load_model(
      settings.target_config, settings.target_checkpoint
    )
    if settings.needs_draft_model:
      draft, draft_params = checkpoints.load_model(settings.draft_config, settings.draft_checkpoint)
  if settings.grow_target_to is not None:  # on the device, one leaf at a time, in its dtype
    large = settings.grow_target_to
    target_params = grow.grow_params_in_memory(
      target_params, settings.target_config, large, dtype=str(large.dtype)
    )
    target = t5_lib.T5(large)
  if settings.decode_path().kernels:  # packed once, here; both modes' steps then use the kernels
    target_params = t5_lib.pack_decode_params(target, target_params)
    if draft is not None:
      draft_params = t5_lib.pack_decode_params(draft, draft_params)
  draft_model_params = draft_params
  if settings.speculative:
    drafter, draft_params = drafters_lib.build_drafter(
      settings.drafter,
      vocab_size=target.vocab_size,
      draft_model=draft,
      draft_params=draft_params,
      stop_below=settings.draft_stop_below,
    )
  return Models(target, target_params, drafter, draft_params, draft, draft_model_params)


def _grown_need(settings: infer_settings.InferSettings) -> memory.Need:
  """What a job with a grown target holds at once: the grown target in its dtype, one decode cache
  of it, its activations, and, while it grows, the checkpoint's model and the draft in float32
  and a leaf being grown; on the CPU kernels' path, the copies `load_models` packs of the grown
  target and the draft model too."""
  s, large = settings, settings.grow_target_to
  itemsize = jnp.dtype(large.dtype).itemsize
  models = [s.target_config] + ([s.draft_config] if s.needs_draft_model else [])
  # What `load_models` packs on the kernels' path: the grown target (its dtype), draft (float32).
  packed = [(large, str(large.dtype))] + [(c, "float32") for c in models[1:]]
  return memory.estimate(
    [large],
    storage_dtype=str(large.dtype),
    batch=s.decode_rows,
    inputs_length=s.inputs_length,
    max_length=decode_state.buffer_length(1, s.max_new_tokens, s.max_gamma),
    caches=1,
    extra_bytes=2 * itemsize * memory.largest_leaf(large)
    + 4 * sum(memory.num_params(c) for c in models),
    packed=packed if s.decode_path().kernels else (),
  )


def _decode_fns(
  settings: infer_settings.InferSettings, models: Models, gamma: int | None = None
) -> dict[str, Any]:
  """{mode: fn(encoder_tokens [B, S], rng) -> DecodeResult}, in the order of
  `settings.job_modes` (with METHOD = 'spectr', SpecTr after the modes: every mode of a batch gets
  the same rng, so SpecTr with K = 1 emits the speculative mode's tokens); an 'auto' job's
  speculative mode at `gamma` (0: the baseline's function; None: not built here)."""
  s = settings
  speculative = gamma != 0 and not (s.auto_gamma and gamma is None)
  fns = modes.decode_fns(
    models.target,
    models.target_params,
    models.drafter if speculative else None,
    models.draft_params,
    options=s.decode_options(gamma or None),
    sampling_params=s.sampling()[1],
    lenience=None if s.exact else s.lenience,
    num_drafts=s.num_drafts if s.spectr else None,
  )
  if gamma == 0:
    fns[modes.SPECULATIVE] = fns[modes.BASELINE]  # plain decoding: the baseline's own program
  return {mode: fns[mode] for mode in s.job_modes if mode in fns}


def _auto_gamma(
  settings: infer_settings.InferSettings,
  models: Models,
  claim: _Claim,
  recorded: dict[str, Any] | None,
) -> auto_gamma.AutoGamma:
  """The speculative mode of a GAMMA = 'auto' job: per-gamma decodes and the calibration (the
  `recorded` one of a resumed job's manifest, else the cache file's, else measured on the job's
  batches); the manifest the job writes records what it started from (`claim`)."""
  # The baseline's batches time the plain loop where it decodes each batch before this mode.
  modes_order = list(settings.job_modes)
  plain_beside = modes.BASELINE in modes_order and modes_order.index(
    modes.BASELINE
  ) < modes_order.index(modes.SPECULATIVE)
  with checks.user_errors():  # a manifest of an older version: one line
    calibration = auto_gamma.start(settings, models, recorded, plain_beside)
  claim.manifest["calibration"] = calibration.to_json()
  _print_calibration(settings, calibration)
  return auto_gamma.AutoGamma(
    calibration,
    lambda gamma: _decode_fns(settings, models, gamma)[modes.SPECULATIVE],
    cache_path=settings.calibration_path,
    plain_beside=plain_beside,
    on_frozen=lambda frozen: _print_calibration(settings, frozen),
  )


def _print_calibration(settings: infer_settings.InferSettings, calibration) -> None:
  """One line: where the costs come from, and the step per gamma once known."""
  head = f"gamma auto (0..{calibration.fields['gamma_max']}): "
  if calibration.costs is None:
    print(
      head + "measuring the loops' steps on this job's first batches (and the first ones' calls "
      "without their steps); "
      f"cached in {settings.calibration_path} once chosen"
    )
    return
  costs = calibration.costs
  source = {
    "measured": f"costs measured on this job's first {calibration.batches} batch(es), "
    f"cached in {settings.calibration_path}",
    "cache": f"costs from the cache {settings.calibration_path}",
    "manifest": "costs from this output directory's manifest (resumed)",
  }[calibration.source]
  print(
    head
    + source
    + "; seconds per step by gamma: "
    + ", ".join(f"{costs.step(g) * 1e3:.2f} ms" for g in range(costs.gamma_max + 1))
    + "; once per call, per token: "
    + ", ".join(f"{costs.fixed_per_token(g) * 1e3:.2f} ms" for g in range(costs.gamma_max + 1))
  )


def _summary(
  settings: infer_settings.InferSettings,
  inputs: infer_inputs.JobInputs,
  runs: Sequence[outputs.ModeRun],
  models: Models,
) -> dict[str, Any]:
  """metrics.json: the settings, totals per mode, and (both modes) the comparison."""
  s = settings
  indices = [e.index for e in inputs.examples]
  summary: dict[str, Any] = {
    "examples": len(indices),
    "inputs_truncated": inputs.num_truncated,
    "inputs_length": s.inputs_length,
    **s.output_settings(),
    "settings": s.output_settings(),  # as the manifest records them; the report's header
    "machine": infer_report.machine(),
    "decode_path": s.decode_path().line,  # the manifest's name of the path, and why
  }
  if s.grow_target_to is not None:
    summary["grown_target"] = (
      f"{memory.describe(s.grow_target_to)}, {s.grow_target_to.dtype}; grown in memory from "
      f"{s.target_checkpoint} ({memory.describe(s.target_config)})"
    )
  for run in runs:
    records = [run.records[i] for i in indices]
    summary[run.name] = infer_report.summarize(records, inputs.metric_fns, s.max_new_tokens)
    summary[run.name]["compile_s"] = run.compile_s
    summary[run.name]["compiles_first_call"] = run.compiles_first_call
    summary[run.name]["compiles_warm"] = run.compiles_warm
    if isinstance(run.decode, auto_gamma.AutoGamma):
      summary["gamma_policy"] = run.decode.summary()
  summary["peak_rss_mib"] = resources.peak_rss_mib()
  by_name = {run.name: run for run in runs}
  if "baseline" in by_name and "speculative" in by_name:
    _compare_modes(settings, inputs, [by_name["baseline"], by_name["speculative"]], models, summary)
  if settings.spectr:
    _compare_spectr(settings, inputs, by_name, summary)
  summary["samples"] = [
    {k: runs[0].records[i][k] for k in ("inputs", "reference", "prediction")} for i in indices[:3]
  ]
  return summary


def _compare_modes(
  settings: infer_settings.InferSettings,
  inputs: infer_inputs.JobInputs,
  runs: Sequence[outputs.ModeRun],
  models: Models,
  summary: dict[str, Any],
) -> None:
  """Speedup and identical outputs into `summary`; greedy and exact: the divergence audit, and a
  mismatch beyond rounding fails the job (after writing metrics.json) if `require_identical`."""
  indices = [e.index for e in inputs.examples]
  base, spec = (summary["baseline"], summary["speculative"])
  summary["speedup"] = base["decode_s"] / spec["decode_s"]
  mismatched = [i for i in indices if runs[0].records[i]["tokens"] != runs[1].records[i]["tokens"]]
  summary["identical_outputs"] = len(indices) - len(mismatched)
  summary["mismatched_examples"] = mismatched[:20]
  if not (settings.temperature == 0 and settings.exact):
    return
  by_index = {e.index: e for e in inputs.examples}
  divergences = audit_greedy_divergences(
    models.target,
    models.target_params,
    [by_index[i] for i in mismatched],
    runs,
    settings.inputs_length,
  )
  summary["audit"] = audit.summarize(divergences, len(indices))
  summary["divergences"] = [dataclasses.asdict(d) for d in divergences]
  bad = [d.example for d in divergences if d.verdict == audit.MISMATCH]
  if bad and settings.require_identical:
    files.write_atomic(
      os.path.join(settings.output_dir, "metrics.json"), json.dumps(summary, indent=2)
    )
    raise AssertionError(
      f"greedy speculative output differs from the baseline beyond "
      f"rounding (audit verdict 'mismatch') on {len(bad)} examples, e.g. "
      f"{bad[:5]}; see metrics.json 'divergences'"
    )


def _compare_spectr(
  settings: infer_settings.InferSettings,
  inputs: infer_inputs.JobInputs,
  runs: dict[str, outputs.ModeRun],
  summary: dict[str, Any],
) -> None:
  """SpecTr against the baseline and one-draft speculative decoding into `summary["spectr"]`: the
  walltime per generated token (the modes sample different outputs, so per token) and the decode
  seconds; the outputs identical to the speculative mode's (same rng). K = 1 must emit the
  speculative mode's tokens: a difference fails the job (after writing metrics.json) if
  `require_identical`."""
  indices = [e.index for e in inputs.examples]
  spectr = summary["spectr"]
  spectr.update(method="spectr", K=settings.num_drafts, L=settings.gamma)
  for other in ("baseline", "speculative"):
    if other in summary:
      spectr[f"speedup_per_token_vs_{other}"] = (
        spectr["tokens_per_s"] / summary[other]["tokens_per_s"]
      )
      spectr[f"decode_s_ratio_vs_{other}"] = summary[other]["decode_s"] / spectr["decode_s"]
  same = [
    i
    for i in indices
    if runs["spectr"].records[i]["tokens"] == runs["speculative"].records[i]["tokens"]
  ]
  spectr["identical_to_speculative"] = len(same)
  if settings.num_drafts == 1 and len(same) < len(indices) and settings.require_identical:
    files.write_atomic(
      os.path.join(settings.output_dir, "metrics.json"), json.dumps(summary, indent=2)
    )
    differ = [i for i in indices if i not in set(same)]
    raise AssertionError(
      f"SpecTr with K = 1 differs from speculative decoding with the same seed on "
      f"{len(differ)} examples, e.g. {differ[:5]}: a bug"
    )


def audit_greedy_divergences(
  target,
  target_params,
  examples: Sequence[infer_inputs.Example],
  runs: Sequence[outputs.ModeRun],
  inputs_length: int,
) -> list[audit.Divergence]:
  """The divergence audit (speculative/decode/audit.py) of the examples whose greedy outputs differ:
  first differing position, float32 top-2 gap there, verdict near-tie or mismatch. `Divergence.example`
  is the example's index in the job."""
  if not examples:
    return []
  encoder_tokens = batching.pad_batch(examples, len(examples), inputs_length)  # [D, S]
  found = audit.audit_divergences(
    target,
    target_params,
    encoder_tokens,
    [runs[0].records[e.index]["tokens"] for e in examples],
    [runs[1].records[e.index]["tokens"] for e in examples],
  )
  return [dataclasses.replace(d, example=examples[d.example].index) for d in found]


def main(argv: Sequence[str] | None = None) -> None:
  from speculative.jobs import gin_utils

  gin_utils.run_gin_main(
    infer,
    "infer",
    __doc__.splitlines()[0],
    argv,
    logging.WARNING,
    default_gin_files=("configs/local/run.gin",),
  )


if __name__ == "__main__":
  main()
