"""Gin-configured batch inference: speculative decoding (and the baseline) over a task or input file.

The main job (README quickstart, `make run`):
  python -m speculative.infer --gin_file=configs/local/run.gin

translates the first 100 sentences of the LibreOffice help En-De test split with the embedded
target/draft pair, greedily, once with plain autoregressive decoding and once with speculative
decoding (interleaved batch by batch in one process, same inputs and weights), checks that the two
outputs are token-identical, and prints BLEU, alpha, acceptance rate, block efficiency, tokens/s and
the walltime speedup. It writes, atomically, under `output_dir`:
  predictions-<mode>.jsonl  one JSON object per example (input, reference, prediction, tokens,
                            target calls, drafted/accepted drafts, decode seconds)
  metrics.json / report.md  the summary
An interrupted job resumes: finished examples are read back and not decoded again.

In the T5X style, the run file names the task (`MIXTURE_OR_TASK_NAME`, a seqio task; or
`INPUT_FILE`, a TSV `source<TAB>reference` / plain text file, tokenized with `vocabulary_path`,
default the shipped 8k vocabulary), `TASK_FEATURE_LENGTHS`, the target and
draft model configs and checkpoints (a T5X checkpoint directory or a `.msgpack` params file), `GAMMA`,
`TEMPERATURE` and `INFER_OUTPUT_DIR`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints
from speculative import decoding
from speculative import drafters as drafters_lib
from speculative import sampling as sampling_lib
from speculative.models import t5 as t5_lib

MODES = ("baseline", "speculative")
# Draft sources of the speculative mode: the draft model, copying n-grams from the source sentence
# or the generated prefix (drafters.PromptLookupDrafter), or copying with the draft model as the
# fallback for rows without a match.
DRAFTERS = ("model", "prompt_lookup", "prompt_lookup+model")


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
    ids = ids[:inputs_length - 1] + [1]
  return np.asarray(ids, np.int32), truncated


def examples_from_file(path: str, vocabulary, inputs_length: int, prefix: str = "",
                       num_examples: int | None = None) -> list[Example]:
  """A TSV (`source<TAB>reference`) or plain text file (one source per line)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"input file does not exist: {path}")
  import gzip
  opener = gzip.open if path.endswith(".gz") else open
  examples = []
  with opener(path, "rt", encoding="utf-8") as f:
    for line_no, line in enumerate(f, 1):
      line = line.rstrip("\n")
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


def examples_from_task(task_name: str, split: str, inputs_length: int,
                       num_examples: int | None = None) -> list[Example]:
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
      tokens = np.concatenate([tokens[:inputs_length - 1], [1]]).astype(np.int32)
    if len(tokens) == 0:
      raise ValueError(f"{task_name}/{split} example {len(examples)} has empty inputs")
    examples.append(Example(len(examples), text.decode() if isinstance(text, bytes) else str(text),
                            reference.decode() if isinstance(reference, bytes) else reference,
                            tokens, truncated))
  if not examples:
    raise ValueError(f"task {task_name!r} split {split!r} has no examples")
  return examples


def _pad_batch(examples: Sequence[Example], batch_size: int, inputs_length: int) -> np.ndarray:
  batch = np.zeros((batch_size, inputs_length), np.int32)  # [batch, inputs_length]
  for row, example in enumerate(examples):
    batch[row, :len(example.input_tokens)] = example.input_tokens
  for row in range(len(examples), batch_size):  # pad rows repeat the first example (discarded)
    batch[row] = batch[0]
  return batch


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
  params = checkpoints.load_params(checkpoint, dtype=np.float32)
  checkpoints.validate_params(params, model.param_shapes(), name=checkpoint)
  return model, jax.tree_util.tree_map(jnp.asarray, params)


# ----------------------------------------------------------------------------------------------
# Atomic JSON/JSONL output.
# ----------------------------------------------------------------------------------------------


def write_atomic(path: str, text: str) -> None:
  """Writes `text` (UTF-8) atomically: readers never see a half-written file."""
  checkpoints.write_atomic(path, text.encode("utf-8"))


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
        raise ValueError(f"{path}:{line_no}: corrupt predictions line ({e}); delete the file "
                         "to start over") from e
      done[int(record["index"])] = record
  return done


