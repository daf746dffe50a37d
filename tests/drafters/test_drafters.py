"""Tests for speculative/drafters/: the registry, n-gram tables, prompt lookup, adaptive gamma.

Properties: the n-gram estimates are the stated formulas; n-gram q is the table under the target's
standardization; prompt lookup finds the latest match of the longest n-gram in the stream, then in
the source, and proposes only what is there; the draft model's cache stays in sync when it is fed
copied tokens (its next proposal equals a fresh draft's); the adaptive-gamma rule maximizes Theorem
3.8's improvement; and for EVERY drafter (unigram, bigram, prompt lookup alone / with a model
fallback, the confidence stop rule, the acceptance-based rule, with the adaptive verify width)
greedy speculative decoding equals the greedy baseline token for token and sampled outputs follow
the target's exact distribution. Tiny decoder-only models with random weights, fixed seeds.
"""

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
from speculative.models.decoder_only import DecoderOnlyConfig
from speculative.models.decoder_only import DecoderOnlyLM

FALSE_FAILURE_RATE = 1e-4  # per test
V = 8


_random_params = model_utils.random_params


TARGET = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=V, d_model=32, d_ff=64, num_layers=2, num_heads=4)
)
DRAFT = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=V, d_model=16, d_ff=32, num_layers=1, num_heads=2)
)
TARGET_PARAMS = _random_params(TARGET, 0, logit_scale=1.5)
DRAFT_PARAMS = _random_params(DRAFT, 1, logit_scale=1.0)
FILTERS = S.SamplingConfig(top_k=True, top_p=True)  # argmax via a run-time temperature of 0
GAMMA = 3

# One compile per drafter serves both checks: N rows, prompt buffer width 6, 6 new tokens.
N, WIDTH, NEW = 8_000, 6, 6
GREEDY_ROWS = 400  # rows with random prompts compared token for token with the baseline
_rng = np.random.default_rng(7)
RANDOM_PROMPTS = _rng.integers(2, V, (N, WIDTH)).astype(np.int32)
RANDOM_LENGTHS = _rng.integers(1, WIDTH + 1, N).astype(np.int32)
# The distribution check decodes one fixed prompt (with a repeated token, so prompt lookup copies).
SEQ_PROMPT = np.array([2, 5, 2], np.int32)
SEQ_PROMPTS = np.zeros((N, WIDTH), np.int32)
SEQ_PROMPTS[:, :3] = SEQ_PROMPT
SEQ_LENGTHS = np.full((N,), 3, np.int32)
SEQ_NEW = 3  # the first 3 generated tokens are enumerable (V^3 = 512 outcomes)

CORPUS = [np.concatenate([[0], _rng.integers(2, V, _rng.integers(3, 12)), [1]]) for _ in range(200)]
UNIGRAM = drafters.estimate_unigram(CORPUS, V)
BIGRAM = drafters.estimate_bigram(CORPUS, V, max_next=4)

DRAFTERS = {
  'unigram': (drafters.UnigramDrafter(V), UNIGRAM, {}),
  'bigram': (drafters.BigramDrafter(V), BIGRAM, {}),
  'prompt_lookup': (drafters.PromptLookupDrafter(V, (2, 1)), None, {}),
  'prompt_lookup+model': (
    drafters.PromptLookupDrafter(V, (3, 2, 1), fallback=drafters.ModelDrafter(DRAFT)),
    DRAFT_PARAMS,
    {},
  ),
  'model_stop_below': (drafters.ModelDrafter(DRAFT, stop_below=0.35), DRAFT_PARAMS, {}),
  'adaptive_gamma+verify': (
    drafters.AdaptiveGammaDrafter(
      drafters.ModelDrafter(DRAFT), draft_cost=0.2, verify_costs=(1.0, 1.1, 1.3, 1.6)
    ),
    DRAFT_PARAMS,
    dict(adaptive_verify=True),
  ),
}


# --------------------------------------------------------------------------------------------------
# The registry and the capability flags.
# --------------------------------------------------------------------------------------------------


