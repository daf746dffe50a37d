"""Tests for lenience (paper Appendix A.5) in sampling.py and its plumbing in decoding.py.

Properties: l = 1 is the exact rule bit for bit (acceptance and decode loop); the sampling form's
acceptance rate and emitted-token distribution are `analysis.lenient_alpha` /
`analysis.lenient_output_distribution` on fixed (p, q) (Monte Carlo), so no token is emitted with
probability above p(x)/l; the argmax form accepts exactly the tokens with p(x) >= l max p (target
softmax at temperature 1) and every token a greedy lenient decode emits satisfies it; alpha grows as
l shrinks; a new lenience value does not recompile; bad values raise clear errors.
"""

import contextlib
import functools

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest
from scipy import stats

from speculative import analysis
from speculative import drafters
from speculative import sampling as S
from speculative.decode import loops as decoding
from speculative.decode import state as decode_state
from speculative.models.decoder_only import DecoderOnlyConfig
from speculative.models.decoder_only import DecoderOnlyLM

FALSE_FAILURE_RATE = 1e-4  # per test
V = 6
NUM_SAMPLES = 100_000


def _pairs():
  rng = np.random.default_rng(99)
  eye = np.eye(V)
  pairs = [(rng.dirichlet([c] * V), rng.dirichlet([c] * V)) for c in (0.3, 1.0, 3.0)]
  pairs += [
    (np.array([0.9, 0.02, 0.02, 0.02, 0.02, 0.02]), np.full(V, 1 / V)),  # peaked p, flat q
    (np.full(V, 1 / V), np.array([0.001, 0.001, 0.001, 0.001, 0.001, 0.995])),  # q ~ one-hot
    (np.array([0.5, 0.5, 0, 0, 0, 0]), eye[4]),  # q outside supp(p)
    (np.array([0.3, 0.3, 0.4, 0, 0, 0]), np.array([0, 0, 0.2, 0.3, 0.3, 0.2])),  # overlap 0.2
  ]
  return [
    (
      np.asarray(p, np.float32) / np.float32(p.sum()),
      np.asarray(q, np.float32) / np.float32(q.sum()),
    )
    for p, q in pairs
  ]


PAIRS = _pairs()


@functools.partial(jax.jit, static_argnames=('num_samples',))
def _lenient_samples(p, q, key, lenience, *, num_samples):
  """x ~ q, lenient acceptance with gamma=1: (emitted-token counts [V], #accepted, min_mass)."""
  draft_key, accept_key = jax.random.split(key)
  x = S.sample_rows(jax.random.split(draft_key, num_samples), jnp.broadcast_to(q, (num_samples, V)))
  q_block = jnp.broadcast_to(q, (num_samples, 1, V))
  p_block = jnp.broadcast_to(jnp.stack([p, jnp.full((V,), 1.0 / V)]), (num_samples, 2, V))
  result = S.speculative_accept(
    x[:, None], q_block, p_block, jax.random.split(accept_key, num_samples), lenience=lenience
  )
  return (
    jnp.bincount(result.tokens[:, 0], length=V),
    jnp.sum(result.num_accepted),
    result.min_mass[0, 0],
  )


# --------------------------------------------------------------------------------------------------
# The acceptance rule.
# --------------------------------------------------------------------------------------------------


def test_lenience_one_is_bit_identical_to_the_exact_rule():
  rng = np.random.default_rng(0)
  batch, gamma = 256, 4
  p = jnp.asarray(rng.dirichlet([0.5] * V, (batch, gamma + 1)), jnp.float32)
  q = jnp.asarray(rng.dirichlet([0.5] * V, (batch, gamma)), jnp.float32)
  x = jnp.asarray(rng.integers(0, V, (batch, gamma)), jnp.int32)
  num_drafted = jnp.asarray(rng.integers(0, gamma + 1, batch), jnp.int32)
  keys = jax.random.split(jax.random.key(4), batch)
  logits = jnp.asarray(rng.normal(size=(batch, gamma, V)), jnp.float32)
  exact = S.speculative_accept(x, q, p, keys, num_drafted)
  lenient_accepts = S.lenient_argmax_accept(logits, x, 1.0)
  assert not np.asarray(lenient_accepts).any()
  one = S.speculative_accept(
    x, q, p, keys, num_drafted, lenience=jnp.float32(1.0), lenient_accepts=lenient_accepts
  )
  for a, b in zip(jax.tree.leaves(exact), jax.tree.leaves(one)):
    np.testing.assert_array_equal(a, b)


