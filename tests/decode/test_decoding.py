"""Tests for speculative/decode/loops.py and drafters.py with tiny decoder-only models (random weights).

Properties: speculative samples follow the target's exact sequence distribution (enumerated), greedy
speculative == greedy baseline token for token, draft == target accepts everything, a row decoded in
a batch equals the row decoded alone, EOS / max-length edge cases, no recompilation when only
sampling values or the seed change, the prefill's width and no random numbers under greedy, and
clear errors for bad input.
"""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import drafters
from speculative import sampling as S
from speculative.decode import inputs as decode_inputs
from speculative.decode import loops as decoding
from speculative.decode import options as decode_options
from speculative.decode import state as decode_state
from speculative.models.decoder_only import DecoderOnlyConfig
from speculative.models.decoder_only import DecoderOnlyLM

FALSE_FAILURE_RATE = 1e-4  # per test


_random_params = model_utils.random_params


# Greedy / edge-case pair: vocab 16.
TARGET = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=16, d_model=32, d_ff=64, num_layers=2, num_heads=4)
)
DRAFT = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=16, d_model=16, d_ff=32, num_layers=1, num_heads=2)
)
TARGET_PARAMS = _random_params(TARGET, 0, logit_scale=2.0)
DRAFT_PARAMS = _random_params(DRAFT, 1, logit_scale=2.0)
GREEDY = S.SamplingConfig(greedy=True)
FILTERS = S.SamplingConfig(top_k=True, top_p=True)  # every value sweep shares one compile

NUM_PROMPTS, PROMPT_WIDTH = 100, 6
_prompt_rng = np.random.default_rng(7)
PROMPTS = jnp.asarray(_prompt_rng.integers(0, 16, (NUM_PROMPTS, PROMPT_WIDTH)), jnp.int32)
PROMPT_LENGTHS = jnp.asarray(_prompt_rng.integers(1, PROMPT_WIDTH + 1, NUM_PROMPTS), jnp.int32)


_target_forward = jax.jit(TARGET.forward)


def _greedy_margin(tokens, prompts, prompt_lengths, row, position):
  """Top-1 minus top-2 target logit at a generated position (to diagnose a greedy mismatch)."""
  stream = np.concatenate(
    [np.asarray(prompts[row, : prompt_lengths[row]]), np.asarray(tokens[row, :position])]
  )
  logits = np.asarray(_target_forward(TARGET_PARAMS, jnp.asarray(stream)[None]))[0, -1]
  top = np.sort(logits)[-2:]
  return float(top[1] - top[0])


def _assert_same_tokens(expected, actual, label, prompts, prompt_lengths):
  exp_tokens, act_tokens = np.asarray(expected.tokens), np.asarray(actual.tokens)
  if not (
    np.array_equal(exp_tokens, act_tokens) and np.array_equal(expected.lengths, actual.lengths)
  ):
    row = int(np.flatnonzero((exp_tokens != act_tokens).any(1))[0])
    position = int(np.flatnonzero(exp_tokens[row] != act_tokens[row])[0])
    margin = _greedy_margin(exp_tokens, prompts, prompt_lengths, row, position)
    raise AssertionError(
      f'{label}: row {row} differs at generated position {position}: '
      f'{exp_tokens[row]} vs {act_tokens[row]} (target logit margin there '
      f'{margin:.2e})'
    )


@pytest.fixture(scope='module')
def greedy_baseline():
  return decoding.autoregressive_decode(
    TARGET, TARGET_PARAMS, PROMPTS, PROMPT_LENGTHS, max_new_tokens=10, sampling=GREEDY, eos_id=3
  )


# --------------------------------------------------------------------------------------------------
# Greedy exactness.
# --------------------------------------------------------------------------------------------------


