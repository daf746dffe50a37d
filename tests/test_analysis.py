"""Tests for speculative/analysis.py: the paper's own numbers, identities, optimal gamma, lenience.

Run (repository root): .venv/bin/python -m pytest -q -p no:xdist tests/test_analysis.py
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative import analysis

# Every sampling test here shares one false-failure budget of 1e-4 (Bonferroni over the tests).
FALSE_FAILURE_RATE = 1e-4
NUM_STATISTICAL_TESTS = 8  # lenience: 4 lenience values x (acceptance rate, output distribution)
PER_TEST_RATE = FALSE_FAILURE_RATE / NUM_STATISTICAL_TESTS


def test_table1_speed_and_operations_assume_free_draft():
  # Table 1 (c = c_hat = 0): alpha = 0.8, gamma = 5 -> operations 1.63X, speed 3.69X.
  assert round(float(analysis.walltime_improvement(0.8, 5, 0.0)), 2) == 3.69
  assert round(float(analysis.expected_tokens(0.8, 5)), 2) == 3.69
  assert round(float(analysis.operations_factor(0.8, 5, 0.0)), 2) == 1.63


def test_table4_exp_column():
  # Table 4, EXP column: alpha = 0.75, gamma = 7, c = 0.02 -> 3.2X (Theorem 3.8).
  assert round(float(analysis.walltime_improvement(0.75, 7, 0.02)), 1) == 3.2


def test_expected_tokens_matches_closed_form_and_limits():
  alphas = np.linspace(0.0, 0.999, 37)
  for gamma in (0, 1, 3, 7, 12):
    closed = (1.0 - alphas ** (gamma + 1)) / (1.0 - alphas)
    np.testing.assert_allclose(analysis.expected_tokens(alphas, gamma), closed, rtol=1e-12)
    assert analysis.expected_tokens(1.0, gamma) == gamma + 1
    assert analysis.expected_tokens(0.0, gamma) == 1.0
  # Integer-array gamma broadcasts against alpha.
  got = analysis.expected_tokens(np.array([[0.5], [0.9]]), np.array([1, 2, 5]))
  want = np.array([[analysis.expected_tokens(a, g) for g in (1, 2, 5)] for a in (0.5, 0.9)])
  np.testing.assert_allclose(got, want, rtol=1e-12)


def test_formulas_trace_under_jit():
  fn = jax.jit(lambda a: analysis.walltime_improvement(a, 4, 0.1, 1.3))
  got = fn(jnp.float32(0.7))
  want = analysis.walltime_improvement(0.7, 4, 0.1, 1.3)
  np.testing.assert_allclose(float(got), want, rtol=1e-6)


def test_theorem_3_8_and_3_11_written_forms():
  for alpha in (0.1, 0.5, 0.62, 0.9):
    for gamma in (1, 3, 7):
      for c in (0.0, 0.02, 0.3):
        thm38 = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
        np.testing.assert_allclose(
          analysis.walltime_improvement(alpha, gamma, c), thm38, rtol=1e-12
        )
        thm311 = (1 - alpha) * (gamma * c + gamma + 1) / (1 - alpha ** (gamma + 1))
        np.testing.assert_allclose(analysis.operations_factor(alpha, gamma, c), thm311, rtol=1e-12)


def test_corollary_3_9():
  for alpha in (0.2, 0.5, 0.8, 0.95):
    for c in (0.0, 0.05, 0.15):
      bound = analysis.min_improvement(alpha, c)
      np.testing.assert_allclose(analysis.walltime_improvement(alpha, 1, c), bound, rtol=1e-12)
      best = analysis.optimal_gamma(alpha, c, max_gamma=40)
      assert analysis.walltime_improvement(alpha, best, c) >= bound - 1e-12
      if alpha > c:
        assert bound > 1.0


def test_optimal_gamma_is_the_integer_argmax():
  gammas = np.arange(1, 41)
  for alpha in (0.3, 0.6, 0.8, 0.9, 0.97):
    for c in (0.0, 0.01, 0.05, 0.2):
      brute = gammas[np.argmax([analysis.walltime_improvement(alpha, g, c) for g in gammas])]
      assert analysis.optimal_gamma(alpha, c, max_gamma=40) == brute
  # Sanity: better drafts and cheaper drafts speculate further.
  assert analysis.optimal_gamma(0.9, 0.02) > analysis.optimal_gamma(0.6, 0.02)
  assert analysis.optimal_gamma(0.8, 0.01) >= analysis.optimal_gamma(0.8, 0.2)
  # A free, perfect-ish draft goes to the end of the range; c = 0 never prefers a shorter gamma.
  assert analysis.optimal_gamma(0.999, 0.0, max_gamma=20) == 20
  # Batched alpha gives an int array of the same shape.
  batched = analysis.optimal_gamma(np.array([0.6, 0.9]), 0.02)
  assert batched.shape == (2,) and list(batched) == [
    analysis.optimal_gamma(0.6, 0.02),
    analysis.optimal_gamma(0.9, 0.02),
  ]


def test_optimal_gamma_with_measured_verify_cost():
  # A verify cost that grows with T (as on this CPU) shortens the best gamma.
  free_verify = analysis.optimal_gamma(0.8, 0.05)
  costly = analysis.verify_cost_fn({8: 2.1})  # docs/design.md section 8: small target, v(8) ~ 2.1
  assert costly(1) == 1.0 and costly(8) == pytest.approx(2.1)
  assert costly(4) == pytest.approx(1.0 + 3 * 1.1 / 7)
  assert costly(15) == pytest.approx(2.1 + 7 * 1.1 / 7)  # linear extension past the last point
  # A falling last segment (timing noise) is extended flat, never to a negative cost.
  noisy = analysis.verify_cost_fn({7: 8.0, 8: 2.6})
  assert noisy(9) == pytest.approx(2.6) and noisy(30) == pytest.approx(2.6)
  assert analysis.optimal_gamma(0.8, 0.05, v=costly) < free_verify
  np.testing.assert_allclose(
    analysis.walltime_improvement(0.8, 7, 0.05, costly),
    analysis.expected_tokens(0.8, 7) / (7 * 0.05 + 2.1),
    rtol=1e-12,
  )


def test_alpha_from_distributions_batched():
  rng = np.random.default_rng(0)
  p = rng.dirichlet(np.ones(7), size=(2, 3))  # [2, 3, 7]
  q = rng.dirichlet(np.ones(7), size=(2, 3))
  alpha = analysis.alpha_from_distributions(p, q)
  assert alpha.shape == (2, 3)
  np.testing.assert_allclose(alpha, 1.0 - 0.5 * np.abs(p - q).sum(-1), rtol=1e-12)
  np.testing.assert_allclose(analysis.alpha_from_distributions(p, p), 1.0)
  assert analysis.alpha_from_distributions(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == 0.0
  with pytest.raises(ValueError, match="same shape"):
    analysis.alpha_from_distributions(p, q[..., :5])


LENIENCE_P = np.array([0.35, 0.25, 0.2, 0.1, 0.1, 0.0])  # target
LENIENCE_Q = np.array([0.1, 0.05, 0.3, 0.3, 0.05, 0.2])  # draft


def _simulate_lenient(p, q, lenience, n, seed):
  """Appendix A.5 rule by direct simulation: x ~ q, accept iff r l q(x) <= p(x), else the
  correction ~ norm(max(0, p - l q))."""
  rng = np.random.default_rng(seed)
  drafts = rng.choice(len(q), size=n, p=q)
  r = rng.random(n)
  accepted = r * lenience * q[drafts] <= p[drafts]
  residual = np.maximum(p - lenience * q, 0.0)
  residual = residual / residual.sum() if residual.sum() > 0 else p
  corrections = rng.choice(len(p), size=n, p=residual)
  return accepted, np.where(accepted, drafts, corrections)


@pytest.mark.parametrize("lenience", [0.0, 0.3, 0.7, 1.0])
def test_lenience_monte_carlo(lenience):
  n = 200_000
  accepted, tokens = _simulate_lenient(LENIENCE_P, LENIENCE_Q, lenience, n, seed=int(lenience * 10))
  alpha_l = float(analysis.lenient_alpha(LENIENCE_P, LENIENCE_Q, lenience))
  # Acceptance count: binomial, two-sided bound at the per-test false-failure rate.
  z = stats.norm.isf(PER_TEST_RATE / 2)
  assert abs(accepted.sum() - n * alpha_l) <= z * np.sqrt(n * alpha_l * (1 - alpha_l)) + 1.0
  # Output distribution: chi-square on categories with positive predicted mass; zero-mass ones
  # must never occur.
  predicted = analysis.lenient_output_distribution(LENIENCE_P, LENIENCE_Q, lenience)
  counts = np.bincount(tokens, minlength=len(LENIENCE_P))
  support = predicted > 0
  assert np.all(counts[~support] == 0)
  expected = n * predicted[support]
  chi2 = float(np.sum((counts[support] - expected) ** 2 / expected))
  assert chi2 <= stats.chi2.isf(PER_TEST_RATE, df=support.sum() - 1), (chi2, counts, expected)


def test_lenience_limits():
  p, q = LENIENCE_P, LENIENCE_Q
  np.testing.assert_allclose(
    analysis.lenient_alpha(p, q, 1.0), analysis.alpha_from_distributions(p, q), rtol=1e-12
  )
  assert analysis.lenient_alpha(p, q, 0.0) == 1.0
  values = analysis.lenient_alpha(p, q, np.linspace(0.0, 1.0, 11))
  assert np.all(np.diff(values) <= 1e-12)  # more lenient (smaller l) accepts more
  # l = 1 is exact: the output distribution is the target p.
  np.testing.assert_allclose(analysis.lenient_output_distribution(p, q, 1.0), p, atol=1e-12)
  # l = 0 accepts every draft: the output is the draft q.
  np.testing.assert_allclose(analysis.lenient_output_distribution(p, q, 0.0), q, atol=1e-12)
  with pytest.raises(ValueError, match="lenience"):
    analysis.lenient_alpha(p, q, 1.5)


def test_speedup_row_from_metrics():
  metrics = dict(
    name="small",
    gamma=4,
    generated_tokens=300,
    target_calls=100,
    drafted_tokens=400,
    accepted_tokens=220,
    alpha=0.7,
    c=0.05,
    v=1.2,
    baseline_walltime=3.0,
    speculative_walltime=1.5,
  )
  row = analysis.speedup_row(metrics)
  assert row["block_efficiency"] == 3.0
  assert row["acceptance_rate"] == 0.55
  assert row["alpha_used"] == 0.7 and row["alpha_source"] == "distributions"
  assert row["predicted_speedup"] == pytest.approx(
    analysis.expected_tokens(0.7, 4) / (4 * 0.05 + 1.2)
  )
  assert row["measured_speedup"] == 2.0
  assert analysis.expected_tokens(row["alpha_from_block_efficiency"], 4) == pytest.approx(3.0)
  assert row["name"] == "small"
  # Without 'alpha' the empirical acceptance rate is used; without times no speedups appear.
  bare = analysis.speedup_row(
    {
      k: metrics[k]
      for k in ("gamma", "generated_tokens", "target_calls", "drafted_tokens", "accepted_tokens")
    }
  )
  assert bare["alpha_source"] == "acceptance_rate" and "predicted_speedup" not in bare
  assert "measured_speedup" not in bare
  with pytest.raises(ValueError, match="target_calls"):
    analysis.speedup_row({k: v for k, v in metrics.items() if k != "target_calls"})


def test_alpha_from_block_efficiency_inverts_eq1():
  alphas = np.array([0.0, 0.2, 0.55, 0.9, 1.0])
  np.testing.assert_allclose(
    analysis.alpha_from_block_efficiency(analysis.expected_tokens(alphas, 5), 5), alphas, atol=1e-9
  )


def test_bad_inputs_raise_value_errors():
  with pytest.raises(ValueError, match="alpha"):
    analysis.expected_tokens(1.2, 3)
  with pytest.raises(ValueError, match="gamma"):
    analysis.expected_tokens(0.5, -1)
  with pytest.raises(ValueError, match="gamma"):
    analysis.expected_tokens(0.5, 2.5)
  with pytest.raises(ValueError, match="c must be"):
    analysis.walltime_improvement(0.5, 3, -0.1)
  with pytest.raises(ValueError, match="min_gamma"):
    analysis.optimal_gamma(0.5, 0.1, max_gamma=0)