def test_lenient_sampling_matches_analysis():
  lenience_values = (0.5, 0.1)
  checks = len(PAIRS) * len(lenience_values) * 2  # token distribution + acceptance count
  threshold = FALSE_FAILURE_RATE / checks
  z = stats.norm.isf(threshold / 2)
  for i, (p, q) in enumerate(PAIRS):
    for lenience in lenience_values:
      counts, accepted, min_mass = _lenient_samples(
        jnp.asarray(p),
        jnp.asarray(q),
        jax.random.key(10 * i + int(lenience * 10)),
        jnp.float32(lenience),
        num_samples=NUM_SAMPLES,
      )
      alpha = float(analysis.lenient_alpha(p.astype(np.float64), q.astype(np.float64), lenience))
      alpha = min(alpha, 1.0)  # float32 inputs may sum to 1 + 1e-8
      np.testing.assert_allclose(float(min_mass), alpha, atol=1e-5)
      sd = np.sqrt(NUM_SAMPLES * alpha * (1 - alpha))
      assert abs(int(accepted) - NUM_SAMPLES * alpha) <= z * sd + 1e-9, (i, lenience, alpha)
      expected = analysis.lenient_output_distribution(p, q, lenience)
      # The documented guarantee: no token above p(x)/l; tokens with p = 0 never emitted.
      assert np.all(expected <= p / lenience + 1e-6), (i, lenience)
      counts = np.asarray(counts, np.int64)
      assert counts[p == 0].sum() == 0
      support = expected > 0
      if support.sum() > 1:
        statistic = np.sum(
          (counts[support] - NUM_SAMPLES * expected[support]) ** 2
          / (NUM_SAMPLES * expected[support])
        )
        p_value = stats.chi2.sf(statistic, support.sum() - 1)
        assert p_value > threshold, (i, lenience, counts, (NUM_SAMPLES * expected).round())


def test_argmax_form_accepts_exactly_the_tokens_within_l_of_the_max():
  rng = np.random.default_rng(1)
  logits = rng.normal(scale=2.0, size=(64, 5, V)).astype(np.float32)
  logits[0, 0, 3] = -np.inf
  x = rng.integers(0, V, (64, 5)).astype(np.int32)
  x[0, 0] = 3
  probs = np.exp(logits.astype(np.float64) - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  ratio = np.take_along_axis(probs, x[..., None], -1)[..., 0] / probs.max(-1)
  for lenience in (1.0, 0.5, 0.1, 0.01):
    got = np.asarray(S.lenient_argmax_accept(jnp.asarray(logits), jnp.asarray(x), lenience))
    expected = (ratio >= lenience) & (lenience < 1)
    clear = np.abs(ratio - lenience) > 1e-5  # skip float ties at the boundary
    np.testing.assert_array_equal(got[clear], expected[clear])
    assert not got[0, 0]  # p(x) = 0 is never accepted
  # In the acceptance step under argmax: a leniently accepted draft is kept; the first position that
  # is neither the argmax nor lenient gets the target's argmax.
  p = jax.nn.one_hot(jnp.array([[1, 2, 3]]), V)  # standardized (one-hot) target, [1, 3, V]
  q = jax.nn.one_hot(jnp.array([[5, 2]]), V)
  result = S.speculative_accept(
    jnp.array([[5, 2]]),
    q,
    p,
    jax.random.split(jax.random.key(0), 1),
    lenience=0.5,
    lenient_accepts=jnp.array([[True, False]]),
  )
  np.testing.assert_array_equal(result.tokens, [[5, 2, 3]])
  np.testing.assert_allclose(result.min_mass, [[1.0, 1.0]])
  result = S.speculative_accept(
    jnp.array([[5, 4]]),
    jax.nn.one_hot(jnp.array([[5, 4]]), V),
    p,
    jax.random.split(jax.random.key(0), 1),
    lenience=0.5,
    lenient_accepts=jnp.array([[True, False]]),
  )
  np.testing.assert_array_equal(result.tokens[0, :2], [5, 2])  # the correction is the argmax
  np.testing.assert_allclose(result.min_mass, [[1.0, 0.0]])


# --------------------------------------------------------------------------------------------------
# In the decode loop.
# --------------------------------------------------------------------------------------------------


_random_params = model_utils.random_params


LM_VOCAB = 8
TARGET = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=LM_VOCAB, d_model=32, d_ff=64, num_layers=2, num_heads=4)
)
DRAFT = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=LM_VOCAB, d_model=16, d_ff=32, num_layers=1, num_heads=2)
)
TARGET_PARAMS = _random_params(TARGET, 0, logit_scale=1.5)
DRAFT_PARAMS = _random_params(DRAFT, 1)
FILTERS = S.SamplingConfig(top_k=True, top_p=True)  # argmax via a run-time temperature of 0
_rng = np.random.default_rng(3)
PROMPTS = jnp.asarray(_rng.integers(0, LM_VOCAB, (64, 5)), jnp.int32)
PROMPT_LENGTHS = jnp.asarray(_rng.integers(1, 6, 64), jnp.int32)
NEW, GAMMA = 8, 3


def _decode(temperature, lenience, rng=0):
  return decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    drafters.ModelDrafter(DRAFT),
    DRAFT_PARAMS,
    PROMPTS,
    PROMPT_LENGTHS,
    gamma=GAMMA,
    max_new_tokens=NEW,
    sampling=FILTERS,
    sampling_params=S.SamplingParams.create(temperature=temperature),
    rng=rng,
    lenience=lenience,
  )


def _alpha(result):
  metrics = jax.tree.map(np.asarray, result.metrics)
  return metrics.alpha_sum.sum() / metrics.drafted.sum()


