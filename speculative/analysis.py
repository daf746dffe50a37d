"""Closed-form analysis of speculative decoding (Leviathan, Kalman, Matias, ICML 2023).

Pure functions of the acceptance rate alpha, the number of drafted tokens gamma, the draft/target
cost ratio c and the verify cost v, plus helpers that turn measured decode metrics into the
predicted-vs-measured tables of docs/design.md section 7. Equation and theorem numbers refer to the
paper ("Fast Inference from Transformers via Speculative Decoding", arXiv:2211.17192).

Notation is the paper's: p is the TARGET distribution (M_p), q the DRAFT distribution (M_q).

Every formula accepts numpy arrays (broadcasting) and, where it makes sense, jax arrays (the
array module is picked from the inputs); `gamma` must be a concrete integer (or an integer array),
because E[#tokens] is evaluated as the finite geometric sum  sum_{j=0}^{gamma} alpha^j, which is
exact at alpha = 1 and has no 0/0.

Conventions that reproduce the paper's own numbers (checked in tests/test_analysis.py):
  * Table 1 (operations / speed for alpha, gamma) assumes c = c_hat = 0, i.e. the draft is free:
    alpha=0.8, gamma=5 gives speed E[#tokens] = 3.69X and operations (gamma+1)/E[#tokens] = 1.63X.
  * The EXP column of Table 4 is Theorem 3.8 with the measured c, e.g. alpha=0.75, gamma=7,
    c=0.02 gives 3.2X.
"""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
from typing import Mapping

import numpy as np

try:  # jax is optional here: these are host-side report formulas that also trace under jit.
  import jax
  import jax.numpy as jnp
except ImportError:  # pragma: no cover
  jax = None
  jnp = None

ArrayLike = Any
VerifyCost = float | Callable[[int], float]


def _xp(*values: Any):
  """numpy, or jax.numpy when any input is a jax array (so the formulas trace under jit)."""
  if jax is not None and any(isinstance(v, jax.Array) for v in values):
    return jnp
  return np


def _check_unit_interval(name: str, value: ArrayLike) -> None:
  """Raises ValueError if a concrete value lies outside [0, 1] or is NaN (tracers are skipped)."""
  if jax is not None and isinstance(value, jax.core.Tracer):
    return
  arr = np.asarray(value, dtype=np.float64)
  if np.any(np.isnan(arr)) or np.any(arr < 0.0) or np.any(arr > 1.0):
    raise ValueError(f"{name} must lie in [0, 1]; got {value!r}")


def _check_gamma(gamma: ArrayLike, minimum: int = 0) -> np.ndarray:
  """gamma as a concrete integer array; ValueError if it is not an integer >= minimum."""
  arr = np.asarray(gamma)
  if arr.dtype.kind not in "iu":
    if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
      arr = arr.astype(np.int64)
    else:
      raise ValueError(f"gamma must be an integer (number of drafted tokens); got {gamma!r}")
  if np.any(arr < minimum):
    raise ValueError(f"gamma must be >= {minimum}; got {gamma!r}")
  return arr


def _check_nonnegative(name: str, value: ArrayLike) -> None:
  if jax is not None and isinstance(value, jax.core.Tracer):
    return
  arr = np.asarray(value, dtype=np.float64)
  if np.any(np.isnan(arr)) or np.any(arr < 0.0):
    raise ValueError(f"{name} must be >= 0; got {value!r}")


# ----------------------------------------------------------------------------------------------
# Core formulas.
# ----------------------------------------------------------------------------------------------