def test_greedy_baseline_is_argmax_of_full_forward(greedy_baseline):
  """The baseline itself is right: each generated token is the argmax of the no-cache forward."""
  rows = 8
  tokens, lengths = np.asarray(greedy_baseline.tokens), np.asarray(greedy_baseline.lengths)
  streams = np.zeros((rows, PROMPT_WIDTH + 10), np.int32)  # causal: padding after is harmless
  for row in range(rows):
    prompt_length = int(PROMPT_LENGTHS[row])
    streams[row, :prompt_length] = PROMPTS[row, :prompt_length]
    streams[row, prompt_length : prompt_length + lengths[row]] = tokens[row, : lengths[row]]
  logits = np.asarray(_target_forward(TARGET_PARAMS, jnp.asarray(streams)))
  for row in range(rows):
    prompt_length, length = int(PROMPT_LENGTHS[row]), int(lengths[row])
    predicted = np.argmax(logits[row, prompt_length - 1 : prompt_length - 1 + length], -1)
    np.testing.assert_array_equal(predicted, tokens[row, :length])
    assert length == 10 or tokens[row, length - 1] == 3  # stopped at max length or at EOS
    assert 3 not in tokens[row, : length - 1]
  assert np.all(tokens[np.arange(10)[None] >= lengths[:, None]] == 0)
  assert lengths.min() < 10 < lengths.max() + 1  # both stopping rules occur


@pytest.mark.slow
@pytest.mark.parametrize('gamma', range(1, 9))
def test_greedy_speculative_equals_baseline_batch_100(greedy_baseline, gamma):
  result = decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    drafters.ModelDrafter(DRAFT),
    DRAFT_PARAMS,
    PROMPTS,
    PROMPT_LENGTHS,
    gamma=gamma,
    max_new_tokens=10,
    sampling=GREEDY,
    eos_id=3,
  )
  _assert_same_tokens(greedy_baseline, result, f'gamma={gamma}', PROMPTS, PROMPT_LENGTHS)
  metrics = jax.tree.map(np.asarray, result.metrics)
  assert np.all(metrics.accepted <= metrics.drafted)
  assert np.all(metrics.drafted == gamma * metrics.target_calls)
  # Each target call emits 1..gamma+1 tokens.
  assert np.all(result.lengths <= (gamma + 1) * metrics.target_calls)
  assert np.all(result.lengths >= metrics.target_calls)
  # Under argmax, min(p, q) mass is 1 exactly where the drafts' argmaxes agree.
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum()


def _filters_decode(
  prompts, lengths, values, row_ids=None, params=None, rng=11, draft_is_target=False
):
  """gamma=3, max_new_tokens=10, eos 3, FILTERS: one compile per batch size, shared by tests."""
  params = TARGET_PARAMS if params is None else params
  drafter = drafters.ModelDrafter(TARGET if draft_is_target else DRAFT)
  draft_params = TARGET_PARAMS if draft_is_target else DRAFT_PARAMS
  return decoding.speculative_decode(
    TARGET,
    params,
    drafter,
    draft_params,
    prompts,
    lengths,
    gamma=3,
    max_new_tokens=10,
    sampling=FILTERS,
    sampling_params=S.SamplingParams.create(**values),
    rng=rng,
    eos_id=3,
    row_ids=row_ids,
  )


def _filters_baseline(prompts, lengths, values, row_ids=None, params=None, rng=11):
  params = TARGET_PARAMS if params is None else params
  return decoding.autoregressive_decode(
    TARGET,
    params,
    prompts,
    lengths,
    max_new_tokens=10,
    sampling=FILTERS,
    sampling_params=S.SamplingParams.create(**values),
    rng=rng,
    eos_id=3,
    row_ids=row_ids,
  )


@pytest.mark.parametrize('batch', [8, 1])
def test_greedy_speculative_equals_baseline_small_batches(greedy_baseline, batch):
  """Batches of 8 and 1; argmax via a run-time temperature of 0 (same compile as sampling)."""
  num = 96 if batch == 8 else 10
  for lo in range(0, num, batch):
    rows = slice(lo, lo + batch)
    result = _filters_decode(PROMPTS[rows], PROMPT_LENGTHS[rows], dict(temperature=0.0))
    expected = jax.tree.map(lambda x: x[rows], greedy_baseline)
    _assert_same_tokens(
      expected, result, f'batch={batch} rows {lo}+', PROMPTS[rows], PROMPT_LENGTHS[rows]
    )


