"""Speculative decoding with T5 encoder-decoder pairs: greedy identity and the exact distribution."""

import dataclasses

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import drafters
from speculative import sampling as S
from speculative.decode import loops as decoding
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config

FALSE_FAILURE_RATE = 1e-4


def _config(vocab, d, layers):
  return T5Config(
    vocab_size=vocab,
    emb_dim=d,
    num_heads=2,
    num_encoder_layers=layers,
    num_decoder_layers=layers,
    head_dim=d // 2,
    mlp_dim=2 * d,
  )


# Greedy identity: vocab 64, 8 different source sentences, no EOS (every row runs to the end). The
# draft is the target without its second decoder layer (the same other weights), so it agrees with
# the target on some greedy tokens and not on others: drafts are accepted and rejected.
TARGET = T5(_config(64, 16, 2))
DRAFT = T5(dataclasses.replace(TARGET.config, num_decoder_layers=1))
TARGET_PARAMS = model_utils.random_params(TARGET, 11, logit_scale=2.0)
DRAFT_PARAMS = {
  **TARGET_PARAMS,
  'decoder': {k: v for k, v in TARGET_PARAMS['decoder'].items() if k != 'layers_1'},
}
SOURCES = jnp.asarray(np.random.default_rng(0).integers(2, 64, size=(8, 10)), jnp.int32)
GREEDY, _ = S.make_sampling(0.0)


@pytest.fixture(scope='module')
def baseline_tokens():
  result = decoding.autoregressive_decode(
    TARGET, TARGET_PARAMS, None, max_new_tokens=20, sampling=GREEDY, encoder_tokens=SOURCES
  )
  return np.asarray(result.tokens)


@pytest.mark.slow
@pytest.mark.parametrize('gamma', range(1, 9))
def test_greedy_speculative_equals_baseline(baseline_tokens, gamma):
  for rows in (slice(0, 8), slice(2, 3)):  # batch 8 and batch 1 (a row that accepts in part)
    result = decoding.speculative_decode(
      TARGET,
      TARGET_PARAMS,
      drafters.ModelDrafter(DRAFT),
      DRAFT_PARAMS,
      None,
      gamma=gamma,
      max_new_tokens=20,
      sampling=GREEDY,
      encoder_tokens=SOURCES[rows],
    )
    np.testing.assert_array_equal(np.asarray(result.tokens), baseline_tokens[rows])
    metrics = jax.tree.map(np.asarray, result.metrics)
    assert 0 < metrics.accepted.sum() < metrics.drafted.sum(), metrics


# Exact distribution: vocab 6, all 216 three-token continuations of one source sentence.
SEQ_VOCAB, SEQ_NEW, SEQ_SAMPLES = 6, 3, 50_000
SEQ_TARGET, SEQ_DRAFT = T5(_config(SEQ_VOCAB, 16, 1)), T5(_config(SEQ_VOCAB, 8, 1))
SEQ_TARGET_PARAMS = model_utils.random_params(SEQ_TARGET, 3, logit_scale=1.5)
SEQ_DRAFT_PARAMS = model_utils.random_params(SEQ_DRAFT, 4, logit_scale=0.5)
SEQ_SOURCE = np.array([3, 5, 2, 4, 1], np.int32)
SAMPLING = S.SamplingConfig(top_k=True)


def _exact_distribution(values):
  continuations = model_utils.all_continuations(SEQ_VOCAB, SEQ_NEW)
  decoder_inputs = np.concatenate(
    [np.zeros((len(continuations), 1), np.int32), continuations[:, :-1]], 1
  )  # shift right, start token 0
  logits = SEQ_TARGET.forward(
    SEQ_TARGET_PARAMS,
    jnp.asarray(np.tile(SEQ_SOURCE, (len(continuations), 1))),
    jnp.asarray(decoder_inputs),
  )
  probs = np.asarray(S.probs_from_logits(logits, SAMPLING, values), np.float64)  # [V^3, 3, V]
  return model_utils.sequence_probs(probs, continuations)  # [V^3], index = base-V number


@pytest.mark.slow
@pytest.mark.parametrize('gamma', (1, 3))
@pytest.mark.parametrize(
  'setting', ({'temperature': 1.0}, {'temperature': 0.8, 'top_k': 4}), ids=('t1.0', 't0.8-topk4')
)
def test_sampled_sequences_follow_the_target_distribution(setting, gamma):
  values = S.SamplingParams.create(**setting)
  exact = _exact_distribution(values)
  assert abs(exact.sum() - 1) < 1e-5
  result = decoding.speculative_decode(
    SEQ_TARGET,
    SEQ_TARGET_PARAMS,
    drafters.ModelDrafter(SEQ_DRAFT),
    SEQ_DRAFT_PARAMS,
    None,
    gamma=gamma,
    max_new_tokens=SEQ_NEW,
    sampling=SAMPLING,
    sampling_params=values,
    rng=17 * gamma,
    eos_id=None,
    encoder_tokens=jnp.asarray(np.tile(SEQ_SOURCE, (SEQ_SAMPLES, 1))),
  )
  tokens = np.asarray(result.tokens)
  counts = model_utils.sequence_counts(tokens, SEQ_VOCAB)
  assert counts[exact == 0].sum() == 0, 'sampled a continuation the target rules out'
  statistic, dof, p_value = model_utils.pooled_chi_square(counts, exact)
  assert p_value > FALSE_FAILURE_RATE / 4, f'chi2={statistic:.1f}, p={p_value:.2e}'  # Bonferroni
  metrics = jax.tree.map(np.asarray, result.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum()  # both branches exercised
