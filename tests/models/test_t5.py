"""Tests of the T5 model (speculative/models/t5.py).

The key test reproduces stock T5X: with the T5X-written tiny checkpoint weights, our cached greedy
decode equals T5X's `temperature_sample` greedy tokens (recorded in decode_results.json) token for
token. Others: cached chunked `extend` (T=1, T=3, ragged per-row starts, overwritten stale entries)
== the full forward, with and without the cross-attention K/V cache; relative position buckets;
parameter tree / logical axes; gin model files; and sharding on a 4-device host mesh (subprocess).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
import subprocess
import sys
import textwrap

import flax
from flax import serialization
import gin
import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative.decode import loops
from speculative.jobs import gin_utils
from speculative.models import t5 as t5_lib
from speculative.models import t5_attention
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config
from speculative.models.t5 import shift_right
from speculative.sampling import SamplingConfig

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 't5x_tiny'  # written by stock T5X (its README.md)

# A small random model for the structural tests: odd sizes so no dimension is accidentally equal.
SMALL = T5Config(
  vocab_size=97,
  emb_dim=16,
  num_heads=4,
  num_encoder_layers=2,
  num_decoder_layers=3,
  head_dim=5,
  mlp_dim=24,
)


@pytest.fixture(scope='module')
def fixture_data():
  results = json.loads((FIXTURE / 'decode_results.json').read_text())
  params = serialization.msgpack_restore((FIXTURE / 'params.msgpack').read_bytes())
  return results, params


def _greedy_fn(model: T5, max_length: int, steps: int):
  """Jitted greedy decode with init_cache + extend(T=1); returns [B, steps] tokens."""

  @jax.jit
  def greedy(params, encoder_tokens):
    batch = encoder_tokens.shape[0]
    cache = model.init_cache(params, batch, max_length, encoder_tokens)
    tokens = jnp.zeros((batch, steps + 1), jnp.int32)  # position 0: decoder start token 0

    def body(i, carry):
      cache, tokens = carry
      logits, cache = model.extend(
        params, cache, tokens[:, i][:, None], jnp.full((batch,), i, jnp.int32)
      )  # [B, 1, V]
      return cache, tokens.at[:, i + 1].set(jnp.argmax(logits[:, 0], -1).astype(jnp.int32))

    _, tokens = jax.lax.fori_loop(0, steps, body, (cache, tokens))
    return tokens[:, 1:]

  return greedy


# ------------------------------------------------------------------------------------------------
# Against stock T5X (fixture).
# ------------------------------------------------------------------------------------------------
def test_param_tree_matches_t5x(fixture_data):
  results, params = fixture_data
  model = T5(T5Config(**results['T5Config']))
  shapes = model.param_shapes()
  assert shapes == {k: tuple(v) for k, v in results['param_shapes'].items()}
  assert sum(math.prod(s) for s in shapes.values()) == results['n_params']
  flat = flax.traverse_util.flatten_dict(params, sep='/')
  assert {k: v.shape for k, v in flat.items()} == shapes


@pytest.mark.parametrize('cache_cross_kv', [True, False])
def test_greedy_equals_stock_t5x(fixture_data, cache_cross_kv):
  results, params = fixture_data
  model = T5(T5Config(**results['T5Config']), cache_cross_kv=cache_cross_kv)
  encoder_tokens = jnp.asarray(results['encoder_input_tokens'], jnp.int32)
  expected = results['results']['greedy_t0']['tokens']
  decode_len = results['decoder_len']
  got = _greedy_fn(model, decode_len, decode_len)(params, encoder_tokens)
  assert np.asarray(got)[0].tolist() == expected


def test_teacher_forced_argmax_equals_stock_t5x(fixture_data):
  results, params = fixture_data
  model = T5(T5Config(**results['T5Config']))
  encoder_tokens = jnp.asarray(results['encoder_input_tokens'], jnp.int32)
  expected = jnp.asarray([results['results']['greedy_t0']['tokens']], jnp.int32)
  logits = jax.jit(model.forward)(params, encoder_tokens, shift_right(expected))
  assert logits.dtype == jnp.float32 and logits.shape == expected.shape + (model.vocab_size,)
  np.testing.assert_array_equal(np.asarray(jnp.argmax(logits, -1)), np.asarray(expected))


def test_greedy_through_autoregressive_decode(fixture_data):
  results, params = fixture_data
  model = T5(T5Config(**results['T5Config']))
  encoder_tokens = jnp.asarray(results['encoder_input_tokens'], jnp.int32)
  out = loops.autoregressive_decode(
    model,
    params,
    None,
    max_new_tokens=results['decoder_len'],
    sampling=SamplingConfig(greedy=True),
    encoder_tokens=encoder_tokens,
    eos_id=None,
  )
  assert np.asarray(out.tokens)[0].tolist() == results['results']['greedy_t0']['tokens']


# ------------------------------------------------------------------------------------------------
# Cached extend == full forward.
# ------------------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def small_setup():
  model = T5(SMALL)
  # Random weights made in NumPy (no initializer to compile): extend == forward for any weights.
  params = model_utils.random_params(model, 1)
  rng = np.random.default_rng(0)
  batch, enc_len, dec_len = 3, 7, 12
  encoder_tokens = rng.integers(2, SMALL.vocab_size, (batch, enc_len)).astype(np.int32)
  encoder_tokens[1, 5:] = 0  # padding in two rows
  encoder_tokens[2, 3:] = 0
  stream = rng.integers(2, SMALL.vocab_size, (batch, dec_len)).astype(np.int32)
  stream[:, 0] = 0  # decoder start token
  full = jax.jit(model.forward)(params, jnp.asarray(encoder_tokens), jnp.asarray(stream))
  return params, jnp.asarray(encoder_tokens), stream, np.asarray(full)


def _extend_fn(model):
  return jax.jit(model.extend)


@pytest.mark.slow
@pytest.mark.parametrize('cache_cross_kv', [True, False])
@pytest.mark.parametrize('chunk', [1, 3])
def test_chunked_extend_equals_forward(small_setup, cache_cross_kv, chunk):
  params, encoder_tokens, stream, full = small_setup
  model = T5(SMALL, cache_cross_kv=cache_cross_kv)
  batch, length = stream.shape
  cache = model.init_cache(params, batch, length, encoder_tokens)
  extend = _extend_fn(model)
  for start in range(0, length, chunk):
    tokens = stream[:, start : start + chunk]
    logits, cache = extend(params, cache, jnp.asarray(tokens), jnp.full((batch,), start, jnp.int32))
    assert logits.dtype == jnp.float32 and logits.shape == tokens.shape + (SMALL.vocab_size,)
    np.testing.assert_allclose(
      np.asarray(logits), full[:, start : start + chunk], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize('cache_cross_kv', [True, False])
def test_ragged_extend_with_rollback_equals_forward(small_setup, cache_cross_kv):
  """Rows at different offsets; stale (rejected) entries are overwritten before being attended."""
  params, encoder_tokens, stream, full = small_setup
  model = T5(SMALL, cache_cross_kv=cache_cross_kv)
  batch, length = stream.shape
  init_cache = jax.jit(model.init_cache, static_argnums=(1, 2))  # one compile, not one per op
  cache = init_cache(params, batch, length + 3, encoder_tokens)
  extend = _extend_fn(model)
  rng = np.random.default_rng(1)
  num_new = 3
  committed = np.array([1, 2, 4])  # each row's next position to feed
  # Prefill rows to different lengths (T=4 at start 0; only the first `committed` count).
  logits, cache = extend(params, cache, jnp.asarray(stream[:, :4]), jnp.zeros((batch,), jnp.int32))
  np.testing.assert_allclose(np.asarray(logits), full[:, :4], rtol=1e-5, atol=1e-5)
  while committed.min() < length - num_new:
    starts = np.minimum(committed, length - num_new)
    # A speculative "draft" chunk with wrong tokens after the first one, then the true chunk.
    wrong = np.stack([stream[b, s : s + num_new] for b, s in enumerate(starts)])
    wrong[:, 1:] = rng.integers(2, SMALL.vocab_size, (batch, num_new - 1))
    _, cache = extend(params, cache, jnp.asarray(wrong), jnp.asarray(starts, jnp.int32))
    true = np.stack([stream[b, s : s + num_new] for b, s in enumerate(starts)])
    logits, cache = extend(params, cache, jnp.asarray(true), jnp.asarray(starts, jnp.int32))
    expected = np.stack([full[b, s : s + num_new] for b, s in enumerate(starts)])
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-5, atol=1e-5)
    committed = starts + np.array([1, 2, 3])  # rows advance by different amounts


def test_forward_target_padding_mask_keeps_valid_positions(small_setup):
  params, encoder_tokens, stream, full = small_setup
  model = T5(SMALL)
  targets = np.concatenate([stream[:, 1:], np.full((stream.shape[0], 1), 5, np.int32)], axis=1)
  targets[0, 8:] = 0  # row 0 has 8 target tokens then padding
  logits = jax.jit(model.forward)(
    params, encoder_tokens, jnp.asarray(stream), decoder_target_tokens=jnp.asarray(targets)
  )
  np.testing.assert_allclose(np.asarray(logits)[0, :8], full[0, :8], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(np.asarray(logits)[1:], full[1:], rtol=1e-5, atol=1e-5)


def test_forward_with_attention_equals_forward(small_setup):
  """Same logits as `forward`; one [B, H, Tq, Tk] softmax per attention layer, padded keys unused."""
  params, encoder_tokens, stream, full = small_setup
  model = T5(SMALL)
  targets = np.concatenate([stream[:, 1:], np.full((stream.shape[0], 1), 5, np.int32)], axis=1)
  logits, weights = jax.jit(model.forward_with_attention)(
    params, encoder_tokens, jnp.asarray(targets)
  )
  np.testing.assert_allclose(np.asarray(logits), full, rtol=1e-5, atol=1e-5)
  batch, heads, (enc_len, dec_len) = 3, SMALL.num_heads, (encoder_tokens.shape[1], stream.shape[1])
  expected = {
    f'encoder/layers_{i}/attention': (enc_len, enc_len) for i in range(SMALL.num_encoder_layers)
  }
  for i in range(SMALL.num_decoder_layers):
    expected[f'decoder/layers_{i}/self_attention'] = (dec_len, dec_len)
    expected[f'decoder/layers_{i}/encoder_decoder_attention'] = (dec_len, enc_len)
  assert {k: v.shape for k, v in weights.items()} == {
    k: (batch, heads) + v for k, v in expected.items()
  }
  for name, w in weights.items():
    w = np.asarray(w)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-5)
    if name.endswith('encoder_decoder_attention'):
      assert w[2, :, :, 3:].max() < 1e-6  # row 2's encoder has 3 real tokens
    if name.endswith('/self_attention'):
      assert np.triu(w[0, 0], k=1).max() < 1e-6  # causal


@pytest.mark.slow
def test_dropout_only_with_rng(small_setup):
  params, encoder_tokens, stream, full = small_setup
  noisy = T5(T5Config(**{**SMALL.__dict__, 'dropout_rate': 0.3}))
  forward = jax.jit(noisy.forward)
  a = forward(params, encoder_tokens, jnp.asarray(stream), dropout_rng=jax.random.PRNGKey(0))
  b = forward(params, encoder_tokens, jnp.asarray(stream), dropout_rng=jax.random.PRNGKey(1))
  assert not np.allclose(np.asarray(a), np.asarray(b))
  # Without a dropout key the model is deterministic (same logits as the dropout-free config).
  np.testing.assert_allclose(
    np.asarray(forward(params, encoder_tokens, jnp.asarray(stream))), full, rtol=1e-5, atol=1e-5
  )


# ------------------------------------------------------------------------------------------------
# Relative position buckets.
# ------------------------------------------------------------------------------------------------
def _reference_bucket(
  relative_position: int, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> int:
  """T5's bucketing written out directly (Raffel et al. 2020, Mesh TensorFlow), one value."""
  n = -relative_position
  bucket = 0
  if bidirectional:
    num_buckets //= 2
    if n < 0:
      bucket += num_buckets
    n = abs(n)
  else:
    n = max(n, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return bucket + n
  large = max_exact + int(
    math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
  )
  return bucket + min(large, num_buckets - 1)


# Values away from the exact log-bucket edges (where float32 vs float64 rounding could differ).
BUCKET_VALUES = [
  0,
  1,
  -1,
  2,
  -5,
  7,
  -7,
  -8,
  8,
  -9,
  13,
  -13,
  -20,
  30,
  -45,
  60,
  -70,
  100,
  -100,
  127,
  -127,
  129,
  -130,
  500,
  -500,
  -10000,
]


@pytest.mark.parametrize('bidirectional', [True, False])
def test_relative_position_bucket_matches_formula(bidirectional):
  got = t5_lib.relative_position_bucket(np.array(BUCKET_VALUES), bidirectional=bidirectional)
  expected = [_reference_bucket(v, bidirectional) for v in BUCKET_VALUES]
  assert got.tolist() == expected
  if not bidirectional:
    assert all(b == 0 for v, b in zip(BUCKET_VALUES, got) if v > 0)  # future keys: bucket 0


@pytest.mark.parametrize('bidirectional', [True, False])
def test_bucket_table_lookup_equals_direct(bidirectional):
  """The clipped lookup table used at run time equals the formula on any distance."""
  rel = np.arange(-1000, 1001)
  direct = t5_lib.relative_position_bucket(rel, bidirectional=bidirectional)
  table = t5_attention.bucket_table(bidirectional, 32, 128)
  looked_up = table[np.clip(rel, -128, 128) + 128]
  np.testing.assert_array_equal(looked_up, direct)


# ------------------------------------------------------------------------------------------------
# Parameters, axes, config, gin.
# ------------------------------------------------------------------------------------------------
def test_logical_axes_follow_t5x():
  axes = flax.traverse_util.flatten_dict(T5(SMALL).logical_axes(), sep='/')
  assert tuple(axes['token_embedder/embedding']) == ('vocab', 'embed')
  assert tuple(axes['encoder/layers_0/attention/query/kernel']) == ('embed', 'joined_kv')
  assert tuple(axes['decoder/layers_1/self_attention/out/kernel']) == ('joined_kv', 'embed')
  assert tuple(axes['decoder/layers_0/mlp/wi_1/kernel']) == ('embed', 'mlp')
  assert tuple(axes['decoder/layers_0/mlp/wo/kernel']) == ('mlp', 'embed')
  assert tuple(axes['decoder/relpos_bias/rel_embedding']) == ('heads', 'relpos_buckets')
  assert tuple(axes['decoder/logits_dense/kernel']) == ('embed', 'vocab')
  assert tuple(axes['encoder/encoder_norm/scale']) == ('embed',)
  specs = flax.traverse_util.flatten_dict(T5(SMALL).partition_specs(), sep='/')
  assert specs['token_embedder/embedding'] == jax.sharding.PartitionSpec('model', None)


def test_init_params_tree_and_query_scaling():
  # One layer per stack: the tree's shape and the scaling are per layer, and the initializer
  # compiles in a fraction of SMALL's time.
  config = dataclasses.replace(SMALL, num_encoder_layers=1, num_decoder_layers=1)
  params = T5(config).init_params(jax.random.PRNGKey(0))
  assert 'params' not in params
  assert set(params) == {'token_embedder', 'encoder', 'decoder'}
  layer = params['encoder']['layers_0']['attention']
  # T5X folds 1/sqrt(head_dim) into the query init: its std is sqrt(1/d)/sqrt(dh), keys sqrt(1/d).
  ratio = np.std(layer['query']['kernel']) / np.std(layer['key']['kernel'])
  assert 0.25 < ratio < 0.75, ratio  # 1/sqrt(5) = 0.45
  assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(params))


