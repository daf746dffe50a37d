"""Tests for speculative/sampling.py: the standardized transforms, validation, and the token-level
exactness of speculative acceptance (output ~ p for any q, including adversarial pairs)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from speculative import sampling as S

V = 6
NUM_SAMPLES = 200_000
FALSE_FAILURE_RATE = 1e-4  # per test; split over the pairs (Bonferroni)


# --------------------------------------------------------------------------------------------------
# Standardized transforms.
# --------------------------------------------------------------------------------------------------


def _probs(logits, config, **values):
  return np.asarray(
    S.probs_from_logits(jnp.asarray(logits, jnp.float32), config, S.SamplingParams.create(**values))
  )


LOGITS = np.array([[2.0, 1.0, 0.5, -1.0, 3.0, 0.0]], np.float32)


def _argmax_cases():
  rng = np.random.default_rng(0)
  rows = rng.normal(size=(6, 8000)).astype(np.float32)
  rows[1, [17, 4000, 7999]] = 9.0  # a three-way tie: the first index
  rows[2, :] = -np.inf  # all -inf: index 0
  rows[3, [5, 70]] = np.nan  # NaN counts as the maximum: the first NaN
  rows[4, 300] = np.inf
  rows[5, :] = 0.0  # all equal
  return rows


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.int32])
def test_argmax_is_jnp_argmax_on_ties_nan_and_inf(dtype):
  x = jnp.asarray(_argmax_cases() if dtype != jnp.int32 else np.arange(24) % 5, dtype)
  x = x.reshape(2, 3, -1) if dtype != jnp.int32 else x.reshape(2, 12)
  got = jax.jit(S.argmax)(x)
  assert got.dtype == jnp.int32 and got.shape == x.shape[:-1]
  np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.argmax(x, axis=-1)))


def test_argmax_lowers_to_single_operand_reductions():
  # jnp.argmax is one variadic (value, index) reduce, which XLA's CPU backend runs element by element.
  text = jax.jit(S.argmax).lower(jnp.zeros((1, 4, 8000), jnp.float32)).as_text()
  reduces = [line for line in text.splitlines() if 'stablehlo.reduce(' in line]
  assert len(reduces) == 2 and all(line.count('init:') == 1 for line in reduces), reduces


def test_greedy_is_one_hot_and_temperature_zero_is_greedy():
  expected = np.eye(V, dtype=np.float32)[[4]]
  np.testing.assert_array_equal(_probs(LOGITS, S.SamplingConfig(greedy=True)), expected)
  np.testing.assert_array_equal(_probs(LOGITS, S.SamplingConfig(), temperature=0.0), expected)


def test_temperature():
  for t in (1.0, 0.5, 2.0):
    np.testing.assert_allclose(
      _probs(LOGITS, S.SamplingConfig(), temperature=t),
      jax.nn.softmax(LOGITS / t),
      rtol=1e-6,
      atol=1e-7,
    )


def test_top_k():
  config = S.SamplingConfig(top_k=True)
  probs = _probs(LOGITS, config, top_k=3)
  kept = np.array([1, 0, 0, 0, 1, 0], bool) | np.array([0, 1, 0, 0, 0, 0], bool)
  expected = np.where(kept, np.exp(LOGITS), 0.0)
  np.testing.assert_allclose(probs, expected / expected.sum(), rtol=1e-6)
  # 0 (and k >= V) keeps everything; ties with the k-th value are kept.
  np.testing.assert_allclose(_probs(LOGITS, config, top_k=0), jax.nn.softmax(LOGITS), rtol=1e-6)
  np.testing.assert_allclose(_probs(LOGITS, config, top_k=50), jax.nn.softmax(LOGITS), rtol=1e-6)
  tied = np.array([[1.0, 2.0, 2.0, 0.0]], np.float32)
  np.testing.assert_allclose(_probs(tied, config, top_k=1), [[0, 0.5, 0.5, 0]], rtol=1e-6)


def test_top_p():
  config = S.SamplingConfig(top_p=True)
  logits = np.log(np.array([[0.1, 0.45, 0.05, 0.3, 0.1]], np.float32))
  # Sorted: 0.45, 0.3, 0.1, 0.1, 0.05. top_p=0.7 needs {0.45, 0.3}.
  np.testing.assert_allclose(_probs(logits, config, top_p=0.7), [[0, 0.6, 0, 0.4, 0]], rtol=1e-5)
  # 0.8 needs a third token; the two tied 0.1 tokens are both kept.
  np.testing.assert_allclose(
    _probs(logits, config, top_p=0.8), [[0.1, 0.45, 0, 0.3, 0.1]] / np.float32(0.95), rtol=1e-5
  )
  np.testing.assert_allclose(_probs(logits, config, top_p=0.01), [[0, 1, 0, 0, 0]])
  np.testing.assert_allclose(_probs(logits, config, top_p=1.0), np.exp(logits), rtol=1e-5)


def test_top_k_then_top_p():
  config = S.SamplingConfig(top_k=True, top_p=True)
  logits = np.log(np.array([[0.1, 0.45, 0.05, 0.3, 0.1]], np.float32))
  # top-2 leaves {0.6, 0.4}; top-p 0.5 on that keeps only the first.
  np.testing.assert_allclose(_probs(logits, config, top_k=2, top_p=0.5), [[0, 1, 0, 0, 0]])


def test_neg_inf_logits_and_invalid_rows():
  logits = np.array(
    [
      [0.0, -np.inf, 1.0, -np.inf],
      [-np.inf, -np.inf, -np.inf, -np.inf],
      [0.0, np.nan, 1.0, 2.0],
      [0.0, np.inf, 1.0, 2.0],
    ],
    np.float32,
  )
  for config, values in [
    (S.SamplingConfig(), {}),
    (S.SamplingConfig(greedy=True), {}),
    (S.SamplingConfig(top_k=True, top_p=True), dict(top_k=1, top_p=0.5)),
  ]:
    probs = _probs(logits, config, **values)
    assert np.all(np.isfinite(probs[0])) and probs[0, 1] == 0 and probs[0, 3] == 0
    assert np.all(np.isnan(probs[1:])), 'invalid rows must not look like distributions'
  np.testing.assert_allclose(
    _probs(logits[:1], S.SamplingConfig()), [[1 / (1 + np.e), 0, np.e / (1 + np.e), 0]], rtol=1e-6
  )
  np.testing.assert_array_equal(S.invalid_logits(jnp.asarray(logits)), [False, True, True, True])
  S.check_finite(logits[:1])
  with pytest.raises(ValueError, match='NaN'):
    S.check_finite(logits)


def test_tiny_temperature_does_not_overflow():
  probs = _probs(LOGITS * 1e30, S.SamplingConfig(), temperature=1e-30)
  np.testing.assert_array_equal(probs, np.eye(V, dtype=np.float32)[[4]])


def test_sampling_validation():
  with pytest.raises(ValueError, match='temperature'):
    S.SamplingParams.create(temperature=-0.5)
  with pytest.raises(ValueError, match='temperature'):
    S.SamplingParams.create(temperature=float('nan'))
  for top_p in (0.0, -0.1, 1.5):
    with pytest.raises(ValueError, match='top_p'):
      S.SamplingParams.create(top_p=top_p)
  with pytest.raises(ValueError, match='top_k'):
    S.SamplingParams.create(top_k=-1)
  with pytest.raises(ValueError, match='greedy'):
    S.SamplingConfig(greedy=True, top_k=True)
  with pytest.raises(ValueError, match='bool'):
    S.SamplingConfig(top_k=3)
  config, params = S.make_sampling(temperature=0.0)
  assert config == S.SamplingConfig(greedy=True)
  config, params = S.make_sampling(temperature=0.8, top_k=5, top_p=0.9)
  assert config == S.SamplingConfig(top_k=True, top_p=True) and int(params.top_k) == 5


def test_sample_from_probs_never_draws_zero_probability():
  probs = jnp.array([[0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 1e-30]])
  keys = jax.random.split(jax.random.key(0), 2000)
  for row in range(2):
    tokens = np.asarray(jax.vmap(S.sample_from_probs, (0, None))(keys, probs[row]))
    assert set(tokens.tolist()) <= set(np.flatnonzero(np.asarray(probs[row])).tolist())


# --------------------------------------------------------------------------------------------------
# Acceptance: deterministic cases.
# --------------------------------------------------------------------------------------------------


def _accept(x, q, p, seed=0, num_drafted=None):
  x, q, p = jnp.asarray(x, jnp.int32), jnp.asarray(q, jnp.float32), jnp.asarray(p, jnp.float32)
  keys = jax.random.split(jax.random.key(seed), x.shape[0])
  return S.speculative_accept(x, q, p, keys, num_drafted)


def test_accept_one_hot_agreement_takes_everything_and_the_bonus():
  eye = np.eye(4, dtype=np.float32)
  x = np.array([[1, 2, 3]])
  q = eye[[1, 2, 3]][None]
  p = eye[[1, 2, 3, 0]][None]
  result = _accept(x, q, p)
  assert int(result.num_accepted[0]) == 3 and int(result.next_token[0]) == 0
  np.testing.assert_array_equal(result.tokens, [[1, 2, 3, 0]])
  np.testing.assert_array_equal(result.min_mass, [[1, 1, 1]])


def test_accept_first_disagreement_gets_the_target_token():
  eye = np.eye(4, dtype=np.float32)
  x = np.array([[1, 2, 3]])
  q = eye[[1, 2, 3]][None]
  p = eye[[1, 0, 3, 3]][None]  # position 2 disagrees: residual = p there, token 0
  result = _accept(x, q, p)
  assert int(result.num_accepted[0]) == 1
  np.testing.assert_array_equal(result.tokens[:, :2], [[1, 0]])
  np.testing.assert_array_equal(result.min_mass, [[1, 0, 1]])


def test_accept_num_drafted_limits_verification():
  """Positions >= num_drafted are not verified: the row emits from p at the first of them."""
  eye = np.eye(4, dtype=np.float32)
  x = np.array([[1, 2, 3], [1, 2, 3]])
  q = np.stack([eye[[1, 2, 3]]] * 2)
  p = np.stack([eye[[1, 2, 3, 0]]] * 2)
  result = _accept(x, q, p, num_drafted=jnp.array([1, 0]))
  np.testing.assert_array_equal(result.num_accepted, [1, 0])
  np.testing.assert_array_equal(result.next_token, [2, 1])  # p at positions 2 and 1
  np.testing.assert_array_equal(result.min_mass, [[1, 0, 0], [0, 0, 0]])


def test_accept_degenerate_cases_have_no_nan():
  p = np.array([[[0.2, 0.8, 0.0, 0.0], [0.25] * 4]], np.float32)
  cases = {
    'p_equals_q': p[:, :1],
    'disjoint': np.array([[[0.0, 0.0, 0.5, 0.5]]], np.float32),
    'one_hot_q_outside_p': np.array([[[0.0, 0.0, 0.0, 1.0]]], np.float32),
    'q_zero_where_p_positive': np.array([[[1.0, 0.0, 0.0, 0.0]]], np.float32),
  }
  for name, q in cases.items():
    for seed in range(20):
      x = [[int(np.argmax(q[0, 0]))]] if name != 'p_equals_q' else [[seed % 2]]
      result = _accept(x, q, p, seed=seed)
      assert not np.isnan(np.asarray(result.min_mass)).any(), name
      assert 0 <= int(result.next_token[0]) < 4, name
      if name in ('disjoint', 'one_hot_q_outside_p'):
        assert int(result.num_accepted[0]) == 0, name
        assert int(result.next_token[0]) in (0, 1), name  # only tokens with p > 0
  np.testing.assert_allclose(_accept([[3]], cases['disjoint'], p).min_mass, [[0.0]])
  np.testing.assert_allclose(_accept([[0]], cases['p_equals_q'], p).min_mass, [[1.0]], rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# Acceptance: token-level distribution (200k samples per (p, q) pair).
# --------------------------------------------------------------------------------------------------


def _pairs():
  rng = np.random.default_rng(1234)
  eye = np.eye(V)
  uniform = np.full(V, 1.0 / V)
  pairs = []
  for concentration in (0.3, 1.0, 3.0):
    for _ in range(3):
      pairs.append((rng.dirichlet([concentration] * V), rng.dirichlet([concentration] * V)))
  p_random = rng.dirichlet([1.0] * V)
  pairs += [
    (p_random, p_random),  # p == q
    (eye[2], eye[2]),  # p == q, one-hot
    (eye[1], rng.dirichlet([1.0] * V)),  # one-hot p
    (p_random, eye[3]),  # one-hot q inside supp(p)
    (np.array([0.5, 0.5, 0, 0, 0, 0]), eye[4]),  # one-hot q outside supp(p)
    (eye[0], eye[5]),  # two different one-hots
    (np.array([0.3, 0.3, 0.4, 0, 0, 0]), np.array([0, 0, 0, 0.2, 0.3, 0.5])),  # disjoint
    (p_random, np.array([0.5, 0.5, 0, 0, 0, 0])),  # q = 0 where p > 0
    (np.array([0.2, 0.8, 0, 0, 0, 0]), p_random),  # p = 0 where q > 0
    (uniform, np.array([0.9, 0.02, 0.02, 0.02, 0.02, 0.02])),  # flat p, peaked q
    (np.array([0.9, 0.02, 0.02, 0.02, 0.02, 0.02]), uniform),  # peaked p, flat q
    (np.array([0.002, 0.998, 0, 0, 0, 0]), uniform),  # tiny target mass
    (uniform, np.array([0.001, 0.001, 0.001, 0.001, 0.001, 0.995])),  # q almost one-hot
  ]
  return [
    (
      np.asarray(p, np.float32) / np.float32(np.sum(p)),
      np.asarray(q, np.float32) / np.float32(np.sum(q)),
    )
    for p, q in pairs
  ]


PAIRS = _pairs()


@functools.partial(jax.jit, static_argnames=('num_samples', 'use_draft'))
def _speculative_samples(p, q, key, *, num_samples, use_draft=True):
  """Draws x ~ q, runs acceptance with gamma=1 and returns (emitted-token counts [V], #accepted)."""
  draft_key, accept_key = jax.random.split(key)
  draft_keys = jax.random.split(draft_key, num_samples)
  x = S.sample_rows(draft_keys, jnp.broadcast_to(q, (num_samples, V)))  # [N]
  q_block = jnp.broadcast_to(q, (num_samples, 1, V))
  # Position 2's distribution (the bonus) is irrelevant to the first emitted token; make it uniform.
  p_block = jnp.broadcast_to(jnp.stack([p, jnp.full((V,), 1.0 / V)]), (num_samples, 2, V))
  num_drafted = jnp.full((num_samples,), 1 if use_draft else 0, jnp.int32)
  result = S.speculative_accept(
    x[:, None], q_block, p_block, jax.random.split(accept_key, num_samples), num_drafted
  )
  first = result.tokens[:, 0]  # [N]
  return jnp.bincount(first, length=V), jnp.sum(result.num_accepted), result.min_mass[0, 0]


def _assert_matches(counts, p, threshold, label):
  counts = np.asarray(counts, np.int64)
  n = counts.sum()
  assert counts[p == 0].sum() == 0, f'{label}: sampled tokens with p = 0: {counts}'
  support = p > 0
  if support.sum() > 1:
    expected = n * p[support].astype(np.float64)
    statistic = np.sum((counts[support] - expected) ** 2 / expected)
    p_value = stats.chi2.sf(statistic, support.sum() - 1)
    assert p_value > threshold, (
      f'{label}: chi2={statistic:.1f} p={p_value:.2e} counts={counts} expected={expected.round()}'
    )


def test_token_level_output_matches_target_for_every_pair():
  assert len(PAIRS) >= 20
  # Two checks per pair (emitted token ~ p; acceptance rate == sum min(p, q)): Bonferroni.
  threshold = FALSE_FAILURE_RATE / (2 * len(PAIRS))
  z = stats.norm.isf(threshold / 2)
  for i, (p, q) in enumerate(PAIRS):
    counts, accepted, min_mass = _speculative_samples(
      jnp.asarray(p), jnp.asarray(q), jax.random.key(i), num_samples=NUM_SAMPLES
    )
    _assert_matches(counts, p, threshold, f'pair {i}')
    alpha = float(np.minimum(p, q).sum())
    np.testing.assert_allclose(float(min_mass), alpha, atol=1e-6)
    # #accepted ~ Binomial(N, alpha) (Corollary 3.6).
    sd = np.sqrt(NUM_SAMPLES * alpha * (1 - alpha))
    assert abs(int(accepted) - NUM_SAMPLES * alpha) <= z * sd + 1e-9, (i, int(accepted), alpha)


def test_token_level_without_draft_samples_from_target():
  """num_drafted = 0: the emitted token is a plain sample from p (the drafter had nothing)."""
  chosen = [PAIRS[0], PAIRS[13], PAIRS[16]]
  threshold = FALSE_FAILURE_RATE / len(chosen)
  for i, (p, q) in enumerate(chosen):
    counts, accepted, _ = _speculative_samples(
      jnp.asarray(p),
      jnp.asarray(q),
      jax.random.key(100 + i),
      num_samples=NUM_SAMPLES,
      use_draft=False,
    )
    assert int(accepted) == 0
    _assert_matches(counts, p, threshold, f'no-draft pair {i}')
