"""Tests of the exactness audit (speculative/decode/audit.py) and of T5Config.logits_dtype.

A constructed near-tie (two float32 logits a relative 1e-3 apart) is a near-tie for a bfloat16
decode and a mismatch for a float32 one; a deliberately inexact acceptance rule (lenience << 1,
which accepts draft tokens far below the target's argmax) is flagged as mismatch; length-only
differences are mismatches. The float32 logits head keeps the cached 1-token decode equal to the
full forward's argmax in bfloat16, and leaves the default model unchanged.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import drafters
from speculative import sampling
from speculative.decode import audit
from speculative.decode import loops as decoding
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config

TINY = T5Config(
  vocab_size=61,
  dtype='bfloat16',
  emb_dim=16,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=2,
  head_dim=8,
  mlp_dim=24,
)
ENCODER = np.array([[5, 9, 13, 2, 1, 0], [7, 3, 1, 0, 0, 0], [11, 4, 8, 6, 20, 1]], np.int32)


def _params(config=TINY, seed=0, logit_scale=4.0):
  return model_utils.random_params(T5(config), seed, logit_scale)


def _near_tie_params(model, params, prefix, delta):
  """Params whose float32 logits after `prefix` (row 0 of ENCODER) have top-2 (a, b) with
  z_b = (1 - delta) z_a: the logits column of b becomes (1 - delta) times a's."""
  logits = audit.teacher_forced_logits(model, params, ENCODER[:1], [prefix])[0]
  a, b = np.argsort(-logits)[:2]
  assert logits[a] > 0
  kernel = params['decoder']['logits_dense']['kernel']
  kernel = kernel.at[:, b].set(kernel[:, a] * (1.0 - delta))
  params = jax.tree.map(lambda x: x, params)
  params['decoder']['logits_dense']['kernel'] = kernel
  return params, int(a), int(b)


@functools.partial(jax.jit, static_argnums=0)
def _block_extend(model, params, encoder, tokens):
  """One cached extend of tokens [B, T] at position 0: logits [B, T, V]."""
  cache = model.init_cache(params, tokens.shape[0], 8, encoder)
  return model.extend(params, cache, tokens, jnp.zeros((tokens.shape[0],), jnp.int32))[0]


@functools.partial(jax.jit, static_argnums=0)
def _step(model, params, cache, token, position):
  """One cached 1-token extend of token [B, 1] at `position`: (logits [B, 1, V], cache)."""
  return model.extend(params, cache, token, jnp.full((token.shape[0],), position, jnp.int32))


def _paths(model, params, encoder, decoder_inputs):
  """Logits [B, T, V] of the full forward, of T cached 1-token steps and of one T-token extend."""
  batch, length = decoder_inputs.shape
  full = audit.forward_logits(model, params, encoder, decoder_inputs)
  cache = jax.jit(model.init_cache, static_argnums=(1, 2))(params, batch, 8, encoder)
  steps = []
  for t in range(length):
    logits, cache = _step(model, params, cache, decoder_inputs[:, t : t + 1], t)
    steps.append(logits)
  return full, jnp.concatenate(steps, 1), _block_extend(model, params, encoder, decoder_inputs)


def test_rounding_bound_and_first_difference():
  c = audit.DEFAULT_BOUND_FACTOR
  assert audit.rounding_bound([10.0, -9.5], 'bfloat16') == c * 2.0**-7 * 10.0
  assert audit.rounding_bound([0.1, 0.2], 'float32') == c * 2.0**-23  # floor at |z| = 1
  assert audit.rounding_bound([3.0], 'bfloat16', factor=1.0) == 2.0**-7 * 3.0
  with pytest.raises(ValueError, match='floating'):
    audit.rounding_bound([1.0], 'int32')
  assert audit.first_difference([1, 2, 3], [1, 2, 3]) is None
  assert audit.first_difference([1, 2, 3], [1, 4, 3]) == 1
  assert audit.first_difference([1, 2], [1, 2, 5]) == 2
  assert audit.first_difference([], [7]) == 0


def test_teacher_forced_logits_match_cached_decode_in_float32():
  """The recompute is the target's own next-token distribution: equal to the cached extend."""
  model = T5(dataclasses.replace(TINY, dtype='float32'))
  params = _params()
  prefixes = [[4, 17, 30], [8], []]
  got = audit.teacher_forced_logits(model, params, ENCODER, prefixes)  # [3, V]
  # One cached extend per row, fed [start] + prefix padded to 4 tokens, read at the prefix end.
  tokens = jnp.asarray([[0] + p + [0] * (3 - len(p)) for p in prefixes], jnp.int32)  # [3, 4]
  logits = _block_extend(model, params, jnp.asarray(ENCODER), tokens)  # [3, 4, V]
  for i, prefix in enumerate(prefixes):
    np.testing.assert_allclose(got[i], np.asarray(logits[i, len(prefix)]), rtol=1e-5, atol=1e-5)


