"""SpecTr token-level draft selection (Sun et al., NeurIPS 2023, "SpecTr: Fast Speculative Decoding
via Optimal Transport"): K-draft sequential selection (k-Seq) with the optimal rho*.

Notation as everywhere in this project (Leviathan et al., sampling.py): `p` is the TARGET
distribution and `q` the DRAFT. (The SpecTr paper uses the opposite letters.) Functions take the
draft before the target, as `sampling.speculative_accept` does: `beta(rho, q, p)`.

The problem (optimal transport with membership cost, OTM-k): given K i.i.d. draft tokens
X_1..X_K ~ q, output one token Y whose distribution is exactly p, maximizing the acceptance
probability P(Y in {X_1, .., X_K}).

k-Seq (the paper's Algorithm 2 / its token-level selection) with a parameter rho >= 1:
  for i = 1..K: accept X_i with probability min(1, p(X_i) / (rho q(X_i)));
  the first accepted X_i is the output; if none is accepted, Y ~ q_res.

Derivation of the residual (why the output is exactly p). Let
    beta(rho) = sum_x min(q(x), p(x)/rho)          (probability that one draft is accepted).
Draft i is the first accepted and equals x with probability (1 - beta)^(i-1) min(q(x), p(x)/rho), so
    P(accepted, Y = x) = min(q(x), p(x)/rho) * g(beta),   g(beta) = sum_{j=0}^{K-1} (1 - beta)^j
                                                                   = (1 - (1 - beta)^K) / beta,
    P(accepted)        = beta g(beta) = 1 - (1 - beta)^K,
and the residual that makes P(Y = x) = p(x) is
    q_res(x) = [p(x) - min(q(x), p(x)/rho) g(beta)] / (1 - beta)^K.
It is a distribution iff every numerator is >= 0. For x with rho q(x) >= p(x) the numerator is
p(x) (1 - g(beta)/rho); for rho q(x) < p(x) it is p(x) - q(x) g(beta) > p(x) (1 - g(beta)/rho).
So q_res is valid iff  beta(rho) = 0  or  rho >= g(beta(rho)), i.e. iff
    f(rho) = rho beta(rho) - (1 - (1 - beta(rho))^K) >= 0.
rho beta(rho) = sum_x min(rho q(x), p(x)) is non-decreasing in rho and beta(rho) is non-increasing,
so f is non-decreasing; f(1) = beta(1) - 1 + (1 - beta(1))^K <= 0 and f(K) >= 0 (Bernoulli:
(1 - beta)^K >= 1 - K beta). The acceptance 1 - (1 - beta(rho))^K is non-increasing in rho, so the
best valid rho is the smallest root
    rho* = min{rho in [1, K] : f(rho) >= 0},
found by bisection (`rho_star`). At rho* the acceptance equals sum_x min(rho* q(x), p(x)) >=
sum_x min(q(x), p(x)), the single-draft (Leviathan) acceptance. K = 1 gives g = 1, rho* = 1, and
k-Seq is exactly Leviathan's rule. (Derived here from the algorithm's definition; it agrees with
the paper's residual, its Eq. for q_res, and is checked analytically and by sampling in
tests/spectr/test_spectr.py.)

Numerics: g(beta) is evaluated as the polynomial sum_{j<K} (1 - beta)^j (no division by beta, exact
as beta -> 0 where g -> K); the acceptance test is the division-free  u rho q(X_i) <= p(X_i); the
residual numerator is clamped at 0 and normalized by its own sum, and falls back to p when that
sum is 0 (then a rejection has probability 0 up to rounding, e.g. q == p). No NaNs for one-hot,
disjoint or identical q and p.

The sequence-level selection (Algorithm 3) is spectr/sequence.py; the exact OTM-k optimum of tiny
problems (ground truth for tests) spectr/otm.py.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_BISECTION_ITERS = 40


def as_distributions(q: jax.Array, p: jax.Array) -> tuple[jax.Array, jax.Array]:
  """float32 [..., V] draft and target distributions with matching shapes (ValueError if not)."""
  q = jnp.asarray(q, jnp.float32)
  p = jnp.asarray(p, jnp.float32)
  if q.shape != p.shape:
    raise ValueError(
      f"draft q and target p must have the same shape [..., vocab]; got {q.shape} "
      f"and {p.shape} (mismatched vocabularies?)"
    )
  if q.ndim < 1 or q.shape[-1] < 1:
    raise ValueError(f"q and p need a vocabulary axis; got shape {q.shape}")
  return q, p


def check_num_drafts(k: int) -> int:
  if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or int(k) < 1:
    raise ValueError(f"the number of drafts K must be a Python int >= 1; got {k!r}")
  return int(k)


def beta(rho: jax.Array, q: jax.Array, p: jax.Array) -> jax.Array:
  """beta_{q,p}(rho) = sum_x min(q(x), p(x) / rho): the acceptance probability of one draft.

  Args:
    rho: [...] float32, >= 1 (broadcasts against the batch axes of q).
    q: [..., V] draft distribution.
    p: [..., V] target distribution.

  Returns:
    [...] float32 in [0, 1] (clipped: rounding can push the sum a hair above 1).
  """
  q, p = as_distributions(q, p)
  rho = jnp.asarray(rho, jnp.float32)
  value = jnp.sum(jnp.minimum(q, p / rho[..., None]), axis=-1)  # [...]
  return jnp.clip(value, 0.0, 1.0)


def geometric_sum(beta_value: jax.Array, k: int) -> jax.Array:
  """g(beta) = sum_{j=0}^{k-1} (1 - beta)^j = (1 - (1 - beta)^k) / beta, without the division."""
  one_minus = 1.0 - jnp.clip(beta_value, 0.0, 1.0)  # [...]
  powers = one_minus[..., None] ** jnp.arange(k, dtype=jnp.float32)  # [..., k]
  return jnp.sum(powers, axis=-1)


def acceptance_probability(rho: jax.Array, q: jax.Array, p: jax.Array, k: int) -> jax.Array:
  """P(some draft is accepted) under k-Seq with parameter rho: 1 - (1 - beta(rho))^k, as
  beta g(beta). [...] float32."""
  k = check_num_drafts(k)
  b = beta(rho, q, p)
  return b * geometric_sum(b, k)


def _is_valid_rho(rho: jax.Array, q: jax.Array, p: jax.Array, k: int) -> jax.Array:
  """f(rho) >= 0, i.e. beta(rho) == 0 or rho >= g(beta(rho)) (residual non-negative). [...] bool."""
  b = beta(rho, q, p)
  return (b <= 0.0) | (rho >= geometric_sum(b, k))


def rho_star(
  q: jax.Array, p: jax.Array, k: int, num_iters: int = DEFAULT_BISECTION_ITERS
) -> jax.Array:
  """Optimal k-Seq parameter: the smallest rho in [1, k] with 1 - (1-beta(rho))^k <= rho beta(rho).

  f(rho) = rho beta(rho) - (1 - (1 - beta(rho))^k) is non-decreasing with f(1) <= 0 <= f(k) (module
  docstring), so bisection keeps `hi` valid (f(hi) >= 0, checked in float32 as rho >= g(beta)) and
  `lo` invalid; after `num_iters` halvings hi - rho* <= (k - 1) / 2^num_iters and `hi` is returned,
  so the result always yields a non-negative residual. Edge cases: rho* = 1 exactly when rho = 1 is
  already valid, which covers k = 1, q == p (beta(1) = 1) and disjoint supports (beta == 0, where
  any rho is valid and the acceptance is 0). jit-able; fixed iteration count.

  Args:
    q: [..., V] draft distribution.
    p: [..., V] target distribution.
    k: number of i.i.d. drafts (static Python int >= 1).
    num_iters: bisection steps (static).

  Returns:
    [...] float32 in [1, k].
  """
  k = check_num_drafts(k)
  q, p = as_distributions(q, p)
  batch_shape = q.shape[:-1]
  one = jnp.ones(batch_shape, jnp.float32)
  if k == 1:
    return one
  return bisect_smallest_valid(
    lambda rho: _is_valid_rho(rho, q, p, k), one, jnp.full(batch_shape, float(k)), num_iters
  )


def bisect_smallest_valid(
  is_valid: Callable[[jax.Array], jax.Array], one: jax.Array, upper: jax.Array, num_iters: int
) -> jax.Array:
  """The smallest valid rho in [1, upper] by bisection, for a predicate that is monotone in rho.

  `hi` stays valid and `lo` invalid; after `num_iters` halvings `hi` is within (upper - 1) /
  2^num_iters of the root and is returned (1 exactly where rho = 1 is already valid). [...] float32.
  """

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    ok = is_valid(mid)
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

  _, hi = jax.lax.fori_loop(0, int(num_iters), body, (one, upper))
  return jnp.where(is_valid(one), one, hi)


def k_sequential_residual(q: jax.Array, p: jax.Array, k: int, rho: jax.Array) -> jax.Array:
  """The residual q_res that is sampled when no draft is accepted (module docstring).

  q_res ∝ max(0, p - min(q, p/rho) g(beta(rho))), normalized by its own sum; p itself when that
  sum is 0 (a rejection then has probability 0, e.g. q == p). [..., V] float32.
  """
  k = check_num_drafts(k)
  q, p = as_distributions(q, p)
  rho = jnp.asarray(rho, jnp.float32)
  g = geometric_sum(beta(rho, q, p), k)  # [...]
  numerator = jnp.maximum(p - jnp.minimum(q, p / rho[..., None]) * g[..., None], 0.0)  # [..., V]
  total = jnp.sum(numerator, axis=-1, keepdims=True)  # [..., 1]
  safe_total = jnp.where(total > 0.0, total, 1.0)
  return jnp.where(total > 0.0, numerator / safe_total, p)


def k_sequential_output_distribution(
  q: jax.Array, p: jax.Array, k: int, rho: jax.Array | None = None
) -> jax.Array:
  """The exact distribution of k-Seq's output, computed analytically (should equal p).

  P(Y = x) = min(q(x), p(x)/rho) g(beta) + (1 - beta)^k q_res(x). [..., V] float32. For tests and
  diagnostics; with rho = None uses rho*.
  """
  k = check_num_drafts(k)
  q, p = as_distributions(q, p)
  rho = rho_star(q, p, k) if rho is None else jnp.asarray(rho, jnp.float32)
  b = beta(rho, q, p)  # [...]
  accepted = jnp.minimum(q, p / rho[..., None]) * geometric_sum(b, k)[..., None]  # [..., V]
  rejected = (1.0 - b) ** k  # [...]
  return accepted + rejected[..., None] * k_sequential_residual(q, p, k, rho)


def sample_from_probabilities(probs: jax.Array, uniform: jax.Array) -> jax.Array:
  """Inverse-CDF sample: the first index whose cumulative probability exceeds uniform * total.

  Args:
    probs: [..., V] non-negative weights (need not sum exactly to 1; total must be > 0).
    uniform: [...] in [0, 1).

  Returns:
    [...] int32. Zero-weight entries are never returned (for uniform < 1).
  """
  cdf = jnp.cumsum(probs, axis=-1)  # [..., V]
  threshold = jnp.asarray(uniform, probs.dtype) * cdf[..., -1]  # [...]
  index = jnp.sum(cdf <= threshold[..., None], axis=-1)  # [...]
  return jnp.minimum(index, probs.shape[-1] - 1).astype(jnp.int32)


def k_sequential_select(
  q: jax.Array,
  p: jax.Array,
  draft_tokens: jax.Array,
  accept_uniforms: jax.Array,
  residual_uniform: jax.Array,
  rho: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """k-Seq: accept the first draft i with u_i rho q(X_i) <= p(X_i), else sample the residual.

  The draft tokens must be K i.i.d. samples from q for the output to be distributed as p.
  Acceptance is tested without division (u_i * rho * q(X_i) <= p(X_i)) and additionally requires
  p(X_i) > 0, so a token the target rules out is never emitted even for u_i == 0 (this differs
  from `u q <= p` only at u == 0). jit-able; K is static (from the shape of draft_tokens).

  Args:
    q: [..., V] draft distribution (the one the drafts were sampled from).
    p: [..., V] target distribution.
    draft_tokens: [..., K] int, X_1..X_K.
    accept_uniforms: [..., K] float in [0, 1), u_1..u_K.
    residual_uniform: [...] float in [0, 1), for the residual sample.
    rho: [...] optional precomputed rho (default: rho_star(q, p, K)); any valid rho keeps the
      output exact, rho* maximizes acceptance.

  Returns:
    token: [...] int32, the selected token (distributed as p).
    accepted_index: [...] int32, index in 0..K-1 of the accepted draft, or -1 if none was accepted.
    acceptance_probability: [...] float32, 1 - (1 - beta(rho))^K.
  """
  q, p = as_distributions(q, p)
  draft_tokens = jnp.asarray(draft_tokens)
  accept_uniforms = jnp.asarray(accept_uniforms, jnp.float32)
  residual_uniform = jnp.asarray(residual_uniform, jnp.float32)
  _check_select_shapes(q.shape[:-1], draft_tokens, accept_uniforms, residual_uniform)
  k = check_num_drafts(draft_tokens.shape[-1])
  rho = rho_star(q, p, k) if rho is None else jnp.asarray(rho, jnp.float32)  # [...]

  q_drafts = jnp.take_along_axis(q, draft_tokens, axis=-1)  # [..., K]
  p_drafts = jnp.take_along_axis(p, draft_tokens, axis=-1)  # [..., K]
  accepted = (accept_uniforms * rho[..., None] * q_drafts <= p_drafts) & (p_drafts > 0.0)
  any_accepted = jnp.any(accepted, axis=-1)  # [...]
  first = jnp.argmax(accepted, axis=-1).astype(jnp.int32)  # [...], 0 when none (masked below)
  accepted_token = jnp.take_along_axis(draft_tokens, first[..., None], axis=-1)[..., 0]

  residual = k_sequential_residual(q, p, k, rho)  # [..., V]
  residual_token = sample_from_probabilities(residual, residual_uniform)  # [...]

  token = jnp.where(any_accepted, accepted_token, residual_token).astype(jnp.int32)
  accepted_index = jnp.where(any_accepted, first, -1).astype(jnp.int32)
  return token, accepted_index, acceptance_probability(rho, q, p, k)


def _check_select_shapes(batch_shape, draft_tokens, accept_uniforms, residual_uniform) -> None:
  if draft_tokens.ndim != len(batch_shape) + 1 or draft_tokens.shape[:-1] != batch_shape:
    raise ValueError(
      f"draft_tokens must be [..., K] with batch shape {batch_shape}; got {draft_tokens.shape}"
    )
  if accept_uniforms.shape != draft_tokens.shape:
    raise ValueError(
      f"accept_uniforms must match draft_tokens {draft_tokens.shape}; got {accept_uniforms.shape}"
    )
  if residual_uniform.shape != batch_shape:
    raise ValueError(
      f"residual_uniform must have the batch shape {batch_shape}; got {residual_uniform.shape}"
    )
  if not jnp.issubdtype(draft_tokens.dtype, jnp.integer):
    raise ValueError(f"draft_tokens must be integer token ids; got dtype {draft_tokens.dtype}")


def k_sequential_sample(
  key: jax.Array, q: jax.Array, p: jax.Array, k: int
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Draws K i.i.d. drafts from q and selects with `k_sequential_select` (simulation helper).

  Args:
    key: PRNG key (split three ways: drafts, acceptance uniforms, residual uniform).
    q: [..., V] draft distribution.
    p: [..., V] target distribution.
    k: number of drafts (static).

  Returns:
    (token [...], accepted_index [...], acceptance_probability [...], draft_tokens [..., K]).
  """
  k = check_num_drafts(k)
  q, p = as_distributions(q, p)
  batch_shape = q.shape[:-1]
  draft_key, accept_key, residual_key = jax.random.split(key, 3)
  # log(0) = -inf: zero-probability drafts are never drawn.
  logits = jnp.log(q)[..., None, :]  # [..., 1, V]
  draft_tokens = jax.random.categorical(
    draft_key, logits, axis=-1, shape=batch_shape + (k,)
  ).astype(jnp.int32)  # [..., K]
  accept_uniforms = jax.random.uniform(accept_key, batch_shape + (k,))  # [..., K]
  residual_uniform = jax.random.uniform(residual_key, batch_shape)  # [...]
  token, index, prob = k_sequential_select(q, p, draft_tokens, accept_uniforms, residual_uniform)
  return token, index, prob, draft_tokens
