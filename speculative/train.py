"""Trains a T5 (T5X parameter tree) on a parallel TSV corpus with optax; optional draft distillation.

Run (the embedded pair; see configs/train/ for the exact files and expected output):
  python -m speculative.train --gin_file=configs/train/embedded_target.gin
  python -m speculative.train --gin_file=configs/train/embedded_draft.gin

Prints a tqdm bar with the running loss, writes T5X-layout checkpoints to `output_dir/checkpoint_<step>/`
every `checkpoint_every` steps (with the optax state beside them, so an interrupted run resumes from
its last checkpoint), evaluates validation loss/accuracy, and at the end exports compact weights
(`export_path`, bfloat16 flax msgpack) for shipping. To ship the newest checkpoint of a run that
stopped early: add --gin_bindings="train.export_only = True".

Batching: examples are bucketed by length into a few fixed (inputs, targets) shapes, each with a
batch size chosen to keep tokens per batch roughly constant, so only a few shapes compile and little
compute goes to padding.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Iterator
from typing import Sequence

from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculative import checkpoints
from speculative import corpus
from speculative import tasks
from speculative.models import t5 as t5_lib

INPUT_PREFIX = tasks.TRANSLATE_EN_DE_PREFIX
EOS_ID = 1
PAD_ID = 0


# ----------------------------------------------------------------------------------------------
# Data.
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Bucket:
  """A fixed batch shape: examples whose inputs/targets fit go here."""

  inputs_length: int
  targets_length: int
  batch_size: int


# Bucket lengths (inputs and targets); batch sizes are set from `tokens_per_batch` in `train`.
DEFAULT_BUCKET_LENGTHS = (24, 48, 96, 192)


def read_tsv(path: str) -> list[tuple[str, str]]:
  """`source<TAB>target` pairs of a (gzipped) TSV file; ValueError when it holds none."""
  pairs = corpus.read_tsv_gz(path)
  if not pairs:
    raise ValueError(f"{path}: no examples")
  return pairs


def tokenize_pairs(
  pairs: Sequence[tuple[str, str]], spm_model: str, prefix: str = INPUT_PREFIX
) -> list[tuple[np.ndarray, np.ndarray]]:
  """Tokenizes with the SentencePiece model; appends EOS to both sides (T5 convention)."""
  import sentencepiece as spm

  sp = spm.SentencePieceProcessor(model_file=spm_model)
  sources = sp.encode([prefix + s for s, _ in pairs])
  targets = sp.encode([t for _, t in pairs])
  return [
    (np.array(s + [EOS_ID], np.int32), np.array(t + [EOS_ID], np.int32))
    for s, t in zip(sources, targets)
  ]


def assign_buckets(examples, buckets: Sequence[Bucket]) -> list[list[int]]:
  """Indices of the examples per bucket; examples longer than the largest bucket are truncated."""
  per_bucket: list[list[int]] = [[] for _ in buckets]
  for i, (src, tgt) in enumerate(examples):
    for b, bucket in enumerate(buckets):
      if len(src) <= bucket.inputs_length and len(tgt) <= bucket.targets_length:
        per_bucket[b].append(i)
        break
    else:
      per_bucket[-1].append(i)
  return per_bucket


def make_batch(examples, indices, bucket: Bucket) -> dict[str, np.ndarray]:
  """Pads (or truncates, keeping EOS last) a batch to the bucket's shape, T5X feature names."""
  n = bucket.batch_size
  enc = np.zeros((n, bucket.inputs_length), np.int32)
  tgt = np.zeros((n, bucket.targets_length), np.int32)
  for row, i in enumerate(indices):
    src, trg = examples[i]
    if len(src) > bucket.inputs_length:
      src = np.concatenate([src[: bucket.inputs_length - 1], [EOS_ID]])
    if len(trg) > bucket.targets_length:
      trg = np.concatenate([trg[: bucket.targets_length - 1], [EOS_ID]])
    enc[row, : len(src)] = src
    tgt[row, : len(trg)] = trg
  # Decoder inputs are the targets shifted right, starting with the decoder start token 0.
  dec_in = np.zeros_like(tgt)
  dec_in[:, 1:] = tgt[:, :-1]
  return {
    "encoder_input_tokens": enc,
    "decoder_input_tokens": dec_in,
    "decoder_target_tokens": tgt,
    "decoder_loss_weights": (tgt != PAD_ID).astype(np.float32),
  }


