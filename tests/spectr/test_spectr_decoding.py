"""Tests for speculative/spectr/decoding.py and the sequence-level selection in spectr.py.

Properties: SpecTr samples follow the target's exact sequence distribution (all V^3 continuations
enumerated, K in {2, 4}, L in {1, 3}); K = 1 is `speculative_decode` token for token (sampled and
greedy, same rng); greedy SpecTr == greedy baseline (decoder-only and T5 encoder-decoder); the
acceptance with K drafts is never below one draft's at the same conditionals, the empirical
acceptance count matches the computed acceptance probabilities, and block efficiency grows with K;
EOS and max-length edges; a row in a batch equals the row alone; no recompilation for new values.

Run (repository root): .venv/bin/python -m pytest -q -p no:xdist tests/spectr/test_spectr_decoding.py
"""

import dataclasses

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest
from scipy import stats

from speculative import drafters
from speculative import sampling as S
from speculative import spectr
from speculative.decode import loops as decoding
from speculative.decode import state as decode_state
from speculative.decode import step
from speculative.models.decoder_only import DecoderOnlyConfig
from speculative.models.decoder_only import DecoderOnlyLM
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config
from speculative.spectr import decoding as spectr_decoding

FALSE_FAILURE_RATE = 1e-4  # per test
FILTERS = S.SamplingConfig(top_k=True, top_p=True)  # greedy = run-time temperature 0, one compile


_random_params = model_utils.random_params


def _values(temperature=1.0, top_k=0, top_p=1.0):
  return S.SamplingParams.create(temperature, top_k, top_p)


# Batch pair (vocab 16) for identities, edges and block efficiency.
TARGET = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=16, d_model=32, d_ff=64, num_layers=2, num_heads=4)
)
DRAFT = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=16, d_model=16, d_ff=32, num_layers=1, num_heads=2)
)
TARGET_PARAMS = _random_params(TARGET, 0, logit_scale=2.0)
DRAFT_PARAMS = _random_params(DRAFT, 1, logit_scale=2.0)
DRAFTER = drafters.ModelDrafter(DRAFT)
NUM_PROMPTS, PROMPT_WIDTH, MAX_NEW, EOS = 64, 6, 10, 3
_prompt_rng = np.random.default_rng(7)
PROMPTS = jnp.asarray(_prompt_rng.integers(0, 16, (NUM_PROMPTS, PROMPT_WIDTH)), jnp.int32)
PROMPT_LENGTHS = jnp.asarray(_prompt_rng.integers(1, PROMPT_WIDTH + 1, NUM_PROMPTS), jnp.int32)
L = 3  # draft length of the batch-pair tests (K varies)
T5_DRAFT_NOISE = 0.2


def _spectr(
  k,
  values,
  rng=11,
  *,
  drafter=DRAFTER,
  draft_params=DRAFT_PARAMS,
  prompts=PROMPTS,
  lengths=PROMPT_LENGTHS,
  max_new=MAX_NEW,
  row_ids=None,
  draft_length=L,
):
  return spectr_decoding.spectr_decode(
    TARGET,
    TARGET_PARAMS,
    drafter,
    draft_params,
    prompts,
    lengths,
    num_drafts=k,
    draft_length=draft_length,
    max_new_tokens=max_new,
    sampling=FILTERS,
    sampling_params=_values(**values),
    rng=rng,
    eos_id=EOS,
    row_ids=row_ids,
  )


def _speculative(values, rng=11):
  return decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    DRAFTER,
    DRAFT_PARAMS,
    PROMPTS,
    PROMPT_LENGTHS,
    gamma=L,
    max_new_tokens=MAX_NEW,
    sampling=FILTERS,
    sampling_params=_values(**values),
    rng=rng,
    eos_id=EOS,
  )


@pytest.fixture(scope='module')
def greedy_baseline():
  return decoding.autoregressive_decode(
    TARGET,
    TARGET_PARAMS,
    PROMPTS,
    PROMPT_LENGTHS,
    max_new_tokens=MAX_NEW,
    sampling=FILTERS,
    sampling_params=_values(0.0),
    eos_id=EOS,
  )


