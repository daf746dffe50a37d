"""Trains a T5 (T5X parameter tree) on a parallel TSV corpus with optax; optional draft distillation.

Run (the embedded pair; see configs/train/ for the exact files and expected output):
  python -m speculative.train --gin_file=configs/train/embedded_target.gin
  python -m speculative.train --gin_file=configs/train/embedded_draft.gin

Prints a tqdm bar with the running loss, writes T5X-layout checkpoints to `output_dir/checkpoint_<step>/`
every `checkpoint_every` steps (with the optax state beside them, so an interrupted run resumes from
its last checkpoint), evaluates validation loss/accuracy, and at the end exports compact weights
(`export_path`, bfloat16 flax msgpack) for shipping. To ship the newest checkpoint of a run that
stopped early: add --gin_bindings="train.export_only = True".

Batching (speculative/train_data.py): examples are bucketed by length into a few fixed (inputs,
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
import optax

from speculative import checkpoints
from speculative import jobs
from speculative.models import t5 as t5_lib
from speculative.train_checkpoints import check_origin
from speculative.train_checkpoints import copy_fork
from speculative.train_checkpoints import fork_step
from speculative.train_checkpoints import prune_checkpoints
from speculative.train_checkpoints import restore_latest
from speculative.train_checkpoints import restore_train_state  # noqa: F401  (re-exported)
from speculative.train_checkpoints import run_origin
from speculative.train_checkpoints import save_train_state
from speculative.train_checkpoints import write_origin
from speculative.train_data import DEFAULT_BUCKET_LENGTHS
from speculative.train_data import EOS_ID  # noqa: F401  (re-exported)
from speculative.train_data import INPUT_PREFIX  # noqa: F401  (re-exported)
from speculative.train_data import PAD_ID  # noqa: F401  (re-exported)
from speculative.train_data import Bucket
from speculative.train_data import assign_buckets
from speculative.train_data import batch_stream
from speculative.train_data import make_batch
from speculative.train_data import make_buckets
from speculative.train_data import read_tsv
from speculative.train_data import tokenize_pairs

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


ATTENTION_KINDS = ("encoder", "decoder_self", "cross")


def _attention_kind(name: str) -> str:
  """'encoder/layers_0/attention' -> 'encoder', '.../self_attention' -> 'decoder_self', else 'cross'."""
  if name.startswith("encoder/"):
    return "encoder"
  return "decoder_self" if name.endswith("/self_attention") else "cross"


def attention_entropy_sums(weights: dict, encoder_tokens, decoder_target_tokens) -> dict:
  """Per attention kind: (sum, count) of normalized entropies H(row) / log(n_keys) over every
  layer, head and real query row that can attend to more than one key. 1.0 is uniform attention,
  0.0 one-hot: T5 does not scale logits by 1/sqrt(head_dim), so optimizer steps that grow the query
  and key kernels saturate the softmax (its gradient vanishes) long before the loss says so.

  weights: from `T5.forward_with_attention`; encoder_tokens [B, S], decoder_target_tokens [B, T].
  """
  enc_real = encoder_tokens != PAD_ID  # [B, S]
  dec_real = decoder_target_tokens != PAD_ID  # [B, T]
  n_enc = jnp.sum(enc_real, axis=-1).astype(jnp.float32)  # [B]
  n_causal = jnp.arange(1, decoder_target_tokens.shape[1] + 1, dtype=jnp.float32)  # [T]
  sums = {kind: (jnp.zeros(()), jnp.zeros(())) for kind in ATTENTION_KINDS}
  for name, w in weights.items():  # w: [B, H, Tq, Tk]
    kind = _attention_kind(name)
    if kind == "encoder":
      n_keys, rows = n_enc[:, None], enc_real  # [B, 1], [B, S]
    elif kind == "cross":
      n_keys, rows = n_enc[:, None], dec_real  # [B, 1], [B, T]
    else:
      n_keys, rows = n_causal[None, :], dec_real  # [1, T], [B, T]
    w = w.astype(jnp.float32)
    entropy = -jnp.sum(w * jnp.log(jnp.maximum(w, 1e-30)), axis=-1)  # [B, H, Tq]
    valid = rows & (n_keys > 1)  # [B, Tq]
    normalized = entropy / jnp.log(jnp.maximum(n_keys, 2.0))[:, None, :]  # [B, H, Tq]
    total, count = sums[kind]
    sums[kind] = (
      total + jnp.sum(normalized * valid[:, None, :]),
      count + jnp.sum(valid) * w.shape[1],
    )
  return sums


def make_eval_step(model: t5_lib.T5):
  @jax.jit
  def eval_step(params, batch):
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    logits, attention = model.forward_with_attention(
      params, batch["encoder_input_tokens"], targets
    )  # [B, T, V], {name: [B, H, Tq, Tk]}
    _, nll = cross_entropy_loss(logits, targets, weights, 0.0)
    correct = jnp.sum((jnp.argmax(logits, -1) == targets) * weights)
    entropy = attention_entropy_sums(attention, batch["encoder_input_tokens"], targets)
    return nll * jnp.sum(weights), correct, jnp.sum(weights), entropy

  return eval_step


def evaluate(eval_step, params, examples, buckets, prefix: str = "val") -> dict[str, float]:
  """Token NLL and accuracy over every example (each exactly once), and the mean normalized
  attention entropy per kind (`attention_entropy_sums`), keys prefixed with `prefix`."""
  per_bucket = assign_buckets(examples, buckets)
  nll_sum = correct = count = 0.0
  entropy = {kind: [0.0, 0.0] for kind in ATTENTION_KINDS}
  for bucket, idx in zip(buckets, per_bucket):
    for start in range(0, len(idx), bucket.batch_size):
      chunk = idx[start : start + bucket.batch_size]
      batch = make_batch(examples, chunk, bucket)  # padding rows have zero weight
      n, c, w, e = eval_step(params, batch)
      nll_sum, correct, count = nll_sum + float(n), correct + float(c), count + float(w)
      for kind, (total, rows) in e.items():
        entropy[kind][0] += float(total)
        entropy[kind][1] += float(rows)
  metrics = {f"{prefix}_nll": nll_sum / count, f"{prefix}_accuracy": correct / count}
  for kind, (total, rows) in entropy.items():
    metrics[f"{prefix}_attention_entropy_{kind}"] = total / rows if rows else float("nan")
  return metrics


# ----------------------------------------------------------------------------------------------
# The training run.
# ----------------------------------------------------------------------------------------------


SCHEDULES = ("cosine", "rsqrt", "constant")
OPTIMIZERS = ("adamw", "adafactor")


def make_schedule(kind: str, learning_rate: float, warmup_steps: int, num_steps: int):
  """'cosine': warmup then cosine to 0.1x over num_steps. 'rsqrt': linear warmup to the peak, then
  peak * sqrt(warmup / step) (Vaswani et al.), independent of the run length, so a run can be
  extended and stopped at its best validation checkpoint. 'constant': linear warmup, then the peak
  (T5X's Adafactor schedule holds 1e-2 for its first 10k steps)."""
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
  if kind == "constant":
    warmup = max(warmup_steps, 1)
    return lambda step: (
      learning_rate * jnp.minimum((jnp.asarray(step, jnp.float32) + 1.0) / warmup, 1.0)
    )
  raise ValueError(f"schedule must be one of {SCHEDULES}, got {kind!r}")


def make_optimizer(
  learning_rate: float,
  warmup_steps: int,
  num_steps: int,
  weight_decay: float,
  clip_norm: float,
  schedule_kind: str = "cosine",
  kind: str = "adamw",
) -> optax.GradientTransformation:
  """'adamw' (b2 0.98, decoupled weight decay) or 'adafactor' (T5X's: factored second moments,
  updates scaled by each parameter's RMS, update clipping 1.0, decay rate 0.8, no momentum; weight
  decay as a fraction of the learning rate). Both after global gradient-norm clipping."""
  schedule = make_schedule(schedule_kind, learning_rate, warmup_steps, num_steps)
  if kind == "adamw":
    inner = optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay)
  elif kind == "adafactor":
    inner = optax.adafactor(
      schedule,
      min_dim_size_to_factor=128,
      decay_rate=0.8,
      multiply_by_parameter_scale=True,
      clipping_threshold=1.0,
      weight_decay_rate=weight_decay or None,
    )
  else:
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {kind!r}")
  return optax.chain(optax.clip_by_global_norm(clip_norm), inner)