def batch_stream(
  examples, buckets: Sequence[Bucket], seed: int, epoch: int = 0
) -> Iterator[dict[str, np.ndarray]]:
  """Endless stream of shuffled bucketed batches; deterministic in (seed, epoch)."""
  per_bucket = assign_buckets(examples, buckets)
  while True:
    rng = np.random.default_rng([seed, epoch])
    batches = []
    for bucket, idx in zip(buckets, per_bucket):
      idx = np.array(idx)
      rng.shuffle(idx)
      for start in range(0, len(idx) - bucket.batch_size + 1, bucket.batch_size):
        batches.append((bucket, idx[start : start + bucket.batch_size]))
    order = rng.permutation(len(batches))
    for j in order:
      bucket, idx = batches[j]
      yield make_batch(examples, idx, bucket)
    epoch += 1


# ----------------------------------------------------------------------------------------------
# Loss and step.
# ----------------------------------------------------------------------------------------------


def cross_entropy_loss(
  logits, targets, weights, z_loss: float = 1e-4, soft_targets=None, label_smoothing: float = 0.0
):
  """Token-weighted cross entropy (+ T5X z-loss). `soft_targets` [B, T, V] replaces one-hot labels.

  `label_smoothing` (as T5X's `cross_entropy_with_logits` with `label_smoothing`): the one-hot label
  becomes (1 - ls) on the reference and ls / (V - 1) elsewhere, minus that distribution's entropy so
  a perfect fit is 0. Returns (loss, nll); nll is always the plain reference NLL (for reporting).
  """
  # logits: [batch, length, vocab] f32; targets, weights: [batch, length]
  assert logits.ndim == 3 and targets.shape == logits.shape[:2]
  log_z = jax.nn.logsumexp(logits, axis=-1)  # [batch, length]
  log_probs = logits - log_z[..., None]  # [batch, length, vocab]
  if soft_targets is None:
    nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]  # [batch, length]
    loss_tok = nll
    if label_smoothing > 0:
      vocab = logits.shape[-1]
      on, off = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
      entropy = -(on * np.log(on) + (vocab - 1) * off * np.log(off + 1e-20))
      loss_tok = on * nll - off * (jnp.sum(log_probs, axis=-1) + nll) - entropy
  else:
    nll = -jnp.sum(soft_targets * log_probs, axis=-1)
    loss_tok = nll
  token_loss = loss_tok + z_loss * jnp.square(log_z)
  denom = jnp.maximum(jnp.sum(weights), 1.0)
  return jnp.sum(token_loss * weights) / denom, jnp.sum(nll * weights) / denom


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """Static options of a train step."""

  model: t5_lib.T5
  z_loss: float = 1e-4
  distill_weight: float = 0.0
  distill_temperature: float = 1.0
  label_smoothing: float = 0.0