@dataclasses.dataclass(frozen=True)
class _PartialDrafter:
  """A ModelDrafter that, like an n-gram drafter without a match, may propose fewer tokens."""

  inner: drafters.ModelDrafter

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  def init(self, *args, **kwargs):
    return self.inner.init(*args, **kwargs)

  def propose(self, params, state, tokens, lengths, gamma, keys, sampling, sampling_params):
    proposal, state = self.inner.propose(
      params, state, tokens, lengths, gamma, keys, sampling, sampling_params
    )
    num_drafted = (lengths * 7) % (gamma + 1)  # 0..gamma, varies per row and step
    filler = jnp.where(jnp.arange(gamma)[None] < num_drafted[:, None], proposal.tokens, 0)
    return proposal.replace(tokens=filler, num_drafted=num_drafted), state


@pytest.mark.slow
def test_greedy_exact_with_fewer_drafted_tokens(greedy_baseline):
  drafter = _PartialDrafter(drafters.ModelDrafter(DRAFT))
  result = decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    drafter,
    DRAFT_PARAMS,
    PROMPTS,
    PROMPT_LENGTHS,
    gamma=4,
    max_new_tokens=10,
    sampling=GREEDY,
    eos_id=3,
  )
  _assert_same_tokens(greedy_baseline, result, 'partial drafter', PROMPTS, PROMPT_LENGTHS)
  metrics = jax.tree.map(np.asarray, result.metrics)
  assert metrics.drafted.sum() < 4 * metrics.target_calls.sum()
  assert np.all(metrics.accepted <= metrics.drafted)


# --------------------------------------------------------------------------------------------------
# Draft == target; EOS and max-length edges.
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize('temperature', [0.0, 1.0])
def test_draft_equal_to_target_accepts_everything(temperature):
  gamma = 3
  result = _filters_decode(
    PROMPTS[:8], PROMPT_LENGTHS[:8], dict(temperature=temperature), draft_is_target=True, rng=5
  )
  metrics = jax.tree.map(np.asarray, result.metrics)
  lengths = np.asarray(result.lengths)
  # Block efficiency gamma+1 except in the last block (cut by EOS or max_new_tokens).
  np.testing.assert_array_equal(metrics.target_calls, np.ceil(lengths / (gamma + 1)))
  np.testing.assert_array_equal(metrics.accepted, metrics.drafted)
  np.testing.assert_allclose(metrics.alpha_sum / metrics.drafted, 1.0, atol=1e-5)


def _eos_candidate(tokens, lengths, gamma):
  """(row, j, token): in the eos=3 baseline, `token` first occurs at index j in 1..gamma-1 of row,
  with no EOS before, so a free decode of that row has the same first j+1 tokens."""
  for row, j in itertools.product(range(8), range(1, gamma)):
    if lengths[row] > j and tokens[row, j] not in tokens[row, :j] and tokens[row, j] != 3:
      return row, j, int(tokens[row, j])
  raise AssertionError('no usable EOS candidate')


@pytest.mark.slow
def test_eos_inside_an_accepted_block(greedy_baseline):
  gamma = 4
  row, j, eos = _eos_candidate(
    np.asarray(greedy_baseline.tokens), np.asarray(greedy_baseline.lengths), gamma
  )
  prompts, lengths = PROMPTS[:8], PROMPT_LENGTHS[:8]
  base = decoding.autoregressive_decode(
    TARGET, TARGET_PARAMS, prompts, lengths, max_new_tokens=12, sampling=GREEDY, eos_id=eos
  )
  spec = decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    drafters.ModelDrafter(TARGET),
    TARGET_PARAMS,
    prompts,
    lengths,
    gamma=gamma,
    max_new_tokens=12,
    sampling=GREEDY,
    eos_id=eos,
  )
  _assert_same_tokens(base, spec, 'eos', prompts, lengths)
  assert int(spec.lengths[row]) == j + 1 and int(spec.tokens[row, j]) == eos
  assert np.all(np.asarray(spec.tokens[row, j + 1 :]) == 0)
  # The whole block was accepted (draft == target), then cut after the EOS, in one target call.
  assert int(spec.metrics.target_calls[row]) == 1 and int(spec.metrics.accepted[row]) == gamma
  for b in range(8):  # every row stops at its first EOS or at max length
    toks = np.asarray(spec.tokens[b, : spec.lengths[b]])
    assert (eos not in toks[:-1]) and (toks[-1] == eos or len(toks) == 12)


