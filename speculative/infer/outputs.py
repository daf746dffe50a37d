"""The output directory of a batch inference job: the manifest of everything that determines the
outputs (a re-run resumes only outputs of identical settings, or grows them to more examples of
the same inputs), one predictions file per mode (one JSON record per example), the per-example
decode times, all written atomically."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any
from typing import Iterable
from typing import Sequence

import numpy as np

from speculative import checkpoints
from speculative.checkpoints import files
from speculative.infer import inputs as infer_inputs
from speculative.infer import settings as infer_settings
from speculative.jobs import lock

# What an output directory holds (removed by `overwrite`).
OUTPUT_FILES = ("manifest.json", "timings.json", "metrics.json", "report.md") + tuple(
  f"predictions-{mode}.jsonl" for mode in infer_settings.ALL_MODES
)
# What a finished job writes last, about all of its examples: no longer true once a job writes
# records beside them (a grow), so deleted then, and written again at that job's end.
SUMMARY_FILES = ("metrics.json", "report.md")


@dataclasses.dataclass
class ModeRun:
  """The decode function of one mode and its accumulated results."""

  name: str
  decode: Any
  path: str
  records: dict[int, dict]
  compile_s: float | None = None  # the compiling calls' seconds, summed over input lengths
  compiles_first_call: int = 0  # XLA compiles in the first (compiling) call at each input length
  compiles_warm: int = 0  # XLA compiles in the timed calls after them (0: one program per shape)
  compiled_shapes: set = dataclasses.field(default_factory=set)  # encoder-token shapes compiled


def build_manifest(
  settings: infer_settings.InferSettings, inputs: infer_inputs.JobInputs
) -> dict[str, Any]:
  """Everything that determines the outputs; weights by content (verified against their
  metadata)."""
  s = settings
  draft = s.needs_draft_model
  return {
    "package_version": _package_version(),
    "inputs": inputs.source,
    "inputs_sha256": infer_inputs.examples_sha256(inputs.examples),
    "examples": len(inputs.examples),
    "num_examples": s.num_examples,
    "task_feature_lengths": dict(s.task_feature_lengths),
    "target_config": checkpoints.config_dict(s.target_config),
    # One hash per checkpoint however its path is written (a T5X model directory, its step
    # directory or the step's `checkpoint` file all resolve to that step: `check_weights`).
    "target_checkpoint_sha256": checkpoints.check_weights(
      "target_checkpoint", s.target_checkpoint, s.target_config
    ),
    # A grown target (only where set: other manifests stay as they were).
    **(
      {"grow_target_to": checkpoints.config_dict(s.grow_target_to)}
      if s.grow_target_to is not None
      else {}
    ),
    "draft_config": checkpoints.config_dict(s.draft_config) if draft else None,
    "draft_checkpoint_sha256": (
      checkpoints.check_weights("draft_checkpoint", s.draft_checkpoint, s.draft_config)
      if draft
      else None
    ),
    "modes": list(s.modes),
    **s.output_settings(),
  }


OVERWRITE_HINT = "bind infer.overwrite = True (OVERWRITE = True in configs/local/run.gin)"
# Recorded by the job after it starts (not settings: never compared, carried over on a resume):
# an 'auto' job's calibration (speculative/infer/auto_gamma.py), so a resume makes its choices again.
RECORDED_FIELDS = ("calibration",)


def settings_of(manifest: dict[str, Any] | None) -> dict[str, Any] | None:
  """`manifest` without its RECORDED_FIELDS: what a re-run's settings are compared with."""
  if manifest is None:
    return None
  return {k: v for k, v in manifest.items() if k not in RECORDED_FIELDS}


def check_output_dir(
  output_dir: str,
  manifest: dict[str, Any],
  overwrite: bool,
  examples: Sequence[infer_inputs.Example] = (),
) -> bool:
  """Whether the job resumes the outputs `output_dir` holds (the caller holds its lock); writes
  nothing. Outputs of other settings are refused (ValueError naming each differing field), unless
  `overwrite` (they are deleted at the first write: `claim_output_dir`) or `manifest` (over
  `examples`) only extends the recorded one (`extends`: the finished records are resumed)."""
  if overwrite:
    return False
  if extends(settings_of(lock.read_manifest(output_dir)), manifest, examples):
    return True
  return lock.check_manifest(output_dir, manifest, OVERWRITE_HINT, ignore=RECORDED_FIELDS)


