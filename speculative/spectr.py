"""SpecTr token-level draft selection (Sun et al., NeurIPS 2023, "SpecTr: Fast Speculative Decoding
via Optimal Transport"): K-draft sequential selection (k-Seq) with the optimal rho* and the exact
OTM-k optimum of tiny problems by linear programming.

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
tests/test_spectr.py.)

Numerics: g(beta) is evaluated as the polynomial sum_{j<K} (1 - beta)^j (no division by beta, exact
as beta -> 0 where g -> K); the acceptance test is the division-free  u rho q(X_i) <= p(X_i); the
residual numerator is clamped at 0 and normalized by its own sum, and falls back to p when that
sum is 0 (then a rejection has probability 0 up to rounding, e.g. q == p). No NaNs for one-hot,
disjoint or identical q and p.

Sequence-level selection (the paper's Algorithm 3, K draft sequences of length L): see
`spectr_sequence_select` at the end of this module; the decode loop around it is
speculative/spectr_decoding.py.
"""

from __future__ import annotations

import itertools
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib

DEFAULT_BISECTION_ITERS = 40


def _as_distributions(q: jax.Array, p: jax.Array) -> tuple[jax.Array, jax.Array]:
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


def _check_num_drafts(k: int) -> int:
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
  q, p = _as_distributions(q, p)
  rho = jnp.asarray(rho, jnp.float32)
  value = jnp.sum(jnp.minimum(q, p / rho[..., None]), axis=-1)  # [...]
  return jnp.clip(value, 0.0, 1.0)


def _geometric_sum(beta_value: jax.Array, k: int) -> jax.Array:
  """g(beta) = sum_{j=0}^{k-1} (1 - beta)^j = (1 - (1 - beta)^k) / beta, without the division."""
  one_minus = 1.0 - jnp.clip(beta_value, 0.0, 1.0)  # [...]
  powers = one_minus[..., None] ** jnp.arange(k, dtype=jnp.float32)  # [..., k]
  return jnp.sum(powers, axis=-1)


def acceptance_probability(rho: jax.Array, q: jax.Array, p: jax.Array, k: int) -> jax.Array:
  """P(some draft is accepted) under k-Seq with parameter rho: 1 - (1 - beta(rho))^k, as
  beta g(beta). [...] float32."""
  k = _check_num_drafts(k)
  b = beta(rho, q, p)
  return b * _geometric_sum(b, k)


def _is_valid_rho(rho: jax.Array, q: jax.Array, p: jax.Array, k: int) -> jax.Array:
  """f(rho) >= 0, i.e. beta(rho) == 0 or rho >= g(beta(rho)) (residual non-negative). [...] bool."""
  b = beta(rho, q, p)
  return (b <= 0.0) | (rho >= _geometric_sum(b, k))


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
  k = _check_num_drafts(k)
  q, p = _as_distributions(q, p)
  batch_shape = q.shape[:-1]
  one = jnp.ones(batch_shape, jnp.float32)
  if k == 1:
    return one
  valid_at_one = _is_valid_rho(one, q, p, k)  # [...]

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    ok = _is_valid_rho(mid, q, p, k)
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

  _, hi = jax.lax.fori_loop(0, int(num_iters), body, (one, jnp.full(batch_shape, float(k))))
  return jnp.where(valid_at_one, one, hi)


def k_sequential_residual(q: jax.Array, p: jax.Array, k: int, rho: jax.Array) -> jax.Array:
  """The residual q_res that is sampled when no draft is accepted (module docstring).

  q_res ∝ max(0, p - min(q, p/rho) g(beta(rho))), normalized by its own sum; p itself when that
  sum is 0 (a rejection then has probability 0, e.g. q == p). [..., V] float32.
  """
  k = _check_num_drafts(k)
  q, p = _as_distributions(q, p)
  rho = jnp.asarray(rho, jnp.float32)
  g = _geometric_sum(beta(rho, q, p), k)  # [...]
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
  k = _check_num_drafts(k)
  q, p = _as_distributions(q, p)
  rho = rho_star(q, p, k) if rho is None else jnp.asarray(rho, jnp.float32)
  b = beta(rho, q, p)  # [...]
  accepted = jnp.minimum(q, p / rho[..., None]) * _geometric_sum(b, k)[..., None]  # [..., V]
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
  q, p = _as_distributions(q, p)
  draft_tokens = jnp.asarray(draft_tokens)
  accept_uniforms = jnp.asarray(accept_uniforms, jnp.float32)
  residual_uniform = jnp.asarray(residual_uniform, jnp.float32)
  batch_shape = q.shape[:-1]
  if draft_tokens.ndim != q.ndim or draft_tokens.shape[:-1] != batch_shape:
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
  k = _check_num_drafts(draft_tokens.shape[-1])
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
  k = _check_num_drafts(k)
  q, p = _as_distributions(q, p)
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