def make_train_step(config: StepConfig, optimizer: optax.GradientTransformation, teacher=None):
  """Returns a jitted (params, opt_state, batch, rng[, teacher_params]) -> (params, opt_state, metrics)."""

  def loss_fn(params, batch, rng, teacher_params):
    logits = config.model.forward(
      params, batch["encoder_input_tokens"], batch["decoder_input_tokens"], dropout_rng=rng
    )
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    loss, nll = cross_entropy_loss(
      logits, targets, weights, config.z_loss, label_smoothing=config.label_smoothing
    )
    if teacher is not None and config.distill_weight > 0:
      teacher_logits = teacher.forward(
        teacher_params, batch["encoder_input_tokens"], batch["decoder_input_tokens"]
      )
      soft = jax.nn.softmax(jax.lax.stop_gradient(teacher_logits) / config.distill_temperature)
      distill, _ = cross_entropy_loss(logits, targets, weights, 0.0, soft_targets=soft)
      loss = (1 - config.distill_weight) * loss + config.distill_weight * distill
    accuracy = jnp.sum((jnp.argmax(logits, -1) == targets) * weights) / jnp.maximum(
      jnp.sum(weights), 1.0
    )
    return loss, {"loss": loss, "nll": nll, "accuracy": accuracy}

  @jax.jit
  def train_step(params, opt_state, batch, rng, teacher_params=None):
    grads, metrics = jax.grad(loss_fn, has_aux=True)(params, batch, rng, teacher_params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    metrics["grad_norm"] = optax.global_norm(grads)
    return params, opt_state, metrics

  return train_step


def make_eval_step(model: t5_lib.T5):
  @jax.jit
  def eval_step(params, batch):
    logits = model.forward(params, batch["encoder_input_tokens"], batch["decoder_input_tokens"])
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    _, nll = cross_entropy_loss(logits, targets, weights, 0.0)
    correct = jnp.sum((jnp.argmax(logits, -1) == targets) * weights)
    return nll * jnp.sum(weights), correct, jnp.sum(weights)

  return eval_step


def evaluate(eval_step, params, examples, buckets) -> dict[str, float]:
  """Validation token NLL and accuracy over every example (each exactly once)."""
  per_bucket = assign_buckets(examples, buckets)
  nll_sum = correct = count = 0.0
  for bucket, idx in zip(buckets, per_bucket):
    for start in range(0, len(idx), bucket.batch_size):
      chunk = idx[start : start + bucket.batch_size]
      batch = make_batch(examples, chunk, bucket)  # padding rows have zero weight
      n, c, w = eval_step(params, batch)
      nll_sum, correct, count = nll_sum + float(n), correct + float(c), count + float(w)
  return {"val_nll": nll_sum / count, "val_accuracy": correct / count}


# ----------------------------------------------------------------------------------------------
# Checkpointing (T5X layout for params; optax state beside it for resuming).
# ----------------------------------------------------------------------------------------------


def _latest_step_list(output_dir: str) -> list[int]:
  """Steps of the complete checkpoints (params and optax state both written) in output_dir."""
  if not os.path.isdir(output_dir):
    return []
  return [
    int(n.split("_")[1])
    for n in os.listdir(output_dir)
    if n.startswith("checkpoint_")
    and n.split("_")[1].isdigit()
    and os.path.exists(os.path.join(output_dir, n, "optax_state.msgpack"))
  ]


def save_train_state(
  output_dir: str,
  step: int,
  params,
  opt_state,
  keep: int = 2,
  config: t5_lib.T5Config | None = None,
) -> str:
  """Writes checkpoint_<step> (T5X layout) with its optax state in one atomic step (temp dir +
  rename), recording `config` and the content sha256 (checked on resume); keeps the newest `keep`."""
  path = checkpoints.save_t5x_checkpoint(
    jax.device_get(params),
    output_dir,
    step,
    overwrite=True,
    config=config,
    extra_files={"optax_state.msgpack": serialization.to_bytes(jax.device_get(opt_state))},
  )
  prune_checkpoints(output_dir, keep)
  return path


def prune_checkpoints(output_dir: str, keep: int = 2, protect: Sequence[int] = ()) -> None:
  """Deletes all complete checkpoints but the newest `keep` (and the steps in `protect`). Each is
  first renamed to `checkpoint_<n>.old-*`, so a kill mid-delete leaves no partial checkpoint_<n>,
  only a temporary that `checkpoints.remove_stale_temporaries` deletes at the next start."""
  for old in sorted(_latest_step_list(output_dir))[:-keep]:
    if old in protect:
      continue
    trash = tempfile.mkdtemp(prefix=f"checkpoint_{old}.old-", dir=output_dir)
    os.rename(os.path.join(output_dir, f"checkpoint_{old}"), os.path.join(trash, "old"))
    shutil.rmtree(trash, ignore_errors=True)


def restore_train_state(
  output_dir: str,
  step: int,
  params_template,
  opt_state_template,
  config: t5_lib.T5Config | None = None,
):
  """Params and optax state of checkpoint_<step>; CheckpointError naming the file if unreadable,
  corrupt, saved with another config, or not matching this run's model or optimizer."""
  path = os.path.join(output_dir, f"checkpoint_{step}")
  params = checkpoints.load_t5x_checkpoint(path, config=config)
  checkpoints.validate_params(params, params_template, name=path)
  params = jax.tree_util.tree_map(lambda t, x: np.asarray(x, t.dtype), params_template, params)
  state_file = os.path.join(path, "optax_state.msgpack")
  try:
    with open(state_file, "rb") as f:
      opt_state = serialization.from_bytes(opt_state_template, f.read())
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise checkpoints.CheckpointError(
      f"{state_file}: optimizer state does not match this run's optimizer or is corrupt "
      f"({type(e).__name__}: {e})"
    ) from e
  return params, opt_state


def restore_latest(
  output_dir: str, params_template, opt_state_template, config: t5_lib.T5Config | None = None
):
  """(step, params, opt_state) of the newest readable checkpoint, falling back past unreadable
  ones with a warning; (0, templates) if there is none. Raises CheckpointError naming every file if
  checkpoints exist but none is readable (rather than silently starting over)."""
  errors = []
  for step in sorted(_latest_step_list(output_dir), reverse=True):
    try:
      params, opt_state = restore_train_state(
        output_dir, step, params_template, opt_state_template, config
      )
    except (checkpoints.CheckpointError, OSError, ValueError) as e:
      logging.warning(
        "cannot resume from %s/checkpoint_%d, trying the previous one: %s", output_dir, step, e
      )
      errors.append(f"checkpoint_{step}: {e}")
      continue
    return step, params, opt_state
  if errors:
    raise checkpoints.CheckpointError(
      f"no readable checkpoint in {output_dir}:\n  " + "\n  ".join(errors)
    )
  return 0, params_template, opt_state_template


# ----------------------------------------------------------------------------------------------
# The training run.
# ----------------------------------------------------------------------------------------------


SCHEDULES = ("cosine", "rsqrt")


def make_schedule(kind: str, learning_rate: float, warmup_steps: int, num_steps: int):
  """'cosine': warmup then cosine to 0.1x over num_steps. 'rsqrt': linear warmup to the peak, then
  peak * sqrt(warmup / step) (Vaswani et al.), independent of the run length, so a run can be
  extended and stopped at its best validation checkpoint."""
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=learning_rate,
      warmup_steps=min(warmup_steps, num_steps // 2),
      decay_steps=max(num_steps, 2),
      end_value=learning_rate * 0.1,
    )
  if kind == "rsqrt":
    warmup = max(warmup_steps, 1)

    def schedule(step):
      step = jnp.asarray(step, jnp.float32) + 1.0
      return learning_rate * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))

    return schedule
  raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")