def claim_output_dir(output_dir: str, manifest: dict[str, Any], overwrite: bool) -> None:
  """Makes `output_dir` this job's, just before its first write (the caller holds its lock and
  checked it with `check_output_dir`): a killed writer's temporaries are removed, the outputs of
  other settings deleted (`overwrite`), the summary of a finished job deleted (SUMMARY_FILES), and
  `manifest` written (atomically). A job that fails before
  it gets here (a bad input, a file that fails to parse at load, an interrupt during the compile)
  leaves the directory as it found it."""
  checkpoints.remove_stale_temporaries(output_dir)  # we hold the lock: no other writer
  for name in OUTPUT_FILES if overwrite else SUMMARY_FILES:
    if os.path.exists(os.path.join(output_dir, name)):
      os.remove(os.path.join(output_dir, name))
  write_manifest(output_dir, manifest)


def write_manifest(output_dir: str, manifest: dict[str, Any]) -> None:
  files.write_atomic(
    os.path.join(output_dir, lock.MANIFEST_FILE),
    json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
  )


# The manifest fields that growing a job to more examples of the same inputs changes.
EXTENSION_FIELDS = ("inputs_sha256", "examples", "num_examples")


def extends(
  old: dict[str, Any] | None, new: dict[str, Any], examples: Sequence[infer_inputs.Example]
) -> bool:
  """Whether `new` (the manifest of `examples`) only grows the job `old` recorded: every field
  equal but EXTENSION_FIELDS, a larger `num_examples` (or None = all) than a bounded old one, and
  the old examples a prefix of `examples` (the sha256 of the first `old['examples']` of them is the
  recorded `inputs_sha256`). Any other change, a shrink included, is not an extension."""
  if old is None:
    return False
  rest = lambda m: {k: v for k, v in m.items() if k not in EXTENSION_FIELDS}  # noqa: E731
  if lock.manifest_differences(rest(old), rest(new)):
    return False
  old_n, new_n = old.get("num_examples"), new.get("num_examples")
  if not isinstance(old_n, int) or (new_n is not None and new_n <= old_n):
    return False
  done = old.get("examples")
  return (
    isinstance(done, int)
    and done <= len(examples)
    and infer_inputs.examples_sha256(examples[:done]) == old.get("inputs_sha256")
  )


def resume_runs(output_dir: str, modes: Sequence[str], resume: bool = True) -> list[ModeRun]:
  """A ModeRun per mode, holding the records (with their decode times) an earlier, interrupted
  run of the same settings finished (none unless `resume`: `check_output_dir`); its `decode` is
  set once the models have loaded."""
  runs = []
  timings = read_timings(output_dir) if resume else {}
  for mode in modes:
    decode = None
    path = os.path.join(output_dir, f"predictions-{mode}.jsonl")
    records = read_predictions(path) if resume else {}
    for index, record in records.items():
      record["decode_s"] = float("nan")
      for field in TIMINGS:
        by_index = timings.get(field, {}).get(mode, {})
        if index in by_index:
          record[field] = by_index[index]
    runs.append(ModeRun(mode, decode, path, records))
  return runs


def record(
  example: infer_inputs.Example,
  vocabulary,
  tokens: np.ndarray,
  length: int,
  metrics: dict,
  seconds: float,
  batch_rows: int,
  stepless_s: float | None = None,
) -> dict:
  generated = [int(t) for t in tokens[:length]]
  text_ids = [t for t in generated if t != 1]
  return {
    "index": example.index,
    "inputs": example.inputs,
    "reference": example.reference,
    "prediction": vocabulary.decode(text_ids),
    "tokens": generated,
    "num_tokens": length,
    "target_calls": int(metrics["target_calls"]),
    "drafted": int(metrics["drafted"]),
    "accepted": int(metrics["accepted"]),
    "alpha_sum": float(metrics["alpha_sum"]),
    # SpecTr: the selections' one-draft acceptance at the same conditionals, and their count.
    **{k: _number(metrics[k]) for k in ("single_alpha_sum", "selections") if k in metrics},
    "inputs_truncated": example.truncated,
    # The batch's decode walltime, split evenly over its rows (batch 1: the example's own time).
    "decode_s": seconds / batch_rows,
    # 'auto' while measuring: the same call without its loop steps, likewise (timings.json).
    **({} if stepless_s is None else {"stepless_s": stepless_s / batch_rows}),
  }