def test_constructed_near_tie_depends_on_dtype():
  model = T5(TINY)
  prefix = [4, 17]
  params, a, b = _near_tie_params(model, _params(), prefix, delta=1e-3)
  baseline = [prefix + [a, 3], [5, 6]]
  speculative = [prefix + [b, 9], [5, 6]]
  divergences = audit.audit_divergences(model, params, ENCODER[:2], baseline, speculative)
  assert len(divergences) == 1
  d = divergences[0]
  assert (d.example, d.position, d.baseline_token, d.speculative_token) == (0, 2, a, b)
  assert d.top_tokens == (a, b)
  np.testing.assert_allclose(d.gap, 1e-3 * d.baseline_logit, rtol=1e-3)
  assert d.gap < d.bound and d.dtype == 'bfloat16' and d.verdict == audit.NEAR_TIE
  assert audit.summarize(divergences, 2) == {
    'identical': 1,
    'diverged': 1,
    'near_tie': 1,
    'mismatch': 0,
  }
  # The same flip in a float32 decode is not explained by rounding (bound ~2e-7 relative).
  f32 = audit.audit_divergences(
    T5(dataclasses.replace(TINY, dtype='float32')), params, ENCODER[:2], baseline, speculative
  )
  assert f32[0].verdict == audit.MISMATCH and f32[0].bound < f32[0].gap
  # Picking a token far below the top is a mismatch in any dtype.
  logits = audit.teacher_forced_logits(model, params, ENCODER[:1], [prefix])[0]
  worst = int(np.argmin(logits))
  far = audit.audit_divergences(model, params, ENCODER[:1], [prefix + [a]], [prefix + [worst]])
  assert far[0].verdict == audit.MISMATCH and far[0].deficit > 2 * far[0].bound
  table = audit.format_table(divergences + far, token_text=lambda t: f'tok{t}')
  assert table.count('\n') == 3 and 'near-tie' in table and 'mismatch' in table
  assert f'tok{b}' in table


@pytest.mark.parametrize('dtype,top', [('bfloat16', 10.0), ('float32', 1.0)])
def test_verdicts_on_both_sides_of_the_bound(dtype, top):
  """The verdict rule on constructed float32 logits: a speculative token 0.9 bound below the top is
  a near-tie, 1.1 bound below a mismatch, and a stopped output (-1) a mismatch however close."""
  bound = audit.rounding_bound([top], dtype)  # C * eps(dtype) * max(|top|, 1)
  logits = np.full((3, 5), -4.0, np.float32)
  logits[:, 0] = top
  logits[:, 2] = [top - 0.9 * bound, top - 1.1 * bound, top - 0.9 * bound]
  out = audit.classify_logits(logits, np.zeros(3, np.int32), np.asarray([2, 2, -1]), dtype)
  assert np.asarray(out['near_tie']).tolist() == [True, False, False]
  np.testing.assert_allclose(np.asarray(out['bound']), bound, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(out['deficit'])[:2], [0.9 * bound, 1.1 * bound], rtol=1e-2)


def test_length_only_difference_is_a_mismatch():
  model = T5(TINY)
  divergences = audit.audit_divergences(model, _params(), ENCODER[:1], [[4, 1]], [[4, 1, 7]])
  assert len(divergences) == 1
  d = divergences[0]
  assert (d.position, d.baseline_token, d.speculative_token) == (2, -1, 7)
  assert d.verdict == audit.MISMATCH
  assert '(stopped)' in audit.format_table(divergences)


def test_input_validation():
  model = T5(TINY)
  with pytest.raises(ValueError, match='speculative'):
    audit.audit_divergences(model, _params(), ENCODER[:2], [[1]], [[1], [2]])
  with pytest.raises(ValueError, match='encoder_tokens'):
    audit.audit_divergences(model, _params(), ENCODER, [[1]], [[2]])
  with pytest.raises(TypeError, match='dataclass'):
    audit.float32_model(object())
  assert audit.audit_divergences(model, _params(), ENCODER[:1], [[3, 1]], [[3, 1]]) == []