def expected_tokens(alpha: ArrayLike, gamma: ArrayLike) -> ArrayLike:
  """Expected number of tokens produced by one target call, Eq. (1).

  E[#generated tokens] = (1 - alpha^(gamma+1)) / (1 - alpha), with the alpha -> 1 limit gamma + 1.
  Evaluated as the geometric sum  sum_{j=0}^{gamma} alpha^j  (identical, exact at alpha = 1, and
  free of cancellation near 1). This is also the expected block efficiency (tokens per target call)
  under the paper's simplifying assumption (Section 3.3) that the acceptance events of successive
  drafted positions are i.i.d. with rate alpha.

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: number of drafted tokens per step, integer(s) >= 0; broadcasts against alpha.

  Returns:
    E[#tokens], same broadcast shape as (alpha, gamma).
  """
  _check_unit_interval("alpha", alpha)
  gamma_arr = _check_gamma(gamma)
  xp = _xp(alpha)
  alpha = xp.asarray(alpha, dtype=xp.float32 if xp is not np else np.float64)
  if gamma_arr.ndim == 0:
    g = int(gamma_arr)
    total = xp.ones_like(alpha)
    power = xp.ones_like(alpha)
    for _ in range(g):
      power = power * alpha
      total = total + power
    return total
  # Integer array gamma: sum the powers up to max(gamma) and mask j > gamma.
  j = np.arange(int(gamma_arr.max()) + 1)  # [J]
  alpha_b, gamma_b = xp.broadcast_arrays(alpha, xp.asarray(gamma_arr))
  powers = alpha_b[..., None] ** j  # [..., J]
  return xp.sum(xp.where(j <= gamma_b[..., None], powers, 0.0), axis=-1)


def _verify_cost(v: VerifyCost, gamma: ArrayLike, xp) -> ArrayLike:
  """v(gamma + 1) as an array; `v` is a number (the same for every gamma) or a callable v(T)."""
  if callable(v):
    gamma_arr = _check_gamma(gamma)
    values = np.vectorize(lambda g: float(v(int(g) + 1)), otypes=[np.float64])(gamma_arr)
    _check_nonnegative("v(gamma + 1)", values)
    return xp.asarray(values)
  _check_nonnegative("v", v)
  return v


def walltime_improvement(
  alpha: ArrayLike, gamma: ArrayLike, c: ArrayLike, v: VerifyCost = 1.0
) -> ArrayLike:
  """Expected walltime improvement factor over autoregressive decoding, Theorem 3.8.

  One speculative step costs gamma draft steps plus one target call over gamma + 1 positions and
  yields E[#tokens] tokens (Eq. 1); the baseline pays one target step per token. In units of a
  target single-step time:

      improvement = E[#tokens] / (gamma * c + v(gamma + 1)),

  which is Theorem 3.8, (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)), when the verify call
  costs the same as one step (v = 1, the paper's TPU assumption). On hardware where a
  (gamma+1)-token call is slower than a 1-token call (docs/design.md section 8), pass the measured
  ratio v = v(gamma+1), or a callable v(T) (e.g. from `verify_cost_fn`).

  Args:
    alpha: acceptance rate(s) in [0, 1].
    gamma: drafted tokens per step, integer(s) >= 0.
    c: draft step time / target step time (>= 0).
    v: target (gamma+1)-token call time / target single-step time; a number or a callable v(T).
  """
  _check_nonnegative("c", c)
  xp = _xp(alpha, c)
  tokens = expected_tokens(alpha, gamma)
  cost = xp.asarray(gamma) * c + _verify_cost(v, gamma, xp)
  return tokens / cost


def min_improvement(alpha: ArrayLike, c: ArrayLike) -> ArrayLike:
  """Lower bound on the best walltime improvement, Corollary 3.9: (1 + alpha) / (1 + c).

  If alpha > c there is a gamma (gamma = 1 already) whose improvement is at least this, which is
  then > 1. Equals `walltime_improvement(alpha, 1, c)`.
  """
  _check_unit_interval("alpha", alpha)
  _check_nonnegative("c", c)
  return (1.0 + alpha) / (1.0 + c)


def operations_factor(alpha: ArrayLike, gamma: ArrayLike, c_hat: ArrayLike) -> ArrayLike:
  """Expected factor of increase in arithmetic operations, Theorem 3.11.

      (1 - alpha) (gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1))
    = (gamma c_hat + gamma + 1) / E[#tokens],

  where c_hat is the draft/target ratio of arithmetic operations per token: each step runs the
  draft gamma times and the target on gamma + 1 tokens, and yields E[#tokens] tokens.
  """
  _check_nonnegative("c_hat", c_hat)
  xp = _xp(alpha, c_hat)
  g = xp.asarray(_check_gamma(gamma))
  return (g * c_hat + g + 1) / expected_tokens(alpha, gamma)