@pytest.mark.slow
@pytest.mark.parametrize('max_new', [1, 7])
def test_max_new_tokens_not_a_multiple_of_the_block(greedy_baseline, max_new):
  gamma = 3
  spec = decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    drafters.ModelDrafter(TARGET),
    TARGET_PARAMS,
    PROMPTS[:8],
    PROMPT_LENGTHS[:8],
    gamma=gamma,
    max_new_tokens=max_new,
    sampling=GREEDY,
    eos_id=3,
  )
  expected_lengths = np.minimum(np.asarray(greedy_baseline.lengths[:8]), max_new)
  assert spec.tokens.shape == (8, max_new)
  np.testing.assert_array_equal(spec.lengths, expected_lengths)
  np.testing.assert_array_equal(spec.tokens, np.asarray(greedy_baseline.tokens)[:8, :max_new])
  assert expected_lengths.max() == max_new
  # Every block accepted: ceil(length / (gamma+1)) target calls, the overshoot truncated.
  np.testing.assert_array_equal(spec.metrics.target_calls, np.ceil(expected_lengths / (gamma + 1)))


# --------------------------------------------------------------------------------------------------
# Batch independence, recompilation.
# --------------------------------------------------------------------------------------------------


def test_row_in_batch_equals_row_alone():
  prompts, lengths = PROMPTS[:8], PROMPT_LENGTHS[:8]
  for values in [dict(temperature=1.0), dict(temperature=0.0), dict(temperature=0.8, top_k=5)]:
    batch = _filters_decode(prompts, lengths, values)
    for row in (1, 6):
      alone = _filters_decode(
        prompts[row : row + 1], lengths[row : row + 1], values, row_ids=jnp.array([row])
      )
      np.testing.assert_array_equal(alone.tokens[0], batch.tokens[row], err_msg=str(values))
      for a, b in zip(jax.tree.leaves(alone.metrics), jax.tree.leaves(batch.metrics)):
        np.testing.assert_allclose(a[0], b[row], rtol=1e-5)
    base = _filters_baseline(prompts, lengths, values)
    alone = _filters_baseline(prompts[2:3], lengths[2:3], values, row_ids=jnp.array([2]))
    np.testing.assert_array_equal(alone.tokens[0], base.tokens[2])


def test_the_prefill_feeds_all_but_the_last_prompt_position(monkeypatch):
  """A decode's first step feeds each row's last prompt token itself, so the prefill writes only
  [0, P-1) and makes no call at all for P = 1 (an encoder-decoder's start token). Checked on the
  widths of the traced `extend` calls (tracing only, nothing compiles)."""
  widths = []
  extend = DecoderOnlyLM.extend

  def recording(self, params, cache, tokens, start):
    widths.append((self.config.num_layers, tokens.shape[1]))  # (target 2 / draft 1, T)
    return extend(self, params, cache, tokens, start)

  monkeypatch.setattr(DecoderOnlyLM, 'extend', recording)
  drafter = drafters.ModelDrafter(DRAFT)
  for width, prompts in ((PROMPT_WIDTH, PROMPTS[:4]), (1, PROMPTS[:4, :1])):
    lengths = jnp.minimum(PROMPT_LENGTHS[:4], width)
    widths.clear()
    jax.make_jaxpr(
      lambda p, lengths=lengths, prompts=prompts: (
        decoding.autoregressive_decode(
          TARGET, p, prompts, lengths, max_new_tokens=4, sampling=GREEDY, check_finite=False
        ).tokens
      )
    )(TARGET_PARAMS)
    assert widths == ([(2, width - 1)] if width > 1 else []) + [(2, 1)], (width, widths)
    widths.clear()
    jax.make_jaxpr(
      lambda p, lengths=lengths, prompts=prompts: (
        decoding.speculative_decode(
          TARGET,
          p,
          drafter,
          DRAFT_PARAMS,
          prompts,
          lengths,
          max_new_tokens=4,
          sampling=GREEDY,
          gamma=3,
          check_finite=False,
        ).tokens
      )
    )(TARGET_PARAMS)
    prefills = [(2, width - 1), (1, width - 1)] if width > 1 else []
    # then the draft's catch-up call (T=2), its T=1 calls, the target's verify (gamma+1)
    assert widths == prefills + [(1, 2), (1, 1), (2, 4)], (width, widths)


