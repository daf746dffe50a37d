"""Standardized sampling and the vectorized speculative acceptance rule.

Three concerns live here, all pure array functions (no models):

1. **Standardized sampling** (Leviathan et al. 2023, Sec. 2.2). Argmax, temperature, top-k and top-p
   are all expressed as a transform `logits[..., V] -> probs[..., V]` that is applied identically to
   the draft and the target; speculative acceptance then works on the two probability vectors.
   The *strategy* (which filters exist) is a static, hashable `SamplingConfig`; the *values*
   (temperature, k, p) are arrays in `SamplingParams`, so a new temperature does not recompile.

2. **Speculative acceptance** (Alg. 1, vectorized over [batch, gamma]): accept draft token x_i while
   `r_i * q_i(x_i) <= p_i(x_i)`, then sample the correction from norm(max(0, p - q)) at the first
   rejected position, or the bonus token from p_{gamma+1} when everything was accepted.

3. **Lenience** (paper Appendix A.5; APPROXIMATE, changes the output when l < 1). A run-time value
   l in (0, 1]; l = 1 (the default) is the exact rule above, bit for bit.
   * Sampling form: accept x iff `r * l * q(x) <= p(x)`, correction from norm(max(0, p - l q)).
     A token is then emitted with probability
         P(x) = min(q(x), p(x)/l) + (1 - alpha_l) norm(max(0, p - l q))(x)  <=  p(x) / l,
     so no token is ever sampled with more than 1/l times its target probability (rare tokens stay
     rare; there is no lower bound, so diversity can drop). alpha_l = sum_x min(q(x), p(x)/l).
     Same rule and formulas as `analysis.lenient_alpha` / `analysis.lenient_output_distribution`.
   * Argmax form (the standardized p, q are one-hot there, so the sampling form is vacuous): accept
     the draft token x iff `p(x) >= l * max_y p(y)`, with p the target's own distribution
     softmax(logits) at temperature 1 before any filter; on rejection (and for the bonus) the
     target's argmax. Guarantee: every emitted token is at most 1/l times less likely than the
     target's argmax under the target model (l = 1: exactly greedy).

Conventions:
  * Probabilities are float32. A logits row that contains NaN or +inf, or is entirely -inf, has no
    distribution: its probs are NaN (never silently a valid-looking distribution), so the decode
    loops can flag it and the caller raises. `check_finite` raises eagerly for callers outside jit.
  * Sampling from a probability vector is Gumbel-max on log(probs): zero-probability tokens are
    never drawn and the vector need not be normalized (used for the residual).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

# --------------------------------------------------------------------------------------------------
# Standardized sampling.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Static sampling strategy (hashable; a jit static argument).

  Attributes:
    greedy: argmax (one-hot distribution); `SamplingParams` are ignored. A run-time temperature of 0
      also gives argmax, without recompiling.
    top_k: apply a top-k filter with the run-time value `SamplingParams.top_k` (0 = keep all).
    top_p: apply a nucleus filter with the run-time value `SamplingParams.top_p` (1 = keep all).
      With both filters, top-k is applied first and top-p on the renormalized top-k distribution.
  """

  greedy: bool = False
  top_k: bool = False
  top_p: bool = False

  def __post_init__(self):
    for name in ('greedy', 'top_k', 'top_p'):
      if not isinstance(getattr(self, name), (bool, np.bool_)):
        raise ValueError(
          f'SamplingConfig.{name} must be a bool (the run-time value goes in '
          f'SamplingParams), got {getattr(self, name)!r}'
        )
    if self.greedy and (self.top_k or self.top_p):
      raise ValueError('SamplingConfig(greedy=True) ignores top-k/top-p; set top_k=top_p=False')


def _is_concrete(x: Any) -> bool:
  return not isinstance(x, jax.core.Tracer)


