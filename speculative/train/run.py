"""Trains a T5 (T5X parameter tree) on a parallel TSV corpus with optax; optional draft distillation.

Run (the embedded pair; see configs/train/ for the exact files and expected output):
  python -m speculative.train --gin_file=configs/train/small_target.gin
  python -m speculative.train --gin_file=configs/train/small_draft.gin

Prints a tqdm bar with the running loss, writes T5X-layout checkpoints to `output_dir/checkpoint_<step>/`
every `checkpoint_every` steps (with the optax state beside them, so an interrupted run resumes from
its last checkpoint), evaluates validation loss/accuracy, and at the end exports compact weights
(`export_path`, bfloat16 flax msgpack) for shipping. To ship the newest checkpoint of a run that
stopped early: add --gin_bindings="train.export_only = True".

Batching (speculative/train/data.py): examples are bucketed by length into a few fixed (inputs,
targets) shapes, each with a batch size chosen to keep tokens per batch roughly constant, so only a
few shapes compile and little compute goes to padding.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints
from speculative.jobs import checks
from speculative.jobs import lock
from speculative.models import t5 as t5_lib
from speculative.train import checkpoints as train_checkpoints
from speculative.train import data as train_data
from speculative.train import settings as settings_lib
from speculative.train import steps


@checks.settings_entry(settings_lib.TrainSettings)
def train(settings: settings_lib.TrainSettings) -> dict[str, float]:
  """Trains (or resumes) and returns the last metrics. See the module docstring. Called with
  `TrainSettings`' fields as keyword arguments (`checks.settings_entry`; gin: `train.*`).

  `train_tsv`: one TSV file or several (e.g. the help corpus and the UI catalogue corpus), read in
  the order given and trained on as one set.
  `export_only`: write `export_path` from the newest checkpoint in `output_dir` without training
  (to ship a model from a run that was stopped before `num_steps`).
  `exclude_heldout`: TSV files (validation, test) whose sentences must not reach training: training
  pairs that match one of their sides exactly or nearly (speculative/data/overlap.py) are dropped, and the
  counts are printed and written to `output_dir/overlap.json`.
  `export_best`: export the parameters with the lowest validation NLL seen (`output_dir/best.msgpack`,
  updated at every evaluation) instead of the last ones.
  `optimizer`: 'adamw' or 'adafactor' (`steps.make_optimizer`).
  `init_checkpoint`: start from these weights (a T5X checkpoint directory or a `.msgpack`; shapes
  checked against `model_config`) with a fresh optimizer state, e.g. to continue another run with a
  different optimizer or schedule. Ignored once `output_dir` holds a checkpoint (resume wins).
  `fork_checkpoint`: continue another run from one of its checkpoints (`<run>/checkpoint_<step>`
  written by this trainer) with this run's settings (data, learning rate, dropout): weights,
  optimizer state and step count carry over. The checkpoint is copied into `output_dir`
  (atomically) when that holds none; a run that has one resumes from it instead.
  `bucket_lengths`: each entry a length n (a square (n, n) bucket) or an (inputs, targets) pair,
  for summarization's long inputs and short targets (`data.make_buckets`, `data.assign_buckets`).
  `input_prefixes`: the T5 task prefix of each `train_tsv` file's inputs, in the same order (e.g.
  'translate English to German: ' and 'summarize: ' for a multi-task model); None (default) puts
  `data.INPUT_PREFIX` (translation) before every input. `validation_tsv` keeps `data.INPUT_PREFIX`.
  `extra_validation`: more validation sets, {name: (tsv, input prefix)}, evaluated beside
  `validation_tsv` (at most `max_validation_examples` each) and logged as `val_<name>_nll` etc.
  (e.g. a second task's NLL); the best-validation export still follows `val_nll`.
  `export_replaces_better`: the export refuses to overwrite weights whose sidecar records a lower
  validation NLL than the ones being exported (e.g. a continuation's early best replacing the
  shipped model) unless this is True. Without `export_best` the exported weights' NLL is that of
  their evaluation in train_log.jsonl (the last step is always evaluated); weights never evaluated
  (`export_only` from a checkpoint between evaluations) do not replace weights that record one.
  `export_overwrites_tracked`: an `export_path` onto a file git tracks in this repository (the
  shipped weights, models/embedded/) is refused with the settings' checks, before any compute,
  unless this is True.
  """
  with checks.user_errors():  # bad paths, another run's checkpoints, a second writer
    os.makedirs(settings.output_dir, exist_ok=True)
    output_lock = lock.OutputLock(settings.output_dir).acquire()  # one writer per run directory
  try:
    return _run(settings)
  finally:
    output_lock.release()


def _run(s: settings_lib.TrainSettings) -> dict[str, float]:
  """`train` after its checks."""
  buckets = s.buckets()
  with checks.user_errors():  # a TSV line without its tab, an empty file, no full batch: one line
    train_examples, val_sets = _load_examples(s)
  logging.info("train examples %d, buckets %s", len(train_examples), buckets)
  model = t5_lib.T5(s.model_config)
  optimizer = steps.make_optimizer(
    s.learning_rate,
    s.warmup_steps,
    s.num_steps,
    s.weight_decay,
    s.clip_norm,
    s.schedule,
    s.optimizer,
  )
  params = _initial_params(s, model)
  opt_state = optimizer.init(params)
  teacher, teacher_params = _load_teacher(s)
  removed = checkpoints.remove_stale_temporaries(s.output_dir)  # left by a killed run
  if not s.has_own_checkpoint:
    train_checkpoints.write_origin(s.output_dir, s.origin)
  if removed:
    logging.warning("removed temporaries of an interrupted run in %s: %s", s.output_dir, removed)
  if s.starts_from_fork:
    train_checkpoints.copy_fork(s.fork_checkpoint, s.output_dir)
    print(f"forked from {s.fork_checkpoint}")
  with checks.user_errors():  # no checkpoint that can be read: one line
    start_step, params, opt_state = train_checkpoints.restore_latest(
      s.output_dir, params, opt_state, s.model_config
    )
  if start_step:
    print(f"resumed from {s.output_dir}/checkpoint_{start_step}")
    # A kill between writing a checkpoint and pruning the old ones left one too many.
    train_checkpoints.prune_checkpoints(s.output_dir, protect=(start_step,))
  os.makedirs(s.output_dir, exist_ok=True)
  if s.export_only:
    with checks.user_errors():
      if not start_step:
        raise ValueError(f"export_only: no checkpoint in {s.output_dir}")
      if not s.export_path:
        raise ValueError("export_only needs export_path")
      _export_run(s, params, start_step)
    return {"step": start_step}
  _drop_log_rows_past(s.output_dir, start_step)  # the steps after it run (and are logged) again

  step_config = steps.StepConfig(
    model=model, distill_weight=s.distill_weight, label_smoothing=s.label_smoothing
  )
  loop = _TrainLoop(
    settings=s,
    train_step=steps.make_train_step(step_config, optimizer, teacher),
    eval_step=steps.make_eval_step(model),
    teacher_params=teacher_params,
    val_sets=val_sets,
    buckets=buckets,
    train_subset=_train_subset(train_examples, len(val_sets["val"])),
  )
  # The stream is deterministic in (seed, epoch); on resume we skip to roughly the same place.
  stream = train_data.batch_stream(train_examples, buckets, s.seed)
  for _ in range(start_step):
    next(stream)  # cheap: numpy only
  params, metrics = loop.run(params, opt_state, stream, start_step)
  if s.export_path and loop.end_step(start_step) == s.num_steps:
    with checks.user_errors():  # an export refused (better weights there): one line, as at start
      _export_run(s, params, loop.end_step(start_step))
  return metrics


def _train_subset(examples: list, size: int) -> list:
  """`size` training examples evenly spaced over the (unshuffled) training set, so every train
  file is represented: evaluated beside validation to tell underfitting from overfitting (the
  progress bar's accuracy is one dropout batch of one length bucket)."""
  stride = max(1, len(examples) // max(size, 1))
  return examples[::stride][:size]


def _initial_params(s: settings_lib.TrainSettings, model: t5_lib.T5):
  """Random T5X initialisation, or `init_checkpoint`'s weights (float32, shapes checked) when
  `output_dir` holds no checkpoint yet (a run that has one resumes from it instead)."""
  if not s.starts_from_init_checkpoint:
    return model.init_params(jax.random.PRNGKey(s.seed))
  params = _load_float32_params(s.init_checkpoint, model)
  print(f"initialised from {s.init_checkpoint}")
  return params


def _load_float32_params(path: str, model: t5_lib.T5):
  """A T5X checkpoint directory or a `.msgpack` (e.g. a bf16 model exactly as it is served) as
  float32 device arrays, its shapes checked against `model` (the error names `path`)."""
  with checks.user_errors(checkpoints.LOAD_ERRORS):  # a file that fails to parse: one line
    params = checkpoints.load_params(path, dtype=np.float32)
    checkpoints.validate_params(params, model.param_shapes(), name=path)
  return jax.tree_util.tree_map(jnp.asarray, params)


def _load_examples(s: settings_lib.TrainSettings) -> tuple[list, dict[str, list]]:
  """Tokenized training pairs (each file with its input prefix; held-out overlap dropped, see
  `exclude_heldout`) and the validation sets: {"val": validation_tsv, "val_<name>": each of
  `extra_validation`}."""
  per_file = [
    (train_data.read_tsv(path), prefix) for path, prefix in zip(s.train_files, s.train_prefixes)
  ]
  if s.exclude_heldout:
    from speculative.data import overlap

    heldout = [p for path in s.exclude_heldout for p in train_data.read_tsv(path)]
    flat = [(pair, k) for k, (pairs, _) in enumerate(per_file) for pair in pairs]
    drop, report = overlap.find_overlap([pair for pair, _ in flat], heldout)
    per_file = [
      ([pair for (pair, k), dropped in zip(flat, drop) if k == j and not dropped], prefix)
      for j, (_, prefix) in enumerate(per_file)
    ]
    os.makedirs(s.output_dir, exist_ok=True)
    checkpoints.write_atomic(
      os.path.join(s.output_dir, "overlap.json"),
      json.dumps(dict(report, heldout_files=list(s.exclude_heldout))).encode(),
    )
    print(f"held-out overlap: {json.dumps(report)}")
  train_examples = [
    example
    for pairs, prefix in per_file
    for example in train_data.tokenize_pairs(pairs, s.spm_model, prefix)
  ]
  validation = {"val": (s.validation_tsv, train_data.INPUT_PREFIX)}
  validation.update({f"val_{name}": tuple(v) for name, v in (s.extra_validation or {}).items()})
  val_sets = {
    key: train_data.tokenize_pairs(
      train_data.read_tsv(path)[: s.max_validation_examples], s.spm_model, prefix
    )
    for key, (path, prefix) in validation.items()
  }
  return train_examples, val_sets


def _load_teacher(s: settings_lib.TrainSettings):
  """(teacher model, float32 params) for distillation, or (None, None)."""
  if s.distill_weight <= 0:
    return None, None
  teacher = t5_lib.T5(s.teacher_config)
  if not os.path.exists(s.teacher_checkpoint):
    raise FileNotFoundError(f"teacher checkpoint does not exist: {s.teacher_checkpoint}")
  return teacher, _load_float32_params(s.teacher_checkpoint, teacher)


@dataclasses.dataclass
class _TrainLoop:
  """The steps of one run: train steps with a running loss on the progress bar, evaluation (and the
  best-validation params) every `eval_every` steps, checkpoints every `checkpoint_every`."""

  settings: settings_lib.TrainSettings
  train_step: Any
  eval_step: Any
  teacher_params: Any
  val_sets: dict[str, list]  # {"val": ..., "val_<name>": ...}: metric prefix -> examples
  buckets: tuple[train_data.Bucket, ...]
  train_subset: list = dataclasses.field(default_factory=list)
  running: float | None = None  # running means (dropout on) of the sampled steps' loss, accuracy
  running_acc: float | None = None
  tokens: int = 0
  t_start: float = 0.0

  def end_step(self, start_step: int) -> int:
    s = self.settings
    if s.max_steps_this_run is None:
      return s.num_steps
    return min(s.num_steps, start_step + s.max_steps_this_run)

  def run(self, params, opt_state, stream, start_step: int):
    """Trains from `start_step` to the end step; returns (params, the last evaluation's metrics)."""
    from tqdm import tqdm

    s = self.settings
    end_step = self.end_step(start_step)
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    metrics: dict[str, float] = {}
    bar = tqdm(
      range(start_step, end_step),
      initial=start_step,
      total=s.num_steps,
      desc=os.path.basename(s.output_dir.rstrip("/")),
      mininterval=10,
    )
    self.t_start, self.tokens = time.time(), 0
    for step in bar:
      batch = next(stream)
      rng = jax.random.fold_in(jax.random.PRNGKey(s.seed + 1), step)
      params, opt_state, m = self.train_step(params, opt_state, batch, rng, self.teacher_params)
      self.tokens += int(
        np.count_nonzero(batch["encoder_input_tokens"])
        + np.count_nonzero(batch["decoder_target_tokens"])
      )  # real (non-pad) tokens
      if step % 20 == 0 or step == end_step - 1:
        self._show_loss(bar, step, m)
      done = step + 1
      if done % s.eval_every == 0 or done == end_step:
        metrics = self._evaluate(bar, params, done, n_params)
      if done % s.checkpoint_every == 0 or done == end_step:
        train_checkpoints.save_train_state(
          s.output_dir, done, params, opt_state, config=s.model_config
        )
    return params, metrics

  def _show_loss(self, bar, step: int, m) -> None:
    loss = float(m["loss"])
    if not np.isfinite(loss):
      raise FloatingPointError(f"loss is {loss} at step {step}")
    acc = float(m["accuracy"])
    self.running = loss if self.running is None else 0.9 * self.running + 0.1 * loss
    self.running_acc = acc if self.running_acc is None else 0.9 * self.running_acc + 0.1 * acc
    bar.set_postfix(
      loss=f"{self.running:.3f}",
      acc=f"{self.running_acc:.3f}",
      tok_s=f"{self.tokens / (time.time() - self.t_start):.0f}",
    )

  def _evaluate(self, bar, params, done: int, n_params: int) -> dict[str, float]:
    """Validation metrics, logged to train_log.jsonl; the params are kept as best.msgpack when
    their validation NLL is the lowest so far."""
    s = self.settings
    metrics = {}
    for prefix, examples in self.val_sets.items():
      metrics.update(steps.evaluate(self.eval_step, params, examples, self.buckets, prefix))
    if self.train_subset:  # the same training pairs every time, eval mode: under- vs overfitting
      metrics.update(
        steps.evaluate(self.eval_step, params, self.train_subset, self.buckets, "train")
      )
    metrics.update(
      step=done,
      train_loss=self.running,
      n_params=n_params,
      tokens_per_s=self.tokens / (time.time() - self.t_start),
    )
    with open(os.path.join(s.output_dir, "train_log.jsonl"), "a") as f:
      f.write(json.dumps(metrics) + "\n")
    bar.write(json.dumps(metrics))
    best_info = s.best_info_path
    best = json.load(open(best_info)) if os.path.exists(best_info) else None
    if best is None or metrics["val_nll"] < best["val_nll"]:
      checkpoints.save_params(
        jax.device_get(params), s.best_path, dtype="float32", config=s.model_config
      )
      checkpoints.write_atomic(best_info, json.dumps(metrics).encode())
    return metrics


def _export_run(s: settings_lib.TrainSettings, params, step: int) -> None:
  """Exports `params`, the weights of checkpoint `step` (or `best.msgpack` with `export_best`),
  with the evaluation train_log.jsonl records at `step` (the run's last evaluation)."""
  export_params(
    params,
    s.export_path,
    s.export_dtype,
    s.export_best,
    s.best_path,
    s.best_info_path,
    step,
    s.model_config,
    provenance=_provenance(s),
    replaces_better=s.export_replaces_better,
    metrics=_logged_evaluation(s.output_dir, step),
  )


def _read_log(output_dir: str) -> list[dict]:
  """The rows of `output_dir/train_log.jsonl` in file order ([] if none); a line that does not
  parse (cut short by a kill mid-write) is skipped."""
  path = os.path.join(output_dir, "train_log.jsonl")
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in filter(str.strip, f):
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        logging.warning("%s: skipped a line that does not parse: %r", path, line[:80])
  return rows


def _drop_log_rows_past(output_dir: str, step: int) -> None:
  """Rewrites train_log.jsonl (atomically) without its rows past `step`, the checkpoint a run
  resumes from: a run stopped after an evaluation but before its next checkpoint logged steps that
  the resumed run evaluates and logs again. A line cut short by a kill goes too."""
  path = os.path.join(output_dir, "train_log.jsonl")
  if not os.path.exists(path):
    return
  kept = "".join(json.dumps(row) + "\n" for row in _read_log(output_dir) if row["step"] <= step)
  with open(path) as f:
    if f.read() == kept:
      return
  checkpoints.write_atomic(path, kept.encode())


def _logged_evaluation(output_dir: str, step: int) -> dict | None:
  """The last evaluation train_log.jsonl records at `step`, or None (not evaluated there)."""
  rows = [row for row in _read_log(output_dir) if row.get("step") == step]
  return rows[-1] if rows else None


def _provenance(s: settings_lib.TrainSettings) -> dict:
  """What the exported weights' sidecar records about their training besides the metrics: seed,
  optimizer and schedule, data, and the training record of the weights the run started from (a
  continuation's lineage). Not the run directory: the same run gives the same sidecar wherever it
  ran (the kill soak compares an interrupted run's outputs byte for byte with another directory's)."""
  started_from = s.init_checkpoint or s.fork_checkpoint
  record = {
    "seed": s.seed,
    "optimizer": s.optimizer,
    "schedule": s.schedule,
    "learning_rate": s.learning_rate,
    "train_tsv": list(s.train_files),
    **({"input_prefixes": list(s.input_prefixes)} if s.input_prefixes is not None else {}),
    "started_from": started_from,
  }
  if started_from is not None and os.path.isfile(started_from):
    record["started_from_training"] = (checkpoints.read_metadata(started_from) or {}).get(
      "training"
    )
  return record


def export_params(
  params,
  export_path: str,
  export_dtype: str,
  export_best: bool,
  best_path: str,
  best_info_path: str,
  step: int,
  config: t5_lib.T5Config | None = None,
  provenance: dict | None = None,
  replaces_better: bool = False,
  metrics: dict | None = None,
) -> None:
  """Writes the shipped weights: the last parameters, or the best-validation ones. The sidecar's
  `training` entry records the step, the validation metrics of the exported weights (with
  `export_best` those of `best_info_path`, else the `val_*` entries of `metrics`, the evaluation of
  `params` at `step`, None when there was none) and `provenance`. Weights at `export_path` whose
  sidecar records a validation NLL are not replaced by weights with a higher one, or with none,
  unless `replaces_better` (checked before anything is written)."""
  if export_best:
    if not os.path.exists(best_path):
      raise FileNotFoundError(f"export_best: no {best_path} (no evaluation has run yet)")
    with open(best_info_path) as f:
      training = json.load(f)
    step = training["step"]
  else:  # only the deterministic entries: a resumed run's sidecar equals an uninterrupted one's
    training = {"step": step, **{k: v for k, v in (metrics or {}).items() if k.startswith("val_")}}
  _check_not_worse(export_path, training.get("val_nll"), step, replaces_better)
  if export_best:
    params = checkpoints.load_params(best_path, dtype=np.float32, config=config)
  training.update(provenance or {})
  n_params = sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))
  checkpoints.save_params(
    jax.device_get(params),
    export_path,
    dtype=export_dtype,
    config=config,
    extra={"training": training},
  )
  print(f"exported step {step} ({n_params / 1e6:.1f}M params) to {export_path} ({export_dtype})")


def _check_not_worse(
  export_path: str, val_nll: float | None, step: int, replaces_better: bool
) -> None:
  """Refuses to overwrite exported weights whose sidecar records a validation NLL lower than
  `val_nll`, or any validation NLL when `val_nll` is None (weights never evaluated, which cannot be
  shown to be better)."""
  if replaces_better or not os.path.exists(export_path):
    return
  shipped = ((checkpoints.read_metadata(export_path) or {}).get("training") or {}).get("val_nll")
  if shipped is None or (val_nll is not None and shipped >= val_nll):
    return
  if val_nll is None:
    why = f"; the weights to export (step {step}) were never evaluated"
  else:
    why = f", lower than the {val_nll:.4f} of the weights to export"
  raise ValueError(
    f"{export_path} records validation NLL {shipped:.4f}{why}; not replaced "
    "(train.export_replaces_better = True to replace it)"
  )


def main(argv: Sequence[str] | None = None) -> None:
  from speculative.jobs import gin_utils

  gin_utils.run_gin_main(
    train,
    "train",
    __doc__.splitlines()[0],
    argv,
    default_gin_files=("configs/train/small_target.gin",),  # the run file --help lists
  )


if __name__ == "__main__":
  main()