def _number(value: Any) -> int | float:
  value = np.asarray(value)
  return int(value) if np.issubdtype(value.dtype, np.integer) else float(value)


# timings.json's fields, {field: {mode: {index: seconds}}}: each row's share of its batch's decode
# time, and of 'auto''s calibration calls on the batch (infer/auto_gamma.py): the stepless call,
# and the measurement of a gamma the batch was then not decoded at, with its stepless call.
TIMINGS = ("decode_s", "stepless_s", "measured_s", "measured_stepless_s")


def write_records(output_dir: str, runs: Sequence[ModeRun], run: ModeRun) -> None:
  """The decode times of every mode, then `run`'s predictions file; records in index order."""
  # Timings first: a kill between the two writes leaves timings for records not yet written.
  files.write_atomic(
    os.path.join(output_dir, "timings.json"),
    json.dumps(
      {
        field: {
          r.name: {str(i): rec[field] for i, rec in sorted(r.records.items()) if field in rec}
          for r in runs
        }
        for field in TIMINGS
      }
    )
    + "\n",
  )
  files.write_atomic(run.path, _jsonl(sorted(run.records.values(), key=lambda r: r["index"])))


def read_timings(output_dir: str) -> dict[str, dict[str, dict[int, float]]]:
  """{field: {mode: {index: seconds}}} of an earlier (interrupted) run (`TIMINGS`)."""
  path = os.path.join(output_dir, "timings.json")
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding="utf-8") as f:
      data = json.load(f)
    return {
      field: {mode: {int(i): s for i, s in by_index.items()} for mode, by_index in by_mode.items()}
      for field, by_mode in data.items()
    }
  except (ValueError, AttributeError, TypeError) as e:  # not JSON, or not {field: {mode: ...}}
    raise ValueError(
      f"{path} is not a timings file ({e}); use a new output directory or OVERWRITE = True"
    ) from None


def read_predictions(path: str) -> dict[int, dict]:
  """Finished examples of an earlier (interrupted) run, by index."""
  if not os.path.exists(path):
    return {}
  return {int(r["index"]): r for r in _read_records(path, "; delete the file to start over")}


def load_predictions(path: str) -> list[dict]:
  """The records of a finished job's predictions-<mode>.jsonl in file order, each with index,
  inputs, prediction and tokens; a malformed line is an error naming file and line."""
  records = _read_records(path, "")
  if not records:
    raise ValueError(f"{path}: no predictions")
  return records


def load_job_manifest(predictions_path: str) -> dict[str, Any]:
  """The manifest of the job that wrote `predictions_path` (in the same directory)."""
  if not os.path.isfile(predictions_path):
    raise FileNotFoundError(f"{predictions_path} does not exist")
  manifest = lock.read_manifest(os.path.dirname(os.path.abspath(predictions_path)))
  if manifest is None:
    raise ValueError(f"{predictions_path}: no {lock.MANIFEST_FILE} beside it (not an infer job?)")
  return manifest


def _read_records(path: str, hint: str) -> list[dict]:
  """The JSON records of a predictions file; a malformed line or a record without index, inputs,
  prediction and tokens is an error naming file and line."""
  records = []
  with open(path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, 1):
      try:
        record = json.loads(line)
        if not all(k in record for k in ("index", "inputs", "prediction", "tokens")):
          raise ValueError("needs index, inputs, prediction and tokens")
      except ValueError as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{path}:{line_no}: not a predictions record ({e}){hint}") from None
      records.append(record)
  return records


def _jsonl(records: Iterable[dict]) -> str:
  """Records without their walltimes (in timings.json), so equal settings give equal bytes."""
  return "".join(
    json.dumps({k: v for k, v in r.items() if k not in TIMINGS}, ensure_ascii=False) + "\n"
    for r in records
  )


def _package_version() -> str:
  from importlib import metadata

  try:
    return metadata.version("speculative")
  except metadata.PackageNotFoundError:
    return "unknown"