def _padded(sequences, width):
  """[N, width] int32 0-padded rows and [N] lengths."""
  tokens = np.zeros((len(sequences), width), np.int32)
  for i, seq in enumerate(sequences):
    tokens[i, : len(seq)] = seq
  return jnp.asarray(tokens), jnp.asarray([len(s) for s in sequences], jnp.int32)


@pytest.mark.slow
def test_audit_arrays_under_jit_agree_with_audit_divergences():
  """The traceable array form gives the host audit's verdicts, positions, tokens, gaps and bounds,
  with and without a shared prompt before the generated tokens."""
  model = T5(TINY)
  prefix = [4, 17]
  params, a, b = _near_tie_params(model, _params(), prefix, delta=1e-3)
  logits = audit.teacher_forced_logits(model, params, ENCODER[:1], [prefix])[0]
  worst = int(np.argmin(logits))
  encoder = ENCODER[[0, 1, 2, 0]]
  baseline = [prefix + [a, 3], [5, 6], [4, 1], prefix + [a]]
  speculative = [prefix + [b, 9], [5, 6], [4, 1, 7], prefix + [worst]]
  run = jax.jit(lambda *args, offsets: audit.audit_arrays(model, params, *args, offsets=offsets))
  for prompt in ([], [9, 12]):
    streams = lambda seqs: _padded([prompt + s for s in seqs], 8)
    (base, _), (spec, _) = streams(baseline), streams(speculative)
    lengths = lambda seqs: jnp.asarray([len(s) for s in seqs], jnp.int32)
    got = run(
      encoder,
      base,
      lengths(baseline),
      spec,
      lengths(speculative),
      offsets=jnp.full((4,), len(prompt), jnp.int32),
    )
    got = {k: np.asarray(v) for k, v in got.items()}
    want = audit.audit_divergences(
      model,
      params,
      encoder,
      [prompt + s for s in baseline],
      [prompt + s for s in speculative],
    )
    assert [d.example for d in want] == [0, 2, 3]
    codes = [audit.VERDICT_CODES[d.verdict] for d in want]
    np.testing.assert_array_equal(got['verdict'], [codes[0], 0, codes[1], codes[2]])
    assert got['position'].tolist() == [2, -1, 2, 2]
    for k, d in zip([0, 2, 3], want):
      assert got['position'][k] + len(prompt) == d.position
      assert (got['baseline_token'][k], got['speculative_token'][k]) == (
        d.baseline_token,
        d.speculative_token,
      )
      np.testing.assert_allclose(
        [got['gap'][k], got['bound'][k]], [d.gap, d.bound], rtol=1e-4, atol=1e-6
      )
      if d.speculative_token >= 0:
        np.testing.assert_allclose(got['deficit'][k], d.deficit, rtol=1e-4, atol=1e-6)
    assert got['gap'][1] == got['bound'][1] == 0.0
    if not prompt:  # the constructed near-tie, the length-only difference, the far token
      assert codes == [1, 2, 2]
  # Nothing differs: the float32 forward is skipped (lax.cond), every verdict is 0.
  same = run(encoder, base, lengths(baseline), base, lengths(baseline), offsets=None)
  np.testing.assert_array_equal(same['verdict'], 0)
  np.testing.assert_array_equal(same['position'], -1)


def _decode_both(model, params, drafter, draft_params, lenience=None):
  config, sampling_params = sampling.make_sampling(0.0)
  common = dict(
    max_new_tokens=10,
    sampling=config,
    sampling_params=sampling_params,
    eos_id=1,
    encoder_tokens=jnp.asarray(ENCODER),
  )
  base = decoding.autoregressive_decode(model, params, None, **common)
  spec = decoding.speculative_decode(
    model, params, drafter, draft_params, None, gamma=3, lenience=lenience, **common
  )
  as_lists = lambda r: [list(np.asarray(r.tokens[i, : r.lengths[i]])) for i in range(len(ENCODER))]
  return as_lists(base), as_lists(spec)


