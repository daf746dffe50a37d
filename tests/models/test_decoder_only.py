"""Tests for speculative/models/decoder_only.py: cached chunked decoding == full forward, per-row
offsets and overwriting stale entries, input validation, and the lm1b gin shapes."""

from pathlib import Path

import gin
import jax
import jax.numpy as jnp
from model_utils import random_params
import numpy as np
import pytest

from speculative.models.decoder_only import DecoderOnlyConfig
from speculative.models.decoder_only import DecoderOnlyLM

REPO = Path(__file__).resolve().parents[2]

VARIANTS = {
  'rotary_rmsnorm_untied': DecoderOnlyConfig(
    vocab_size=11, d_model=32, d_ff=48, num_layers=2, num_heads=4
  ),
  'learned_layernorm_tied': DecoderOnlyConfig(
    vocab_size=11,
    d_model=24,
    d_ff=40,
    num_layers=2,
    num_heads=3,
    positions='learned',
    max_positions=16,
    norm='layernorm',
    tie_embeddings=True,
  ),
}


def _params_and_tokens(model, seed, shape):
  """Random params with the real init's shapes and scales (`model_utils.random_params`) and random
  tokens, both made in NumPy: `init_params` and `jax.random.randint` outside a jit compiled one
  program per op (~4 s of the fast tier per variant). The properties below hold for any weights."""
  tokens = np.random.default_rng(seed).integers(0, model.vocab_size, shape).astype(np.int32)
  return random_params(model, 0), jnp.asarray(tokens)


@gin.configurable
def _pick_lm1b_models(target=gin.REQUIRED, draft=gin.REQUIRED):
  return target, draft