def optimal_gamma(
  alpha: ArrayLike, c: ArrayLike, v: VerifyCost = 1.0, max_gamma: int = 32, min_gamma: int = 1
) -> ArrayLike:
  """The integer gamma in [min_gamma, max_gamma] maximizing `walltime_improvement` (Section 3.4).

  The paper picks gamma by maximizing Theorem 3.8 over integers (its Figure 3); with a measured
  verify cost v(T) the same argmax uses the general form. Ties go to the smaller gamma. The best
  improvement may still be < 1 (alpha too low, or c / v too high): compare
  `walltime_improvement(alpha, optimal_gamma(...), c, v)` with 1 before speculating.

  Args:
    alpha: acceptance rate(s) in [0, 1] (any shape; broadcast against c).
    c: draft/target step-time ratio(s).
    v: verify cost, a number or a callable v(T) (T = gamma + 1 tokens).
    max_gamma, min_gamma: the integer search range (min_gamma >= 1).

  Returns:
    int (or an int array of the broadcast shape of alpha and c).
  """
  if int(min_gamma) < 1 or int(max_gamma) < int(min_gamma):
    raise ValueError(
      f"need 1 <= min_gamma <= max_gamma; got min_gamma={min_gamma}, max_gamma={max_gamma}"
    )
  _check_unit_interval("alpha", alpha)
  _check_nonnegative("c", c)
  alpha_b, c_b = np.broadcast_arrays(np.asarray(alpha, np.float64), np.asarray(c, np.float64))
  gammas = np.arange(int(min_gamma), int(max_gamma) + 1)  # [G]
  improvement = walltime_improvement(alpha_b[..., None], gammas, c_b[..., None], v)  # [..., G]
  best = gammas[np.argmax(improvement, axis=-1)]
  return int(best) if best.ndim == 0 else best


def alpha_from_distributions(p: ArrayLike, q: ArrayLike, axis: int = -1) -> ArrayLike:
  """Acceptance rate of one drafted token, Corollary 3.6.

  beta = E_{x~q}[min(1, p(x)/q(x))] = sum_x min(p(x), q(x)) = 1 - D_LK(p, q), where
  D_LK(p, q) = sum_x |p(x) - q(x)| / 2 is the total-variation distance; alpha is its mean over
  positions (average the result over the position axes). Batched: reduces `axis`
  only, so [batch, gamma, vocab] inputs give the per-position alphas [batch, gamma].
  """
  xp = _xp(p, q)
  p = xp.asarray(p)
  q = xp.asarray(q)
  if p.shape != q.shape:
    raise ValueError(f"p and q must have the same shape; got {p.shape} and {q.shape}")
  return xp.sum(xp.minimum(p, q), axis=axis)


# ----------------------------------------------------------------------------------------------
# Lenience (Appendix A.5).
# ----------------------------------------------------------------------------------------------


def lenient_alpha(p: ArrayLike, q: ArrayLike, lenience: ArrayLike) -> ArrayLike:
  """Acceptance rate of the lenient (approximate) rule of Appendix A.5.

  Rule: draw x ~ q (draft) and r ~ U(0, 1); accept iff  r * l * q(x) <= p(x)  (the paper multiplies
  q(x) by the lenience l in [0, 1] before comparing with p(x); l = 1 is the exact rule). So
  x is accepted with probability min(1, p(x) / (l q(x))) and

      alpha_l = sum_x q(x) min(1, p(x) / (l q(x))) = sum_x min(q(x), p(x) / l)
              = (1/l) sum_x min(l q(x), p(x))                      (l > 0),

  and alpha_0 = 1 (every draft is accepted). alpha_l is non-increasing in l and alpha_1 = alpha
  (Corollary 3.6). Derived from the rule above and verified by Monte Carlo in
  tests/test_analysis.py; the paper's appendix text itself was not available offline, so this
  docstring, not a quotation, is the reference here. The output is no longer distributed as p for
  l < 1 (see `lenient_output_distribution`).
  """
  _check_unit_interval("lenience", lenience)
  xp = _xp(p, q, lenience)
  p = xp.asarray(p)
  q = xp.asarray(q)
  if p.shape != q.shape:
    raise ValueError(f"p and q must have the same shape; got {p.shape} and {q.shape}")
  lenience = xp.asarray(lenience, dtype=p.dtype)  # [...], broadcasts against p[..., 0]
  safe_l = xp.where(lenience > 0, lenience, 1.0)
  accepted = xp.sum(xp.minimum(lenience[..., None] * q, p), axis=-1) / safe_l  # [...]
  return xp.where(lenience > 0, accepted, 1.0)


