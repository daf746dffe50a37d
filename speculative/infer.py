"""Gin-configured batch inference: speculative decoding (and the baseline) over a task or input file.

The main job (README quickstart, `make run`):
  python -m speculative.infer --gin_file=configs/local/run.gin

translates the first 100 sentences of the LibreOffice help En-De test split with the embedded
target/draft pair, greedily, once with plain autoregressive decoding and once with speculative
decoding (interleaved batch by batch in one process, same inputs and weights), checks that the two
outputs are token-identical, and prints BLEU, alpha, acceptance rate, block efficiency, tokens/s and
the walltime speedup. It writes, atomically, under `output_dir`:
  manifest.json             everything that determines the outputs (inputs hash, checkpoint
                            hashes, model configs, drafter, gamma, sampling, seed, ...)
  predictions-<mode>.jsonl  one JSON object per example (input, reference, prediction, tokens,
                            target calls, drafted/accepted drafts); identical across re-runs
  timings.json              per-example decode seconds of each mode
  metrics.json / report.md  the summary
An interrupted job resumes: finished examples are read back and not decoded again, but only if
the manifest matches; a re-run with any different setting is refused before a model loads (use a
new output directory, or `infer.overwrite = True` / OVERWRITE = True to delete the old outputs).
One run at a time may write to an output directory (an OS lock, `.lock`). Every knob, path and
the output directory are checked in the first seconds, before any weights load (docs/batch_jobs.md).

In the T5X style, the run file names the task (`MIXTURE_OR_TASK_NAME`, a seqio task; or
`INPUT_FILE`, a TSV `source<TAB>reference` / plain text file, one segment a line, UTF-8 with or
without BOM, '-' = stdin, tokenized with `vocabulary_path`, default the shipped 8k vocabulary;
inputs longer than the inputs feature length are truncated and counted in the report),
`TASK_FEATURE_LENGTHS`, the target and draft model configs and checkpoints (a T5X checkpoint
directory or a `.msgpack` params file), `GAMMA`, `TEMPERATURE` and `INFER_OUTPUT_DIR`.
`python -m speculative.infer --help` lists the run file's macros with their values.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
from typing import Any
from typing import Iterable
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import audit
from speculative import batching
from speculative import checkpoints
from speculative import decoding
from speculative import drafters as drafters_lib
from speculative import jobs
from speculative import sampling as sampling_lib
from speculative.models import t5 as t5_lib

MODES = ("baseline", "speculative")
EOS_ID = 1
# Draft sources of the speculative mode (names of the drafter registry, speculative.drafters.registry):
# the draft model, copying n-grams from the source sentence or the generated prefix, or copying with
# the draft model as the fallback for rows without a match. The n-gram table drafters need a corpus
# and are benchmarked only (speculative.benchmark).
DRAFTERS = tuple(name for name in drafters_lib.DRAFTERS if not drafters_lib.needs_corpus(name))
# gamma: draft tokens per target call. Past ~32 the verify call costs more than drafting saves.
GAMMA_RANGE = (1, 32)
# What an output directory holds (removed by `overwrite`).
OUTPUT_FILES = ("manifest.json", "timings.json", "metrics.json", "report.md") + tuple(
  f"predictions-{mode}.jsonl" for mode in MODES
)


@dataclasses.dataclass(frozen=True)
class Example:
  index: int
  inputs: str  # the model input text (task prefix included)
  reference: str | None
  input_tokens: np.ndarray  # [S] int32, EOS-terminated, truncated to the inputs feature length
  truncated: bool


# ----------------------------------------------------------------------------------------------
# Inputs.
# ----------------------------------------------------------------------------------------------


def _tokenize_inputs(vocabulary, text: str, inputs_length: int) -> tuple[np.ndarray, bool]:
  ids = list(vocabulary.encode(text)) + [1]  # EOS
  truncated = len(ids) > inputs_length
  if truncated:
    ids = ids[: inputs_length - 1] + [1]
  return np.asarray(ids, np.int32), truncated


def read_lines(path: str) -> list[str]:
  """The lines of a UTF-8 text file (a leading BOM dropped; `.gz` decompressed; '-' = stdin).

  Raises ValueError naming `path:line` at the first line that is not valid UTF-8.
  """
  import gzip

  if path == "-":
    data = sys.stdin.buffer.read()
  else:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"input file does not exist: {path}")
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
      data = f.read()
  if data.startswith(b"\xef\xbb\xbf"):
    data = data[3:]
  lines = []
  for line_no, raw in enumerate(data.splitlines(), 1):
    try:
      lines.append(raw.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as e:
      raise ValueError(
        f"{path}:{line_no}: not valid UTF-8 (byte {raw[e.start : e.start + 1]!r} at "
        f"column {e.start + 1}); convert the file to UTF-8"
      ) from None
  return lines


def examples_from_file(
  path: str, vocabulary, inputs_length: int, prefix: str = "", num_examples: int | None = None
) -> list[Example]:
  """A TSV (`source<TAB>reference`) or plain text file (one source per line); '-' = stdin."""
  examples = []
  for line_no, line in enumerate(read_lines(path), 1):
    if not line.strip():
      raise ValueError(f"{path}:{line_no}: empty input line")
    source, _, reference = line.partition("\t")
    text = prefix + source
    tokens, truncated = _tokenize_inputs(vocabulary, text, inputs_length)
    examples.append(Example(len(examples), text, reference or None, tokens, truncated))
    if num_examples is not None and len(examples) >= num_examples:
      break
  if not examples:
    raise ValueError(f"{path}: no examples")
  return examples


def examples_from_task(
  task_name: str, split: str, inputs_length: int, num_examples: int | None = None
) -> list[Example]:
  """Examples of a registered seqio task (e.g. `libreoffice_ende`), in dataset order."""
  import seqio

  from speculative import tasks

  tasks.register_tasks()
  task = seqio.get_mixture_or_task(task_name)
  dataset = task.get_dataset(sequence_length=None, split=split, shuffle=False, use_cached=False)
  if num_examples is not None:
    dataset = dataset.take(num_examples)
  examples = []
  for record in dataset.as_numpy_iterator():  # seqio appended EOS
    tokens = np.asarray(record["inputs"], np.int32)
    text = record.get("inputs_pretokenized", b"")
    reference = record.get("targets_pretokenized")
    truncated = len(tokens) > inputs_length
    if truncated:
      tokens = np.concatenate([tokens[: inputs_length - 1], [1]]).astype(np.int32)
    if len(tokens) == 0:
      raise ValueError(f"{task_name}/{split} example {len(examples)} has empty inputs")
    examples.append(
      Example(
        len(examples),
        text.decode() if isinstance(text, bytes) else str(text),
        reference.decode() if isinstance(reference, bytes) else reference,
        tokens,
        truncated,
      )
    )
  if not examples:
    raise ValueError(f"task {task_name!r} split {split!r} has no examples")
  return examples


# ----------------------------------------------------------------------------------------------
# Models.
# ----------------------------------------------------------------------------------------------


def load_model(config: t5_lib.T5Config, checkpoint: str) -> tuple[t5_lib.T5, Any]:
  """A T5 and its f32 params from a T5X checkpoint dir or a `.msgpack` params file, shape-checked."""
  if not checkpoint:
    raise ValueError("no checkpoint path given")
  if not os.path.exists(checkpoint):
    raise FileNotFoundError(f"checkpoint does not exist: {checkpoint}")
  model = t5_lib.T5(config)
  params = checkpoints.load_params(checkpoint, dtype=np.float32, config=config)
  checkpoints.validate_params(params, model.param_shapes(), name=checkpoint)
  return model, jax.tree_util.tree_map(jnp.asarray, params)


# ----------------------------------------------------------------------------------------------
# Atomic JSON/JSONL output.
# ----------------------------------------------------------------------------------------------


def write_atomic(path: str, text: str) -> None:
  """Writes `text` (UTF-8) atomically: readers never see a half-written file."""
  checkpoints.write_atomic(path, text.encode("utf-8"))


def read_timings(output_dir: str) -> dict[str, dict[int, float]]:
  """{mode: {index: decode seconds}} of an earlier (interrupted) run."""
  path = os.path.join(output_dir, "timings.json")
  if not os.path.exists(path):
    return {}
  with open(path, encoding="utf-8") as f:
    return {
      mode: {int(i): s for i, s in by_index.items()} for mode, by_index in json.load(f).items()
    }


def read_predictions(path: str) -> dict[int, dict]:
  """Finished examples of an earlier (interrupted) run, by index."""
  if not os.path.exists(path):
    return {}
  done = {}
  with open(path, encoding="utf-8") as f:
    for line_no, line in enumerate(f, 1):
      try:
        record = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(
          f"{path}:{line_no}: corrupt predictions line ({e}); delete the file to start over"
        ) from e
      done[int(record["index"])] = record
  return done


def _jsonl(records: Iterable[dict]) -> str:
  """Records without their walltime (in timings.json), so equal settings give equal bytes."""
  return "".join(
    json.dumps({k: v for k, v in r.items() if k != "decode_s"}, ensure_ascii=False) + "\n"
    for r in records
  )


# ----------------------------------------------------------------------------------------------
# The job.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ModeRun:
  """The decode function of one mode and its accumulated results."""

  name: str
  decode: Any
  path: str
  records: dict[int, dict]
  compile_s: float | None = None


def _record(
  example: Example,
  vocabulary,
  tokens: np.ndarray,
  length: int,
  metrics: dict,
  seconds: float,
  batch_rows: int,
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
    "inputs_truncated": example.truncated,
    # The batch's decode walltime, split evenly over its rows (batch 1: the example's own time).
    "decode_s": seconds / batch_rows,
  }


def hit_length_cap(record: dict, max_new_tokens: int) -> bool:
  """The decode stopped at the length cap, not at EOS (a runaway output)."""
  return record["num_tokens"] >= max_new_tokens and (
    not record["tokens"] or record["tokens"][-1] != EOS_ID
  )


def summarize(
  records: Sequence[dict], metric_fns: Sequence[Any] = (), max_new_tokens: int | None = None
) -> dict[str, float]:
  """Totals over a mode's records (docs/design.md section 7 definitions)."""
  tokens = sum(r["num_tokens"] for r in records)
  calls = sum(r["target_calls"] for r in records)
  drafted = sum(r["drafted"] for r in records)
  seconds = sum(r["decode_s"] for r in records)
  out = {
    "examples": len(records),
    "generated_tokens": tokens,
    "target_calls": calls,
    "block_efficiency": tokens / max(calls, 1),
    "decode_s": seconds,
    "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
    "sentences_per_s": len(records) / seconds if seconds > 0 else float("nan"),
  }
  if max_new_tokens is not None and records:
    out["cap_pct"] = 100.0 * sum(hit_length_cap(r, max_new_tokens) for r in records) / len(records)
  if drafted:
    out["alpha"] = sum(r["alpha_sum"] for r in records) / drafted
    out["acceptance_rate"] = sum(r["accepted"] for r in records) / drafted
  if metric_fns and all(r["reference"] is not None for r in records):
    ordered = sorted(records, key=lambda r: r["index"])
    for metric_fn in metric_fns:  # seqio-style: (targets, predictions) -> {name: value}
      out.update(metric_fn([r["reference"] for r in ordered], [r["prediction"] for r in ordered]))
  return out