@flax.struct.dataclass
class SamplingParams:
  """Run-time sampling values (arrays, so changing them does not recompile).

  Attributes:
    temperature: [] float32, >= 0. 0 means argmax.
    top_k: [] int32, >= 0. 0 means no top-k filter. Ties with the k-th logit are kept.
    top_p: [] float32 in (0, 1]. 1 means no nucleus filter. Ties with the last kept prob are kept.
  """

  temperature: jax.Array
  top_k: jax.Array
  top_p: jax.Array

  @classmethod
  def create(cls, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0) -> 'SamplingParams':
    """Validated constructor; always returns strongly typed f32/int32 scalars (stable jit cache)."""
    params = cls(
      temperature=jnp.asarray(temperature, jnp.float32),
      top_k=jnp.asarray(top_k, jnp.int32),
      top_p=jnp.asarray(top_p, jnp.float32),
    )
    params.validate()
    return params

  def validate(self) -> None:
    """Raises ValueError for out-of-range values (only checks concrete, non-traced values)."""
    for name in ('temperature', 'top_k', 'top_p'):
      if np.ndim(getattr(self, name)) != 0:
        raise ValueError(
          f'SamplingParams.{name} must be a scalar, got shape {np.shape(getattr(self, name))}'
        )
    if _is_concrete(self.temperature):
      t = float(self.temperature)
      if not np.isfinite(t) or t < 0:
        raise ValueError(f'temperature must be a finite number >= 0 (0 = argmax), got {t}')
    if _is_concrete(self.top_k):
      k = int(self.top_k)
      if k < 0:
        raise ValueError(f'top_k must be >= 0 (0 = disabled), got {k}')
    if _is_concrete(self.top_p):
      p = float(self.top_p)
      if not 0.0 < p <= 1.0:
        raise ValueError(f'top_p must be in (0, 1] (1 = disabled), got {p}')


def make_sampling(
  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> tuple[SamplingConfig, SamplingParams]:
  """Convenience: the minimal static strategy for these values, plus the run-time values.

  temperature 0 -> greedy; top_k > 0 enables top-k; top_p < 1 enables top-p. Use an explicit
  `SamplingConfig(top_k=True, top_p=True)` instead when sweeping values without recompiling.
  """
  params = SamplingParams.create(temperature, top_k, top_p)
  greedy = float(temperature) == 0.0
  config = SamplingConfig(
    greedy=greedy, top_k=not greedy and int(top_k) > 0, top_p=not greedy and float(top_p) < 1.0
  )
  return config, params


def _top_k_filter(scaled: jax.Array, k: jax.Array) -> jax.Array:
  """Sets entries below the k-th largest to -inf (dynamic k; k <= 0 keeps all)."""
  vocab = scaled.shape[-1]
  sorted_desc = -jnp.sort(-scaled, axis=-1)  # [..., V]
  kth_index = jnp.clip(k - 1, 0, vocab - 1)
  kth = sorted_desc[..., kth_index][..., None]  # [..., 1]
  keep = (scaled >= kth) | (k <= 0)
  return jnp.where(keep, scaled, -jnp.inf)


def _top_p_filter(scaled: jax.Array, top_p: jax.Array) -> jax.Array:
  """Keeps the smallest set of most likely tokens with mass >= top_p (top_p >= 1 keeps all)."""
  probs = jax.nn.softmax(scaled, axis=-1)  # [..., V]
  sorted_desc = -jnp.sort(-probs, axis=-1)
  mass_before = jnp.cumsum(sorted_desc, axis=-1) - sorted_desc  # exclusive cumulative mass
  # The most likely token is always kept (mass_before = 0 < top_p); the threshold is the smallest
  # kept probability, and every token at least that likely is kept (ties included).
  kept_sorted = mass_before < top_p
  threshold = jnp.min(jnp.where(kept_sorted, sorted_desc, jnp.inf), axis=-1, keepdims=True)
  keep = (probs >= threshold) | (top_p >= 1.0)
  return jnp.where(keep, scaled, -jnp.inf)


def invalid_logits(logits: jax.Array) -> jax.Array:
  """[..., V] -> [...] bool: the row has a NaN or +inf, or every entry is -inf."""
  has_nan = jnp.any(jnp.isnan(logits), axis=-1)
  row_max = jnp.max(logits, axis=-1)
  return has_nan | ~jnp.isfinite(row_max)


def check_finite(logits: jax.Array, what: str = 'logits') -> None:
  """Eager check (outside jit): raises ValueError naming the problem if any row is invalid."""
  bad = np.asarray(invalid_logits(jnp.asarray(logits)))
  if bad.any():
    where = np.argwhere(bad)[:5].tolist()
    raise ValueError(
      f'{what} contain NaN/+inf or an all -inf row at indices {where} '
      f'({int(bad.sum())} rows); the model produced no valid distribution'
    )


def argmax(x: jax.Array) -> jax.Array:
  """`jnp.argmax(x, axis=-1)` as int32 [...]: the same index (the first maximum, or the first NaN
  where a row has one), from two single-operand reductions over the last axis: the row's max, then
  the smallest index holding it.

  Why not `jnp.argmax`: it lowers to one variadic (value, index) reduce, which XLA's CPU backend
  runs element by element (33 us over an 8k vocabulary on a 2-core AVX-512 host, against 3 us for
  this form; 9 of them ran per speculative step of the shipped pair, docs/training.md). x: [..., V],
  V >= 1, any real dtype.
  """
  x = jnp.asarray(x)
  assert x.ndim >= 1 and x.shape[-1] >= 1, x.shape
  row_max = jnp.max(x, axis=-1, keepdims=True)  # [..., 1]; NaN where the row has a NaN
  hit = x == row_max  # [..., V]
  if jnp.issubdtype(x.dtype, jnp.inexact):
    hit = hit | jnp.isnan(x)  # jnp.argmax takes a NaN as the maximum
  index = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)  # [..., V]
  return jnp.min(jnp.where(hit, index, x.shape[-1]), axis=-1)  # [...]