def test_registry_builds_every_name_with_its_params():
  calls = []

  def corpus():
    calls.append(1)
    return CORPUS

  built = {
    name: drafters.build_drafter(
      name,
      vocab_size=V,
      draft_model=DRAFT,
      draft_params=DRAFT_PARAMS,
      train_sequences=corpus,
      stop_below=0.25,
      ngram_sizes=(2, 1),
    )
    for name in drafters.DRAFTERS
  }
  assert len(calls) == 2  # the corpus is read only for the n-gram names
  assert built['model'] == (drafters.ModelDrafter(DRAFT, stop_below=0.25), DRAFT_PARAMS)
  assert built['prompt_lookup'] == (drafters.PromptLookupDrafter(V, (2, 1)), None)
  assert built['prompt_lookup+model'] == (
    drafters.PromptLookupDrafter(V, (2, 1), fallback=drafters.ModelDrafter(DRAFT, stop_below=0.25)),
    DRAFT_PARAMS,
  )
  assert built['unigram'][0] == drafters.UnigramDrafter(V)
  np.testing.assert_array_equal(built['unigram'][1]['log_probs'], UNIGRAM['log_probs'])
  assert built['bigram'][0] == drafters.BigramDrafter(V)
  for name, (drafter, _) in built.items():
    assert drafter.vocab_size == V
    assert drafters.needs_draft_model(name) == (name in ('model', 'prompt_lookup+model')), name
    assert drafters.needs_corpus(name) == (name in ('unigram', 'bigram')), name


def test_registry_errors():
  with pytest.raises(ValueError, match='unknown drafter'):
    drafters.build_drafter('trigram', vocab_size=V)
  with pytest.raises(ValueError, match='unknown drafter'):
    drafters.needs_draft_model('trigram')
  with pytest.raises(ValueError, match='needs a draft model'):
    drafters.build_drafter('prompt_lookup+model', vocab_size=V)
  with pytest.raises(ValueError, match='vocabularies differ'):
    drafters.build_drafter('model', vocab_size=V + 1, draft_model=DRAFT)
  with pytest.raises(ValueError, match='train_sequences'):
    drafters.build_drafter('bigram', vocab_size=V)


def test_capability_flags():
  guided = {
    drafters.ModelDrafter(DRAFT),
    drafters.AdaptiveGammaDrafter(drafters.ModelDrafter(DRAFT), draft_cost=0.1),
  }
  unguided = {
    drafters.UnigramDrafter(V),
    drafters.BigramDrafter(V),
    drafters.PromptLookupDrafter(V),
  }
  for drafter in guided:
    assert drafter.supports_guided_draft and callable(drafter.draft)
  for drafter in unguided:
    assert not drafter.supports_guided_draft
  with pytest.raises(ValueError, match='guided inner drafter'):
    drafters.AdaptiveGammaDrafter(drafters.UnigramDrafter(V), draft_cost=0.1)


# --------------------------------------------------------------------------------------------------
# N-gram tables.
# --------------------------------------------------------------------------------------------------


def test_unigram_and_bigram_estimates():
  corpus = [[0, 4, 5, 4, 1], [0, 4, 1]]
  unigram = np.exp(np.asarray(drafters.estimate_unigram(corpus, 6, add_k=0.5)['log_probs']))
  counts = np.array([0, 2, 0, 0, 3, 1]) + 0.5  # tokens after the first of each stream
  np.testing.assert_allclose(unigram, counts / counts.sum(), rtol=1e-6)

  params = drafters.estimate_bigram(corpus, 6, add_k=0.5, prior_weight=2.0, max_next=1)
  q = np.exp(np.asarray(drafters.bigram_log_probs(params, jnp.array([4, 0, 3]))))  # [3, 6]
  np.testing.assert_allclose(q.sum(1), 1.0, rtol=1e-5)
  # After 4: counts 5 -> 1, 1 -> 2; max_next=1 keeps only (4 -> 1, 2).
  expected_4 = 2.0 * unigram / (2 + 2.0)
  expected_4[1] += 2 / (2 + 2.0)
  np.testing.assert_allclose(q[0], expected_4, rtol=1e-5)
  expected_0 = 2.0 * unigram / (2 + 2.0)  # after 0: 4 twice
  expected_0[4] += 2 / 4.0
  np.testing.assert_allclose(q[1], expected_0, rtol=1e-5)
  np.testing.assert_allclose(q[2], unigram, rtol=1e-5)  # unseen context: the unigram

  with pytest.raises(ValueError, match='token ids'):
    drafters.estimate_unigram([[0, 7]], 6)
  with pytest.raises(ValueError, match='add_k'):
    drafters.estimate_unigram(corpus, 6, add_k=0)
  with pytest.raises(ValueError, match='no token sequences'):
    drafters.estimate_bigram([], 6)