def infer(
  *,
  target_config: t5_lib.T5Config,
  target_checkpoint: str,
  output_dir: str,
  task_feature_lengths: dict[str, int],
  mixture_or_task_name: str | None = None,
  split: str = "test",
  input_file: str | None = None,
  input_prefix: str = "",
  vocabulary_path: str | None = None,
  num_examples: int | None = None,
  draft_config: t5_lib.T5Config | None = None,
  draft_checkpoint: str | None = None,
  modes: Sequence[str] = MODES,
  batch_size: int = 1,
  gamma: int = 4,
  drafter: str = "model",
  draft_stop_below: float = 0.0,
  adaptive_verify: bool = False,
  lenience: float = 1.0,
  temperature: float = 0.0,
  top_k: int = 0,
  top_p: float = 1.0,
  seed: int = 0,
  require_identical: bool = True,
  progress: bool = True,
  overwrite: bool = False,
) -> dict[str, Any]:
  """Runs the job; returns the metrics dict also written to `output_dir/metrics.json`.

  Before anything is loaded, every knob's type and range (`check_settings`), every path and the
  output directory's writability are checked; then the output directory is locked (one writer) and
  its manifest compared (a re-run resumes only outputs of identical settings; `overwrite` deletes
  outputs of other settings instead of refusing). `num_examples`: how many examples (>= 1) from the
  start of the task split / input file; None = all. `gamma` in GAMMA_RANGE; `temperature` >= 0;
  `top_k` >= 0 (0 = off); `top_p` in (0, 1]; `lenience` in (0, 1]; `batch_size` >= 1.

  Speculative knobs (speculative mode only): `drafter` (one of DRAFTERS); `draft_stop_below` > 0
  is adaptive gamma (the draft stops proposing once its confidence falls below it; exact);
  `adaptive_verify` narrows the target's verify call to the longest proposal (exact); `lenience`
  < 1 accepts more drafts and CHANGES the output (Appendix A.5; greedy outputs are then not
  required to match the baseline).
  """
  job = dict(locals())
  check_settings(**job)
  jobs.probe_writable(output_dir)
  with jobs.OutputLock(output_dir):
    return _run(**job)


