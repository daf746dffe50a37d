"""The lockstep `T5.extend` path (scalar `start`) equals the ragged per-row path bit for bit.

Lockstep (all rows at one position) writes the cache with a dynamic_update_slice and shares the
attention bias across rows; ragged (per-row positions, speculative verification) scatters per row.
Both must give identical logits, caches and decoded tokens (docs/batch_performance.md).
"""

import jax
import jax.numpy as jnp
from model_utils import random_params
import numpy as np
import pytest

from speculative import sampling as sampling_lib
from speculative.decode import loops as decoding
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config

CONFIG = T5Config(
  vocab_size=37,
  emb_dim=16,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=2,
  head_dim=8,
  mlp_dim=24,
  eos_id=1,
)
MAX_LENGTH = 9


@pytest.fixture(scope='module')
def setup():
  model = T5(CONFIG)
  params = random_params(model, seed=3, logit_scale=4.0)
  rng = np.random.default_rng(0)
  encoder_tokens = rng.integers(2, CONFIG.vocab_size, (8, 6)).astype(np.int32)
  encoder_tokens[1, 4:] = 0  # padding
  encoder_tokens[5, 2:] = 0
  return model, params, jnp.asarray(encoder_tokens)


@jax.jit
def _tree_equal(a, b):
  return jnp.all(
    jnp.stack([jnp.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))])
  )


@pytest.mark.slow
@pytest.mark.parametrize('batch', [1, 8])
def test_lockstep_extend_equals_ragged(setup, batch):
  model, params, encoder_tokens = setup
  encoder_tokens = encoder_tokens[:batch]
  rng = np.random.default_rng(batch)
  extend = jax.jit(model.extend)  # jitted (one compile, not one per op), as a decode loop runs it
  cache = jax.jit(model.init_cache, static_argnums=(1, 2))(
    params, batch, MAX_LENGTH, encoder_tokens
  )
  prefix = jnp.asarray(rng.integers(0, CONFIG.vocab_size, (batch, MAX_LENGTH)), jnp.int32)
  # Random (non-zero) stale entries everywhere, as in a cache after rejected drafts.
  _, cache = extend(params, cache, prefix, jnp.zeros((batch,), jnp.int32))
  # (T, start): single tokens, a verify-sized block, and writes past the end (dropped).
  for num_new, start in [
    (1, 0),
    (1, 4),
    (3, 2),
    (1, MAX_LENGTH - 1),
    (3, MAX_LENGTH - 2),
    (2, MAX_LENGTH),
  ]:
    tokens = jnp.asarray(rng.integers(0, CONFIG.vocab_size, (batch, num_new)), jnp.int32)
    ragged_logits, ragged_cache = extend(
      params, cache, tokens, jnp.full((batch,), start, jnp.int32)
    )
    lock_logits, lock_cache = extend(params, cache, tokens, jnp.asarray(start, jnp.int32))
    assert lock_logits.shape == (batch, num_new, CONFIG.vocab_size)
    np.testing.assert_array_equal(np.asarray(lock_logits), np.asarray(ragged_logits))
    assert bool(_tree_equal(lock_cache, ragged_cache)), (num_new, start)
    # The writes that fit changed the cache (the comparison above is not vacuous).
    assert bool(_tree_equal(lock_cache, cache)) == (start >= MAX_LENGTH), (num_new, start)


@pytest.mark.slow
@pytest.mark.parametrize('batch', [1, 8])
def test_lockstep_greedy_loop_equals_ragged(setup, batch):
  """Chained T=1 steps (the baseline's loop) decode the same tokens on both paths."""
  model, params, encoder_tokens = setup
  encoder_tokens = encoder_tokens[:batch]
  steps = MAX_LENGTH - 1

  @jax.jit
  def greedy(params, encoder_tokens):
    cache = model.init_cache(params, batch, MAX_LENGTH, encoder_tokens)
    token = jnp.zeros((batch,), jnp.int32)
    out = []
    caches = [cache, cache]
    tokens = [token, token]
    for i in range(steps):
      for path in range(2):
        start = jnp.asarray(i, jnp.int32) if path else jnp.full((batch,), i, jnp.int32)
        logits, caches[path] = model.extend(params, caches[path], tokens[path][:, None], start)
        tokens[path] = jnp.argmax(logits[:, 0], -1).astype(jnp.int32)
      out.append(jnp.stack(tokens))
    return jnp.stack(out, -1)  # [2, B, steps]

  ragged, lockstep = np.asarray(greedy(params, encoder_tokens))
  np.testing.assert_array_equal(lockstep, ragged)
  assert len(np.unique(ragged)) > 1  # not a degenerate constant output


@pytest.mark.slow
@pytest.mark.parametrize('batch', [1, 8])
def test_autoregressive_decode_equals_ragged_greedy(setup, batch):
  """`autoregressive_decode` (whichever path it takes) == a plain ragged-`extend` greedy loop."""
  model, params, encoder_tokens = setup
  encoder_tokens = encoder_tokens[:batch]
  max_new = MAX_LENGTH - 2
  result = decoding.autoregressive_decode(
    model,
    params,
    None,
    max_new_tokens=max_new,
    encoder_tokens=encoder_tokens,
    sampling=sampling_lib.SamplingConfig(greedy=True),
    eos_id=CONFIG.eos_id,
  )

  extend = jax.jit(model.extend)  # one compile, not one per op
  cache = jax.jit(model.init_cache, static_argnums=(1, 2))(
    params, batch, MAX_LENGTH, encoder_tokens
  )
  token = jnp.zeros((batch,), jnp.int32)
  expected = []
  for i in range(max_new):
    logits, cache = extend(params, cache, token[:, None], jnp.full((batch,), i, jnp.int32))
    token = jnp.argmax(logits[:, 0], -1).astype(jnp.int32)
    expected.append(np.asarray(token))
  expected = np.stack(expected, -1)  # [B, max_new]
  lengths = np.asarray(result.lengths)
  tokens = np.asarray(result.tokens)
  for b in range(batch):
    eos = np.flatnonzero(expected[b] == CONFIG.eos_id)
    want = expected[b, : eos[0] + 1] if eos.size else expected[b]
    assert lengths[b] == len(want)
    np.testing.assert_array_equal(tokens[b, : lengths[b]], want)