@pytest.mark.slow
def test_decode_with_lenience_one_is_exact_and_new_values_do_not_recompile():
  for temperature in (0.0, 1.0):
    exact = _decode(temperature, None)
    one = _decode(temperature, 1.0)
    np.testing.assert_array_equal(exact.tokens, one.tokens)
    np.testing.assert_array_equal(exact.lengths, one.lengths)
    for field in ('target_calls', 'drafted', 'accepted'):
      np.testing.assert_array_equal(getattr(exact.metrics, field), getattr(one.metrics, field))
    # The same sums in two compiled programs may round differently in the last bit.
    np.testing.assert_allclose(exact.metrics.alpha_sum, one.metrics.alpha_sum, rtol=1e-6)
  counts = dict(decode_state.TRACE_COUNTS)
  for lenience in (0.5, 0.1):
    with pytest.warns(UserWarning, match='APPROXIMATE'):
      _decode(1.0, lenience)
    with pytest.warns(UserWarning, match='APPROXIMATE'):
      _decode(0.0, jnp.float32(lenience))
  assert dict(decode_state.TRACE_COUNTS) == counts


@pytest.mark.slow
def test_greedy_lenience_guarantee_and_alpha_grows_as_l_shrinks():
  baseline = decoding.autoregressive_decode(
    TARGET,
    TARGET_PARAMS,
    PROMPTS,
    PROMPT_LENGTHS,
    max_new_tokens=NEW,
    sampling=FILTERS,
    sampling_params=S.SamplingParams.create(temperature=0.0),
  )
  alphas = []
  forward = jax.jit(TARGET.forward)
  for lenience in (1.0, 0.5, 0.1):
    approximate = pytest.warns(UserWarning, match=f'lenience {lenience} < 1: APPROXIMATE')
    with approximate if lenience < 1 else contextlib.nullcontext():
      result = _decode(0.0, lenience)
    alphas.append(_alpha(result))
    tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
    if lenience == 1.0:
      np.testing.assert_array_equal(tokens, baseline.tokens)
    streams = np.asarray(
      drafters.write_rows(
        jnp.zeros((64, 5 + NEW), jnp.int32).at[:, :5].set(PROMPTS),
        jnp.asarray(tokens),
        PROMPT_LENGTHS,
      )
    )
    probs = np.asarray(jax.nn.softmax(forward(TARGET_PARAMS, jnp.asarray(streams)), -1))
    for row in range(64):
      start = int(PROMPT_LENGTHS[row]) - 1
      dist = probs[row, start : start + int(lengths[row])]  # [length, V]: predicts each token
      emitted = dist[np.arange(len(dist)), tokens[row, : lengths[row]]]
      # Every emitted token is within a factor 1/l of the target's argmax probability.
      assert np.all(emitted >= lenience * dist.max(-1) - 1e-5), (lenience, row)
    if lenience == 0.1:
      assert (tokens != np.asarray(baseline.tokens)).any()  # the output did change
  assert alphas[0] < alphas[1] <= alphas[2], alphas


@pytest.mark.slow
def test_first_emitted_token_in_the_loop_follows_the_lenient_distribution():
  """gamma=1, one new token: P(first token) = lenient_output_distribution(p_1, q_1, l)."""
  num, lenience = 40_000, 0.3
  prompt = jnp.tile(jnp.array([[3, 1, 4]], jnp.int32), (num, 1))
  with pytest.warns(UserWarning, match='APPROXIMATE'):
    result = decoding.speculative_decode(
      TARGET,
      TARGET_PARAMS,
      drafters.ModelDrafter(DRAFT),
      DRAFT_PARAMS,
      prompt,
      gamma=1,
      max_new_tokens=1,
      sampling=FILTERS,
      sampling_params=S.SamplingParams.create(),
      rng=5,
      lenience=lenience,
    )
  p = np.asarray(jax.nn.softmax(TARGET.forward(TARGET_PARAMS, prompt[:1])[0, -1]), np.float64)
  q = np.asarray(jax.nn.softmax(DRAFT.forward(DRAFT_PARAMS, prompt[:1])[0, -1]), np.float64)
  expected = analysis.lenient_output_distribution(p, q, lenience)
  assert np.abs(expected - p).max() > 0.01  # lenience matters for this (p, q)
  counts = np.bincount(np.asarray(result.tokens[:, 0]), minlength=LM_VOCAB)
  statistic = np.sum((counts - num * expected) ** 2 / (num * expected))
  p_value = stats.chi2.sf(statistic, LM_VOCAB - 1)
  assert p_value > FALSE_FAILURE_RATE, (counts, (num * expected).round())
  metrics = jax.tree.map(np.asarray, result.metrics)
  np.testing.assert_allclose(
    metrics.alpha_sum.mean(), analysis.lenient_alpha(p, q, lenience), atol=1e-4
  )


def test_bad_lenience_raises():
  for bad in (0.0, -0.5, 1.5, float('nan'), [0.5, 0.5]):
    with pytest.raises(ValueError, match='lenience'):
      _decode(1.0, bad)
  with pytest.raises(ValueError, match='lenience'):
    S.check_lenience(2.0)