def lenient_output_distribution(p: ArrayLike, q: ArrayLike, lenience: ArrayLike) -> np.ndarray:
  """Distribution of one emitted token under the lenient rule, correction norm(max(0, p - l q)).

      P(Y = x) = min(q(x), p(x)/l) + (1 - alpha_l) * norm(max(0, p - l q))(x),

  the first term being the mass of accepted drafts equal to x, the second the correction drawn on a
  rejection. For l = 1 this is exactly p (Theorem 3.5 / Appendix A.1); for l < 1 it is biased
  towards q. Vocabulary on the last axis; numpy only (a reporting helper). When a rejection is
  impossible (alpha_l = 1) the correction term is 0 and its normalization is skipped.
  """
  _check_unit_interval("lenience", lenience)
  p = np.asarray(p, np.float64)
  q = np.asarray(q, np.float64)
  if p.shape != q.shape:
    raise ValueError(f"p and q must have the same shape; got {p.shape} and {q.shape}")
  lam = np.asarray(lenience, np.float64)[..., None]
  with np.errstate(divide="ignore", invalid="ignore"):
    accepted_mass = np.where(lam > 0, np.minimum(q, p / np.where(lam > 0, lam, 1.0)), q)
  alpha_l = accepted_mass.sum(-1, keepdims=True)
  residual = np.maximum(p - lam * q, 0.0)
  residual_total = residual.sum(-1, keepdims=True)
  residual = np.where(
    residual_total > 0, residual / np.where(residual_total > 0, residual_total, 1.0), 0.0
  )
  return accepted_mass + np.clip(1.0 - alpha_l, 0.0, None) * residual


# ----------------------------------------------------------------------------------------------
# From measurements to tables (docs/design.md section 7).
# ----------------------------------------------------------------------------------------------


def verify_cost_fn(measured: Mapping[int, float]) -> Callable[[int], float]:
  """A callable v(T) from measured ratios {T: target T-token call time / single-step time}.

  Linear interpolation between measured T; beyond the largest measured T it extends the last
  segment linearly, never downwards (a wider call never costs less: a falling last segment is
  timing noise, and extended it would reach negative costs). v(1) is taken as 1 unless measured.
  """
  points = {1: 1.0}
  points.update({int(t): float(r) for t, r in measured.items()})
  if any(t < 1 for t in points):
    raise ValueError(f"verify lengths T must be >= 1; got {sorted(points)}")
  ts = np.array(sorted(points), np.float64)
  vs = np.array([points[int(t)] for t in ts], np.float64)
  _check_nonnegative("measured verify cost", vs)

  def v(t: int) -> float:
    t = float(t)
    if len(ts) == 1:
      return float(vs[0])
    if t > ts[-1]:
      slope = max((vs[-1] - vs[-2]) / (ts[-1] - ts[-2]), 0.0)
      return float(vs[-1] + slope * (t - ts[-1]))
    return float(np.interp(t, ts, vs))

  return v


def block_efficiency(metrics: Mapping[str, float]) -> float:
  """Generated tokens per target call: metrics['generated_tokens'] / metrics['target_calls']."""
  generated = _require(metrics, "generated_tokens")
  calls = _require(metrics, "target_calls")
  if calls <= 0:
    raise ValueError(f"target_calls must be > 0 to compute block efficiency; got {calls}")
  return float(generated) / float(calls)


def acceptance_rate(metrics: Mapping[str, float]) -> float:
  """Empirical acceptance rate accepted / drafted (docs/design.md section 7).

  Note: `drafted_tokens` counts every drafted token, including those after a rejection that were
  never tested, so under the i.i.d. model this is below alpha for gamma > 1; `alpha_from_block_
  efficiency` inverts Eq. (1) instead.
  """
  accepted = _require(metrics, "accepted_tokens")
  drafted = _require(metrics, "drafted_tokens")
  if drafted <= 0:
    raise ValueError(f"drafted_tokens must be > 0 to compute an acceptance rate; got {drafted}")
  return float(accepted) / float(drafted)