def probs_from_logits(
  logits: jax.Array, config: SamplingConfig, params: SamplingParams
) -> jax.Array:
  """The standardized transform: logits [..., V] -> probabilities [..., V] (float32).

  Rows with invalid logits (see `invalid_logits`) become all-NaN so the caller can detect them.
  """
  logits = logits.astype(jnp.float32)
  vocab = logits.shape[-1]
  argmax_probs = jax.nn.one_hot(argmax(logits), vocab, dtype=jnp.float32)
  if config.greedy:
    probs = argmax_probs
  else:
    temperature = params.temperature
    safe_temperature = jnp.where(temperature > 0, temperature, 1.0)
    # Subtract the max first: dividing by a tiny temperature then cannot overflow to inf.
    row_max = jnp.max(logits, axis=-1, keepdims=True)
    scaled = (logits - jax.lax.stop_gradient(row_max)) / safe_temperature  # [..., V], max 0
    if config.top_k:
      scaled = _top_k_filter(scaled, params.top_k)
    if config.top_p:
      scaled = _top_p_filter(scaled, params.top_p)
    probs = jax.nn.softmax(scaled, axis=-1)
    probs = jnp.where(temperature > 0, probs, argmax_probs)
  return jnp.where(invalid_logits(logits)[..., None], jnp.nan, probs)


def sample_from_probs(key: jax.Array, probs: jax.Array) -> jax.Array:
  """Draws one token from an (unnormalized) probability vector [V] by Gumbel-max; int32 []."""
  gumbel = jax.random.gumbel(key, probs.shape, jnp.float32)
  return argmax(jnp.log(probs) + gumbel)


def sample_rows(keys: jax.Array, probs: jax.Array, greedy: bool = False) -> jax.Array:
  """One token per row: keys [B] (one PRNG key per row), probs [B, V] -> [B] int32.

  `greedy` (static) says every row of `probs` has a single positive entry (one-hot, as under
  `SamplingConfig(greedy=True)`, or a residual of one-hot p and q): Gumbel-max then returns that
  entry's index whatever the noise, so it is taken with an argmax and no noise is drawn (the same
  tokens, without B x V random numbers per call; T5X's temperature_sample also takes an argmax).
  """
  assert probs.ndim == 2 and keys.shape == probs.shape[:1], (keys.shape, probs.shape)
  if greedy:
    return argmax(probs)
  return jax.vmap(sample_from_probs)(keys, probs)