def check_settings(
  *,
  target_config,
  target_checkpoint,
  output_dir,
  task_feature_lengths,
  mixture_or_task_name,
  split,
  input_file,
  input_prefix,
  vocabulary_path,
  num_examples,
  draft_config,
  draft_checkpoint,
  modes,
  batch_size,
  gamma,
  drafter,
  draft_stop_below,
  adaptive_verify,
  lenience,
  temperature,
  top_k,
  top_p,
  seed,
  require_identical,
  progress,
  overwrite,
) -> None:
  """Raises a ValueError/FileNotFoundError/PermissionError naming the first bad setting of
  `infer` (same arguments); stats paths but reads no weights or inputs."""
  del adaptive_verify, require_identical, progress, overwrite, input_prefix  # any value is valid
  if isinstance(modes, str) or not modes:
    raise ValueError(f"modes must be a non-empty sequence of {MODES}, got {modes!r}")
  for mode in modes:
    jobs.check_choice("mode", mode, MODES)
  if (mixture_or_task_name is None) == (input_file is None):
    raise ValueError(
      "give exactly one of mixture_or_task_name (MIXTURE_OR_TASK_NAME) and "
      "input_file (INPUT_FILE); to decode a file with configs/local/run.gin, bind "
      "INPUT_FILE = 'path' and MIXTURE_OR_TASK_NAME = None"
    )
  if mixture_or_task_name is not None and not isinstance(split, str):
    raise ValueError(f"split must be a string, got {split!r}")
  jobs.check_int("batch_size", batch_size, 1)
  jobs.check_int("gamma", gamma, *GAMMA_RANGE)
  jobs.check_float("temperature", temperature, 0.0)
  jobs.check_int("top_k", top_k, 0)
  jobs.check_float("top_p", top_p, 0.0, 1.0, low_inclusive=False)
  sampling_lib.check_lenience(jobs.check_float("lenience", lenience, 0.0, 1.0, low_inclusive=False))
  jobs.check_float("draft_stop_below", draft_stop_below, 0.0, 1.0, high_inclusive=False)
  jobs.check_int("seed", seed, 0)
  jobs.check_int("num_examples (None = all)", num_examples, 1, allow_none=True)
  jobs.check_choice("drafter", drafter, DRAFTERS)
  if not isinstance(task_feature_lengths, dict) or set(task_feature_lengths) != {
    "inputs",
    "targets",
  }:
    raise ValueError(
      f"task_feature_lengths must be {{'inputs': N, 'targets': M}}, got {task_feature_lengths!r}"
    )
  jobs.check_int("task_feature_lengths['inputs']", task_feature_lengths["inputs"], 2)
  jobs.check_int("task_feature_lengths['targets']", task_feature_lengths["targets"], 1)
  if not isinstance(target_config, t5_lib.T5Config):
    raise ValueError(f"target_config must be a t5.T5Config, got {type(target_config).__name__}")
  jobs.check_readable("target_checkpoint", target_checkpoint)
  if "speculative" in modes and drafter != "prompt_lookup":
    if draft_config is None or not draft_checkpoint:
      raise ValueError(
        f"speculative mode with drafter {drafter!r} needs draft_config and draft_checkpoint"
      )
    if not isinstance(draft_config, t5_lib.T5Config):
      raise ValueError(f"draft_config must be a t5.T5Config, got {type(draft_config).__name__}")
    if draft_config.vocab_size != target_config.vocab_size:
      raise ValueError(
        f"draft and target vocabularies differ: draft vocab_size "
        f"{draft_config.vocab_size} != target vocab_size "
        f"{target_config.vocab_size}"
      )
    jobs.check_readable("draft_checkpoint", draft_checkpoint)
  if input_file is not None and input_file != "-":
    jobs.check_readable("input_file", input_file)
  if vocabulary_path is not None:
    jobs.check_readable("vocabulary_path", vocabulary_path)
  if not isinstance(output_dir, (str, os.PathLike)) or not str(output_dir):
    raise ValueError(f"output_dir must be a path, got {output_dir!r}")
  sampling_lib.make_sampling(temperature, top_k, top_p)[1].validate()