def train(
  *,
  model_config: t5_lib.T5Config,
  train_tsv: str | Sequence[str],
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
  optimizer: str = "adamw",
  init_checkpoint: str | None = None,
  fork_checkpoint: str | None = None,
  export_replaces_better: bool = False,
) -> dict[str, float]:
  """Trains (or resumes) and returns the last metrics. See the module docstring.

  `train_tsv`: one TSV file or several (e.g. the help corpus and the UI catalogue corpus), read in
  the order given and trained on as one set.
  `export_only`: write `export_path` from the newest checkpoint in `output_dir` without training
  (to ship a model from a run that was stopped before `num_steps`).
  `exclude_heldout`: TSV files (validation, test) whose sentences must not reach training: training
  pairs that match one of their sides exactly or nearly (speculative/overlap.py) are dropped, and the
  counts are printed and written to `output_dir/overlap.json`.
  `export_best`: export the parameters with the lowest validation NLL seen (`output_dir/best.msgpack`,
  updated at every evaluation) instead of the last ones.
  `optimizer`: 'adamw' or 'adafactor' (`make_optimizer`).
  `init_checkpoint`: start from these weights (a T5X checkpoint directory or a `.msgpack`; shapes
  checked against `model_config`) with a fresh optimizer state, e.g. to continue another run with a
  different optimizer or schedule. Ignored once `output_dir` holds a checkpoint (resume wins).
  `fork_checkpoint`: continue another run from one of its checkpoints (`<run>/checkpoint_<step>`
  written by this trainer) with this run's settings (data, learning rate, dropout): weights,
  optimizer state and step count carry over. The checkpoint is copied into `output_dir`
  (atomically) when that holds none; a run that has one resumes from it instead.
  `export_replaces_better`: the export refuses to overwrite weights whose sidecar records a lower
  validation NLL than the ones being exported (e.g. a continuation's early best replacing the
  shipped model) unless this is True.
  """
  settings = TrainSettings(**locals())
  os.makedirs(settings.output_dir, exist_ok=True)
  with jobs.OutputLock(settings.output_dir):  # one writer per run directory
    return _run(settings)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """Every argument of `train` (same names and defaults), checked on construction."""

  model_config: t5_lib.T5Config
  train_tsv: str | Sequence[str]
  validation_tsv: str
  spm_model: str
  output_dir: str
  num_steps: int
  learning_rate: float = 1e-3
  warmup_steps: int = 500
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  tokens_per_batch: int = 3072
  bucket_lengths: Sequence[int] = DEFAULT_BUCKET_LENGTHS
  checkpoint_every: int = 500
  eval_every: int = 1000
  max_validation_examples: int = 500
  seed: int = 0
  teacher_config: t5_lib.T5Config | None = None
  teacher_checkpoint: str | None = None
  distill_weight: float = 0.0
  export_path: str | None = None
  export_dtype: str = "bfloat16"
  max_steps_this_run: int | None = None
  export_only: bool = False
  schedule: str = "cosine"
  label_smoothing: float = 0.0
  exclude_heldout: Sequence[str] = ()
  export_best: bool = False
  optimizer: str = "adamw"
  init_checkpoint: str | None = None
  fork_checkpoint: str | None = None
  export_replaces_better: bool = False

  def __post_init__(self):
    if not self.train_files:
      raise ValueError("train_tsv names no file")
    for path in (*self.train_files, self.validation_tsv, *self.exclude_heldout):
      if not os.path.isfile(path):
        raise FileNotFoundError(f"data file does not exist: {path}")
    if self.starts_from_init_checkpoint and not os.path.exists(self.init_checkpoint):
      raise FileNotFoundError(f"init_checkpoint does not exist: {self.init_checkpoint}")
    if self.init_checkpoint is not None and self.fork_checkpoint is not None:
      raise ValueError("set init_checkpoint or fork_checkpoint, not both")
    if self.starts_from_fork:
      fork_step(self.fork_checkpoint)  # names the problem before any compute
    if self.has_own_checkpoint:
      check_origin(self.output_dir, self.origin)
    if self.optimizer not in OPTIMIZERS:
      raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
    if self.num_steps < 1:
      raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
    if not 0.0 <= self.distill_weight <= 1.0:
      raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
    if self.distill_weight > 0 and (self.teacher_config is None or self.teacher_checkpoint is None):
      raise ValueError("distillation needs teacher_config and teacher_checkpoint")
    if not self.bucket_lengths or list(self.bucket_lengths) != sorted(self.bucket_lengths):
      raise ValueError(f"bucket_lengths must be non-empty and ascending, got {self.bucket_lengths}")

  @property
  def train_files(self) -> tuple[str, ...]:
    """`train_tsv` as a tuple of paths."""
    if isinstance(self.train_tsv, (str, os.PathLike)):
      return (os.fspath(self.train_tsv),)
    return tuple(os.fspath(path) for path in self.train_tsv)

  def buckets(self) -> tuple[Bucket, ...]:
    """Batch size per bucket keeps the padded tokens per batch near `tokens_per_batch`."""
    return make_buckets(self.bucket_lengths, self.tokens_per_batch)

  @property
  def has_own_checkpoint(self) -> bool:
    """`output_dir` holds a checkpoint to resume from."""
    return os.path.isdir(self.output_dir) and bool(checkpoints.checkpoint_steps(self.output_dir))

  @property
  def starts_from_init_checkpoint(self) -> bool:
    """`init_checkpoint` is set and `output_dir` holds no checkpoint to resume from."""
    return self.init_checkpoint is not None and not self.has_own_checkpoint

  @property
  def starts_from_fork(self) -> bool:
    """`fork_checkpoint` is set and `output_dir` holds no checkpoint to resume from."""
    return self.fork_checkpoint is not None and not self.has_own_checkpoint

  @property
  def origin(self) -> dict:
    """The start of this run (weights and seed), recorded in a new run directory and checked on
    resume."""
    return run_origin(self.init_checkpoint, self.fork_checkpoint, self.seed)

  @property
  def best_path(self) -> str:
    return os.path.join(self.output_dir, "best.msgpack")

  @property
  def best_info_path(self) -> str:
    return os.path.join(self.output_dir, "best.json")


