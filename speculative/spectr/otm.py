"""The exact OTM-k optimum of tiny problems (SpecTr's optimal transport with membership cost):
ground truth for the tests and analysis of k-Seq, by linear programming and in closed form by
min-cut (numpy / scipy; V^K draft tuples are enumerated, so tiny vocabularies only)."""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from speculative.spectr import kseq


def _check_small_problem(
  q: Sequence[float], p: Sequence[float], k: int, max_tuples: int
) -> tuple[np.ndarray, np.ndarray, int]:
  q = np.asarray(q, np.float64)
  p = np.asarray(p, np.float64)
  k = kseq.check_num_drafts(k)
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