@pytest.mark.slow
def test_ngram_q_is_the_table_under_the_target_standardization():
  tokens = jnp.zeros((2, 8), jnp.int32).at[:, 0].set(jnp.array([4, 7]))
  lengths = jnp.array([1, 1], jnp.int32)
  keys = jax.random.split(jax.random.key(0), 2)
  propose_unigram = jax.jit(drafters.UnigramDrafter(V).propose, static_argnums=(4, 6))
  propose_bigram = jax.jit(drafters.BigramDrafter(V).propose, static_argnums=(4, 6))
  config = FILTERS  # one compile each; temperature 0 is argmax (one-hot q at the table's argmax)
  for values in [dict(temperature=0.5, top_k=5), dict(temperature=0.0)]:
    params_values = S.SamplingParams.create(**values)
    proposal, _ = propose_unigram(UNIGRAM, None, tokens, lengths, 4, keys, config, params_values)
    expected = S.probs_from_logits(UNIGRAM['log_probs'], config, params_values)
    np.testing.assert_allclose(proposal.probs, jnp.broadcast_to(expected, (2, 4, V)), rtol=1e-6)
    if values['temperature'] == 0:  # argmax: always the most frequent token
      assert np.all(np.asarray(proposal.tokens) == int(np.argmax(UNIGRAM['log_probs'])))
    proposal, _ = propose_bigram(BIGRAM, None, tokens, lengths, 4, keys, config, params_values)
    previous = jnp.concatenate([tokens[:, :1], proposal.tokens[:, :-1]], axis=1)  # [2, 4]
    expected = S.probs_from_logits(
      drafters.bigram_log_probs(BIGRAM, previous.reshape(-1)), config, params_values
    ).reshape(2, 4, V)
    np.testing.assert_allclose(proposal.probs, expected, rtol=1e-5, atol=1e-7)
    assert np.all(
      np.take_along_axis(np.asarray(proposal.probs), np.asarray(proposal.tokens)[..., None], -1) > 0
    )


# --------------------------------------------------------------------------------------------------
# Prompt lookup.
# --------------------------------------------------------------------------------------------------


def _lookup(drafter, streams, source=None, gamma=4):
  width = max(len(s) for s in streams) + gamma + 1
  tokens = np.zeros((len(streams), width), np.int32)
  for row, stream in enumerate(streams):
    tokens[row, : len(stream)] = stream
  lengths = jnp.array([len(s) for s in streams], jnp.int32)

  @jax.jit  # one compile, not one per op
  def init_and_lookup(prompts, tokens, lengths, source):
    state = drafter.init(None, prompts, jnp.ones_like(lengths), width, source)
    return drafter.lookup(state, tokens, lengths, gamma)

  found, continuation, count = init_and_lookup(
    jnp.asarray(tokens[:, :1]),
    jnp.asarray(tokens),
    lengths,
    None if source is None else jnp.asarray(source, jnp.int32),
  )
  return np.asarray(found), np.asarray(continuation), np.asarray(count)