# ----------------------------------------------------------------------------------------------
# The OTM-k optimum for tiny vocabularies (ground truth for tests and analysis; numpy / scipy).
# ----------------------------------------------------------------------------------------------


def _check_small_problem(
  q: Sequence[float], p: Sequence[float], k: int, max_tuples: int
) -> tuple[np.ndarray, np.ndarray, int]:
  q = np.asarray(q, np.float64)
  p = np.asarray(p, np.float64)
  k = _check_num_drafts(k)
  if q.ndim != 1 or q.shape != p.shape:
    raise ValueError(f"q and p must be 1-D distributions of equal length; got {q.shape}, {p.shape}")
  for name, d in (("q", q), ("p", p)):
    if np.any(~np.isfinite(d)) or np.any(d < 0) or abs(d.sum() - 1.0) > 1e-6:
      raise ValueError(f"{name} must be a probability vector (non-negative, sums to 1); got {d}")
  if len(q) ** k > max_tuples:
    raise ValueError(
      f"V^K = {len(q)}^{k} draft tuples exceed {max_tuples}; the exact OTM-k "
      "solvers are for tiny vocabularies only"
    )
  return q / q.sum(), p / p.sum(), k


def otm_k_acceptance_lp(
  q: Sequence[float], p: Sequence[float], k: int, max_tuples: int = 4096
) -> float:
  """The optimal OTM-k acceptance probability, by linear programming (scipy HiGHS).

  OTM-k: over couplings pi(t, y) of the draft tuple (X_1..X_K) ~ q^{⊗K} (t in V^K) with an output
  Y ~ p, maximize P(Y in {X_1..X_K}) = sum_{t, y in t} pi(t, y). Only the "accepting" entries
  (y in t) enter the objective, and any partial coupling of them extends to a full coupling (couple
  the leftover masses of the two marginals arbitrarily, e.g. independently), so the LP solved is
  the equivalent transport / max-flow form over those entries alone:
      maximize sum pi(t, y)   s.t.  sum_{y in t} pi(t, y) <= prod_i q(t_i),
                                    sum_{t ∋ y}  pi(t, y) <= p(y),       pi >= 0,
  which is always feasible (pi = 0), so rounding in the marginals cannot make it infeasible.
  Enumerates V^K tuples, so only for tiny problems (V <= 4, K <= 3 or so).

  Args:
    q: [V] draft distribution.  p: [V] target distribution.  k: number of drafts.

  Returns:
    The optimum as a float in [0, 1].
  """
  from scipy.optimize import linprog  # Local: scipy is only needed for this ground truth.

  q, p, k = _check_small_problem(q, p, k, max_tuples)
  vocab = len(q)
  tuples = list(itertools.product(range(vocab), repeat=k))
  edges = [(t, y) for t, draws in enumerate(tuples) for y in sorted(set(draws))]  # y in tuple t
  a_ub = np.zeros((len(tuples) + vocab, len(edges)))
  for e, (t, y) in enumerate(edges):
    a_ub[t, e] = 1.0
    a_ub[len(tuples) + y, e] = 1.0
  tuple_mass = np.array([np.prod(q[list(draws)]) for draws in tuples])
  b_ub = np.concatenate([tuple_mass, p])
  result = linprog(-np.ones(len(edges)), A_ub=a_ub, b_ub=b_ub, bounds=(0, None), method="highs")
  if not result.success:
    raise RuntimeError(f"OTM-k linear program failed: {result.message}")
  return float(np.clip(-result.fun, 0.0, 1.0))


def otm_k_acceptance_mincut(
  q: Sequence[float], p: Sequence[float], k: int, max_subsets: int = 1 << 16
) -> float:
  """The OTM-k optimum in closed form: min over subsets S of V of p(S) + 1 - q(S)^K.

  The LP of `otm_k_acceptance_lp` is a bipartite flow problem (draft tuples -> allowed outputs, an
  output y allowed for tuple t iff y in t); by max-flow/min-cut its value is
  min_A [p(V \\ A) + P(some X_i in A)] over output sets A, i.e. with S = V \\ A,
  min_S [p(S) + 1 - q(S)^K]. Enumerates 2^V subsets (V <= 16); an independent check of the LP.
  """
  q = np.asarray(q, np.float64)
  p = np.asarray(p, np.float64)
  vocab = len(q)
  if 2**vocab > max_subsets:
    raise ValueError(f"2^V = 2^{vocab} subsets exceed {max_subsets}")
  q, p, k = _check_small_problem(q, p, k, max_tuples=np.inf)
  masks = ((np.arange(2**vocab)[:, None] >> np.arange(vocab)) & 1).astype(np.float64)  # [2^V, V]
  values = masks @ p + 1.0 - (masks @ q) ** k
  return float(np.clip(values.min(), 0.0, 1.0))


