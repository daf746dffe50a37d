"""Tests for speculative/spectr/: k-Seq is exact (output ~ target p), rho* is valid and minimal,
its acceptance meets the paper's bounds against the OTM-k optimum (LP), and K = 1 is Leviathan.

Notation as in sampling.py: q is the DRAFT distribution, p the TARGET.

Run (repository root): .venv/bin/python -m pytest -q -p no:xdist tests/spectr/test_spectr.py
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative import analysis
from speculative import spectr

VOCAB = 6


def _pad(values) -> np.ndarray:
  out = np.zeros(VOCAB)
  out[: len(values)] = values
  return out / out.sum()


def _one_hot(i: int) -> np.ndarray:
  out = np.zeros(VOCAB)
  out[i] = 1.0
  return out


def _adversarial_pairs() -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """(draft q, target p) pairs over VOCAB tokens, including every degenerate case."""
  rng = np.random.default_rng(1234)
  random_q = rng.dirichlet(np.ones(VOCAB))
  random_p = rng.dirichlet(np.ones(VOCAB))
  close_p = 0.9 * random_q + 0.1 * rng.dirichlet(np.ones(VOCAB))
  return {
    "random": (random_q, random_p),
    "equal": (random_q, random_q.copy()),
    "near_equal": (random_q, close_p / close_p.sum()),
    "disjoint": (_pad([0.5, 0.3, 0.2]), np.array([0, 0, 0, 0.2, 0.3, 0.5])),
    "target_zero_where_draft_positive": (np.full(VOCAB, 1 / VOCAB), _pad([0.7, 0.3])),
    "draft_one_hot": (_one_hot(2), _pad([0.1, 0.2, 0.3, 0.15, 0.15, 0.1])),
    "target_one_hot": (_pad([0.1, 0.2, 0.3, 0.15, 0.15, 0.1]), _one_hot(4)),
    "same_one_hot": (_one_hot(3), _one_hot(3)),
    "different_one_hot": (_one_hot(0), _one_hot(5)),
    "uniform_draft_peaked_target": (np.full(VOCAB, 1 / VOCAB), _pad([0.9] + [0.02] * 5)),
    "draft_mode_is_target_tail": (_pad([0.9] + [0.02] * 5), _pad([0.01, 0.39, 0.3, 0.3])),
    "draft_support_inside_target": (_pad([0.5, 0.5]), _pad([0.1, 0.1, 0.2, 0.2, 0.2, 0.2])),
  }


PAIRS = _adversarial_pairs()
SAMPLED_K = (2, 4, 8)
NUM_SAMPLES = 200_000
# One false-failure budget for all sampling tests of this file, split by Bonferroni over the
# (pair, K) cases, two statistics each (output chi-square, acceptance count).
FALSE_FAILURE_RATE = 1e-4
PER_TEST_RATE = FALSE_FAILURE_RATE / (len(PAIRS) * len(SAMPLED_K) * 2)


@functools.partial(jax.jit, static_argnums=(3, 4))
def _simulate(key, q, p, k, n):
  """n independent k-Seq selections for one (q, p): token counts, acceptance count, acceptance
  probability."""
  keys = jax.random.split(key, n)
  tokens, index, prob, _ = jax.vmap(lambda kk: spectr.k_sequential_sample(kk, q, p, k))(keys)
  counts = jnp.bincount(tokens, length=q.shape[-1])  # [V]
  return counts, jnp.sum(index >= 0), prob[0], jnp.max(index)


@pytest.mark.slow
@pytest.mark.parametrize("k", SAMPLED_K)
def test_output_is_distributed_as_target(k):
  for case, (q, p) in enumerate(PAIRS.values()):
    name = list(PAIRS)[case]
    key = jax.random.fold_in(jax.random.PRNGKey(7), 100 * k + case)
    counts, num_accepted, acc_prob, max_index = _simulate(
      key, jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32), k, NUM_SAMPLES
    )
    counts = np.asarray(counts)
    assert counts.sum() == NUM_SAMPLES
    assert int(max_index) < k
    support = p > 0
    assert np.all(counts[~support] == 0), (name, k, counts)  # never a token the target rules out
    if support.sum() > 1:
      expected = NUM_SAMPLES * p[support]
      chi2 = float(np.sum((counts[support] - expected) ** 2 / expected))
      threshold = stats.chi2.isf(PER_TEST_RATE, df=support.sum() - 1)
      assert chi2 <= threshold, (name, k, chi2, threshold, counts, expected)
    # The empirical acceptance count matches 1 - (1 - beta(rho*))^k.
    a = float(acc_prob)
    accepted = int(num_accepted)
    if a <= 1e-6 or a >= 1 - 1e-6:
      assert abs(accepted - NUM_SAMPLES * a) <= NUM_SAMPLES * 1e-5 + 1, (name, k, accepted, a)
    else:
      z = stats.norm.isf(PER_TEST_RATE / 2)
      bound = z * np.sqrt(NUM_SAMPLES * a * (1 - a)) + 1.0
      assert abs(accepted - NUM_SAMPLES * a) <= bound, (name, k, accepted, a)


def _random_qairs(n: int, vocab: int, seed: int):
  rng = np.random.default_rng(seed)
  for _ in range(n):
    concentration = rng.choice([0.1, 0.5, 2.0])
    yield rng.dirichlet(np.full(vocab, concentration)), rng.dirichlet(np.full(vocab, concentration))


def test_analytic_output_distribution_is_target():
  cases = list(PAIRS.values()) + list(_random_qairs(40, VOCAB, seed=0))
  q = jnp.asarray(np.stack([c[0] for c in cases]), jnp.float32)  # [N, V]
  p = jnp.asarray(np.stack([c[1] for c in cases]), jnp.float32)

  @functools.partial(jax.jit, static_argnums=2)
  def analytic(q, p, k):
    rho = spectr.rho_star(q, p, k)  # [N]
    return (
      rho,
      spectr.k_sequential_residual(q, p, k, rho),
      spectr.k_sequential_output_distribution(q, p, k, rho),
    )

  for k in (1, 2, 3, 4, 8, 16):
    rho, residual, out = analytic(q, p, k)
    for array in (rho, residual, out):
      assert bool(jnp.all(jnp.isfinite(array)))
    assert bool(jnp.all(residual >= 0))
    np.testing.assert_allclose(np.asarray(residual).sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out), np.asarray(p), atol=2e-6)


def test_rho_star_is_valid_minimal_and_in_range():
  cases = list(PAIRS.values()) + list(_random_qairs(40, VOCAB, seed=1))
  q = np.stack([c[0] for c in cases])
  p = np.stack([c[1] for c in cases])
  for k in (1, 2, 4, 8):
    rho = np.asarray(spectr.rho_star(q, p, k), np.float64)
    assert np.all(rho >= 1.0) and np.all(rho <= k)
    b = np.asarray(spectr.beta(rho, q, p), np.float64)
    acceptance = np.asarray(spectr.acceptance_probability(rho, q, p, k), np.float64)
    # Valid: f(rho*) = rho beta(rho) - (1 - (1 - beta)^k) >= 0 (up to float32 rounding).
    assert np.all(rho * b - acceptance >= -1e-5)
    # Minimal: a slightly smaller rho is invalid wherever rho* > 1.
    inner = rho > 1.0 + 1e-3
    smaller = rho - 1e-3
    b_smaller = np.asarray(spectr.beta(smaller, q, p), np.float64)
    f_smaller = smaller * b_smaller - (1 - (1 - b_smaller) ** k)
    assert np.all(f_smaller[inner] < 0)
    # At an interior root the acceptance is sum_x min(rho* q, p) >= sum_x min(q, p) (K = 1).
    np.testing.assert_allclose(
      acceptance[inner], np.minimum(rho[:, None] * q, p).sum(-1)[inner], atol=1e-4
    )
    assert np.all(acceptance >= np.minimum(q, p).sum(-1) - 1e-6)
  # Edge cases: K = 1, q == p and disjoint supports all give rho* = 1 exactly.
  for name in ("equal", "same_one_hot", "disjoint", "different_one_hot"):
    q_case, p_case = PAIRS[name]
    for k in (1, 3, 8):
      assert float(spectr.rho_star(q_case, p_case, k)) == 1.0, (name, k)
  assert float(spectr.acceptance_probability(1.0, *PAIRS["disjoint"], 8)) == 0.0
  assert float(spectr.acceptance_probability(1.0, *PAIRS["same_one_hot"], 8)) == 1.0


def test_lp_and_min_cut_agree():
  for k in (1, 2, 3):
    for q, p in _random_qairs(6, 4, seed=10 + k):
      assert spectr.otm_k_acceptance_lp(q, p, k) == pytest.approx(
        spectr.otm_k_acceptance_mincut(q, p, k), abs=1e-7
      )
  # K = 1: the optimum is the maximal coupling, 1 - TV = sum_x min(q, p).
  for q, p in _random_qairs(4, 4, seed=3):
    assert spectr.otm_k_acceptance_lp(q, p, 1) == pytest.approx(np.minimum(q, p).sum(), abs=1e-7)


def _kseq_acceptance(cases, k: int) -> np.ndarray:
  """k-Seq acceptance at rho* for a list of (q, p) pairs, computed in one batched call."""
  q = np.stack([c[0] for c in cases])  # [N, V]
  p = np.stack([c[1] for c in cases])
  return np.asarray(spectr.acceptance_probability(spectr.rho_star(q, p, k), q, p, k), np.float64)


def test_acceptance_bounds_against_otm_optimum():
  small = [
    (q[:4] / q[:4].sum(), p[:4] / p[:4].sum())
    for q, p in PAIRS.values()
    if q[:4].sum() > 0 and p[:4].sum() > 0
  ]
  checks = [
    (k, small + list(_random_qairs(15, 4, seed=20 + k)), spectr.otm_k_acceptance_lp) for k in (2, 3)
  ]
  # Larger K on the full vocabulary, against the closed-form (min-cut) optimum.
  checks += [
    (
      k,
      list(PAIRS.values()) + list(_random_qairs(15, VOCAB, seed=30 + k)),
      spectr.otm_k_acceptance_mincut,
    )
    for k in (4, 8)
  ]
  for k, cases, solver in checks:
    acceptance = _kseq_acceptance(cases, k)  # [N]
    for (q, p), accept in zip(cases, acceptance):
      optimum = solver(q, p, k)
      assert accept <= optimum + 1e-5  # k-Seq is one feasible coupling
      assert accept >= (1 - (1 - 1 / k) ** k) * optimum - 1e-5, (q, p, k)
      assert accept >= np.minimum(q, p).sum() - 1e-6  # never worse than one draft


def test_k1_is_leviathan():
  """K = 1 makes the same accept/reject decisions as `u * q(x) <= p(x)` and
  samples the same residual norm(max(0, p - q))."""
  batch = 4096
  rng = np.random.default_rng(5)
  q = rng.dirichlet(np.full(VOCAB, 0.5), size=batch)  # [B, V] draft
  p = rng.dirichlet(np.full(VOCAB, 0.5), size=batch)  # [B, V] target
  drafts = np.array([rng.choice(VOCAB, p=row) for row in q])[:, None]  # [B, 1]
  u = rng.uniform(1e-7, 1.0, size=(batch, 1))  # open interval: see k_sequential_select
  residual_u = rng.uniform(size=batch)
  select = jax.jit(spectr.k_sequential_select)
  token, index, prob = select(q, p, drafts, u, residual_u)
  q32 = np.asarray(q, np.float32)
  p32 = np.asarray(p, np.float32)
  leviathan_accept = (
    np.float32(u[:, 0]) * np.take_along_axis(q32, drafts, -1)[:, 0]
    <= np.take_along_axis(p32, drafts, -1)[:, 0]
  )
  np.testing.assert_array_equal(np.asarray(index) == 0, leviathan_accept)
  assert set(np.unique(np.asarray(index))) <= {-1, 0}
  np.testing.assert_array_equal(np.asarray(token)[leviathan_accept], drafts[leviathan_accept, 0])
  np.testing.assert_allclose(np.asarray(prob), np.minimum(q32, p32).sum(-1), atol=1e-6)
  leviathan_residual = np.maximum(p - q, 0.0)
  leviathan_residual /= leviathan_residual.sum(-1, keepdims=True)
  np.testing.assert_allclose(
    np.asarray(spectr.k_sequential_residual(q, p, 1, np.ones(batch))), leviathan_residual, atol=1e-5
  )


def test_batched_jit_select_matches_rows_and_never_emits_target_zero():
  names = list(PAIRS)
  q = jnp.asarray(np.stack([PAIRS[n][0] for n in names]), jnp.float32)  # [N, V]
  p = jnp.asarray(np.stack([PAIRS[n][1] for n in names]), jnp.float32)
  k = 4

  @jax.jit  # the draws in one program, not one per op
  def draws(key, q):
    drafts = jax.random.categorical(key, jnp.log(q)[:, None, :], shape=(len(names), k))  # [N, K]
    u = jax.random.uniform(jax.random.fold_in(key, 1), (len(names), k))
    u = u.at[:, 0].set(0.0)  # u == 0 must still reject a draft the target gives 0 probability
    ru = jax.random.uniform(jax.random.fold_in(key, 2), (len(names),))
    return drafts, u, ru

  drafts, u, ru = draws(jax.random.PRNGKey(3), q)
  select = jax.jit(spectr.k_sequential_select)
  token, index, prob = select(q, p, drafts, u, ru)
  # The rows are sliced on the host: a jax array sliced op by op compiles a program per row.
  q, p, drafts, u, ru, token, index, prob = jax.device_get(
    (q, p, drafts, u, ru, token, index, prob)
  )
  for i in range(len(names)):
    row = select(q[i : i + 1], p[i : i + 1], drafts[i : i + 1], u[i : i + 1], ru[i : i + 1])
    assert (int(row[0][0]), int(row[1][0])) == (int(token[i]), int(index[i]))
    np.testing.assert_allclose(float(row[2][0]), float(prob[i]), rtol=1e-6)
    assert float(p[i, token[i]]) > 0.0, names[i]
    if int(index[i]) >= 0:
      assert int(token[i]) == int(drafts[i, index[i]])


def test_bad_inputs_raise_value_errors():
  q, p = PAIRS["random"]
  with pytest.raises(ValueError, match="same shape"):
    spectr.rho_star(q, p[:4], 2)
  with pytest.raises(ValueError, match="K must be"):
    spectr.rho_star(q, p, 0)
  with pytest.raises(ValueError, match="draft_tokens"):
    spectr.k_sequential_select(
      q[None], p[None], np.zeros((2, 3), np.int32), np.zeros((2, 3)), np.zeros(2)
    )
  with pytest.raises(ValueError, match="exceed"):
    spectr.otm_k_acceptance_lp(np.full(10, 0.1), np.full(10, 0.1), 5)
  with pytest.raises(ValueError, match="probability vector"):
    spectr.otm_k_acceptance_lp([0.5, 0.6], [0.5, 0.5], 2)


def test_beta_matches_analysis_alpha_at_rho_one():
  q, p = PAIRS["random"]
  np.testing.assert_allclose(
    float(spectr.beta(1.0, q, p)), analysis.alpha_from_distributions(q, p), rtol=1e-6
  )