def _jsonl(records: Iterable[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


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


def _record(example: Example, vocabulary, tokens: np.ndarray, length: int, metrics: dict,
            seconds: float, batch_rows: int) -> dict:
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


def summarize(records: Sequence[dict], metric_fns: Sequence[Any] = ()) -> dict[str, float]:
  """Totals over a mode's records (DESIGN.md section 7 definitions)."""
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
  }
  if drafted:
    out["alpha"] = sum(r["alpha_sum"] for r in records) / drafted
    out["acceptance_rate"] = sum(r["accepted"] for r in records) / drafted
  if metric_fns and all(r["reference"] is not None for r in records):
    ordered = sorted(records, key=lambda r: r["index"])
    for metric_fn in metric_fns:  # seqio-style: (targets, predictions) -> {name: value}
      out.update(metric_fn([r["reference"] for r in ordered], [r["prediction"] for r in ordered]))
  return out


def infer(*,
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
          progress: bool = True) -> dict[str, Any]:
  """Runs the job; returns the metrics dict also written to `output_dir/metrics.json`.

  Speculative knobs (speculative mode only): `drafter` (one of DRAFTERS); `draft_stop_below` > 0
  is adaptive gamma (the draft stops proposing once its confidence falls below it; exact);
  `adaptive_verify` narrows the target's verify call to the longest proposal (exact); `lenience`
  < 1 accepts more drafts and CHANGES the output (Appendix A.5; greedy outputs are then not
  required to match the baseline).
  """
  from tqdm import tqdm
  for mode in modes:
    if mode not in MODES:
      raise ValueError(f"unknown mode {mode!r}; expected some of {MODES}")
  if not modes:
    raise ValueError("modes is empty")
  if (mixture_or_task_name is None) == (input_file is None):
    raise ValueError("give exactly one of mixture_or_task_name and input_file")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  if gamma < 1:
    raise ValueError(f"gamma must be >= 1, got {gamma}")
  sampling_lib.check_lenience(lenience)
  if drafter not in DRAFTERS:
    raise ValueError(f"unknown drafter {drafter!r}; expected one of {DRAFTERS}")
  needs_draft_model = "speculative" in modes and drafter != "prompt_lookup"
  exact = float(lenience) == 1.0
  inputs_length = int(task_feature_lengths["inputs"])
  max_new_tokens = int(task_feature_lengths["targets"])
  sampling, sampling_params = sampling_lib.make_sampling(temperature, top_k, top_p)
  sampling_params.validate()

  from speculative import tasks
  if mixture_or_task_name is not None:
    import seqio
    tasks.register_tasks()
    # Predictions are decoded with the task's own output vocabulary (e.g. 32k for the TFDS tasks).
    task = seqio.get_mixture_or_task(mixture_or_task_name)
    vocabulary = task.output_features["targets"].vocabulary
    metric_fns = list(getattr(task, "metric_fns", ()))
    examples = examples_from_task(mixture_or_task_name, split, inputs_length, num_examples)
  else:
    vocabulary = tasks.get_vocabulary(vocabulary_path)
    metric_fns = [tasks.bleu]
    examples = examples_from_file(input_file, vocabulary, inputs_length, input_prefix,
                                  num_examples)
  n_truncated = sum(e.truncated for e in examples)
  if n_truncated:
    logging.warning("%d of %d inputs were longer than %d tokens and were truncated", n_truncated,
                    len(examples), inputs_length)

  if needs_draft_model:
    if draft_config is None or not draft_checkpoint:
      raise ValueError(f"speculative mode with drafter {drafter!r} needs draft_config and "
                       "draft_checkpoint")
    if draft_config.vocab_size != target_config.vocab_size:
      raise ValueError(f"draft and target vocabularies differ: draft vocab_size "
                       f"{draft_config.vocab_size} != target vocab_size "
                       f"{target_config.vocab_size}")
  target, target_params = load_model(target_config, target_checkpoint)
  if target.vocab_size < vocabulary.vocab_size:
    raise ValueError(f"target vocab_size {target.vocab_size} < vocabulary size "
                     f"{vocabulary.vocab_size}")
  draft_source = draft_params = None
  if needs_draft_model:
    draft, draft_params = load_model(draft_config, draft_checkpoint)
    draft_source = drafters_lib.ModelDrafter(draft, stop_below=draft_stop_below)
  if drafter.startswith("prompt_lookup"):
    draft_source = drafters_lib.PromptLookupDrafter(target.vocab_size, fallback=draft_source)

  def baseline_fn(encoder_tokens, rng):
    return decoding.autoregressive_decode(
        target, target_params, None, max_new_tokens=max_new_tokens, sampling=sampling,
        sampling_params=sampling_params, rng=rng, eos_id=1, encoder_tokens=encoder_tokens,
        check_finite=False)

  def speculative_fn(encoder_tokens, rng):
    return decoding.speculative_decode(
        target, target_params, draft_source, draft_params, None, gamma=gamma,
        max_new_tokens=max_new_tokens, sampling=sampling, sampling_params=sampling_params,
        rng=rng, eos_id=1, encoder_tokens=encoder_tokens, check_finite=False,
        lenience=None if exact else lenience, adaptive_verify=adaptive_verify)

  os.makedirs(output_dir, exist_ok=True)
  runs = []
  for mode in modes:
    path = os.path.join(output_dir, f"predictions-{mode}.jsonl")
    runs.append(ModeRun(mode, baseline_fn if mode == "baseline" else speculative_fn, path,
                        read_predictions(path)))
  todo = [e for e in examples if any(e.index not in run.records for run in runs)]
  if len(todo) < len(examples):
    print(f"resuming: {len(examples) - len(todo)} of {len(examples)} examples already done")

  batches = [todo[i:i + batch_size] for i in range(0, len(todo), batch_size)]
  bar = tqdm(batches, desc="decoding", unit="batch", disable=not progress)
  for batch_examples in bar:
    encoder_tokens = jnp.asarray(_pad_batch(batch_examples, batch_size, inputs_length))
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
      metrics = jax.tree_util.tree_map(np.asarray, dataclasses.asdict(result.metrics)
                                       if dataclasses.is_dataclass(result.metrics)
                                       else result.metrics.__dict__)
      if np.any(metrics["invalid"][:len(batch_examples)]):
        raise FloatingPointError("NaN/inf logits while decoding examples "
                                 f"{[e.index for e in batch_examples]}")
      for row, example in enumerate(batch_examples):
        run.records[example.index] = _record(
            example, vocabulary, tokens[row], int(lengths[row]),
            {k: v[row] for k, v in metrics.items()}, seconds, len(batch_examples))
      write_atomic(run.path, _jsonl(sorted(run.records.values(), key=lambda r: r["index"])))

  indices = [e.index for e in examples]
  summary: dict[str, Any] = {"examples": len(examples), "inputs_truncated": n_truncated,
                             "batch_size": batch_size, "gamma": gamma, "drafter": drafter,
                             "draft_stop_below": draft_stop_below,
                             "adaptive_verify": adaptive_verify, "lenience": lenience,
                             "temperature": temperature, "top_k": top_k, "top_p": top_p,
                             "machine": _machine()}
  for run in runs:
    records = [run.records[i] for i in indices]
    summary[run.name] = summarize(records, metric_fns)
    summary[run.name]["compile_s"] = run.compile_s
  if len(runs) == 2:
    base, spec = (summary["baseline"], summary["speculative"])
    summary["speedup"] = base["decode_s"] / spec["decode_s"]
    mismatched = [i for i in indices
                  if runs[0].records[i]["tokens"] != runs[1].records[i]["tokens"]]
    summary["identical_outputs"] = len(indices) - len(mismatched)
    summary["mismatched_examples"] = mismatched[:20]
    if temperature == 0 and mismatched and require_identical and exact:
      write_atomic(os.path.join(output_dir, "metrics.json"), json.dumps(summary, indent=2))
      raise AssertionError(f"greedy speculative output differs from the baseline on "
                           f"{len(mismatched)} examples, e.g. {mismatched[:5]}")
  write_atomic(os.path.join(output_dir, "metrics.json"), json.dumps(summary, indent=2) + "\n")
  report = format_report(summary)
  write_atomic(os.path.join(output_dir, "report.md"), report)
  print(report)
  return summary


def _machine() -> str:
  import platform
  return f"{platform.machine()}, {os.cpu_count()} CPU cores, jax {jax.__version__} " \
         f"({jax.default_backend()})"


def format_report(summary: dict[str, Any]) -> str:
  lines = ["# Batch inference report", "",
           f"{summary['examples']} examples, batch size {summary['batch_size']}, "
           + (f"drafter {summary.get('drafter', 'model')}, gamma {summary['gamma']}, "
              if "speculative" in summary else "")
           + f"temperature {summary['temperature']}; "
           f"machine: {summary['machine']}", ""]
  knobs = [f"adaptive gamma (draft stops below confidence {summary['draft_stop_below']})"
           if summary.get("draft_stop_below") else "",
           "adaptive verify width" if summary.get("adaptive_verify") else "",
           f"lenience {summary['lenience']} (APPROXIMATE: changes the output)"
           if summary.get("lenience", 1.0) != 1.0 else ""]
  if any(knobs):
    lines += ["Speculative options: " + "; ".join(k for k in knobs if k), ""]
  lines += ["| mode | BLEU | tokens | target calls | block efficiency | alpha | acceptance | "
            "decode s | tokens/s | compile s |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  for mode in MODES:
    if mode not in summary:
      continue
    m = summary[mode]
    fmt = lambda k, f="{:.3f}": f.format(m[k]) if m.get(k) is not None else "-"  # noqa: E731
    lines.append(f"| {mode} | {fmt('bleu', '{:.2f}')} | {m['generated_tokens']} | "
                 f"{m['target_calls']} | {m['block_efficiency']:.3f} | {fmt('alpha')} | "
                 f"{fmt('acceptance_rate')} | {m['decode_s']:.2f} | {m['tokens_per_s']:.1f} | "
                 f"{fmt('compile_s', '{:.1f}')} |")
  if "speedup" in summary:
    lines += ["", f"Walltime speedup (baseline / speculative decode time, warm, same process): "
              f"**{summary['speedup']:.2f}x**",
              f"Identical outputs: {summary['identical_outputs']} / {summary['examples']}"]
  return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
  from speculative import gin_utils
  gin_utils.run_gin_main(infer, "infer", __doc__.splitlines()[0], argv, logging.WARNING)


if __name__ == "__main__":
  main()