def make_optimizer(
  learning_rate: float,
  warmup_steps: int,
  num_steps: int,
  weight_decay: float,
  clip_norm: float,
  schedule_kind: str = "cosine",
) -> optax.GradientTransformation:
  schedule = make_schedule(schedule_kind, learning_rate, warmup_steps, num_steps)
  return optax.chain(
    optax.clip_by_global_norm(clip_norm),
    optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay),
  )


def train(
  *,
  model_config: t5_lib.T5Config,
  train_tsv: str,
  validation_tsv: str,
  spm_model: str,
  output_dir: str,
  num_steps: int,
  learning_rate: float = 1e-3,
  warmup_steps: int = 500,
  weight_decay: float = 0.01,
  clip_norm: float = 1.0,
  tokens_per_batch: int = 3072,
  bucket_lengths: Sequence[int] = DEFAULT_BUCKET_LENGTHS,
  checkpoint_every: int = 500,
  eval_every: int = 1000,
  max_validation_examples: int = 500,
  seed: int = 0,
  teacher_config: t5_lib.T5Config | None = None,
  teacher_checkpoint: str | None = None,
  distill_weight: float = 0.0,
  export_path: str | None = None,
  export_dtype: str = "bfloat16",
  max_steps_this_run: int | None = None,
  export_only: bool = False,
  schedule: str = "cosine",
  label_smoothing: float = 0.0,
  exclude_heldout: Sequence[str] = (),
  export_best: bool = False,
) -> dict[str, float]:
  """Trains (or resumes) and returns the last metrics. See the module docstring.

  `export_only`: write `export_path` from the newest checkpoint in `output_dir` without training
  (to ship a model from a run that was stopped before `num_steps`).
  `exclude_heldout`: TSV files (validation, test) whose sentences must not reach training: training
  pairs that match one of their sides exactly or nearly (speculative/overlap.py) are dropped, and the
  counts are printed and written to `output_dir/overlap.json`.
  `export_best`: export the parameters with the lowest validation NLL seen (`output_dir/best.msgpack`,
  updated at every evaluation) instead of the last ones.
  """
  if num_steps < 1:
    raise ValueError(f"num_steps must be >= 1, got {num_steps}")
  if not 0.0 <= distill_weight <= 1.0:
    raise ValueError(f"distill_weight must be in [0, 1], got {distill_weight}")
  if distill_weight > 0 and (teacher_config is None or teacher_checkpoint is None):
    raise ValueError("distillation needs teacher_config and teacher_checkpoint")
  from tqdm import tqdm

  # Batch size per bucket keeps the padded tokens per batch near `tokens_per_batch`.
  if not bucket_lengths or list(bucket_lengths) != sorted(bucket_lengths):
    raise ValueError(f"bucket_lengths must be non-empty and ascending, got {bucket_lengths}")
  buckets = tuple(Bucket(n, n, max(1, tokens_per_batch // (2 * n))) for n in bucket_lengths)
  train_pairs = read_tsv(train_tsv)
  if exclude_heldout:
    from speculative import overlap

    heldout = [p for path in exclude_heldout for p in read_tsv(path)]
    drop, report = overlap.find_overlap(train_pairs, heldout)
    train_pairs = [p for p, d in zip(train_pairs, drop) if not d]
    os.makedirs(output_dir, exist_ok=True)
    checkpoints.write_atomic(
      os.path.join(output_dir, "overlap.json"),
      json.dumps(dict(report, heldout_files=list(exclude_heldout))).encode(),
    )
    print(f"held-out overlap: {json.dumps(report)}")
  train_examples = tokenize_pairs(train_pairs, spm_model)
  val_examples = tokenize_pairs(read_tsv(validation_tsv)[:max_validation_examples], spm_model)
  logging.info("train examples %d, buckets %s", len(train_examples), buckets)

  model = t5_lib.T5(model_config)
  optimizer = make_optimizer(
    learning_rate, warmup_steps, num_steps, weight_decay, clip_norm, schedule
  )
  params = model.init_params(jax.random.PRNGKey(seed))
  opt_state = optimizer.init(params)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))

  teacher = teacher_params = None
  if distill_weight > 0:
    teacher = t5_lib.T5(teacher_config)
    if not os.path.exists(teacher_checkpoint):
      raise FileNotFoundError(f"teacher checkpoint does not exist: {teacher_checkpoint}")
    # A T5X checkpoint dir or a shipped .msgpack (e.g. the bf16 target exactly as it is served).
    teacher_params = checkpoints.load_params(teacher_checkpoint, dtype=np.float32)
    checkpoints.validate_params(teacher_params, teacher.param_shapes(), name=teacher_checkpoint)
    teacher_params = jax.tree_util.tree_map(jnp.asarray, teacher_params)

  removed = checkpoints.remove_stale_temporaries(output_dir)  # left by a killed run
  if removed:
    logging.warning("removed temporaries of an interrupted run in %s: %s", output_dir, removed)
  start_step, params, opt_state = restore_latest(output_dir, params, opt_state, model_config)
  if start_step:
    print(f"resumed from {output_dir}/checkpoint_{start_step}")
    # A kill between writing a checkpoint and pruning the old ones left one too many.
    prune_checkpoints(output_dir, protect=(start_step,))
  os.makedirs(output_dir, exist_ok=True)

  best_path = os.path.join(output_dir, "best.msgpack")
  best_info_path = os.path.join(output_dir, "best.json")
  if export_only:
    if not start_step:
      raise ValueError(f"export_only: no checkpoint in {output_dir}")
    if not export_path:
      raise ValueError("export_only needs export_path")
    _export(
      params,
      export_path,
      export_dtype,
      export_best,
      best_path,
      best_info_path,
      start_step,
      model_config,
    )
    return {"step": start_step}

  step_config = StepConfig(
    model=model, distill_weight=distill_weight, label_smoothing=label_smoothing
  )
  train_step = make_train_step(step_config, optimizer, teacher)
  eval_step = make_eval_step(model)
  # The stream is deterministic in (seed, epoch); on resume we skip to roughly the same place.
  stream = batch_stream(train_examples, buckets, seed)
  for _ in range(start_step):
    next(stream)  # cheap: numpy only

  end_step = (
    num_steps if max_steps_this_run is None else min(num_steps, start_step + max_steps_this_run)
  )
  metrics: dict[str, float] = {}
  log_path = os.path.join(output_dir, "train_log.jsonl")
  bar = tqdm(
    range(start_step, end_step),
    initial=start_step,
    total=num_steps,
    desc=os.path.basename(output_dir.rstrip("/")),
    mininterval=10,
  )
  t_start, tokens = time.time(), 0
  running = None
  for step in bar:
    batch = next(stream)
    rng = jax.random.fold_in(jax.random.PRNGKey(seed + 1), step)
    params, opt_state, m = train_step(params, opt_state, batch, rng, teacher_params)
    tokens += int(
      np.count_nonzero(batch["encoder_input_tokens"])
      + np.count_nonzero(batch["decoder_target_tokens"])
    )  # real (non-pad) tokens
    if step % 20 == 0 or step == end_step - 1:
      loss = float(m["loss"])
      if not np.isfinite(loss):
        raise FloatingPointError(f"loss is {loss} at step {step}")
      running = loss if running is None else 0.9 * running + 0.1 * loss
      bar.set_postfix(
        loss=f"{running:.3f}",
        acc=f"{float(m['accuracy']):.3f}",
        tok_s=f"{tokens / (time.time() - t_start):.0f}",
      )
    done = step + 1
    if done % eval_every == 0 or done == end_step:
      metrics = evaluate(eval_step, params, val_examples, buckets)
      metrics.update(
        step=done,
        train_loss=running,
        n_params=n_params,
        tokens_per_s=tokens / (time.time() - t_start),
      )
      with open(log_path, "a") as f:
        f.write(json.dumps(metrics) + "\n")
      bar.write(json.dumps(metrics))
      best = json.load(open(best_info_path)) if os.path.exists(best_info_path) else None
      if best is None or metrics["val_nll"] < best["val_nll"]:
        checkpoints.save_params(
          jax.device_get(params), best_path, dtype="float32", config=model_config
        )
        checkpoints.write_atomic(best_info_path, json.dumps(metrics).encode())
    if done % checkpoint_every == 0 or done == end_step:
      save_train_state(output_dir, done, params, opt_state, config=model_config)

  if export_path and end_step == num_steps:
    _export(
      params,
      export_path,
      export_dtype,
      export_best,
      best_path,
      best_info_path,
      end_step,
      model_config,
    )
  return metrics


def _export(
  params,
  export_path: str,
  export_dtype: str,
  export_best: bool,
  best_path: str,
  best_info_path: str,
  step: int,
  config: t5_lib.T5Config | None = None,
) -> None:
  """Writes the shipped weights: the last parameters, or the best-validation ones."""
  if export_best:
    if not os.path.exists(best_path):
      raise FileNotFoundError(f"export_best: no {best_path} (no evaluation has run yet)")
    params = checkpoints.load_params(best_path, dtype=np.float32, config=config)
    with open(best_info_path) as f:
      step = json.load(f)["step"]
  n_params = sum(int(np.prod(np.shape(x))) for x in jax.tree_util.tree_leaves(params))
  checkpoints.save_params(jax.device_get(params), export_path, dtype=export_dtype, config=config)
  print(f"exported step {step} ({n_params / 1e6:.1f}M params) to {export_path} ({export_dtype})")


def main(argv: Sequence[str] | None = None) -> None:
  from speculative import gin_utils

  gin_utils.run_gin_main(train, "train", __doc__.splitlines()[0], argv, logging.INFO)


if __name__ == "__main__":
  main()