# --------------------------------------------------------------------------------------------------
# Speculative acceptance.
# --------------------------------------------------------------------------------------------------


def check_lenience(lenience: Any) -> None:
  """Raises ValueError unless lenience is a scalar in (0, 1] (only checks concrete values)."""
  if np.ndim(lenience) != 0:
    raise ValueError(f'lenience must be a scalar in (0, 1], got shape {np.shape(lenience)}')
  if _is_concrete(lenience):
    value = float(lenience)
    if not 0.0 < value <= 1.0:  # also rejects NaN
      raise ValueError(f'lenience must be in (0, 1] (1 = exact speculative decoding), got {value}')


def accept_test(
  uniforms: jax.Array,
  draft_prob: jax.Array,
  target_prob: jax.Array,
  lenience: jax.Array | float | None = None,
) -> jax.Array:
  """The acceptance rule, elementwise: accept x iff r * q(x) <= p(x) (and p(x) > 0).

  Equivalent to r < min(1, p(x)/q(x)) without a division. The `p(x) > 0` guard only matters for
  r == 0 or q(x) == 0, events of probability zero for a properly sampled draft: it makes sure a
  token the target rules out is never accepted.

  Lenience (the sampling form, APPROXIMATE for l < 1): accept iff r * (l * q(x)) <= p(x), i.e. with
  probability min(1, p(x) / (l q(x))). l = 1 (or None) is the exact rule, bit for bit.
  """
  if lenience is not None:
    draft_prob = lenience * draft_prob
  return (uniforms * draft_prob <= target_prob) & (target_prob > 0)


def lenient_argmax_accept(
  target_logits: jax.Array, draft_tokens: jax.Array, lenience: jax.Array | float
) -> jax.Array:
  """The argmax form of lenience: [B, gamma] bool, p(x_i) >= l * max_y p(y) and l < 1.

  Args:
    target_logits: [B, gamma, V] the target's logits at the drafted positions (raw: the rule uses
      the model's own distribution softmax(logits) at temperature 1, because under argmax decoding
      the standardized p is one-hot and no lenience could apply to it).
    draft_tokens: [B, gamma] int32.
    lenience: [] l in (0, 1]. At l = 1 this is all False, so the caller's exact argmax rule alone
      decides (no tie-breaking differences from comparing probabilities).

  Computed in log space without a softmax: log p(x) - log max p = logit(x) - max logit >= log l.
  A token with a -inf logit (p = 0) is never accepted.
  """
  assert target_logits.ndim == 3 and target_logits.shape[:2] == draft_tokens.shape, (
    target_logits.shape,
    draft_tokens.shape,
  )
  logits = target_logits.astype(jnp.float32)
  at_draft = jnp.take_along_axis(logits, draft_tokens[..., None].astype(jnp.int32), axis=-1)[
    ..., 0
  ]  # [B, gamma]
  gap = at_draft - jnp.max(logits, axis=-1)  # [B, gamma], <= 0
  lenience = jnp.asarray(lenience, jnp.float32)
  return (gap >= jnp.log(lenience)) & jnp.isfinite(at_draft) & (lenience < 1.0)


@flax.struct.dataclass
class AcceptResult:
  """Outcome of one vectorized acceptance step.

  Attributes:
    num_accepted: [B] int32, n in [0, gamma]: the accepted prefix length of the draft.
    next_token: [B] int32, the correction (sampled from the residual at position n) or, when no
      draft token remained to verify at position n, a sample from p at that position (the bonus).
    tokens: [B, gamma+1] int32, the emitted block: tokens[:, :n] are the accepted drafts,
      tokens[:, n] is next_token; entries after n are filler (the rejected drafts, then 0).
    min_mass: [B, gamma] float32, sum_x min(p_i(x), q_i(x)) at every drafted position (the
      per-position acceptance probability, Corollary 3.6); 0 at positions >= num_drafted.
  """

  num_accepted: jax.Array
  next_token: jax.Array
  tokens: jax.Array
  min_mass: jax.Array