def test_prompt_lookup_finds_the_latest_longest_match():
  drafter = drafters.PromptLookupDrafter(20, ngram_sizes=(1, 3, 2))  # sorted: 3, 2, 1
  assert drafter.ngram_sizes == (3, 2, 1)
  found, continuation, count = _lookup(
    drafter,
    [
      [0, 5, 6, 7, 8, 9, 5, 6, 7],  # 3-gram "5 6 7" at 1: copies 8 9 5 6
      [0, 5, 6, 3, 9, 6, 4, 4, 9, 6],  # "9 6" at 4 (3-gram "4 9 6" absent): copies 4 4 9 6
      [0, 8, 3, 1, 8, 2, 2, 8],  # 1-gram "8": latest earlier one at 4 -> 2 2 8 (3 left)
      [0, 3, 4, 5],  # no earlier occurrence
      [0, 7],  # too short for anything but a 1-gram; none
      [0, 4, 4],  # 1-gram "4" at 1 -> only "4" is left to copy
    ],
  )
  np.testing.assert_array_equal(found, [1, 1, 1, 0, 0, 1])
  np.testing.assert_array_equal(count, [4, 4, 3, 0, 0, 1])
  np.testing.assert_array_equal(
    continuation,
    [[8, 9, 5, 6], [4, 4, 9, 6], [2, 2, 8, 0], [0, 0, 0, 0], [0, 0, 0, 0], [4, 0, 0, 0]],
  )


def test_prompt_lookup_searches_the_source_after_the_stream():
  drafter = drafters.PromptLookupDrafter(20, ngram_sizes=(2, 1))
  source = [
    [11, 12, 13, 14, 1, 0, 0],
    [11, 12, 13, 14, 1, 0, 0],
    [9, 9, 1, 0, 0, 0, 0],
    [5, 6, 1, 0, 0, 0, 0],
  ]
  found, continuation, count = _lookup(
    drafter,
    [
      [0, 3, 12],  # source "12" -> 13 14 1 (the EOS may be copied; padding never)
      [0, 13, 2, 13],  # the stream's own "13" (at 1) wins over the source at the same n
      [0, 7, 9],  # source "9": the latest occurrence (at 1) -> "1"
      [0, 7, 8],  # nothing
    ],
    source=source,
  )
  np.testing.assert_array_equal(found, [1, 1, 1, 0])
  np.testing.assert_array_equal(count, [3, 2, 1, 0])
  np.testing.assert_array_equal(
    continuation[:, :3], [[13, 14, 1], [2, 13, 0], [1, 0, 0], [0, 0, 0]]
  )
  # Without the source the first and third rows have no match.
  found, _, _ = _lookup(
    drafters.PromptLookupDrafter(20, (2, 1), search_source=False),
    [[0, 3, 12], [0, 7, 9]],
    source=source[:2],
  )
  np.testing.assert_array_equal(found, [0, 0])


def test_prompt_lookup_proposal_and_fallback():
  tokens = jnp.array([[0, 5, 6, 5, 0, 0, 0, 0], [0, 7, 3, 2, 0, 0, 0, 0]], jnp.int32)
  lengths = jnp.array([4, 4], jnp.int32)
  keys = jax.random.split(jax.random.key(3), 2)
  values = S.SamplingParams.create()

  def propose(drafter, params, state=True):  # init (unless the drafter has no state), then propose
    @jax.jit  # one compile, not one per op
    def run(params, tokens, lengths, keys, values):
      start = drafter.init(params, tokens, lengths, 8) if state else None
      return drafter.propose(params, start, tokens, lengths, 3, keys, FILTERS, values)

    return run(params, tokens, lengths, keys, values)

  alone = drafters.PromptLookupDrafter(V, (1,))
  proposal, _ = propose(alone, None)
  np.testing.assert_array_equal(proposal.num_drafted, [2, 0])
  np.testing.assert_array_equal(proposal.tokens, [[6, 5, 0], [0, 0, 0]])
  np.testing.assert_array_equal(proposal.probs[0, :2], np.eye(V)[[6, 5]])
  with_fallback = drafters.PromptLookupDrafter(V, (1,), fallback=drafters.UnigramDrafter(V))
  proposal, _ = propose(with_fallback, UNIGRAM)
  fallback, _ = propose(drafters.UnigramDrafter(V), UNIGRAM, state=False)
  np.testing.assert_array_equal(proposal.num_drafted, [2, 3])
  np.testing.assert_array_equal(proposal.tokens[1], fallback.tokens[1])
  np.testing.assert_allclose(proposal.probs[1], fallback.probs[1])
  with pytest.raises(ValueError, match='vocab_size'):
    drafters.PromptLookupDrafter(V + 1, fallback=drafters.UnigramDrafter(V))
  with pytest.raises(ValueError, match='ngram_sizes'):
    drafters.PromptLookupDrafter(V, ())