# ----------------------------------------------------------------------------------------------
# Sequence level (the paper's Algorithm 3): K i.i.d. draft sequences of length L.
# ----------------------------------------------------------------------------------------------


def _geometric_sum_counted(beta_value: jax.Array, count: jax.Array, max_count: int) -> jax.Array:
  """g(beta) = sum_{j < count} (1 - beta)^j for a run-time count in [0, max_count]. [...] float32.

  Equals `_geometric_sum(beta, count)` (the masked terms are exact zeros); count == 1 gives 1.0
  exactly, count == 0 gives 0.
  """
  one_minus = 1.0 - jnp.clip(beta_value, 0.0, 1.0)  # [...]
  exponents = jnp.arange(max_count, dtype=jnp.float32)  # [max_count]
  powers = one_minus[..., None] ** exponents  # [..., max_count]
  powers = jnp.where(exponents < count[..., None], powers, 0.0)
  return jnp.sum(powers, axis=-1)


def rho_star_counted(
  q: jax.Array,
  p: jax.Array,
  count: jax.Array,
  max_count: int,
  num_iters: int = DEFAULT_BISECTION_ITERS,
) -> jax.Array:
  """`rho_star` with a run-time number of drafts per row: count [...] int32 in [0, max_count].

  At depth i of the sequence-level selection only the drafts whose prefix agrees with the tokens
  emitted so far take part, so K varies per row and per depth; `max_count` (static) bounds it.
  Bisection on [1, max(count, 1)] exactly as in `rho_star`; count <= 1 gives rho = 1 exactly (a
  single draft is Leviathan's rule; with no draft rho is irrelevant).

  Args:
    q: [..., V] draft distribution.
    p: [..., V] target distribution.
    count: [...] int, the number of i.i.d. drafts of this row.
    max_count: static upper bound of count (>= 1).
    num_iters: bisection steps (static).

  Returns:
    [...] float32 in [1, max(count, 1)].
  """
  max_count = _check_num_drafts(max_count)
  q, p = _as_distributions(q, p)
  count = jnp.asarray(count, jnp.int32)
  batch_shape = q.shape[:-1]
  if count.shape != batch_shape:
    raise ValueError(f"count must have the batch shape {batch_shape}; got {count.shape}")
  one = jnp.ones(batch_shape, jnp.float32)
  if max_count == 1:
    return one

  def is_valid(rho):
    b = beta(rho, q, p)
    return (b <= 0.0) | (rho >= _geometric_sum_counted(b, count, max_count))

  def body(_, bounds):
    lo, hi = bounds
    mid = 0.5 * (lo + hi)
    ok = is_valid(mid)
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)

  upper = jnp.maximum(count, 1).astype(jnp.float32)
  _, hi = jax.lax.fori_loop(0, int(num_iters), body, (one, upper))
  return jnp.where(is_valid(one), one, hi)


@flax.struct.dataclass
class SequenceSelection:
  """Outcome of the sequence-level selection for a batch of rows (K drafts of length L each).

  Attributes:
    num_accepted: [B] int32, n in [0, L]: the number of depths at which a draft was accepted.
    next_token: [B] int32, the token emitted after them: the k-Seq residual sample at depth n, or
      the bonus token from the target's conditional at depth L when n == L (or a sample from the
      target's conditional at depth n when no draft reached that depth; see `num_drafted`).
    tokens: [B, L+1] int32, the emitted block: tokens[:, :n] are the accepted draft tokens,
      tokens[:, n] is next_token, entries after n are filler (the chosen branch's drafts, then 0).
    branch: [B] int32 in [0, K): a draft whose first n tokens equal tokens[:, :n] (the draft whose
      caches the decode loop adopts).
    acceptance_sum: [B] float32, sum over the depths where a selection ran of the k-Seq acceptance
      probability 1 - (1 - beta(rho*))^k with k the number of drafts still in the running there.
    single_draft_acceptance_sum: [B] float32, the same sum of sum_x min(q(x), p(x)) (what one draft
      would be accepted with at those conditionals; Leviathan's alpha).
    num_selections: [B] int32, the number of depths where a selection ran (min(n + 1, L), less when
      drafts were shorter than L).
  """

  num_accepted: jax.Array
  next_token: jax.Array
  tokens: jax.Array
  branch: jax.Array
  acceptance_sum: jax.Array
  single_draft_acceptance_sum: jax.Array
  num_selections: jax.Array