def speculative_accept(
  draft_tokens: jax.Array,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  keys: jax.Array,
  num_drafted: jax.Array | None = None,
  *,
  lenience: jax.Array | float | None = None,
  lenient_accepts: jax.Array | None = None,
  greedy: bool = False,
) -> AcceptResult:
  """Speculative acceptance (Alg. 1) for a batch of rows.

  Args:
    draft_tokens: [B, gamma] int32, x_1..x_gamma.
    draft_probs: [B, gamma, V] float32, q_i (the distribution x_i was sampled from).
    target_probs: [B, gamma+1, V] float32, p_1..p_{gamma+1} (p_i conditions on x_1..x_{i-1}).
    keys: [B] PRNG keys, one per row (each used once: split into uniforms and the final sample).
    num_drafted: [B] int32 in [0, gamma], how many draft tokens each row really proposed (default
      gamma). Positions >= num_drafted count as "nothing to verify": the row emits a sample from p
      at position n = (accepted prefix) exactly as after gamma accepted drafts. Since p at position i
      only conditions on x_1..x_{i-1}, the filler draft tokens there cannot influence the result.
    lenience: [] l in (0, 1] or None (exact). APPROXIMATE for l < 1: the sampling form of the module
      docstring (accept iff r * l * q(x) <= p(x), correction from norm(max(0, p - l q))); then
      `min_mass` is the lenient acceptance probability sum_x min(q(x), p(x)/l). l = 1 gives the
      same result as None, bit for bit (in a different compiled program the
      alpha sums may round differently in the last bit).
    lenient_accepts: [B, gamma] bool or None: positions accepted regardless of r (the argmax form,
      `lenient_argmax_accept`); they count as acceptance probability 1 in `min_mass`.
    greedy: (static) p and q are one-hot (greedy sampling config): the correction's residual then
      has a single positive entry and is drawn by argmax (`sample_rows(greedy=True)`).

  Returns:
    AcceptResult. Exactness: tokens[:, :n+1] is distributed as n+1 tokens sampled from the target
    (for any q), and no NaN is produced for valid p, q (p == q, one-hot, disjoint supports, q(x)=0).
  """
  assert draft_tokens.ndim == 2, draft_tokens.shape
  batch, gamma = draft_tokens.shape
  vocab = target_probs.shape[-1]
  assert draft_probs.shape == (batch, gamma, vocab), (draft_probs.shape, draft_tokens.shape)
  assert target_probs.shape == (batch, gamma + 1, vocab), (target_probs.shape, draft_tokens.shape)
  assert keys.shape == (batch,), keys.shape
  if num_drafted is None:
    num_drafted = jnp.full((batch,), gamma, jnp.int32)
  positions = jnp.arange(gamma, dtype=jnp.int32)
  drafted = positions[None, :] < num_drafted[:, None]  # [B, gamma]
  # Undrafted positions have no draft distribution: q = 0 there, so the residual is p itself.
  draft_probs = jnp.where(drafted[..., None], draft_probs.astype(jnp.float32), 0.0)
  target_probs = target_probs.astype(jnp.float32)

  sample_keys = jax.vmap(lambda k: jax.random.fold_in(k, 1))(keys)
  if greedy:
    # p is one-hot, so p(x) is 0 or 1 and the test r q(x) <= p(x), p(x) > 0 gives p(x) > 0 for
    # every r in [0, 1] (q(x) <= 1): no uniforms are drawn (the same tokens, without the RNG work
    # in every step; sample_rows skips the correction's noise the same way).
    uniforms = jnp.zeros((batch, gamma), jnp.float32)
  else:
    uniform_keys = jax.vmap(lambda k: jax.random.fold_in(k, 0))(keys)
    uniforms = jax.vmap(lambda k: jax.random.uniform(k, (gamma,), jnp.float32))(uniform_keys)
  accepted = _accepted(draft_tokens, draft_probs, target_probs, uniforms, lenience)  # [B, gamma]
  if lenient_accepts is not None:
    assert lenient_accepts.shape == (batch, gamma), lenient_accepts.shape
    accepted = accepted | lenient_accepts
  accepted = accepted & drafted
  # n = length of the all-accepted prefix (everything after the first rejection is discarded).
  num_accepted = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32), axis=1), axis=1)  # [B]

  next_token = _correction(
    draft_probs, target_probs, num_accepted, sample_keys, lenience, greedy
  )  # [B]
  block = emitted_block(draft_tokens.astype(jnp.int32), num_accepted, next_token)  # [B, gamma+1]
  if lenience is None:
    min_mass = jnp.sum(jnp.minimum(target_probs[:, :gamma], draft_probs), axis=-1)  # [B, gamma]
  else:
    # sum_x min(q, p/l): equal to sum_x min(p, q) (same float ops) at l = 1.
    min_mass = jnp.sum(jnp.minimum(target_probs[:, :gamma] / lenience, draft_probs), axis=-1)
  if lenient_accepts is not None:
    min_mass = jnp.where(lenient_accepts & drafted, 1.0, min_mass)
  return AcceptResult(
    num_accepted=num_accepted.astype(jnp.int32),
    next_token=next_token,
    tokens=block,
    min_mass=min_mass,
  )