@pytest.mark.slow
def test_draft_cache_stays_in_sync_when_fed_copied_tokens():
  """After a step in which the draft model was fed copied (forced) tokens -- all rows forced (one
  wide call) or some rows (the per-token loop) -- and a prefix of them was committed, its next
  proposal equals that of a draft model prefilled from scratch with the committed stream: the
  same distributions q (sampled at temperature 1, so a cache entry off by a position shows in
  them, where an argmax may not move) and the same tokens drawn with the same keys."""
  drafter = drafters.ModelDrafter(DRAFT)
  gamma, width = 3, 16
  rng = np.random.default_rng(5)
  tokens = jnp.asarray(rng.integers(2, V, (3, width)), jnp.int32)
  lengths = jnp.array([1, 4, 6], jnp.int32)
  keys = jax.random.split(jax.random.key(1), 3)
  greedy = S.SamplingConfig(greedy=True)
  values = S.SamplingParams.create()
  copied = jnp.asarray(rng.integers(2, V, (3, gamma)), jnp.int32)
  draft = jax.jit(drafter.draft, static_argnames=('gamma', 'sampling'))
  # The acceptance-rule wrapper passes the forced tokens through to its ModelDrafter.
  wrapper = drafters.AdaptiveGammaDrafter(drafter, draft_cost=0.5)
  wrapper_draft = jax.jit(wrapper.draft, static_argnames=('gamma', 'sampling'))
  for forced, wrapped in (
    ([True, True, True], False),
    ([True, False, True], False),
    ([True, False, True], True),
  ):
    forced = jnp.array(forced)
    state = drafter.init(DRAFT_PARAMS, tokens, lengths, width)
    if wrapped:
      wrapper_state = wrapper.init(DRAFT_PARAMS, tokens, lengths, width)
      proposal, wrapper_state = wrapper_draft(
        DRAFT_PARAMS,
        wrapper_state,
        tokens,
        lengths,
        gamma=gamma,
        keys=keys,
        sampling=greedy,
        sampling_params=values,
        max_drafted=jnp.full((3,), gamma),
        forced_tokens=copied,
        forced=forced,
      )
      np.testing.assert_array_equal(proposal.num_drafted[np.asarray(forced)], gamma)
      state = wrapper_state.inner
    else:
      _, state = draft(
        DRAFT_PARAMS,
        state,
        tokens,
        lengths,
        gamma=gamma,
        keys=keys,
        sampling=greedy,
        sampling_params=values,
        max_drafted=jnp.full((3,), gamma),
        forced_tokens=copied,
        forced=forced,
      )
    # Commit the copied tokens (all accepted) plus one more token.
    committed = drafters.write_rows(tokens, jnp.concatenate([copied, tokens[:, -1:]], 1), lengths)
    new_lengths = lengths + gamma + 1
    proposal, _ = draft(
      DRAFT_PARAMS,
      state,
      committed,
      new_lengths,
      gamma=gamma,
      keys=keys,
      sampling=S.SamplingConfig(),
      sampling_params=values,
    )
    fresh_state = drafter.init(DRAFT_PARAMS, committed, new_lengths, width)
    fresh, _ = draft(
      DRAFT_PARAMS,
      fresh_state,
      committed,
      new_lengths,
      gamma=gamma,
      keys=keys,
      sampling=S.SamplingConfig(),
      sampling_params=values,
    )
    for row in np.flatnonzero(np.asarray(forced)):
      np.testing.assert_allclose(proposal.probs[row], fresh.probs[row], rtol=1e-5, atol=1e-7)
      np.testing.assert_array_equal(proposal.tokens[row], fresh.tokens[row])