def _examples_sha256(examples: Sequence[Example]) -> str:
  digest = hashlib.sha256()
  for e in examples:
    digest.update(
      json.dumps(
        [e.index, e.inputs, e.reference, e.input_tokens.tolist(), e.truncated], ensure_ascii=False
      ).encode()
    )
  return digest.hexdigest()


def _package_version() -> str:
  from importlib import metadata

  try:
    return metadata.version("speculative")
  except metadata.PackageNotFoundError:
    return "unknown"


def _run(
  *,
  target_config,
  target_checkpoint,
  output_dir,
  task_feature_lengths,
  mixture_or_task_name,
  split,
  input_file,
  input_prefix,
  vocabulary_path,
  num_examples,
  draft_config,
  draft_checkpoint,
  modes,
  batch_size,
  gamma,
  drafter,
  draft_stop_below,
  adaptive_verify,
  lenience,
  temperature,
  top_k,
  top_p,
  seed,
  require_identical,
  progress,
  overwrite,
) -> dict[str, Any]:
  """`infer` after its checks, holding the output directory's lock."""
  from tqdm import tqdm

  needs_draft_model = "speculative" in modes and drafters_lib.needs_draft_model(drafter)
  exact = float(lenience) == 1.0
  inputs_length = int(task_feature_lengths["inputs"])
  max_new_tokens = int(task_feature_lengths["targets"])
  sampling, sampling_params = sampling_lib.make_sampling(temperature, top_k, top_p)

  from speculative import tasks

  if mixture_or_task_name is not None:
    import seqio

    tasks.register_tasks()
    # Predictions are decoded with the task's own output vocabulary (e.g. 32k for the TFDS tasks).
    task = seqio.get_mixture_or_task(mixture_or_task_name)
    vocabulary = task.output_features["targets"].vocabulary
    metric_fns = list(getattr(task, "metric_fns", ()))
    examples = examples_from_task(mixture_or_task_name, split, inputs_length, num_examples)
    source = {"task": mixture_or_task_name, "split": split}
  else:
    vocabulary = tasks.get_vocabulary(vocabulary_path)
    metric_fns = [tasks.translation_metrics]
    examples = examples_from_file(input_file, vocabulary, inputs_length, input_prefix, num_examples)
    source = {
      "input_file": input_file,
      "input_prefix": input_prefix,
      "vocabulary_path": vocabulary_path,
    }
  n_truncated = sum(e.truncated for e in examples)
  if n_truncated:
    logging.warning(
      "%d of %d inputs were longer than %d tokens and were truncated",
      n_truncated,
      len(examples),
      inputs_length,
    )
  if target_config.vocab_size < vocabulary.vocab_size:
    raise ValueError(
      f"target vocab_size {target_config.vocab_size} < vocabulary size {vocabulary.vocab_size}"
    )

  # Everything that determines the outputs; weights by content (verified against their metadata).
  manifest = {
    "package_version": _package_version(),
    "inputs": source,
    "inputs_sha256": _examples_sha256(examples),
    "examples": len(examples),
    "num_examples": num_examples,
    "task_feature_lengths": dict(task_feature_lengths),
    "target_config": checkpoints.config_dict(target_config),
    "target_checkpoint_sha256": checkpoints.verify_weights(target_checkpoint, target_config),
    "draft_config": checkpoints.config_dict(draft_config) if needs_draft_model else None,
    "draft_checkpoint_sha256": (
      checkpoints.verify_weights(draft_checkpoint, draft_config) if needs_draft_model else None
    ),
    "param_dtype": "float32",
    "modes": list(modes),
    "batch_size": batch_size,
    "drafter": drafter if "speculative" in modes else None,
    "gamma": gamma,
    "draft_stop_below": draft_stop_below,
    "adaptive_verify": adaptive_verify,
    "lenience": lenience,
    "temperature": temperature,
    "top_k": top_k,
    "top_p": top_p,
    "seed": seed,
  }
  checkpoints.remove_stale_temporaries(output_dir)  # we hold the lock: no other writer
  if overwrite:
    for name in OUTPUT_FILES:
      if os.path.exists(os.path.join(output_dir, name)):
        os.remove(os.path.join(output_dir, name))
  else:
    jobs.check_manifest(
      output_dir,
      manifest,
      "bind infer.overwrite = True (OVERWRITE = True in configs/local/run.gin)",
    )
  write_atomic(
    os.path.join(output_dir, jobs.MANIFEST_FILE),
    json.dumps(manifest, indent=2, ensure_ascii=False) + "\n",
  )

  target, target_params = load_model(target_config, target_checkpoint)
  draft = draft_source = draft_params = None
  if needs_draft_model:
    draft, draft_params = load_model(draft_config, draft_checkpoint)
  if "speculative" in modes:
    draft_source, draft_params = drafters_lib.build_drafter(
      drafter,
      vocab_size=target.vocab_size,
      draft_model=draft,
      draft_params=draft_params,
      stop_below=draft_stop_below,
    )

  def baseline_fn(encoder_tokens, rng):
    return decoding.autoregressive_decode(
      target,
      target_params,
      None,
      max_new_tokens=max_new_tokens,
      sampling=sampling,
      sampling_params=sampling_params,
      rng=rng,
      eos_id=EOS_ID,
      encoder_tokens=encoder_tokens,
      check_finite=False,
    )

  def speculative_fn(encoder_tokens, rng):
    return decoding.speculative_decode(
      target,
      target_params,
      draft_source,
      draft_params,
      None,
      gamma=gamma,
      max_new_tokens=max_new_tokens,
      sampling=sampling,
      sampling_params=sampling_params,
      rng=rng,
      eos_id=EOS_ID,
      encoder_tokens=encoder_tokens,
      check_finite=False,
      lenience=None if exact else lenience,
      adaptive_verify=adaptive_verify,
    )

  runs = []
  timings = read_timings(output_dir)
  for mode in modes:
    path = os.path.join(output_dir, f"predictions-{mode}.jsonl")
    records = read_predictions(path)
    for index, record in records.items():
      record["decode_s"] = timings.get(mode, {}).get(index, float("nan"))
    runs.append(ModeRun(mode, baseline_fn if mode == "baseline" else speculative_fn, path, records))
  todo = [e for e in examples if any(e.index not in run.records for run in runs)]
  if len(todo) < len(examples):
    print(f"resuming: {len(examples) - len(todo)} of {len(examples)} examples already done")

  batches = batching.length_sorted_batches(todo, batch_size)
  bar = tqdm(batches, desc="decoding", unit="batch", disable=not progress)
  for batch_examples in bar:
    encoder_tokens = jnp.asarray(batching.pad_batch(batch_examples, batch_size, inputs_length))
    rng = jax.random.fold_in(jax.random.PRNGKey(seed), batch_examples[0].index)
    for run in runs:
      if all(e.index in run.records for e in batch_examples):
        continue
      if run.compile_s is None:  # first call compiles; time it separately, then run warm
        t0 = time.perf_counter()
        jax.block_until_ready(run.decode(encoder_tokens, rng))
        run.compile_s = time.perf_counter() - t0
      t0 = time.perf_counter()
      result = run.decode(encoder_tokens, rng)
      jax.block_until_ready(result)
      seconds = time.perf_counter() - t0
      tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
      metrics = jax.tree_util.tree_map(
        np.asarray,
        dataclasses.asdict(result.metrics)
        if dataclasses.is_dataclass(result.metrics)
        else result.metrics.__dict__,
      )
      if np.any(metrics["invalid"][: len(batch_examples)]):
        raise FloatingPointError(
          f"NaN/inf logits while decoding examples {[e.index for e in batch_examples]}"
        )
      for row, example in enumerate(batch_examples):
        run.records[example.index] = _record(
          example,
          vocabulary,
          tokens[row],
          int(lengths[row]),
          {k: v[row] for k, v in metrics.items()},
          seconds,
          len(batch_examples),
        )
      # Timings first: a kill between the two writes leaves timings for records not yet written.
      write_atomic(
        os.path.join(output_dir, "timings.json"),
        json.dumps(
          {r.name: {str(i): rec["decode_s"] for i, rec in sorted(r.records.items())} for r in runs}
        )
        + "\n",
      )
      write_atomic(run.path, _jsonl(sorted(run.records.values(), key=lambda r: r["index"])))

  indices = [e.index for e in examples]
  summary: dict[str, Any] = {
    "examples": len(examples),
    "inputs_truncated": n_truncated,
    "inputs_length": inputs_length,
    "batch_size": batch_size,
    "gamma": gamma,
    "drafter": drafter,
    "draft_stop_below": draft_stop_below,
    "adaptive_verify": adaptive_verify,
    "lenience": lenience,
    "temperature": temperature,
    "top_k": top_k,
    "top_p": top_p,
    "machine": _machine(),
  }
  for run in runs:
    records = [run.records[i] for i in indices]
    summary[run.name] = summarize(records, metric_fns, max_new_tokens)
    summary[run.name]["compile_s"] = run.compile_s
  if len(runs) == 2:
    base, spec = (summary["baseline"], summary["speculative"])
    summary["speedup"] = base["decode_s"] / spec["decode_s"]
    mismatched = [
      i for i in indices if runs[0].records[i]["tokens"] != runs[1].records[i]["tokens"]
    ]
    summary["identical_outputs"] = len(indices) - len(mismatched)
    summary["mismatched_examples"] = mismatched[:20]
    if temperature == 0 and exact:
      by_index = {e.index: e for e in examples}
      divergences = audit_greedy_divergences(
        target, target_params, [by_index[i] for i in mismatched], runs, inputs_length
      )
      summary["audit"] = audit.summarize(divergences, len(indices))
      summary["divergences"] = [dataclasses.asdict(d) for d in divergences]
      bad = [d.example for d in divergences if d.verdict == audit.MISMATCH]
      if bad and require_identical:
        write_atomic(os.path.join(output_dir, "metrics.json"), json.dumps(summary, indent=2))
        raise AssertionError(
          f"greedy speculative output differs from the baseline beyond "
          f"rounding (audit verdict 'mismatch') on {len(bad)} examples, e.g. "
          f"{bad[:5]}; see metrics.json 'divergences'"
        )
  summary["samples"] = [
    {k: runs[0].records[i][k] for k in ("inputs", "reference", "prediction")} for i in indices[:3]
  ]
  write_atomic(os.path.join(output_dir, "metrics.json"), json.dumps(summary, indent=2) + "\n")
  report = format_report(summary)
  write_atomic(os.path.join(output_dir, "report.md"), report)
  print(report)
  return summary