@pytest.mark.slow
def test_inexact_acceptance_rule_is_flagged_as_mismatch():
  """lenience 1e-3 accepts any draft token within log(1000) of the top logit: not exact."""
  model, params = T5(TINY), _params(seed=1)
  # A bigram table from random streams: cheap to compile, its greedy drafts are mostly not the
  # target's argmax.
  streams = np.random.default_rng(2).integers(0, TINY.vocab_size, (20, 12))
  table = drafters.estimate_bigram(streams, TINY.vocab_size)
  with pytest.warns(UserWarning, match='APPROXIMATE'):
    baseline, speculative = _decode_both(
      model, params, drafters.BigramDrafter(TINY.vocab_size), table, lenience=1e-3
    )
  divergences = audit.audit_divergences(model, params, ENCODER, baseline, speculative)
  summary = audit.summarize(divergences, len(ENCODER))
  assert summary['mismatch'] >= 1, audit.format_table(divergences)
  for d in divergences:
    assert (d.verdict == audit.MISMATCH) == (
      d.deficit > d.bound or d.speculative_token < 0 or d.baseline_token < 0
    )
    # The baseline is the target's greedy choice: its token is the float32 top one unless the
    # bfloat16 decode itself sat on a near-tie.
    assert d.baseline_logit >= d.top_logits[0] - d.bound


def test_logits_dtype_config():
  assert T5Config().logits_dtype is None
  assert T5Config(logits_dtype=np.float32).logits_dtype == 'float32'
  with pytest.raises(ValueError, match='logits_dtype'):
    T5Config(logits_dtype='bfloat16')


@pytest.mark.slow
def test_float32_logits_head_default_unchanged_and_applied_in_every_path():
  params = _params()
  encoder = jnp.asarray(ENCODER)
  decoder_inputs = jnp.asarray([[0, 4, 17, 30, 2]] * len(ENCODER), jnp.int32)
  # float32 activations: the option is a no-op, bit for bit.
  f32 = T5(dataclasses.replace(TINY, dtype='float32'))
  f32_head = T5(dataclasses.replace(TINY, dtype='float32', logits_dtype='float32'))
  reference = audit.forward_logits(f32, params, encoder, decoder_inputs)
  np.testing.assert_array_equal(
    reference, audit.forward_logits(f32_head, params, encoder, decoder_inputs)
  )

  def paths(model):
    """Full forward, T=1 steps and one T=5 extend: three [B, 5, V] logits."""
    return [np.asarray(x, np.float32) for x in _paths(model, params, encoder, decoder_inputs)]

  bf16 = paths(T5(TINY))
  bf16_head = paths(T5(dataclasses.replace(TINY, logits_dtype='float32')))
  for plain, head in zip(bf16, bf16_head):
    # The option changes every path (it is applied there) and moves it towards float32.
    assert np.abs(plain - head).max() > 0
    assert (
      np.abs(head - np.asarray(reference)).mean() < np.abs(plain - np.asarray(reference)).mean()
    )
  # Within one configuration the paths agree up to bfloat16 rounding of the activations.
  for other in bf16_head[1:]:
    np.testing.assert_allclose(other, bf16_head[0], atol=0.1 * np.abs(bf16_head[0]).max())


@pytest.mark.slow
def test_float32_logits_head_greedy_decode_equals_full_forward_argmax():
  model = T5(dataclasses.replace(TINY, logits_dtype='float32'))
  params = _params(seed=3)
  config, sampling_params = sampling.make_sampling(0.0)
  steps = 8
  result = decoding.autoregressive_decode(
    model,
    params,
    None,
    max_new_tokens=steps,
    sampling=config,
    sampling_params=sampling_params,
    encoder_tokens=jnp.asarray(ENCODER),
  )
  tokens = np.asarray(result.tokens)  # [B, steps], no EOS: every row has `steps` tokens
  assert (np.asarray(result.lengths) == steps).all()
  decoder_inputs = np.concatenate([np.zeros((len(ENCODER), 1), np.int32), tokens[:, :-1]], 1)
  full = np.asarray(
    audit.forward_logits(model, params, jnp.asarray(ENCODER), jnp.asarray(decoder_inputs))
  )  # [B, T, V]
  np.testing.assert_array_equal(full.argmax(-1), tokens)


def test_logit_error_ratios():
  params = _params()
  sequences = [[4, 17, 1], [8], [3, 3, 3, 3]]
  f32 = audit.logit_error_ratios(
    T5(dataclasses.replace(TINY, dtype='float32')), params, ENCODER, sequences, pad_to=6
  )
  assert f32.shape == (2 * 8,)  # the top-2 logits at each of the 8 positions
  np.testing.assert_array_equal(f32, 0.0)  # the same float32 computation as the reference
  bf16 = audit.logit_error_ratios(T5(TINY), params, ENCODER, sequences, pad_to=6)
  assert bf16.shape == (2 * 8,) and np.isfinite(bf16).all() and bf16.max() > 0
