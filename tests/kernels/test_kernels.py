"""Tests of the CPU kernels (speculative/kernels/) and of the T5 decode step on them.

Each kernel against its NumPy reference (speculative/kernels/reference.py) on shapes that are not
multiples of the 16-lane blocks, with float32 and bfloat16 weight storage and several rows; every
ISA path this host runs against the portable one, bit for bit; a row's bits independent of the
other rows of the call. Then the model: one T-token `extend` equals T one-token `extend`s bit for
bit (float32 and bfloat16 activations, lockstep and ragged rows); the kernel path reproduces stock
T5X's greedy tokens on the fixture; greedy speculative decoding on the kernels equals the baseline
on the kernels; a job records its path and its compiled decodes call the kernels. Skipped, with the
reason, only where the kernels cannot run (model_utils.kernels_cannot_run_here: a GPU or TPU
backend, a host that cannot build them, SPECULATIVE_KERNELS=0); a library that is missing or stale
on a host that can build it fails them. The path policy itself: test_policy.py.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
import re

from flax import serialization
import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import kernels
from speculative.kernels import policy
from speculative.kernels import reference
from speculative.models import t5 as t5_lib

pytestmark = model_utils.kernels_run_here_mark()

FIXTURE = Path(__file__).resolve().parents[1] / 'fixtures' / 't5x_tiny'
ISAS = ('portable', 'avx2', 'avx512')


def _host_isas() -> list[str]:
  best = ISAS.index(kernels.best_isa())
  return list(ISAS[: best + 1])


def _bf16_valued(x: np.ndarray) -> np.ndarray:
  return np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))


# ------------------------------------------------------------------------------------------------
# matmul
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('storage', ['float32', 'bfloat16'])
@pytest.mark.parametrize('k, n', [(7, 5), (33, 37), (128, 1000), (256, 16)])
def test_matmul_matches_reference_on_every_isa_and_row_count(storage, k, n):
  rng = np.random.default_rng(k * n)
  w = _bf16_valued(rng.standard_normal((k, n)).astype(np.float32))
  packed = kernels.pack(w, storage)
  x = rng.standard_normal((2, 9, k)).astype(np.float32)  # batch 2, 9 rows each
  want = reference.packed_matmul(x, np.asarray(packed, np.float32), n)
  outs = {
    isa: np.asarray(jax.jit(kernels.matmul, static_argnums=(2, 3))(x, packed, n, isa))
    for isa in _host_isas()
  }
  for isa, out in outs.items():
    assert out.shape == (2, 9, n) and out.dtype == np.float32
    np.testing.assert_array_equal(out, outs['portable'], err_msg=f'{isa} differs from portable')
  # float32 rounding of a K-term sum: |error| <= K * eps * sum |x w| (a loose, safe bound).
  bound = k * np.finfo(np.float32).eps * (np.abs(x) @ np.abs(w)) + 1e-30
  assert np.all(np.abs(outs['portable'] - want) <= bound)
  # Each row's bits do not depend on how many rows share the call (T = 1..9).
  for t in range(1, 10):
    part = np.asarray(kernels.matmul(x[:, :t], packed, n))
    np.testing.assert_array_equal(part, outs['portable'][:, :t])


def test_matmul_is_one_fma_chain_per_element():
  rng = np.random.default_rng(1)
  w = rng.standard_normal((19, 21)).astype(np.float32)
  x = rng.standard_normal((3, 19)).astype(np.float32)
  packed = kernels.pack(w)
  np.testing.assert_array_equal(
    np.asarray(kernels.matmul(x, packed, 21)),
    reference.fma_chain_matmul(x, np.asarray(packed), 21),
  )


def test_pack_refuses_what_it_cannot_store_exactly():
  w = np.full((4, 3), 1.0 + 2.0**-12, np.float32)  # not a bfloat16 value
  with pytest.raises(
    ValueError, match='decoder/layers_0/mlp/wo/kernel: bfloat16 storage would round'
  ):
    kernels.pack(w, 'bfloat16', 'decoder/layers_0/mlp/wo/kernel')
  with pytest.raises(ValueError, match='only 2-D'):
    kernels.pack(np.zeros((2, 3, 4), np.float32))
  with pytest.raises(ValueError, match='packed storage must be one of'):
    kernels.pack(np.zeros((2, 3), np.float32), 'float16')


def test_packed_weight_that_does_not_fit_is_refused_with_its_name():
  packed = kernels.pack(np.zeros((8, 20), np.float32))  # [2, 8, 16]
  with pytest.raises(
    ValueError, match=r'dec/q: packed weight has shape \(2, 8, 16\), expected \(2, 9, 16\)'
  ):
    kernels.check_packed(packed, 9, 20, 'dec/q')
  with pytest.raises(ValueError, match='dtype float16'):
    kernels.check_packed(packed.astype(jnp.float16), 8, 20, 'dec/q')


# ------------------------------------------------------------------------------------------------
# attention and RMS norm
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
  'b, t, h, dh, k, bias_shape',
  [
    (1, 5, 4, 64, 48, 'per_query'),  # self-attention, lockstep rows
    (2, 3, 2, 64, 7, 'per_row'),  # ragged rows: bias per batch row
    (3, 1, 8, 16, 130, 'cross'),  # cross-attention: [B, 1, 1, S]
  ],
)
def test_decode_attention_matches_reference_and_is_row_invariant(b, t, h, dh, k, bias_shape):
  rng = np.random.default_rng(b * 100 + k)
  q = 0.3 * rng.standard_normal((b, t, h, dh)).astype(np.float32)
  key = rng.standard_normal((b, h, dh, k)).astype(np.float32)
  value = rng.standard_normal((b, h, dh, k)).astype(np.float32)
  shape = {'per_query': (1, h, t, k), 'per_row': (b, h, t, k), 'cross': (b, 1, 1, k)}[bias_shape]
  bias = rng.standard_normal(shape).astype(np.float32)
  bias[..., k // 2 :] = -1e10  # masked keys: weight exactly 0
  outs = {
    isa: np.asarray(kernels.decode_attention(q, key, value, bias, isa=isa)) for isa in _host_isas()
  }
  for isa, out in outs.items():
    np.testing.assert_array_equal(out, outs['portable'], err_msg=f'{isa} differs from portable')
  np.testing.assert_allclose(
    outs['portable'], reference.decode_attention(q, key, value, bias), rtol=2e-5, atol=2e-6
  )
  # Masked values never reach the output: changing them changes nothing.
  value2 = value.copy()
  value2[..., k // 2 :] = 1e3
  np.testing.assert_array_equal(
    np.asarray(kernels.decode_attention(q, key, value2, bias)), outs['portable']
  )
  for i in range(t):
    row_bias = bias if bias.shape[2] == 1 else bias[:, :, i : i + 1]
    row = np.asarray(kernels.decode_attention(q[:, i : i + 1], key, value, row_bias))
    np.testing.assert_array_equal(row, outs['portable'][:, i : i + 1])


@pytest.mark.parametrize('k', [7, 48, 130])
def test_decode_attention_over_the_first_num_keys_has_the_bits_of_all_keys(k):
  # A decode step: row b's queries sit at positions start[b] .. start[b]+T-1 of a cache of k keys
  # (causal bias, later entries stale); attending over its first start[b]+T keys (what the decoder
  # passes) must give the bits of attending over all k, on every ISA path, and nothing in the
  # skipped entries (here NaN) may reach the output.
  b, t, h, dh = 3, 4, 2, 64
  rng = np.random.default_rng(k)
  q = 0.3 * rng.standard_normal((b, t, h, dh)).astype(np.float32)
  key = rng.standard_normal((b, h, dh, k)).astype(np.float32)
  value = rng.standard_normal((b, h, dh, k)).astype(np.float32)
  start = np.array([0, k // 3, k - t], np.int32)
  positions = start[:, None] + np.arange(t)  # [B, T]
  bias = rng.standard_normal((b, h, t, k)).astype(np.float32)
  bias = np.where(np.arange(k) <= positions[:, None, :, None], bias, -1e10).astype(np.float32)
  num_keys = start + t
  stale_key, stale_value = key.copy(), value.copy()
  for row, n in enumerate(num_keys):
    stale_key[row, ..., n:] = np.nan
    stale_value[row, ..., n:] = np.nan
  for isa in _host_isas():
    full = np.asarray(kernels.decode_attention(q, key, value, bias, isa=isa))
    first = kernels.decode_attention(q, stale_key, stale_value, bias, num_keys, isa=isa)
    np.testing.assert_array_equal(np.asarray(first), full, err_msg=isa)
  np.testing.assert_allclose(
    full, reference.decode_attention(q, key, value, bias), rtol=2e-5, atol=2e-6
  )
  with pytest.raises(ValueError, match=r'num_keys \(2,\) must be \[3\]'):
    kernels.decode_attention(q, key, value, bias, num_keys[:2])


@pytest.mark.parametrize('d', [16, 37, 256])
def test_rms_norm_matches_reference_and_is_row_invariant(d):
  rng = np.random.default_rng(d)
  x = rng.standard_normal((2, 5, d)).astype(np.float32)
  scale = rng.standard_normal(d).astype(np.float32)
  outs = {isa: np.asarray(kernels.rms_norm(x, scale, 1e-6, isa)) for isa in _host_isas()}
  for isa, out in outs.items():
    np.testing.assert_array_equal(out, outs['portable'], err_msg=f'{isa} differs from portable')
  np.testing.assert_allclose(
    outs['portable'], reference.rms_norm(x, scale, 1e-6), rtol=3e-6, atol=1e-6
  )
  np.testing.assert_array_equal(
    np.asarray(kernels.rms_norm(x[:, 2:3], scale, 1e-6)), outs['portable'][:, 2:3]
  )


# ------------------------------------------------------------------------------------------------
# The T5 decode step on the kernels
# ------------------------------------------------------------------------------------------------
SMALL = t5_lib.T5Config(
  vocab_size=97,
  emb_dim=40,
  num_heads=3,
  num_encoder_layers=2,
  num_decoder_layers=3,
  head_dim=16,
  mlp_dim=72,
)


@functools.cache
def _small_params():
  """Random float32 params of SMALL with the real init's shapes and scales, made in NumPy
  (`model_utils.random_params`: compiling T5's initializer for this config took ~13 s). The
  config's activation dtype does not change them: the same values serve a bfloat16 config."""
  return model_utils.random_params(t5_lib.T5(SMALL), seed=0)


def _packed_small(dtype: str):
  model = t5_lib.T5(
    SMALL if dtype == 'float32' else t5_lib.T5Config(**{**SMALL.__dict__, 'dtype': dtype})
  )
  params = jax.tree.map(lambda x: x, _small_params())  # the callers' own containers
  return model, params, t5_lib.pack_decode_params(model, params)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16'])
@pytest.mark.parametrize('lockstep', [True, False])
def test_extend_over_t_tokens_equals_t_one_token_extends_bit_for_bit(dtype, lockstep):
  model, _, packed = _packed_small(dtype)
  rng = np.random.default_rng(0)
  encoder = jnp.asarray(rng.integers(2, 97, (2, 11)), jnp.int32).at[1, 8:].set(0)
  tokens = jnp.asarray(rng.integers(2, 97, (2, 9)), jnp.int32)
  extend = jax.jit(model.extend)
  cache = jax.jit(model.init_cache, static_argnums=(1, 2))(packed, 2, 24, encoder)  # not op by op
  start = (
    (lambda p: jnp.asarray(p, jnp.int32))
    if lockstep
    else (lambda p: jnp.asarray([p, p + 2], jnp.int32))
  )
  _, cache = extend(packed, cache, tokens[:, :3], start(0))  # a prefix, written in one call
  for t in (2, 4, 6):  # verify calls of gamma + 1 = t tokens
    multi, multi_cache = extend(packed, cache, tokens[:, 3 : 3 + t], start(3))
    singles, single_cache = [], cache
    for i in range(t):
      logits, single_cache = extend(packed, single_cache, tokens[:, 3 + i : 4 + i], start(3 + i))
      singles.append(logits)
    np.testing.assert_array_equal(np.asarray(multi), np.asarray(jnp.concatenate(singles, 1)))
    for a, b in zip(
      multi_cache.self_key + multi_cache.self_value, single_cache.self_key + single_cache.self_value
    ):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_kernel_path_close_to_xla_path():
  model, params, packed = _packed_small('float32')
  encoder = jnp.asarray(np.random.default_rng(1).integers(2, 97, (1, 9)), jnp.int32)
  tokens = jnp.asarray([[0, 5, 9, 13]], jnp.int32)
  outs = []
  init_cache, extend = jax.jit(model.init_cache, static_argnums=(1, 2)), jax.jit(model.extend)
  for p in (params, packed):
    cache = init_cache(p, 1, 8, encoder)
    outs.append(np.asarray(extend(p, cache, tokens, jnp.asarray([0], jnp.int32))[0]))
  np.testing.assert_allclose(outs[1], outs[0], rtol=1e-5, atol=1e-5)
  assert not np.array_equal(outs[1], np.zeros_like(outs[1]))


def test_kernel_path_reproduces_stock_t5x_greedy_tokens():
  results = json.loads((FIXTURE / 'decode_results.json').read_text())
  params = serialization.msgpack_restore((FIXTURE / 'params.msgpack').read_bytes())
  model = t5_lib.T5(t5_lib.T5Config(**results['T5Config']))
  assert t5_lib.packed_storage(model, params) == 'float32'  # random float32 weights
  packed = t5_lib.pack_decode_params(model, params)
  encoder = jnp.asarray(results['encoder_input_tokens'], jnp.int32)
  steps = results['decoder_len']
  cache = jax.jit(model.init_cache, static_argnums=(1, 2))(packed, 1, steps, encoder)
  extend = jax.jit(model.extend)  # as a job runs them: one compile, not each op on its own
  tokens = [0]
  for i in range(steps):
    logits, cache = extend(
      packed, cache, jnp.asarray([[tokens[-1]]], jnp.int32), jnp.asarray([i], jnp.int32)
    )
    tokens.append(int(jnp.argmax(logits[0, 0])))
  assert tokens[1:] == results['results']['greedy_t0']['tokens']


def test_pack_decode_params_packs_the_decoder_only():
  model, params, packed = _packed_small('float32')
  assert set(packed.packed) == {'decoder'}
  dec = packed.packed['decoder']
  # query, key and value side by side: 3 x 48 = 144 columns = 9 blocks; wi_0 and wi_1: 2 x 72.
  assert dec['layers_0']['self_attention']['qkv'].shape == (9, 40, 16)
  assert 'query' not in dec['layers_0']['self_attention']
  assert dec['layers_0']['mlp']['wi_fused'].shape == (9, 40, 16)
  assert dec['layers_0']['encoder_decoder_attention']['query']['kernel'].shape == (3, 40, 16)
  assert dec['logits_dense']['kernel'].shape == (7, 40, 16)  # 97 -> 7 blocks
  assert dec['decoder_norm']['scale'].shape == (40,)
  assert packed.params is params  # the T5X tree itself is unchanged
  with pytest.raises(ValueError, match='already packed'):
    t5_lib.pack_decode_params(model, packed)


def test_a_packed_weight_of_the_wrong_shape_names_the_parameter():
  model, params, packed = _packed_small('float32')
  bad = jax.tree_util.tree_map(lambda x: x, packed.packed)
  mlp = bad['decoder']['layers_1']['mlp']
  mlp['wo']['kernel'] = mlp['wi_fused']  # [9, 40, 16] where [3, 72, 16] belongs
  broken = t5_lib.DecodeParams(params=params, packed=bad)
  encoder = jnp.ones((1, 4), jnp.int32)
  cache = jax.jit(model.init_cache, static_argnums=(1, 2))(params, 1, 4, encoder)  # not op by op
  with pytest.raises(ValueError, match='decoder/layers_1/mlp/wo: packed weight has shape'):
    # Refused while tracing (as in a job, where extend runs under jit), before any compile.
    jax.jit(model.extend)(broken, cache, jnp.zeros((1, 1), jnp.int32), jnp.asarray([0], jnp.int32))


def test_greedy_speculative_on_kernels_equals_baseline_on_kernels():
  from speculative import drafters
  from speculative import sampling as sampling_lib
  from speculative.decode import modes

  target, target_params, target_packed = _packed_small('float32')
  # The draft: the target without its last decoder layer (the other weights shared), so it agrees
  # with the target on some greedy tokens: drafts are accepted and rejected.
  draft_model = t5_lib.T5(t5_lib.T5Config(**{**SMALL.__dict__, 'num_decoder_layers': 2}))
  decoder = {k: v for k, v in target_params['decoder'].items() if k != 'layers_2'}
  draft_packed = t5_lib.pack_decode_params(draft_model, {**target_params, 'decoder': decoder})
  drafter, drafter_params = drafters.build_drafter(
    'model', vocab_size=97, draft_model=draft_model, draft_params=draft_packed
  )
  sampling, sampling_params = sampling_lib.make_sampling(0.0, 0, 1.0)
  fns = modes.decode_fns(
    target,
    target_packed,
    drafter,
    drafter_params,
    gamma=4,
    max_new_tokens=20,
    sampling=sampling,
    sampling_params=sampling_params,
    eos_id=None,
  )
  encoder = jnp.asarray(np.random.default_rng(3).integers(2, 97, (2, 10)), jnp.int32)
  rng = jax.random.PRNGKey(0)
  base, spec = fns['baseline'](encoder, rng), fns['speculative'](encoder, rng)
  np.testing.assert_array_equal(np.asarray(base.tokens), np.asarray(spec.tokens))
  metrics = jax.tree.map(np.asarray, spec.metrics)
  assert 0 < metrics.accepted.sum() < metrics.drafted.sum(), metrics


# ------------------------------------------------------------------------------------------------
# The build, the switch, and a job's recorded path
# ------------------------------------------------------------------------------------------------
def test_build_without_a_compiler_says_so_in_one_line_and_leaves_nothing(tmp_path, monkeypatch):
  from speculative.kernels import build

  monkeypatch.setattr(build, 'LIBRARY', str(tmp_path / '_kernels.so'))
  monkeypatch.setenv('CXX', str(tmp_path / 'no-such-compiler'))
  line = build.build(force=True)
  assert line.startswith('kernels: not built (no C++ compiler:') and line.endswith('XLA path')
  assert '\n' not in line and list(tmp_path.iterdir()) == []


def test_environment_switch_turns_the_kernels_off():
  import os
  import subprocess
  import sys

  code = 'from speculative import kernels; print(kernels.status())'
  env = {**os.environ, 'SPECULATIVE_KERNELS': '0'}
  out = subprocess.run(
    [sys.executable, '-c', code], env=env, capture_output=True, text=True, check=True
  )
  assert out.stdout.strip() == 'kernels off (SPECULATIVE_KERNELS=0); XLA path'


@pytest.mark.slow
def test_a_job_records_its_path_runs_it_and_refuses_to_resume_on_the_other(tmp_path, monkeypatch):
  """A job with kernels 'on' on the correlated tiny pair (tests/model_utils.py): greedy identity on
  rows that accepted and rejected drafts, got bonus tokens, accepted blocks in part and ended at EOS
  or at the cap; the manifest and report say CPU kernels and both modes' compiled decodes call
  them; a resume with 'off' is refused."""
  import model_utils

  from speculative import infer

  sources = [
    'Click OK.',
    'Open the file menu and choose Save.',
    'Hello',
    'Select a cell range.',
    'Press Enter to perform the search.',
    'Choose Format - Cells.',
  ]  # test_infer's, for which the pair was tuned
  kwargs = dict(
    **model_utils.save_tiny_pair(tmp_path, sources, record_config=False),
    input_prefix='translate English to German: ',
    task_feature_lengths={'inputs': 24, 'targets': 12},
    batch_size=2,
    gamma=3,
    progress=False,
  )
  out = tmp_path / 'job'
  compiled_hlo = model_utils.record_decode_programs(monkeypatch)
  summary = infer.infer(output_dir=str(out), kernels='on', **kwargs)
  assert summary['identical_outputs'] == len(sources)
  assert json.loads((out / 'manifest.json').read_text())['decode_path'] == policy.KERNELS
  assert 'Decode path: CPU kernels' in (out / 'report.md').read_text()
  spec = [json.loads(line) for line in (out / 'predictions-speculative.jsonl').open()]
  model_utils.assert_speculation_exercised(spec, 3, 12)
  model_utils.assert_path_ran(out, summary, compiled_hlo())
  with pytest.raises(ValueError, match='decode_path'):
    infer.infer(output_dir=str(out), kernels='off', **kwargs)
  with pytest.raises(ValueError, match="unknown kernels 'fast'"):
    infer.infer(output_dir=str(tmp_path / 'other'), kernels='fast', **kwargs)


@pytest.mark.parametrize(
  'rows, rounds, message',
  [
    ('abc', 7, "--rows must be integers separated by commas, got 'abc'"),
    ('1,', 7, "--rows must be integers separated by commas, got '1,'"),
    ('2,4', 7, '--rows must start with 1'),
    ('1,0', 7, 'each >= 1'),
    ('1,2', 0, '--rounds must be >= 1, got 0'),
  ],
)
def test_the_microbenchmarks_refuse_bad_rows_and_rounds_in_one_line(rows, rounds, message):
  """`kernels.bench` and `bench.decode_step` share these options: one line, not a traceback or a
  table of NaN."""
  import argparse

  from speculative.kernels import bench

  args = argparse.Namespace(rows=rows, rounds=rounds)
  with pytest.raises(SystemExit, match=re.escape(message)):
    bench.timing_rows(args, kernels_needed=False)
  assert bench.timing_rows(argparse.Namespace(rows='1,2', rounds=1), kernels_needed=False) == (1, 2)