@pytest.mark.slow
@pytest.mark.parametrize('name', sorted(VARIANTS))
def test_cached_chunks_equal_full_forward(name):
  model = DecoderOnlyLM(VARIANTS[name])
  params, tokens = _params_and_tokens(model, 1, (2, 10))
  full = jax.jit(model.forward)(params, tokens)  # [2, 10, V]
  assert full.dtype == jnp.float32 and full.shape == (2, 10, model.vocab_size)
  cache = model.init_cache(params, 2, 12)
  extend = jax.jit(model.extend)
  chunks = []
  for lo, hi in [(0, 3), (3, 4), (4, 7), (7, 10)]:  # T = 3, 1, 3, 3
    logits, cache = extend(params, cache, tokens[:, lo:hi], jnp.full((2,), lo, jnp.int32))
    chunks.append(logits)
  np.testing.assert_allclose(np.concatenate(chunks, axis=1), full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('name', sorted(VARIANTS))
def test_per_row_offsets_and_overwritten_stale_entries(name):
  """Rows at different offsets; garbage written past a row's length is overwritten on re-feed."""
  model = DecoderOnlyLM(VARIANTS[name])
  params, tokens = _params_and_tokens(model, 2, (2, 9))
  full = np.asarray(jax.jit(model.forward)(params, tokens))
  cache = model.init_cache(params, 2, 12)
  extend = jax.jit(model.extend)
  # Both rows: positions 0..3, then junk at 4..7 (a "rejected" draft), never attended to later.
  _, cache = extend(params, cache, tokens[:, :4], jnp.zeros((2,), jnp.int32))
  junk = (tokens[:, 4:8] + 1) % model.vocab_size
  _, cache = extend(params, cache, junk, jnp.full((2,), 4, jnp.int32))
  # Row 0 re-feeds from position 2 (identical entries), row 1 from 4: T=4 at start [2, 4].
  start = jnp.array([2, 4], jnp.int32)
  chunk = jnp.stack([tokens[0, 2:6], tokens[1, 4:8]])
  logits, cache = extend(params, cache, chunk, start)
  np.testing.assert_allclose(logits[0], full[0, 2:6], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(logits[1], full[1, 4:8], atol=1e-5, rtol=1e-5)
  # Continue both rows to the end one token at a time (the T=1 decode path).
  start_t = jnp.array([6, 8], jnp.int32)
  step_tokens = jnp.stack([tokens[0, 6], tokens[1, 8]])[:, None]
  logits, cache = extend(params, cache, step_tokens, start_t)
  np.testing.assert_allclose(logits[0, 0], full[0, 6], atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(logits[1, 0], full[1, 8], atol=1e-5, rtol=1e-5)


def test_a_write_past_the_cache_is_refused_where_it_can_be_seen():
  """`extend` past its cache would clamp the write onto earlier positions (silently wrong
  entries): refused from the static shapes (T > max_length, at trace time) and from a concrete
  start; the last start that fits writes the cache's last positions, as the full forward."""
  model = DecoderOnlyLM(VARIANTS['rotary_rmsnorm_untied'])
  params, tokens = _params_and_tokens(model, 4, (1, 8))
  full = np.asarray(jax.jit(model.forward)(params, tokens))  # [1, 8, V]
  cache = model.init_cache(params, 1, 8)
  _, cache = jax.jit(model.extend)(params, cache, tokens[:, :5], jnp.zeros((1,), jnp.int32))
  logits, _ = model.extend(params, cache, tokens[:, 5:8], jnp.full((1,), 5, jnp.int32))
  np.testing.assert_allclose(logits[0], full[0, 5:8], atol=1e-5, rtol=1e-5)
  with pytest.raises(ValueError, match=r'at start 6\.\.6 leave a cache of 8 .*\[0, 5\]'):
    model.extend(params, cache, tokens[:, 5:8], jnp.full((1,), 6, jnp.int32))
  with pytest.raises(ValueError, match='at start -1'):
    model.extend(params, cache, tokens[:, 5:8], jnp.full((1,), -1, jnp.int32))
  with pytest.raises(ValueError, match='9 new tokens do not fit a cache of 8 positions'):
    jax.jit(model.extend)(params, cache, jnp.zeros((1, 9), jnp.int32), jnp.zeros((1,), jnp.int32))


def test_logits_depend_on_the_prefix_only():
  """Causality of the full forward: changing token t leaves logits before t unchanged."""
  model = DecoderOnlyLM(VARIANTS['rotary_rmsnorm_untied'])
  params, tokens = _params_and_tokens(model, 3, (1, 8))
  changed = tokens.at[0, 5].set((tokens[0, 5] + 1) % model.vocab_size)
  forward = jax.jit(model.forward)
  a, b = forward(params, tokens), forward(params, changed)
  np.testing.assert_array_equal(a[0, :5], b[0, :5])
  assert np.abs(np.asarray(a[0, 5:] - b[0, 5:])).max() > 1e-4


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match='divisible'):
    DecoderOnlyConfig(d_model=10, num_heads=3)
  with pytest.raises(ValueError, match='positions'):
    DecoderOnlyConfig(positions='alibi')
  with pytest.raises(ValueError, match='norm'):
    DecoderOnlyConfig(norm='batchnorm')
  with pytest.raises(ValueError, match='vocab_size'):
    DecoderOnlyConfig(vocab_size=0)
  model = DecoderOnlyLM(VARIANTS['learned_layernorm_tied'])
  # max_positions 16: a decode's cache of 18 feeds 16 positions for the rows it keeps, one of 19
  # feeds 17 (interface.UNFED_POSITIONS).
  model.init_cache(None, 1, 18)
  with pytest.raises(ValueError, match='feeds 17 positions .* max_positions=16'):
    model.init_cache(None, 1, 19)
  with pytest.raises(ValueError, match='encoder_tokens'):
    model.init_cache(None, 1, 8, encoder_tokens=jnp.ones((1, 3), jnp.int32))


def _param_count(model):
  shapes = jax.eval_shape(model.init_params, jax.random.key(0))
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


def test_lm1b_gin_shapes():
  """The gin files build the paper's lm1b pair: ~97M target, ~6M draft, shared 8k vocab."""
  files = [str(REPO / 'configs/models' / name) for name in ('lm1b_target.gin', 'lm1b_draft.gin')]
  with gin.unlock_config():
    gin.clear_config()
    gin.parse_config_files_and_bindings(
      files,
      ['_pick_lm1b_models.target = %TARGET_MODEL', '_pick_lm1b_models.draft = %DRAFT_MODEL'],
      finalize_config=False,
    )
    try:
      target, draft = _pick_lm1b_models()
    finally:
      gin.clear_config()
  assert isinstance(target, DecoderOnlyLM) and isinstance(draft, DecoderOnlyLM)
  assert (
    target.config.d_model,
    target.config.d_ff,
    target.config.num_layers,
    target.config.num_heads,
    target.vocab_size,
  ) == (768, 3072, 12, 12, 8192)
  assert (
    draft.config.d_model,
    draft.config.d_ff,
    draft.config.num_layers,
    draft.config.num_heads,
    draft.vocab_size,
  ) == (256, 1024, 2, 4, 8192)
  hash((target, draft))  # usable as jit static arguments
  assert 90e6 < _param_count(target) < 100e6
  assert 5e6 < _param_count(draft) < 7e6