def spectr_sequence_select(
  draft_tokens: jax.Array,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  accept_uniforms: jax.Array,
  sample_keys: jax.Array,
  num_drafted: jax.Array | None = None,
  num_iters: int = DEFAULT_BISECTION_ITERS,
) -> SequenceSelection:
  """The paper's Algorithm 3 with k-Seq (rho*) as the token-level selection, vectorized over rows.

  The K drafts of a row form a tree walked depth by depth. At depth i (0-based) the drafts still
  in the running ("survivors": those whose first i tokens equal the i tokens emitted so far) hold
  i.i.d. samples of the draft's conditional q(. | prefix) (their tokens at depth i were drawn
  independently of everything that decided the survival). k-Seq among the k survivors (rho* for
  that k, acceptance uniforms u[i, j] per draft j, in draft order) outputs a token distributed as
  the target's conditional p(. | prefix):
    * a draft is accepted: emit its token, keep the survivors that carry the same token, go deeper;
    * none is accepted: emit the k-Seq residual sample and stop (the first correction).
  After L accepted depths, emit the bonus token from p(. | all L tokens) of a surviving draft. Every
  emitted token is then distributed as the target's conditional given the tokens before it, so a
  decode loop that repeats this is exact. (Algorithm 3 as printed continues while the output token
  equals some survivor's token; after a residual sample that is an event of probability zero at the
  exact rho* — every survivor's token x has rho* q(x) >= p(x), where the residual has no mass — so
  stopping at the first correction is the same rule, and it needs one sample per step.)

  With K = 1 this is Leviathan's Algorithm 1 operation for operation (rho = 1, g = 1, the same
  acceptance test and the same unnormalized residual max(0, p - q), the same Gumbel-max sample with
  the same key), so `speculative_accept` and this function emit the same tokens for the same
  uniforms and keys (tested through the decode loops).

  Notation: q is the DRAFT, p the TARGET (as in sampling.py).

  Args:
    draft_tokens: [B, K, L] int32, K i.i.d. draft sequences per row.
    draft_probs: [B, K, L, V] float32, draft_probs[b, j, i] is the distribution token i of draft j
      was drawn from (it conditions on draft j's tokens before i).
    target_probs: [B, K, L+1, V] float32, target_probs[b, j, i] is the target's conditional given
      draft j's first i tokens (the verify call over [last token, draft j]).
    accept_uniforms: [B, L, K] float32 in [0, 1), u for (depth, draft).
    sample_keys: [B] PRNG keys, one per row, used once (residual or bonus sample).
    num_drafted: [B, K] int32 in [0, L], tokens each draft really proposed (default L). Positions
      at or beyond it take no part; when no survivor has a token at depth i the row emits a sample
      of p at depth i, as `speculative_accept` does. Exactness then needs num_drafted to depend
      only on the draft's own earlier tokens (a stopping rule), so survivors agree on it.
    num_iters: bisection steps for rho* (static).

  Returns:
    SequenceSelection.
  """
  draft_tokens = jnp.asarray(draft_tokens)
  if draft_tokens.ndim != 3:
    raise ValueError(f"draft_tokens must be [batch, K, L]; got shape {draft_tokens.shape}")
  batch, k, length = draft_tokens.shape
  vocab = target_probs.shape[-1]
  if draft_probs.shape != (batch, k, length, vocab):
    raise ValueError(
      f"draft_probs must be [batch, K, L, V] = {(batch, k, length, vocab)}; got {draft_probs.shape}"
    )
  if target_probs.shape != (batch, k, length + 1, vocab):
    raise ValueError(
      f"target_probs must be [batch, K, L+1, V] = {(batch, k, length + 1, vocab)}; "
      f"got {target_probs.shape}"
    )
  if accept_uniforms.shape != (batch, length, k):
    raise ValueError(
      f"accept_uniforms must be [batch, L, K] = {(batch, length, k)}; got {accept_uniforms.shape}"
    )
  if sample_keys.shape != (batch,):
    raise ValueError(f"sample_keys must be [batch] = {(batch,)}; got {sample_keys.shape}")
  if num_drafted is None:
    num_drafted = jnp.full((batch, k), length, jnp.int32)
  if num_drafted.shape != (batch, k):
    raise ValueError(f"num_drafted must be [batch, K] = {(batch, k)}; got {num_drafted.shape}")
  draft_tokens = draft_tokens.astype(jnp.int32)
  draft_probs = draft_probs.astype(jnp.float32)
  target_probs = target_probs.astype(jnp.float32)
  accept_uniforms = accept_uniforms.astype(jnp.float32)
  rows = jnp.arange(batch)

  def depth_step(i, carry):
    alive, running, num_accepted, next_dist, acceptance, single, selections = carry
    participants = alive & (i < num_drafted)  # [B, K]
    count = jnp.sum(participants, axis=1).astype(jnp.int32)  # [B]
    has_drafts = count > 0
    # Survivors share their prefix, so any one of them gives the conditionals q and p at depth i.
    representative = jnp.argmax(participants, axis=1)  # [B]
    q = draft_probs[rows, representative, i]  # [B, V]
    p = target_probs[rows, representative, i]  # [B, V]
    q = jnp.where(has_drafts[:, None], q, 0.0)  # no draft here: the residual below is p itself
    rho = rho_star_counted(q, p, count, k, num_iters)  # [B]
    tokens_here = draft_tokens[:, :, i]  # [B, K]
    q_at = jnp.take_along_axis(q, tokens_here, axis=1)  # [B, K]
    p_at = jnp.take_along_axis(p, tokens_here, axis=1)  # [B, K]
    accepted = (
      participants & (accept_uniforms[:, i, :] * rho[:, None] * q_at <= p_at) & (p_at > 0.0)
    )  # [B, K]
    any_accepted = jnp.any(accepted, axis=1)  # [B]
    first = jnp.argmax(accepted, axis=1)  # [B]
    emitted = jnp.take_along_axis(tokens_here, first[:, None], axis=1)[:, 0]  # [B]

    beta_rho = beta(rho, q, p)  # [B]
    g = _geometric_sum_counted(beta_rho, count, k)  # [B]
    # Unnormalized residual (Gumbel-max needs no normalization); p when it has no mass.
    residual = jnp.maximum(p - jnp.minimum(q, p / rho[:, None]) * g[:, None], 0.0)  # [B, V]
    residual = jnp.where(jnp.sum(residual, axis=1, keepdims=True) > 0.0, residual, p)

    selecting = running & has_drafts
    advance = running & any_accepted
    next_dist = jnp.where((running & ~any_accepted)[:, None], residual, next_dist)
    alive = jnp.where(advance[:, None], participants & (tokens_here == emitted[:, None]), alive)
    acceptance = acceptance + jnp.where(selecting, beta_rho * g, 0.0)
    single = single + jnp.where(selecting, jnp.sum(jnp.minimum(q, p), axis=1), 0.0)
    return (
      alive,
      advance,
      num_accepted + advance.astype(jnp.int32),
      next_dist,
      acceptance,
      single,
      selections + selecting.astype(jnp.int32),
    )

  init = (
    jnp.ones((batch, k), bool),
    jnp.ones((batch,), bool),
    jnp.zeros((batch,), jnp.int32),
    jnp.zeros((batch, vocab), jnp.float32),
    jnp.zeros((batch,), jnp.float32),
    jnp.zeros((batch,), jnp.float32),
    jnp.zeros((batch,), jnp.int32),
  )
  alive, running, num_accepted, next_dist, acceptance, single, selections = jax.lax.fori_loop(
    0, length, depth_step, init
  )
  branch = jnp.argmax(alive, axis=1).astype(jnp.int32)  # [B]; all K alive when n == 0
  bonus = target_probs[rows, branch, length]  # [B, V]
  next_dist = jnp.where(running[:, None], bonus, next_dist)
  next_token = sampling_lib.sample_rows(sample_keys, next_dist)  # [B]

  chosen = draft_tokens[rows, branch]  # [B, L]
  block = jnp.concatenate([chosen, jnp.zeros((batch, 1), jnp.int32)], axis=1)  # [B, L+1]
  block = jnp.where(
    jnp.arange(length + 1)[None, :] == num_accepted[:, None], next_token[:, None], block
  )
  return SequenceSelection(
    num_accepted=num_accepted,
    next_token=next_token,
    tokens=block,
    branch=branch,
    acceptance_sum=acceptance,
    single_draft_acceptance_sum=single,
    num_selections=selections,
  )