def alpha_from_block_efficiency(block_eff: ArrayLike, gamma: int, iters: int = 60) -> ArrayLike:
  """The alpha whose E[#tokens] (Eq. 1) equals a measured block efficiency (method of moments).

  E[#tokens] is increasing in alpha from 1 (alpha=0) to gamma+1 (alpha=1), so bisection inverts it;
  values outside [1, gamma+1] are clipped to alpha = 0 or 1.
  """
  g = int(_check_gamma(gamma, minimum=1))
  target = np.asarray(block_eff, np.float64)
  lo = np.zeros_like(target)
  hi = np.ones_like(target)
  for _ in range(iters):
    mid = 0.5 * (lo + hi)
    below = expected_tokens(mid, g) < target
    lo = np.where(below, mid, lo)
    hi = np.where(below, hi, mid)
  result = 0.5 * (lo + hi)
  return float(result) if result.ndim == 0 else result


def _require(metrics: Mapping[str, Any], key: str) -> float:
  if key not in metrics or metrics[key] is None:
    raise ValueError(f"metrics lack {key!r} (have {sorted(metrics)})")
  value = float(metrics[key])
  if math.isnan(value) or value < 0:
    raise ValueError(f"metrics[{key!r}] must be a non-negative number; got {metrics[key]!r}")
  return value


def speedup_row(metrics: Mapping[str, Any]) -> dict[str, Any]:
  """One predicted-vs-measured row from a metrics dict (docs/design.md section 7).

  Required keys: 'gamma', 'generated_tokens', 'target_calls', 'drafted_tokens', 'accepted_tokens'.
  Optional keys:
    'alpha': mean over drafted positions of sum_x min(p, q) (Corollary 3.6); when absent the
      empirical acceptance rate is used for the prediction (and 'alpha_source' says so);
    'c': draft step time / target single-step time;
    'v': target (gamma+1)-token call time / single-step time (default 1, the paper's assumption);
    'baseline_walltime', 'speculative_walltime': seconds, same inputs, warm runs.
  Any other keys (e.g. 'name', 'temperature') are passed through.

  Adds: 'block_efficiency', 'acceptance_rate', 'alpha_used', 'alpha_source', 'expected_tokens'
  (Eq. 1, the predicted block efficiency), 'predicted_speedup' (E[#tokens] / (gamma c + v); needs
  'c'), 'measured_speedup' (baseline / speculative walltime; needs both), and 'alpha_from_block_
  efficiency' (Eq. 1 inverted on the measured block efficiency).
  """
  row = dict(metrics)
  gamma = int(_check_gamma(_require(metrics, "gamma"), minimum=1))
  row["gamma"] = gamma
  row["block_efficiency"] = block_efficiency(metrics)
  row["acceptance_rate"] = acceptance_rate(metrics)
  if metrics.get("alpha") is not None:
    alpha = float(metrics["alpha"])
    row["alpha_source"] = "distributions"
  else:
    alpha = row["acceptance_rate"]
    row["alpha_source"] = "acceptance_rate"
  _check_unit_interval("alpha", alpha)
  row["alpha_used"] = alpha
  row["expected_tokens"] = float(expected_tokens(alpha, gamma))
  row["alpha_from_block_efficiency"] = alpha_from_block_efficiency(row["block_efficiency"], gamma)
  if metrics.get("c") is not None:
    v = float(metrics["v"]) if metrics.get("v") is not None else 1.0
    row["v"] = v
    row["predicted_speedup"] = float(walltime_improvement(alpha, gamma, float(metrics["c"]), v))
  if (
    metrics.get("baseline_walltime") is not None and metrics.get("speculative_walltime") is not None
  ):
    speculative = _require(metrics, "speculative_walltime")
    if speculative <= 0:
      raise ValueError(f"speculative_walltime must be > 0; got {speculative}")
    row["measured_speedup"] = _require(metrics, "baseline_walltime") / speculative
  return row