def audit_greedy_divergences(
  target, target_params, examples: Sequence[Example], runs: Sequence[ModeRun], inputs_length: int
) -> list[audit.Divergence]:
  """The divergence audit (speculative/audit.py) of the examples whose greedy outputs differ:
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


def _machine() -> str:
  import platform

  return (
    f"{platform.machine()}, {os.cpu_count()} CPU cores, jax {jax.__version__} "
    f"({jax.default_backend()})"
  )


def format_report(summary: dict[str, Any]) -> str:
  lines = [
    "# Batch inference report",
    "",
    f"{summary['examples']} examples, batch size {summary['batch_size']}, "
    + (
      f"drafter {summary.get('drafter', 'model')}, gamma {summary['gamma']}, "
      if "speculative" in summary
      else ""
    )
    + f"temperature {summary['temperature']}; "
    f"machine: {summary['machine']}",
    "",
  ]
  if summary.get("inputs_truncated"):
    lines += [
      f"Inputs truncated: {summary['inputs_truncated']} of {summary['examples']} were "
      f"longer than {summary.get('inputs_length', '?')} tokens and were cut to fit "
      "(raise TASK_FEATURE_LENGTHS['inputs'] to keep them whole).",
      "",
    ]
  knobs = [
    f"adaptive gamma (draft stops below confidence {summary['draft_stop_below']})"
    if summary.get("draft_stop_below")
    else "",
    "adaptive verify width" if summary.get("adaptive_verify") else "",
    f"lenience {summary['lenience']} (APPROXIMATE: changes the output)"
    if summary.get("lenience", 1.0) != 1.0
    else "",
  ]
  if any(knobs):
    lines += ["Speculative options: " + "; ".join(k for k in knobs if k), ""]
  lines += [
    "| mode | BLEU | chrF | loop % | length cap % | tokens | target calls | "
    "block efficiency | alpha | acceptance | decode s | sentences/s | tokens/s | "
    "compile s |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
  ]
  for mode in MODES:
    if mode not in summary:
      continue
    m = summary[mode]
    fmt = lambda k, f="{:.3f}": f.format(m[k]) if m.get(k) is not None else "-"  # noqa: E731
    lines.append(
      f"| {mode} | {fmt('bleu', '{:.2f}')} | {fmt('chrf', '{:.2f}')} | "
      f"{fmt('loop_pct', '{:.1f}')} | {fmt('cap_pct', '{:.1f}')} | "
      f"{m['generated_tokens']} | "
      f"{m['target_calls']} | {m['block_efficiency']:.3f} | {fmt('alpha')} | "
      f"{fmt('acceptance_rate')} | {m['decode_s']:.2f} | "
      f"{fmt('sentences_per_s', '{:.2f}')} | {m['tokens_per_s']:.1f} | "
      f"{fmt('compile_s', '{:.1f}')} |"
    )
  if summary.get("samples"):
    lines += ["", "Examples (the first three inputs):", ""]
    for sample in summary["samples"]:
      lines += [
        f"- source:     {sample['inputs']}",
        f"  reference:  {sample['reference'] if sample['reference'] is not None else '-'}",
        f"  output:     {sample['prediction']}",
      ]
  if "speedup" in summary:
    lines += [
      "",
      f"Walltime speedup (baseline / speculative decode time, warm, same process): "
      f"**{summary['speedup']:.2f}x**",
      f"Identical outputs: {summary['identical_outputs']} / {summary['examples']}",
    ]
    if summary.get("audit", {}).get("diverged"):
      counts = summary["audit"]
      lines += [
        "",
        f"Divergence audit (docs/exactness.md): {counts['near_tie']} near-tie, "
        f"{counts['mismatch']} mismatch. A near-tie is a position where the target's "
        "float32 top-2 logits are closer than the model dtype's rounding can move them; "
        "a mismatch is a bug.",
        "",
        audit.format_table([audit.Divergence(**d) for d in summary["divergences"]]),
      ]
    if summary["temperature"] > 0:
      lines += [
        "",
        "Under sampling (temperature > 0) identical outputs are NOT expected: the two "
        "modes consume random numbers differently. Speculative sampling is exact in "
        "distribution (every output is distributed as the target alone would sample it), "
        "not token-for-token; compare distributions, not outputs.",
      ]
    elif summary.get("lenience", 1.0) != 1.0:
      lines += ["", "With lenience < 1 the outputs are expected to differ from the baseline."]
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
  from speculative import gin_utils

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