def _run(s: TrainSettings) -> dict[str, float]:
  """`train` after its checks."""
  buckets = s.buckets()
  train_examples, val_examples = _load_examples(s)
  logging.info("train examples %d, buckets %s", len(train_examples), buckets)
  model = t5_lib.T5(s.model_config)
  optimizer = make_optimizer(
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
    write_origin(s.output_dir, s.origin)
  if removed:
    logging.warning("removed temporaries of an interrupted run in %s: %s", s.output_dir, removed)
  if s.starts_from_fork:
    copy_fork(s.fork_checkpoint, s.output_dir)
    print(f"forked from {s.fork_checkpoint}")
  start_step, params, opt_state = restore_latest(s.output_dir, params, opt_state, s.model_config)
  if start_step:
    print(f"resumed from {s.output_dir}/checkpoint_{start_step}")
    # A kill between writing a checkpoint and pruning the old ones left one too many.
    prune_checkpoints(s.output_dir, protect=(start_step,))
  os.makedirs(s.output_dir, exist_ok=True)
  if s.export_only:
    if not start_step:
      raise ValueError(f"export_only: no checkpoint in {s.output_dir}")
    if not s.export_path:
      raise ValueError("export_only needs export_path")
    _export_run(s, params, start_step)
    return {"step": start_step}

  step_config = StepConfig(
    model=model, distill_weight=s.distill_weight, label_smoothing=s.label_smoothing
  )
  loop = _TrainLoop(
    settings=s,
    train_step=make_train_step(step_config, optimizer, teacher),
    eval_step=make_eval_step(model),
    teacher_params=teacher_params,
    val_examples=val_examples,
    buckets=buckets,
    train_subset=_train_subset(train_examples, len(val_examples)),
  )
  # The stream is deterministic in (seed, epoch); on resume we skip to roughly the same place.
  stream = batch_stream(train_examples, buckets, s.seed)
  for _ in range(start_step):
    next(stream)  # cheap: numpy only
  params, metrics = loop.run(params, opt_state, stream, start_step)
  if s.export_path and loop.end_step(start_step) == s.num_steps:
    _export_run(s, params, loop.end_step(start_step))
  return metrics


def _train_subset(examples: list, size: int) -> list:
  """`size` training examples evenly spaced over the (unshuffled) training set, so every train
  file is represented: evaluated beside validation to tell underfitting from overfitting (the
  progress bar's accuracy is one dropout batch of one length bucket)."""
  stride = max(1, len(examples) // max(size, 1))
  return examples[::stride][:size]


def _initial_params(s: TrainSettings, model: t5_lib.T5):
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
  params = checkpoints.load_params(path, dtype=np.float32)
  checkpoints.validate_params(params, model.param_shapes(), name=path)
  return jax.tree_util.tree_map(jnp.asarray, params)


def _load_examples(s: TrainSettings) -> tuple[list, list]:
  """Tokenized training pairs (held-out overlap dropped, see `exclude_heldout`) and validation
  pairs."""
  train_pairs = [pair for path in s.train_files for pair in read_tsv(path)]
  if s.exclude_heldout:
    from speculative import overlap

    heldout = [p for path in s.exclude_heldout for p in read_tsv(path)]
    train_pairs, report = overlap.drop_overlap(train_pairs, heldout)
    os.makedirs(s.output_dir, exist_ok=True)
    checkpoints.write_atomic(
      os.path.join(s.output_dir, "overlap.json"),
      json.dumps(dict(report, heldout_files=list(s.exclude_heldout))).encode(),
    )
    print(f"held-out overlap: {json.dumps(report)}")
  train_examples = tokenize_pairs(train_pairs, s.spm_model)
  validation = read_tsv(s.validation_tsv)[: s.max_validation_examples]
  return train_examples, tokenize_pairs(validation, s.spm_model)


def _load_teacher(s: TrainSettings):
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

  settings: TrainSettings
  train_step: Any
  eval_step: Any
  teacher_params: Any
  val_examples: list
  buckets: tuple[Bucket, ...]
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
        save_train_state(s.output_dir, done, params, opt_state, config=s.model_config)
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
    metrics = evaluate(self.eval_step, params, self.val_examples, self.buckets)
    if self.train_subset:  # the same training pairs every time, eval mode: under- vs overfitting
      metrics.update(evaluate(self.eval_step, params, self.train_subset, self.buckets, "train"))
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


def _export_run(s: TrainSettings, params, step: int) -> None:
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
  )


def _provenance(s: TrainSettings) -> dict:
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
) -> None:
  """Writes the shipped weights: the last parameters, or the best-validation ones. The sidecar's
  `training` entry records the step, the validation metrics of the exported weights (when
  `export_best`) and `provenance`. Weights at `export_path` whose sidecar records a lower
  validation NLL are not replaced unless `replaces_better` (checked before anything is written)."""
  training = {"step": step}
  if export_best:
    if not os.path.exists(best_path):
      raise FileNotFoundError(f"export_best: no {best_path} (no evaluation has run yet)")
    with open(best_info_path) as f:
      training = json.load(f)
    step = training["step"]
  _check_not_worse(export_path, training.get("val_nll"), replaces_better)
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


def _check_not_worse(export_path: str, val_nll: float | None, replaces_better: bool) -> None:
  """Refuses to overwrite exported weights whose sidecar records a lower validation NLL."""
  if replaces_better or val_nll is None or not os.path.exists(export_path):
    return
  shipped = ((checkpoints.read_metadata(export_path) or {}).get("training") or {}).get("val_nll")
  if shipped is not None and shipped < val_nll:
    raise ValueError(
      f"{export_path} records validation NLL {shipped:.4f}, lower than the {val_nll:.4f} of the "
      "weights to export; not replaced (train.export_replaces_better = True to replace it)"
    )


def main(argv: Sequence[str] | None = None) -> None:
  from speculative import gin_utils

  gin_utils.run_gin_main(train, "train", __doc__.splitlines()[0], argv, logging.INFO)


if __name__ == "__main__":
  main()