def test_bad_inputs_raise_clear_errors(small_setup):
  params, encoder_tokens, stream, _ = small_setup
  model = T5(SMALL)
  with pytest.raises(ValueError, match='emb_dim'):
    T5Config(emb_dim=0)
  with pytest.raises(ValueError, match='activation'):
    T5Config(mlp_activations=('nope',))
  with pytest.raises(ValueError, match='encoder_tokens'):
    model.init_cache(params, 3, 8, None)
  with pytest.raises(ValueError, match='integer'):
    model.forward(params, encoder_tokens.astype(jnp.float32), jnp.asarray(stream))
  with pytest.raises(ValueError, match='batch'):
    model.forward(params, encoder_tokens[:2], jnp.asarray(stream))
  with pytest.raises(ValueError, match='cache_cross_kv'):
    cache = T5(SMALL, cache_cross_kv=False).init_cache(params, 3, 8, encoder_tokens)
    model.extend(params, cache, jnp.zeros((3, 1), jnp.int32), jnp.zeros((3,), jnp.int32))


EXPECTED_SHAPES = {  # docs/design.md section 3: d, H, L_enc, L_dec, dh, f
  'tiny': (8, 4, 2, 2, 3, 16),
  'small': (512, 6, 8, 8, 64, 1024),
  'base': (768, 12, 12, 12, 64, 2048),
  'large': (1024, 16, 24, 24, 64, 2816),
  'xl': (2048, 32, 24, 24, 64, 5120),
  'xxl': (4096, 64, 24, 24, 64, 10240),
}