# --------------------------------------------------------------------------------------------------
# Adaptive gamma.
# --------------------------------------------------------------------------------------------------


def test_adaptive_gamma_rule_maximizes_the_predicted_improvement():
  alphas = np.linspace(0.0, 0.98, 50)
  for c in (0.0, 0.05, 0.3, 1.0):
    rule = drafters.AdaptiveGammaDrafter(drafters.ModelDrafter(DRAFT), draft_cost=c)
    chosen = np.asarray(rule.choose_gamma(jnp.asarray(alphas, jnp.float32), 8))
    best = analysis.optimal_gamma(alphas, c, max_gamma=8)
    improvement = lambda g: analysis.walltime_improvement(alphas, g, c)
    np.testing.assert_allclose(improvement(chosen), improvement(best), rtol=1e-5)
  # A measured verify cost v(T), T = 1..9, growing faster with T: the rule's v(k + 1) indexing
  # against Theorem 3.8's general form.
  verify = (1.0, 1.1, 1.25, 1.45, 1.7, 2.0, 2.35, 2.75, 3.2)
  v = lambda t: np.asarray(verify)[np.asarray(t) - 1]  # noqa: E731
  for c in (0.0, 0.05, 0.3):
    rule = drafters.AdaptiveGammaDrafter(
      drafters.ModelDrafter(DRAFT), draft_cost=c, verify_costs=verify
    )
    chosen = np.asarray(rule.choose_gamma(jnp.asarray(alphas, jnp.float32), 8))
    best = analysis.optimal_gamma(alphas, c, v, max_gamma=8)
    assert len(set(best.tolist())) > 2  # the costs move the choice
    improvement = lambda g: analysis.walltime_improvement(alphas, g, c, v)  # noqa: E731
    np.testing.assert_allclose(improvement(chosen), improvement(best), rtol=1e-5)
  with pytest.raises(ValueError, match='needs a guided inner drafter'):
    drafters.AdaptiveGammaDrafter(drafters.UnigramDrafter(V), draft_cost=0.1)
  with pytest.raises(ValueError, match='stop_below'):
    drafters.ModelDrafter(DRAFT, stop_below=1.5)


@pytest.mark.slow
def test_confidence_stop_rule_drafts_until_an_unsure_token():
  drafter = drafters.ModelDrafter(DRAFT, stop_below=0.35)
  width, gamma = 12, 5
  tokens = jnp.asarray(np.random.default_rng(2).integers(2, V, (64, width)), jnp.int32)
  lengths = jnp.asarray(np.random.default_rng(3).integers(1, 6, 64), jnp.int32)
  state = drafter.init(DRAFT_PARAMS, tokens, lengths, width)
  propose = jax.jit(drafter.propose, static_argnames=('gamma', 'sampling'))
  proposal, _ = propose(
    DRAFT_PARAMS,
    state,
    tokens,
    lengths,
    gamma=gamma,
    keys=jax.random.split(jax.random.key(0), 64),
    sampling=S.SamplingConfig(greedy=True),
    sampling_params=S.SamplingParams.create(),
  )
  # Recompute each drafted token's confidence with a full forward of the stream + drafts.
  num = np.asarray(proposal.num_drafted)
  assert 1 <= num.min() and num.max() <= gamma and num.min() < gamma
  streams = np.asarray(drafters.write_rows(tokens, proposal.tokens, lengths))  # causal: padding ok
  confidence = np.asarray(drafters.draft_confidence(jax.jit(DRAFT.forward)(DRAFT_PARAMS, streams)))
  for row in range(64):
    length = int(lengths[row])
    confident = confidence[row, length - 1 : length - 1 + gamma] >= 0.35  # [gamma]
    # num_drafted = 1 + the number of leading confident tokens (the first unsure one included).
    expected = min(gamma, 1 + int(np.argmin(np.append(confident, False))))
    assert num[row] == expected, (row, num[row], confident)


# --------------------------------------------------------------------------------------------------
# Exactness of every drafter in the decode loop.
# --------------------------------------------------------------------------------------------------