def test_greedy_decodes_draw_no_random_numbers():
  """Under greedy every sampled token is an argmax and the acceptance test does not depend on the
  uniforms (p is one-hot), so the compiled loop holds no random-number work; sampling does."""
  drafter = drafters.ModelDrafter(DRAFT)

  def hlo(sampling):
    options = decode_options.DecodeOptions(max_new_tokens=4, sampling=sampling, gamma=2)
    values = S.make_sampling(1.0)[1]
    inputs = decode_inputs.prepare_inputs(
      TARGET, options, PROMPTS[:2], PROMPT_LENGTHS[:2], None, values, 0, None
    ).with_drafter(TARGET, drafter, None)
    lowered = decoding._speculative_jit.lower(
      TARGET_PARAMS, DRAFT_PARAMS, inputs, None, target=TARGET, drafter=drafter, options=options
    )
    return lowered.compile().as_text()

  assert 'threefry' not in hlo(GREEDY)
  assert 'threefry' in hlo(S.SamplingConfig())  # the check can fail: sampling draws


def test_no_recompilation_for_new_values_seeds_or_prompts():
  first = _filters_decode(PROMPTS[:8], PROMPT_LENGTHS[:8], {}, rng=0)
  _filters_baseline(PROMPTS[:8], PROMPT_LENGTHS[:8], {}, rng=0)
  counts = dict(decode_state.TRACE_COUNTS)
  outputs = [first.tokens]
  for i, values in enumerate(
    [
      dict(temperature=0.3),
      dict(top_k=2),
      dict(top_p=0.5),
      dict(temperature=0.0, top_k=3, top_p=0.9),
    ]
  ):
    outputs.append(_filters_decode(PROMPTS[8:16], PROMPT_LENGTHS[8:16], values, rng=i + 1).tokens)
    _filters_baseline(PROMPTS[8:16], PROMPT_LENGTHS[8:16], values, rng=jax.random.key(i))
  outputs.append(
    _filters_decode(PROMPTS[:8], PROMPT_LENGTHS[:8], {}, rng=jax.random.key(42)).tokens
  )
  assert dict(decode_state.TRACE_COUNTS) == counts
  assert len({np.asarray(o).tobytes() for o in outputs}) == len(outputs)  # the values took effect


# --------------------------------------------------------------------------------------------------
# Sequence-level distribution: speculative samples vs the target's enumerated distribution.
# --------------------------------------------------------------------------------------------------

SEQ_VOCAB, SEQ_NEW, SEQ_SAMPLES = 6, 3, 50_000
SEQ_TARGET = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=SEQ_VOCAB, d_model=16, d_ff=32, num_layers=1, num_heads=2)
)
SEQ_DRAFT = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=SEQ_VOCAB, d_model=8, d_ff=16, num_layers=1, num_heads=2)
)
SEQ_TARGET_PARAMS = _random_params(SEQ_TARGET, 3, logit_scale=1.5)
SEQ_DRAFT_PARAMS = _random_params(SEQ_DRAFT, 4, logit_scale=0.5)  # alpha ~0.4-0.6
SEQ_PROMPT = np.array([2, 5, 1], np.int32)
SEQ_SETTINGS = {
  't1.0': dict(temperature=1.0),
  't0.7': dict(temperature=0.7),
  'topk3': dict(temperature=1.0, top_k=3),
  'topp0.8': dict(temperature=1.0, top_p=0.8),
}
SEQ_GAMMAS = (1, 3, 5)