def _accepted(
  draft_tokens: jax.Array,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  uniforms: jax.Array,
  lenience: jax.Array | float | None,
) -> jax.Array:
  """[B, gamma] bool: the acceptance test r_i q_i(x_i) <= p_i(x_i) at every draft position."""
  gamma = draft_tokens.shape[1]
  index = draft_tokens[..., None].astype(jnp.int32)  # [B, gamma, 1]
  target_at_draft = jnp.take_along_axis(target_probs[:, :gamma], index, axis=-1)[..., 0]
  draft_at_draft = jnp.take_along_axis(draft_probs, index, axis=-1)[..., 0]  # [B, gamma]
  return accept_test(uniforms, draft_at_draft, target_at_draft, lenience)


def _correction(
  draft_probs: jax.Array,
  target_probs: jax.Array,
  num_accepted: jax.Array,
  sample_keys: jax.Array,
  lenience: jax.Array | float | None,
  greedy: bool = False,
) -> jax.Array:
  """[B] the token after the n accepted drafts: a sample of norm(max(0, p_n - q_n)) (of
  norm(max(0, p_n - l q_n)) under lenience), or of p_{gamma+1} when n = gamma.

  draft_probs: [B, gamma, V] (0 at undrafted positions); target_probs: [B, gamma+1, V].
  """
  batch, _, vocab = draft_probs.shape
  draft_padded = jnp.concatenate([draft_probs, jnp.zeros((batch, 1, vocab), jnp.float32)], axis=1)
  at_n = num_accepted[:, None, None]
  target_n = jnp.take_along_axis(target_probs, at_n, axis=1)[:, 0]  # [B, V]
  draft_n = jnp.take_along_axis(draft_padded, at_n, axis=1)[:, 0]  # [B, V]
  if lenience is not None:
    draft_n = lenience * draft_n  # the lenient correction norm(max(0, p - l q))
  residual = jnp.maximum(target_n - draft_n, 0.0)  # [B, V], unnormalized
  # residual == 0 everywhere iff p == q at n, where a rejection has probability 0; fall back to p
  # so the (unused) sample is well defined instead of NaN.
  residual_mass = jnp.sum(residual, axis=-1, keepdims=True)
  next_dist = jnp.where(residual_mass > 0, residual, target_n)
  return sample_rows(sample_keys, next_dist, greedy)  # [B]


def emitted_block(draft_tokens: jax.Array, num_accepted: jax.Array, next_token: jax.Array):
  """The block a step emits, [B, L+1] int32: draft_tokens [B, L] with next_token [B] written at
  position num_accepted [B] (entries after it are filler: the rejected drafts, then 0)."""
  batch, length = draft_tokens.shape
  block = jnp.concatenate([draft_tokens, jnp.zeros((batch, 1), jnp.int32)], axis=1)  # [B, L+1]
  return jnp.where(
    jnp.arange(length + 1)[None, :] == num_accepted[:, None], next_token[:, None], block
  )