def _decode(drafter, draft_params, prompts, lengths, temperature, rng, **options):
  return decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    drafter,
    draft_params,
    jnp.asarray(prompts),
    jnp.asarray(lengths),
    gamma=GAMMA,
    max_new_tokens=NEW,
    sampling=FILTERS,
    sampling_params=S.SamplingParams.create(temperature=temperature),
    rng=rng,
    **options,
  )


@pytest.fixture(scope='module')
def greedy_baseline():
  return decoding.autoregressive_decode(
    TARGET,
    TARGET_PARAMS,
    jnp.asarray(RANDOM_PROMPTS),
    jnp.asarray(RANDOM_LENGTHS),
    max_new_tokens=NEW,
    sampling=FILTERS,
    sampling_params=S.SamplingParams.create(temperature=0.0),
  )


@pytest.fixture(scope='module')
def exact_distribution():
  """P(c1 c2 c3 | SEQ_PROMPT) under the target at temperature 1, for all V^3 continuations."""
  continuations = model_utils.all_continuations(V, SEQ_NEW)
  streams = np.concatenate([np.tile(SEQ_PROMPT, (len(continuations), 1)), continuations], 1)
  logits = jax.jit(TARGET.forward)(TARGET_PARAMS, jnp.asarray(streams))
  probs = np.asarray(S.probs_from_logits(logits, FILTERS, S.SamplingParams.create()))
  probs = probs[:, len(SEQ_PROMPT) - 1 : -1]  # [V^3, 3, V]
  return model_utils.sequence_probs(probs, continuations)  # [V^3], index = base-V number


@pytest.mark.slow
@pytest.mark.parametrize('name', list(DRAFTERS))
def test_every_drafter_is_exact(name, greedy_baseline, exact_distribution):
  drafter, draft_params, options = DRAFTERS[name]
  # Greedy: token for token equal to the baseline (same compile as the sampled run below).
  greedy = _decode(drafter, draft_params, RANDOM_PROMPTS, RANDOM_LENGTHS, 0.0, 0, **options)
  expected = np.asarray(greedy_baseline.tokens[:GREEDY_ROWS])
  actual = np.asarray(greedy.tokens[:GREEDY_ROWS])
  mismatched = np.flatnonzero((expected != actual).any(1))
  assert mismatched.size == 0, (
    f'{name}: greedy rows {mismatched[:5]} differ: '
    f'{expected[mismatched[0]]} vs {actual[mismatched[0]]}'
  )
  metrics = jax.tree.map(np.asarray, greedy.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum()

  # Sampling at temperature 1: the first 3 generated tokens follow the target's distribution.
  sampled = _decode(
    drafter, draft_params, SEQ_PROMPTS, SEQ_LENGTHS, 1.0, list(DRAFTERS).index(name) + 17, **options
  )
  tokens = np.asarray(sampled.tokens)[:, :SEQ_NEW]
  counts = model_utils.sequence_counts(tokens, V)
  exact = exact_distribution
  assert counts[exact == 0].sum() == 0
  expected_counts = N * exact
  big = expected_counts >= 5  # smaller bins are pooled into one
  observed_bins = np.append(counts[big], counts[~big].sum())
  expected_bins = np.append(expected_counts[big], expected_counts[~big].sum())
  statistic = np.sum((observed_bins - expected_bins) ** 2 / expected_bins)
  p_value = stats.chi2.sf(statistic, len(observed_bins) - 1)
  threshold = FALSE_FAILURE_RATE / len(DRAFTERS)  # Bonferroni over the drafters
  assert p_value > threshold, (
    f'{name}: chi2={statistic:.1f}, dof {len(observed_bins) - 1}, p={p_value:.2e}'
  )
  metrics = jax.tree.map(np.asarray, sampled.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum()
  if name in ('model_stop_below', 'adaptive_gamma+verify', 'prompt_lookup'):
    # Adaptive / copying drafters really propose fewer than gamma tokens per step.
    assert metrics.drafted.sum() < GAMMA * metrics.target_calls.sum()