@jax.jit
def _standardized_target_probs(params, streams, sampling_params):
  logits = SEQ_TARGET.forward(params, streams)
  return S.probs_from_logits(logits, FILTERS, sampling_params)


def _exact_sequence_distribution(values):
  """P(c1 c2 c3 | prompt) under the standardized target, for all V^3 continuations."""
  continuations = model_utils.all_continuations(SEQ_VOCAB, SEQ_NEW)
  streams = np.concatenate([np.tile(SEQ_PROMPT, (len(continuations), 1)), continuations], 1)
  prompt_len = len(SEQ_PROMPT)
  probs = np.asarray(
    _standardized_target_probs(
      SEQ_TARGET_PARAMS, jnp.asarray(streams), S.SamplingParams.create(**values)
    )
  )
  probs = probs[:, prompt_len - 1 : -1]  # [V^3, 3, V]: the distributions of c1, c2, c3
  return model_utils.sequence_probs(probs, continuations)  # [V^3], index = base-V number


@pytest.mark.slow
@pytest.mark.parametrize('gamma', SEQ_GAMMAS)
@pytest.mark.parametrize('setting', sorted(SEQ_SETTINGS))
def test_sequence_distribution_matches_target(setting, gamma):
  values = SEQ_SETTINGS[setting]
  exact = _exact_sequence_distribution(values)
  assert abs(exact.sum() - 1) < 1e-5
  result = decoding.speculative_decode(
    SEQ_TARGET,
    SEQ_TARGET_PARAMS,
    drafters.ModelDrafter(SEQ_DRAFT),
    SEQ_DRAFT_PARAMS,
    jnp.asarray(np.tile(SEQ_PROMPT, (SEQ_SAMPLES, 1))),
    gamma=gamma,
    max_new_tokens=SEQ_NEW,
    sampling=FILTERS,
    sampling_params=S.SamplingParams.create(**values),
    rng=1000 * gamma + sorted(SEQ_SETTINGS).index(setting),
  )
  tokens = np.asarray(result.tokens)
  assert np.all(np.asarray(result.lengths) == SEQ_NEW)
  counts = model_utils.sequence_counts(tokens, SEQ_VOCAB)
  assert counts[exact == 0].sum() == 0, 'sampled a continuation the target rules out'
  statistic, dof, p_value = model_utils.pooled_chi_square(counts, exact)
  # The 12 parametrizations share the false-failure budget (Bonferroni).
  threshold = FALSE_FAILURE_RATE / (len(SEQ_SETTINGS) * len(SEQ_GAMMAS))
  assert p_value > threshold, f'chi2={statistic:.1f} on {dof} dof, p={p_value:.2e}'
  # The draft is a different model: both acceptance and rejection must have been exercised.
  metrics = jax.tree.map(np.asarray, result.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum()
  alpha = metrics.alpha_sum.sum() / metrics.drafted.sum()
  assert 0.2 < alpha < 0.9, alpha


# --------------------------------------------------------------------------------------------------
# Bad input.
# --------------------------------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
  drafter = drafters.ModelDrafter(DRAFT)

  def spec(**overrides):
    kwargs = dict(
      prompt_tokens=PROMPTS[:2],
      prompt_lengths=PROMPT_LENGTHS[:2],
      gamma=2,
      max_new_tokens=4,
      sampling=GREEDY,
    )
    kwargs.update(overrides)
    return decoding.speculative_decode(
      TARGET, TARGET_PARAMS, kwargs.pop('drafter', drafter), DRAFT_PARAMS, **kwargs
    )

  with pytest.raises(ValueError, match='gamma'):
    spec(gamma=0)
  with pytest.raises(ValueError, match='max_new_tokens'):
    spec(max_new_tokens=0)
  with pytest.raises(ValueError, match='temperature'):
    spec(
      sampling=FILTERS,
      sampling_params=S.SamplingParams(jnp.float32(-1.0), jnp.int32(0), jnp.float32(1.0)),
    )
  with pytest.raises(ValueError, match='top_p'):
    spec(
      sampling=FILTERS,
      sampling_params=S.SamplingParams(jnp.float32(1.0), jnp.int32(0), jnp.float32(1.5)),
    )
  with pytest.raises(ValueError, match='top_k'):
    spec(
      sampling=FILTERS,
      sampling_params=S.SamplingParams(jnp.float32(1.0), jnp.int32(-2), jnp.float32(1.0)),
    )
  other_vocab = drafters.ModelDrafter(
    DecoderOnlyLM(dataclasses.replace(DRAFT.config, vocab_size=17))
  )
  with pytest.raises(ValueError, match='vocab'):
    spec(drafter=other_vocab)
  with pytest.raises(ValueError, match='empty prompt'):
    spec(prompt_tokens=jnp.zeros((2, 0), jnp.int32), prompt_lengths=jnp.zeros((2,), jnp.int32))
  with pytest.raises(ValueError, match='empty prompt'):
    spec(prompt_lengths=jnp.array([3, 0]))
  with pytest.raises(ValueError, match='longer than the prompt buffer'):
    spec(prompt_lengths=jnp.array([3, PROMPT_WIDTH + 1]))
  with pytest.raises(ValueError, match='token ids'):
    spec(prompt_tokens=PROMPTS[:2].at[0, 0].set(16))
  with pytest.raises(ValueError, match='eos_id'):
    spec(eos_id=16)
  with pytest.raises(ValueError, match='encoder_tokens'):
    spec(encoder_tokens=jnp.ones((2, 3), jnp.int32))
  # A model with learned positions cannot embed a stream longer than max_positions.
  short = DecoderOnlyLM(dataclasses.replace(TARGET.config, positions='learned', max_positions=12))
  with pytest.raises(ValueError, match='max_positions'):
    decoding.autoregressive_decode(
      short, _random_params(short, 0), PROMPTS[:2], max_new_tokens=8, sampling=GREEDY
    )
  # NaN weights: no valid distribution -> a clear error instead of garbage tokens.
  nan_params = jax.tree.map(lambda x: x * jnp.nan, TARGET_PARAMS)
  with pytest.raises(ValueError, match='NaN'):
    _filters_decode(PROMPTS[:8], PROMPT_LENGTHS[:8], {}, params=nan_params)
  with pytest.raises(ValueError, match='NaN'):
    _filters_baseline(PROMPTS[:8], PROMPT_LENGTHS[:8], {}, params=nan_params)


@pytest.mark.parametrize('gamma', [0, 3])
def test_a_learned_position_target_decodes_every_position_it_has(gamma):
  """max_positions M bounds what a decode feeds the target for the rows it keeps, prompt P +
  max_new_tokens N - 1 + gamma (the last token's verify at P + N - 2, its gamma drafts after it),
  not its cache (2 positions more, decode/state.py's `buffer_length`): N = M + 1 - P - gamma
  decodes as the full forward does, one token more is refused in one line."""
  max_positions, prompt_len = 16, 4
  config = dataclasses.replace(TARGET.config, positions='learned', max_positions=max_positions)
  target = DecoderOnlyLM(config)
  params = _random_params(target, 0, logit_scale=2.0)
  prompts = PROMPTS[:3, :prompt_len]  # [3, P], every row P long

  def decode(max_new_tokens):
    kwargs = dict(max_new_tokens=max_new_tokens, sampling=GREEDY)
    if not gamma:
      return decoding.autoregressive_decode(target, params, prompts, **kwargs)
    drafter = drafters.ModelDrafter(DRAFT)
    return decoding.speculative_decode(
      target, params, drafter, DRAFT_PARAMS, prompts, gamma=gamma, **kwargs
    )

  longest = max_positions + 1 - prompt_len - gamma
  assert decode_state.fed_positions(prompt_len, longest, gamma) == max_positions
  result = decode(longest)
  tokens = np.asarray(result.tokens)  # [3, N]
  # A row that gained one token a step verified its last one at P + N - 2 (fed up to M - 1).
  assert longest in np.asarray(result.metrics.target_calls)
  stream = np.concatenate([np.asarray(prompts), tokens[:, :-1]], axis=1)  # [3, P + N - 1]
  logits = np.asarray(jax.jit(target.forward)(params, jnp.asarray(stream)))  # [3, P + N - 1, V]
  np.testing.assert_array_equal(np.argmax(logits[:, prompt_len - 1 :], -1), tokens)
  with pytest.raises(ValueError, match=f'more than the model.s max_positions={max_positions}') as e:
    decode(longest + 1)
  assert len(str(e.value).splitlines()) == 1


@dataclasses.dataclass(frozen=True)
class _WriteRecordingLM:
  """`inner`, recording for each `extend` call the end of its furthest write, max_b start[b] + T,
  and its cache's length in `_WRITE_ENDS[name]` (a host callback: the loops' starts are traced)."""

  inner: DecoderOnlyLM
  name: str

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  def init_cache(self, *args, **kwargs):
    return self.inner.init_cache(*args, **kwargs)

  def extend(self, params, cache, tokens, start):
    cache_length = cache[0][0].shape[1]  # [B, max_length, H, D]
    record = lambda end: _WRITE_ENDS[self.name].append((int(end), cache_length))  # noqa: E731
    jax.debug.callback(record, jnp.max(start) + tokens.shape[1])
    return self.inner.extend(params, cache, tokens, start)


_WRITE_ENDS: dict = {}


def test_the_loops_caches_hold_their_longest_write():
  """`DecoderOnlyLM.extend` clamps a write past its cache onto earlier positions, unchecked under
  jit, so every write of every loop must end inside the cache (decode/state.py's
  `buffer_length`). The longest is a finished row's, which rides along while others run: its
  gamma + 1 tokens at P + N - 1 end at L_max - 1 (the last position is the token buffer's)."""
  from speculative.decode import spectr_loop

  gamma, max_new = 3, 7
  target = _WriteRecordingLM(TARGET, 'target')
  draft = drafters.ModelDrafter(_WriteRecordingLM(DRAFT, 'draft'))
  prompts = PROMPTS[:8]  # [8, P]: every row P long, so a row finished by length is at P + N
  kwargs = dict(max_new_tokens=max_new, sampling=GREEDY)
  speculative = dict(kwargs, gamma=gamma)
  decodes = {
    'baseline': lambda: decoding.autoregressive_decode(target, TARGET_PARAMS, prompts, **kwargs),
    'speculative': lambda: decoding.speculative_decode(
      target, TARGET_PARAMS, draft, DRAFT_PARAMS, prompts, **speculative
    ),
    'adaptive_verify': lambda: decoding.speculative_decode(
      target, TARGET_PARAMS, draft, DRAFT_PARAMS, prompts, adaptive_verify=True, **speculative
    ),
    'spectr': lambda: spectr_loop.spectr_decode(
      target,
      TARGET_PARAMS,
      draft,
      DRAFT_PARAMS,
      prompts,
      num_drafts=2,
      draft_length=gamma,
      **kwargs,
    ),
  }
  furthest = {}
  for name, decode in decodes.items():
    _WRITE_ENDS.clear()
    _WRITE_ENDS.update(target=[], draft=[])
    jax.block_until_ready(decode().tokens)
    jax.effects_barrier()
    l_max = decode_state.buffer_length(PROMPT_WIDTH, max_new, 0 if name == 'baseline' else gamma)
    for model, ends in _WRITE_ENDS.items():  # the baseline has no draft: no ends
      assert all(length == l_max for _, length in ends), (name, model, ends)
      if ends:
        furthest[name, model] = max(end for end, _ in ends) - l_max  # <= 0: inside the cache
  assert furthest == {
    ('baseline', 'target'): -2,  # rows in step: none finishes while another runs
    **{(name, 'target'): -1 for name in ('speculative', 'adaptive_verify', 'spectr')},
    **{(name, 'draft'): -2 for name in ('speculative', 'adaptive_verify', 'spectr')},
  }, furthest