def _assert_same(expected, actual, label):
  exp, act = np.asarray(expected.tokens), np.asarray(actual.tokens)
  if not (np.array_equal(exp, act) and np.array_equal(expected.lengths, actual.lengths)):
    row = int(
      np.flatnonzero(
        (exp != act).any(1) | (np.asarray(expected.lengths) != np.asarray(actual.lengths))
      )[0]
    )
    raise AssertionError(f'{label}: row {row} differs: {exp[row]} vs {act[row]}')


# --------------------------------------------------------------------------------------------------
# K = 1 is Leviathan's algorithm; greedy identity.
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
  'values',
  [dict(temperature=1.0), dict(temperature=0.0), dict(temperature=0.8, top_k=5)],
  ids=['t1', 'greedy', 'topk'],
)
def test_k1_equals_speculative_decode_token_for_token(values):
  for rng in (11, 12):
    expected = _speculative(values, rng)
    actual = _spectr(1, values, rng)
    _assert_same(expected, actual, f'K=1 {values} rng={rng}')
    np.testing.assert_array_equal(expected.metrics.target_calls, actual.metrics.target_calls)
    np.testing.assert_array_equal(expected.metrics.accepted, actual.metrics.accepted)
    np.testing.assert_array_equal(expected.metrics.drafted, actual.metrics.drafted)


