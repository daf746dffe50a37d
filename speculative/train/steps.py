"""The training step and evaluation: the loss (with optional distillation from a teacher), the
jitted train and eval steps, attention entropies, and the learning-rate schedules and optimizers."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax

from speculative.data import tasks
from speculative.models import t5 as t5_lib
from speculative.train import data as train_data

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
  enc_real = encoder_tokens != tasks.PAD_ID  # [B, S]
  dec_real = decoder_target_tokens != tasks.PAD_ID  # [B, T]
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
  per_bucket = train_data.assign_buckets(examples, buckets)
  nll_sum = correct = count = 0.0
  entropy = {kind: [0.0, 0.0] for kind in ATTENTION_KINDS}
  for bucket, idx in zip(buckets, per_bucket):
    for start in range(0, len(idx), bucket.batch_size):
      chunk = idx[start : start + bucket.batch_size]
      batch = train_data.make_batch(examples, chunk, bucket)  # padding rows have zero weight
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
  """'cosine': linear warmup (over at most half the run), then cosine to 0.1x at the last of
  num_steps. 'rsqrt': linear warmup to the peak, then peak * sqrt(warmup / step) (Vaswani et al.),
  independent of the run length, so a run can be extended and stopped at its best validation
  checkpoint. 'constant': linear warmup, then the peak (T5X's Adafactor schedule holds 1e-2 for its
  first 10k steps). Each warmup gives step 0 (the optimizer's first update) peak / warmup steps and
  the peak at the warmup's last step: a rate of 0 would spend a step's compute, and move the
  optimizer's statistics, for an update of 0."""
  if kind == "cosine":
    cosine = optax.warmup_cosine_decay_schedule(
      init_value=0.0,
      peak_value=learning_rate,
      warmup_steps=min(warmup_steps, num_steps // 2),
      decay_steps=max(num_steps, 2),
      end_value=learning_rate * 0.1,
    )
    return lambda step: cosine(step + 1)  # optax's is 0 at step 0
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


def adafactor(learning_rate, weight_decay: float = 0.0) -> optax.GradientTransformation:
  """T5X's Adafactor: factored second moments, updates scaled by each parameter's RMS, update
  clipping 1.0, decay rate 0.8, no momentum; weight decay of `weight_decay` x the parameter per
  step, added after the learning rate's scaling (optax's `weight_decay_rate`: not scaled by it).
  `learning_rate` is a float or a schedule; wrapped in `optax.inject_hyperparams` it becomes a
  run-time value of the optimizer state (`speculative.train.pair` sets it from the wall clock)."""
  return optax.adafactor(
    learning_rate,
    min_dim_size_to_factor=128,
    decay_rate=0.8,
    multiply_by_parameter_scale=True,
    clipping_threshold=1.0,
    weight_decay_rate=weight_decay or None,
  )


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
  decay not scaled by the learning rate). Both after global gradient-norm clipping."""
  schedule = make_schedule(schedule_kind, learning_rate, warmup_steps, num_steps)
  if kind == "adamw":
    inner = optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay)
  elif kind == "adafactor":
    inner = adafactor(schedule, weight_decay)
  else:
    raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {kind!r}")
  return optax.chain(optax.clip_by_global_norm(clip_norm), inner)