def test_gin_model_files():
  gin_utils.register_configurables()
  gin.clear_config()
  try:
    for name in EXPECTED_SHAPES:
      gin.parse_config_file(str(REPO / 'configs' / 'models' / f't5_1_1_{name}.gin'))
    for name, (d, h, le, ld, dh, f) in EXPECTED_SHAPES.items():
      config = gin.query_parameter(f'%T5_1_1_{name.upper()}').scoped_configurable_fn()
      assert isinstance(config, T5Config)
      assert (
        config.emb_dim,
        config.num_heads,
        config.num_encoder_layers,
        config.num_decoder_layers,
        config.head_dim,
        config.mlp_dim,
      ) == (d, h, le, ld, dh, f)
      assert config.vocab_size == 32128 and config.mlp_activations == ('gelu', 'linear')
  finally:
    gin.clear_config()
  # Parameter counts of the public T5 1.1 checkpoints (eval_shape: no memory).
  small = sum(
    math.prod(s)
    for s in T5(
      T5Config(
        emb_dim=512,
        num_heads=6,
        num_encoder_layers=8,
        num_decoder_layers=8,
        head_dim=64,
        mlp_dim=1024,
      )
    )
    .param_shapes()
    .values()
  )
  assert round(small / 1e6, 1) == 77.0