@pytest.mark.slow
@pytest.mark.parametrize('k', [2, 4])
def test_greedy_spectr_equals_greedy_baseline(greedy_baseline, k):
  result = _spectr(k, dict(temperature=0.0))
  _assert_same(greedy_baseline, result, f'greedy K={k}')
  lengths = np.asarray(result.lengths)
  assert lengths.min() < MAX_NEW == lengths.max()  # both stopping rules (EOS, max length) occur
  metrics = jax.tree.map(np.asarray, result.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum()
  assert np.all(metrics.drafted == L * metrics.target_calls)
  assert np.all(lengths <= (L + 1) * metrics.target_calls)
  assert np.all(lengths >= metrics.target_calls)


# --------------------------------------------------------------------------------------------------
# Acceptance and block efficiency.
# --------------------------------------------------------------------------------------------------


def test_acceptance_with_k_drafts_beats_one_draft_and_matches_the_counts():
  """Per selection, k-Seq's acceptance 1-(1-beta(rho*))^k >= sum_x min(p, q) (deterministic); the
  number of accepted depths is a sum of Bernoulli(acceptance) draws (a martingale, z-test); and the
  block efficiency with K = 4 exceeds K = 1 on the same prompts (two-sample z-test over 256
  rows: the effect here is ~7.5 standard errors, so the 3.7-SE threshold fails with probability
  < 1e-4)."""
  seeds = range(20, 24)
  runs = {k: [_spectr(k, dict(temperature=1.0), rng) for rng in seeds] for k in (1, 4)}
  for k, results in runs.items():
    metrics = [jax.tree.map(np.asarray, r.metrics) for r in results]
    alpha = np.concatenate([m.alpha_sum for m in metrics])
    single = np.concatenate([m.single_alpha_sum for m in metrics])
    selections = np.concatenate([m.selections for m in metrics])
    accepted = np.concatenate([m.accepted for m in metrics])
    assert np.all(alpha >= single - 1e-5 * selections), k
    if k == 1:
      np.testing.assert_allclose(alpha, single, rtol=1e-6, atol=1e-6)
    mean = alpha.sum() / selections.sum()
    bound = stats.norm.isf(FALSE_FAILURE_RATE / 4) * np.sqrt(selections.sum() * mean * (1 - mean))
    assert abs(accepted.sum() - alpha.sum()) <= bound, (k, accepted.sum(), alpha.sum(), bound)
  per_row = {
    k: np.concatenate([np.asarray(r.lengths) / np.asarray(r.metrics.target_calls) for r in results])
    for k, results in runs.items()
  }
  k4_alpha = sum(float(r.metrics.alpha_sum.sum()) for r in runs[4])
  k4_single = sum(float(r.metrics.single_alpha_sum.sum()) for r in runs[4])
  assert k4_alpha > 1.2 * k4_single  # the gain is real in this setting, not only >=
  diff = per_row[4].mean() - per_row[1].mean()
  se = np.sqrt(per_row[4].var(ddof=1) / len(per_row[4]) + per_row[1].var(ddof=1) / len(per_row[1]))
  assert diff > 0 and diff / se > stats.norm.isf(FALSE_FAILURE_RATE), (diff, se)


# --------------------------------------------------------------------------------------------------
# Edges: draft == target, EOS inside a block, max length, batch independence, recompilation.
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_draft_equal_to_target_and_max_length(greedy_baseline):
  """Draft == target: every draft accepted, block efficiency L+1 except in the last block (cut by
  EOS or max_new_tokens, which is not a multiple of L+1); tokens equal the baseline, truncated."""
  max_new = 7
  for values in (dict(temperature=0.0), dict(temperature=1.0)):
    result = _spectr(
      3,
      values,
      drafter=drafters.ModelDrafter(TARGET),
      draft_params=TARGET_PARAMS,
      max_new=max_new,
      prompts=PROMPTS[:16],
      lengths=PROMPT_LENGTHS[:16],
    )
    metrics = jax.tree.map(np.asarray, result.metrics)
    lengths = np.asarray(result.lengths)
    assert result.tokens.shape == (16, max_new)
    np.testing.assert_array_equal(metrics.target_calls, np.ceil(lengths / (L + 1)))
    np.testing.assert_array_equal(metrics.accepted, metrics.drafted)
    np.testing.assert_allclose(metrics.alpha_sum / metrics.selections, 1.0, atol=1e-5)
    tokens = np.asarray(result.tokens)
    for row in range(16):  # every row stops at its first EOS or at max length
      toks = tokens[row, : lengths[row]]
      assert EOS not in toks[:-1] and (toks[-1] == EOS or len(toks) == max_new)
      assert np.all(tokens[row, lengths[row] :] == 0)
    if values['temperature'] == 0.0:
      np.testing.assert_array_equal(lengths, np.minimum(greedy_baseline.lengths[:16], max_new))
      np.testing.assert_array_equal(tokens, np.asarray(greedy_baseline.tokens)[:16, :max_new])
  assert 0 < (lengths < max_new).sum() and (lengths == max_new).any()


@dataclasses.dataclass(frozen=True)
class _AgreementCheckingLM:
  """A decoder-only LM whose `extend` over `check_width` tokens returns NaN logits for the rows
  whose K copies (rows b*K .. b*K+K-1) disagree on any cache entry before `start`: the entries the
  call reads. spectr_decode then raises, so a test sees any cache-adoption error directly (a wrong
  draft cache alone would only lower acceptance, which no distribution test can see)."""

  inner: DecoderOnlyLM
  copies: int
  check_width: int
  trace: int = 0  # another value: another static argument, so a patched step is traced anew

  @property
  def vocab_size(self):
    return self.inner.vocab_size

  def init_cache(self, *args, **kwargs):
    return self.inner.init_cache(*args, **kwargs)

  def init_params(self, *args, **kwargs):
    return self.inner.init_params(*args, **kwargs)

  def extend(self, params, cache, tokens, start):
    logits, new_cache = self.inner.extend(params, cache, tokens, start)
    rows = tokens.shape[0]
    if tokens.shape[1] != self.check_width or rows % self.copies:
      return logits, new_cache
    groups = rows // self.copies
    row_start = start.reshape(groups, self.copies)[:, 0]  # copies share their length
    agree = jnp.ones((groups,), bool)
    for leaf in jax.tree_util.tree_leaves(cache):  # [rows, positions, heads, dims]
      grouped = leaf.reshape(groups, self.copies, leaf.shape[1], -1)
      differs = jnp.any(grouped != grouped[:, :1], axis=(1, 3))  # [groups, positions]
      read = jnp.arange(leaf.shape[1])[None, :] < row_start[:, None]
      agree &= ~jnp.any(differs & read, axis=1)
    agree = jnp.repeat(agree, self.copies)
    return jnp.where(agree[:, None, None], logits, jnp.nan), new_cache


def _agreement_checked_decode(trace: int = 0):
  """SpecTr at temperature 1, K = 4, on 32 prompts, through the agreement-checking models."""
  k = 4
  target = _AgreementCheckingLM(TARGET, k, L + 1, trace)
  draft = drafters.ModelDrafter(_AgreementCheckingLM(DRAFT, k, 2, trace))
  return spectr_decoding.spectr_decode(
    target,
    TARGET_PARAMS,
    draft,
    DRAFT_PARAMS,
    PROMPTS[:32],
    PROMPT_LENGTHS[:32],
    num_drafts=k,
    draft_length=L,
    max_new_tokens=MAX_NEW,
    sampling=FILTERS,
    sampling_params=_values(temperature=1.0),
    rng=5,
    eos_id=EOS,
  )


@pytest.mark.slow
def test_all_copies_agree_on_every_cache_entry_that_is_read(monkeypatch):
  """Target verify calls and the drafter's catch-up calls (T=2) check that the K copies of a row
  hold identical cache entries at every position the call reads (NaN -> ValueError otherwise).
  At temperature 1, where the K drafts differ (greedy drafts are K equal copies, which agree
  whatever the step does). The check fails where the copies keep their own branches' caches."""
  metrics = jax.tree.map(np.asarray, _agreement_checked_decode().metrics)
  assert metrics.target_calls.sum() > 2 * 32 and 0 < metrics.accepted.sum()
  monkeypatch.setattr(step, '_adopt_rows', lambda new, old, index: new)
  with pytest.raises(ValueError, match='no valid distribution'):
    _agreement_checked_decode(trace=1)


@pytest.mark.slow
def test_row_in_batch_equals_row_alone_and_no_recompilation():
  batch = _spectr(4, dict(temperature=1.0), rng=3)
  counts = dict(decode_state.TRACE_COUNTS)
  others = [
    _spectr(4, values, rng=rng).tokens
    for values, rng in [
      (dict(temperature=0.7), 3),
      (dict(temperature=1.0, top_p=0.6), 3),
      (dict(temperature=1.0), jax.random.key(9)),
    ]
  ]
  assert dict(decode_state.TRACE_COUNTS) == counts  # new values and seeds: no new trace
  # ... and the new values took effect.
  assert len({np.asarray(t).tobytes() for t in [batch.tokens] + others}) == 4
  for row in (5, 40):
    alone = _spectr(
      4,
      dict(temperature=1.0),
      rng=3,
      prompts=PROMPTS[row : row + 1],
      lengths=PROMPT_LENGTHS[row : row + 1],
      row_ids=jnp.array([row]),
    )
    np.testing.assert_array_equal(alone.tokens[0], batch.tokens[row])
    np.testing.assert_allclose(alone.metrics.alpha_sum[0], batch.metrics.alpha_sum[row], rtol=1e-5)


@pytest.mark.slow
def test_t5_encoder_decoder_greedy_identity():
  """A tiny T5 pair (the draft: the target's weights plus noise, so drafts are partly accepted):
  greedy SpecTr == greedy baseline; sampling runs (its exactness is the decoder-only test's job)."""
  target = T5(
    T5Config(
      vocab_size=32,
      emb_dim=16,
      num_heads=2,
      num_encoder_layers=1,
      num_decoder_layers=2,
      head_dim=8,
      mlp_dim=32,
    )
  )
  target_params = _random_params(target, 0)
  noise = _random_params(target, 1)
  draft_params = jax.tree.map(lambda x, n: x + T5_DRAFT_NOISE * n, target_params, noise)
  drafter = drafters.ModelDrafter(target)
  rng = np.random.default_rng(3)
  encoder_tokens = rng.integers(2, 32, (6, 7)).astype(np.int32)
  encoder_tokens[np.arange(6), rng.integers(3, 8, 6) - 1] = 1  # EOS, then padding
  encoder_tokens[np.arange(7)[None, :] > np.argmax(encoder_tokens == 1, axis=1)[:, None]] = 0
  greedy = _values(0.0)
  base = decoding.autoregressive_decode(
    target,
    target_params,
    None,
    max_new_tokens=12,
    sampling=FILTERS,
    sampling_params=greedy,
    eos_id=1,
    encoder_tokens=encoder_tokens,
  )

  def decode(values, seed):
    return spectr_decoding.spectr_decode(
      target,
      target_params,
      drafter,
      draft_params,
      None,
      num_drafts=3,
      draft_length=2,
      max_new_tokens=12,
      sampling=FILTERS,
      sampling_params=values,
      eos_id=1,
      encoder_tokens=encoder_tokens,
      rng=seed,
    )

  result = decode(greedy, 0)
  _assert_same(base, result, 'T5 greedy K=3')
  metrics = jax.tree.map(np.asarray, result.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum(), metrics
  sampled = decode(_values(1.0), 4)
  metrics = jax.tree.map(np.asarray, sampled.metrics)
  assert np.all(np.asarray(sampled.lengths) >= 1)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum(), metrics


def test_bad_inputs_raise_clear_errors():
  with pytest.raises(ValueError, match='num_drafts'):
    _spectr(0, {})
  with pytest.raises(ValueError, match='draft_length'):
    _spectr(2, {}, draft_length=0)
  other_vocab = drafters.ModelDrafter(
    DecoderOnlyLM(DecoderOnlyConfig(vocab_size=17, d_model=16, d_ff=32, num_layers=1, num_heads=2))
  )
  with pytest.raises(ValueError, match='vocab'):
    _spectr(2, {}, drafter=other_vocab)
  with pytest.raises(ValueError, match='max_new_tokens'):
    _spectr(2, {}, max_new=0)
  with pytest.raises(ValueError, match='accept_uniforms'):
    spectr.spectr_sequence_select(
      jnp.zeros((1, 2, 3), jnp.int32),
      jnp.zeros((1, 2, 3, 4)),
      jnp.zeros((1, 2, 4, 4)),
      jnp.zeros((1, 2, 3)),
      jax.random.split(jax.random.key(0), 1),
    )


def test_a_row_whose_survivors_stop_drafting_samples_from_a_survivors_prefix():
  """Draft 0 = [0, 4], draft 1 = [1] (num_drafted [2, 1]); the target emits 1 surely at depth 0,
  so draft 0 dies there and draft 1, the survivor, has no token at depth 1: the row emits a
  sample of p at depth 1 given the survivor's prefix [1] (token 2), not draft 0's [0] (token 3)."""
  vocab = 5
  tokens = jnp.array([[[0, 4], [1, 0]]], jnp.int32)  # [B=1, K=2, L=2]; draft 1's 0: filler
  q = jnp.zeros((1, 2, 2, vocab)).at[0, :, 0, :2].set(0.5).at[0, 0, 1, 4].set(1.0)
  q = q.at[0, 1, 1, 0].set(1.0)  # the filler's (never read: past num_drafted)
  p = jnp.zeros((1, 2, 3, vocab)).at[0, :, 0, 1].set(1.0)  # depth 0: token 1 surely
  p = p.at[0, 0, 1, 3].set(1.0).at[0, 1, 1, 2].set(1.0)  # p(.|0) = 3, p(.|1) = 2
  p = p.at[0, :, 2, 0].set(1.0)
  selection = spectr.spectr_sequence_select(
    tokens,
    q,
    p,
    jnp.full((1, 2, 2), 0.3),
    jax.random.split(jax.random.key(0), 1),
    num_drafted=jnp.array([[2, 1]], jnp.int32),
  )
  assert int(selection.num_accepted[0]) == 1 and int(selection.branch[0]) == 1
  assert np.asarray(selection.tokens)[0, :2].tolist() == [1, 2]


# --------------------------------------------------------------------------------------------------
# rho* with a run-time draft count.
# --------------------------------------------------------------------------------------------------


def test_rho_star_counted_matches_static_rho_star():
  rng = np.random.default_rng(0)
  p = jnp.asarray(rng.dirichlet(np.full(6, 0.5), 30), jnp.float32)
  q = jnp.asarray(rng.dirichlet(np.full(6, 0.5), 30), jnp.float32)
  # Jitted as the decode loop runs them: one compile each, not one per op.
  counted_fn = jax.jit(spectr.rho_star_counted, static_argnums=3)
  static_fn = jax.jit(spectr.rho_star, static_argnums=2)
  for k in (1, 2, 3, 5):
    counted = counted_fn(p, q, jnp.full((30,), k), 5)
    np.testing.assert_allclose(counted, static_fn(p, q, k), rtol=1e-6)
  np.testing.assert_array_equal(counted_fn(p, q, jnp.full((30,), 1), 5), 1.0)


# --------------------------------------------------------------------------------------------------
# Sequence-level distribution: SpecTr samples vs the target's enumerated distribution.
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
# (K, L, the draft's stop_below): with a stop rule the K drafts of a row propose different
# numbers of tokens, and a depth can have survivors none of which drafted there.
SEQ_CASES = [(2, 1, 0.0), (2, 3, 0.0), (4, 1, 0.0), (4, 3, 0.0), (4, 3, 0.3)]


@jax.jit
def _standardized_target_probs(params, streams, sampling_params):
  logits = SEQ_TARGET.forward(params, streams)
  return S.probs_from_logits(logits, FILTERS, sampling_params)


def _exact_sequence_distribution(values):
  """P(c1 c2 c3 | prompt) under the standardized target, for all V^3 continuations."""
  continuations = model_utils.all_continuations(SEQ_VOCAB, SEQ_NEW)
  streams = np.concatenate([np.tile(SEQ_PROMPT, (len(continuations), 1)), continuations], 1)
  probs = np.asarray(_standardized_target_probs(SEQ_TARGET_PARAMS, jnp.asarray(streams), values))
  probs = probs[:, len(SEQ_PROMPT) - 1 : -1]  # [V^3, 3, V]: the distributions of c1, c2, c3
  return model_utils.sequence_probs(probs, continuations)  # [V^3], index = base-V number


@pytest.mark.slow
@pytest.mark.parametrize('k, length, stop_below', SEQ_CASES)
def test_sequence_distribution_matches_target(k, length, stop_below):
  values = _values(1.0)
  exact = _exact_sequence_distribution(values)
  assert abs(exact.sum() - 1) < 1e-5
  result = spectr_decoding.spectr_decode(
    SEQ_TARGET,
    SEQ_TARGET_PARAMS,
    drafters.ModelDrafter(SEQ_DRAFT, stop_below=stop_below),
    SEQ_DRAFT_PARAMS,
    jnp.asarray(np.tile(SEQ_PROMPT, (SEQ_SAMPLES, 1))),
    num_drafts=k,
    draft_length=length,
    max_new_tokens=SEQ_NEW,
    sampling=FILTERS,
    sampling_params=values,
    rng=100 * k + length,
  )
  tokens = np.asarray(result.tokens)
  assert np.all(np.asarray(result.lengths) == SEQ_NEW)
  counts = model_utils.sequence_counts(tokens, SEQ_VOCAB)
  assert counts[exact == 0].sum() == 0, 'sampled a continuation the target rules out'
  statistic, dof, p_value = model_utils.pooled_chi_square(counts, exact)
  # The parametrizations share the false-failure budget (Bonferroni).
  assert p_value > FALSE_FAILURE_RATE / len(SEQ_CASES), (
    f'chi2={statistic:.1f} on {dof} dof, p={p_value:.2e}'
  )
  # Both acceptance and rejection were exercised, and several drafts survived some depths.
  metrics = jax.tree.map(np.asarray, result.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum()
  alpha = metrics.alpha_sum.sum() / metrics.selections.sum()
  single = metrics.single_alpha_sum.sum() / metrics.selections.sum()
  assert 0.2 < single < 0.9 and alpha > single, (alpha, single)
  if stop_below:  # the stop rule shortened some drafts
    assert metrics.drafted.sum() < length * metrics.target_calls.sum()