# ------------------------------------------------------------------------------------------------
# Sharding on a 4-device host mesh (subprocess: XLA_FLAGS must be set before jax starts).
# ------------------------------------------------------------------------------------------------
_SHARDING_SCRIPT = textwrap.dedent('''
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from speculative.models.t5 import T5, T5Config
    assert jax.device_count() == 4, jax.devices()
    config = T5Config(vocab_size=128, emb_dim=16, num_heads=4, num_encoder_layers=2,
                      num_decoder_layers=2, head_dim=3, mlp_dim=24)
    model = T5(config)
    params = model.init_params(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    enc = jnp.asarray(rng.integers(2, 128, (2, 6)), jnp.int32)
    dec = jnp.asarray(rng.integers(2, 128, (2, 5)), jnp.int32).at[:, 0].set(0)

    def greedy(params, enc):
      cache = model.init_cache(params, 2, 10, enc)
      def body(i, carry):
        cache, toks = carry
        logits, cache = model.extend(params, cache, toks[:, i][:, None], jnp.full((2,), i))
        return cache, toks.at[:, i + 1].set(jnp.argmax(logits[:, 0], -1).astype(jnp.int32))
      return jax.lax.fori_loop(0, 9, body, (cache, jnp.zeros((2, 10), jnp.int32)))[1]

    forward, greedy = jax.jit(model.forward), jax.jit(greedy)
    one = jax.device_put(params, jax.devices()[0])
    ref_logits, ref_tokens = forward(one, enc, dec), greedy(one, enc)
    for shape in [(2, 2)]:  # data and model parallel at once
      mesh = Mesh(np.array(jax.devices()).reshape(shape), ('data', 'model'))
      sharded = jax.device_put(params, model.param_shardings(mesh))
      emb = sharded['token_embedder']['embedding']
      assert emb.sharding.spec == P('model', None), emb.sharding
      assert emb.addressable_shards[0].data.shape == (128 // shape[1], 16)
      batch = NamedSharding(mesh, P('data', None))
      logits = forward(sharded, jax.device_put(enc, batch), jax.device_put(dec, batch))
      np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_logits), rtol=1e-5, atol=1e-5)
      tokens = greedy(sharded, jax.device_put(enc, batch))
      np.testing.assert_array_equal(np.asarray(tokens), np.asarray(ref_tokens))
    print('SHARDING_OK')
''')


@pytest.mark.slow
def test_sharded_equals_single_device():
  env = dict(os.environ)
  flags = env.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=4'
  env['XLA_FLAGS'] = flags.strip()
  env['JAX_PLATFORMS'] = 'cpu'
  proc = subprocess.run(
    [sys.executable, '-c', _SHARDING_SCRIPT],
    env=env,
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=600,
  )
  assert proc.returncode == 0 and 'SHARDING_OK' in proc.stdout, proc.stdout + proc.stderr
