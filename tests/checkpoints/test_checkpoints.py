"""Tests of T5X checkpoint reading/writing without t5x (speculative/checkpoints/).

The fixture `tests/fixtures/t5x_tiny/ckpt/checkpoint_0` was written by stock T5X; loading it
must give exactly the arrays of `params.msgpack`. Saving must produce the same layout (msgpack with
relative tensorstore specs + gzip zarr arrays), round-trip exactly (also with bfloat16 storage),
be atomic, and every broken input must raise an error that names the problem.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
import shutil

import flax
from flax import serialization
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import checkpoints
from speculative.checkpoints import CheckpointError

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 't5x_tiny'  # written by stock T5X (its README.md)


def _flat(tree):
  return flax.traverse_util.flatten_dict(tree, sep='/')


def _assert_trees_equal(a, b):
  fa, fb = _flat(a), _flat(b)
  assert fa.keys() == fb.keys()
  for k in fa:
    assert fa[k].dtype == fb[k].dtype, (k, fa[k].dtype, fb[k].dtype)
    assert fa[k].shape == fb[k].shape, (k, fa[k].shape, fb[k].shape)
    np.testing.assert_array_equal(np.asarray(fa[k]), np.asarray(fb[k]), err_msg=k)


def _small_params():
  rng = np.random.default_rng(0)
  return {
    'token_embedder': {'embedding': rng.normal(size=(11, 4)).astype(np.float32)},
    'encoder': {
      'layers_0': {'mlp': {'wi_0': {'kernel': rng.normal(size=(4, 6)).astype(np.float32)}}},
      'encoder_norm': {'scale': np.ones((4,), np.float32)},
    },
    'decoder': {'relpos_bias': {'rel_embedding': rng.normal(size=(2, 32)).astype(np.float32)}},
  }


@pytest.fixture(scope='module')
def fixture_params():
  return serialization.msgpack_restore((FIXTURE / 'params.msgpack').read_bytes())


# ------------------------------------------------------------------------------------------------
# Reading the real T5X checkpoint.
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize('where', ['ckpt/checkpoint_0', 'ckpt', 'ckpt/checkpoint_0/checkpoint'])
def test_fixture_checkpoint_equals_params_msgpack(fixture_params, where):
  params = checkpoints.load_t5x_checkpoint(FIXTURE / where)
  _assert_trees_equal(params, fixture_params)


def test_fixture_checkpoint_state_and_model_shapes(fixture_params):
  import json

  from speculative.models.t5 import T5
  from speculative.models.t5 import T5Config

  result = checkpoints.read_t5x_checkpoint(FIXTURE / 'ckpt', include_state=True)
  assert result['step'] == 0 and result['path'].name == 'checkpoint_0'
  states = result['state']['param_states']['token_embedder']['embedding']
  assert states['v'].shape == (32128, 8) and states['m'].shape == (1,)  # Adafactor, inline + zarr
  config = json.loads((FIXTURE / 'decode_results.json').read_text())['T5Config']
  checkpoints.validate_params(result['target'], T5(T5Config(**config)).param_shapes())


# ------------------------------------------------------------------------------------------------
# Writing.
# ------------------------------------------------------------------------------------------------
def test_save_layout_is_t5x(tmp_path):
  params = _small_params()
  out = checkpoints.save_t5x_checkpoint(params, tmp_path, 5)
  assert out == tmp_path / 'checkpoint_5'
  assert sorted(p.name for p in tmp_path.iterdir()) == ['checkpoint_5']  # no temp dirs left
  contents = serialization.msgpack_restore((out / 'checkpoint').read_bytes())
  assert set(contents) == {'version', 'optimizer'} and contents['version'] == 3
  assert int(contents['optimizer']['state']['step']) == 5
  spec = contents['optimizer']['target']['token_embedder']['embedding']
  assert spec['driver'] == 'zarr' and spec['kvstore'] == {
    'driver': 'file',
    'path': 'target.token_embedder.embedding',
  }  # relative to checkpoint dir
  assert spec['metadata']['compressor']['id'] == 'gzip'
  assert (out / 'target.token_embedder.embedding' / '.zarray').is_file()
  assert (out / 'target.encoder.layers_0.mlp.wi_0.kernel' / '.zarray').is_file()


@pytest.mark.parametrize('dtype', [None, 'bfloat16'])
def test_save_load_round_trip(tmp_path, dtype):
  params = _small_params()
  optimizer_state = {
    'token_embedder': {
      'embedding': {'v': np.full((11, 4), 0.5, np.float32), 'm': np.zeros((1,), np.float32)}
    }
  }
  checkpoints.save_t5x_checkpoint(params, tmp_path, 3, dtype=dtype, optimizer_state=optimizer_state)
  stored = checkpoints.load_t5x_checkpoint(tmp_path, dtype=None)
  expected = (
    params
    if dtype is None
    else flax.traverse_util.unflatten_dict(
      {k: v.astype(jnp.bfloat16) for k, v in _flat(params).items()}, sep='/'
    )
  )
  _assert_trees_equal(stored, expected)
  as_f32 = checkpoints.load_t5x_checkpoint(tmp_path)  # default: cast to float32
  assert all(v.dtype == np.float32 for v in _flat(as_f32).values())
  state = checkpoints.read_t5x_checkpoint(tmp_path, include_state=True)['state']
  _assert_trees_equal(state['param_states'], optimizer_state)


def test_fixture_resave_round_trip(tmp_path, fixture_params):
  checkpoints.save_t5x_checkpoint(fixture_params, tmp_path, 0)
  _assert_trees_equal(checkpoints.load_t5x_checkpoint(tmp_path), fixture_params)


def test_latest_step_is_chosen_and_incomplete_ignored(tmp_path):
  params = _small_params()
  checkpoints.save_t5x_checkpoint(params, tmp_path, 3)
  later = {
    **params,
    'encoder': {**params['encoder'], 'encoder_norm': {'scale': np.full((4,), 2.0, np.float32)}},
  }
  checkpoints.save_t5x_checkpoint(later, tmp_path, 10)
  (tmp_path / 'checkpoint_20').mkdir()  # e.g. an interrupted foreign writer: no msgpack
  (tmp_path / 'checkpoint_30.tmp-123').mkdir()
  assert checkpoints.checkpoint_steps(tmp_path) == [3, 10]
  loaded = checkpoints.read_t5x_checkpoint(tmp_path)
  assert loaded['step'] == 10
  np.testing.assert_array_equal(loaded['target']['encoder']['encoder_norm']['scale'], 2.0)


def test_save_is_atomic_on_failure(tmp_path, monkeypatch):
  def boom(*args, **kwargs):
    raise RuntimeError('disk full')

  monkeypatch.setattr(checkpoints.serialization, 'msgpack_serialize', boom)
  with pytest.raises(RuntimeError, match='disk full'):
    checkpoints.save_t5x_checkpoint(_small_params(), tmp_path, 1)
  assert list(tmp_path.iterdir()) == []  # neither checkpoint_1 nor a temp dir


def test_write_atomic_gives_the_usual_file_mode(tmp_path):
  umask = os.umask(0o022)
  try:
    checkpoints.write_atomic(tmp_path / 'out.json', b'{}')
  finally:
    os.umask(umask)
  assert (tmp_path / 'out.json').read_bytes() == b'{}'
  assert (tmp_path / 'out.json').stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600
  assert [p.name for p in tmp_path.iterdir()] == ['out.json']


def test_save_refuses_to_overwrite_unless_asked(tmp_path):
  params = _small_params()
  checkpoints.save_t5x_checkpoint(params, tmp_path, 1)
  with pytest.raises(FileExistsError, match='checkpoint_1'):
    checkpoints.save_t5x_checkpoint(params, tmp_path, 1)
  params['encoder']['encoder_norm']['scale'] = np.full((4,), 3.0, np.float32)
  checkpoints.save_t5x_checkpoint(params, tmp_path, 1, overwrite=True)
  assert sorted(p.name for p in tmp_path.iterdir()) == ['checkpoint_1']
  np.testing.assert_array_equal(
    checkpoints.load_t5x_checkpoint(tmp_path)['encoder']['encoder_norm']['scale'], 3.0
  )
  with pytest.raises(ValueError, match="'params'"):
    checkpoints.save_t5x_checkpoint({'params': params}, tmp_path, 2)


def test_save_load_params_file(tmp_path):
  params = _small_params()
  path = checkpoints.save_params(params, tmp_path / 'w.msgpack')  # bfloat16 storage by default
  stored = serialization.msgpack_restore(path.read_bytes())
  assert stored['token_embedder']['embedding'].dtype == jnp.bfloat16
  loaded = checkpoints.load_params(path)
  expected = {k: v.astype(jnp.bfloat16).astype(np.float32) for k, v in _flat(params).items()}
  _assert_trees_equal(loaded, flax.traverse_util.unflatten_dict(expected, sep='/'))
  exact = checkpoints.load_params(checkpoints.save_params(params, tmp_path / 'f.msgpack', None))
  _assert_trees_equal(exact, params)
  assert [p.name for p in sorted(tmp_path.iterdir())] == [
    'f.msgpack',
    'f.msgpack.json',
    'w.msgpack',
    'w.msgpack.json',
  ]  # + sha256/config sidecars


# ------------------------------------------------------------------------------------------------
# Clear errors.
# ------------------------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
  return checkpoints.save_t5x_checkpoint(_small_params(), tmp_path / 'model', 4)


def test_error_missing_directory(tmp_path):
  with pytest.raises(FileNotFoundError, match='does not exist'):
    checkpoints.load_t5x_checkpoint(tmp_path / 'nope')
  (tmp_path / 'empty').mkdir()
  with pytest.raises(FileNotFoundError, match='no T5X checkpoint'):
    checkpoints.load_t5x_checkpoint(tmp_path / 'empty')


def test_error_missing_checkpoint_file(saved):
  os.remove(saved / 'checkpoint')
  with pytest.raises(FileNotFoundError, match="no 'checkpoint' msgpack"):
    checkpoints.load_t5x_checkpoint(saved)


def test_error_corrupt_msgpack(saved):
  data = (saved / 'checkpoint').read_bytes()
  (saved / 'checkpoint').write_bytes(data[: len(data) // 2])  # truncated
  with pytest.raises(CheckpointError, match='corrupt T5X checkpoint msgpack'):
    checkpoints.load_t5x_checkpoint(saved)
  (saved / 'checkpoint').write_bytes(serialization.msgpack_serialize({'a': np.zeros(2)}))
  with pytest.raises(CheckpointError, match="'version' and 'optimizer'"):
    checkpoints.load_t5x_checkpoint(saved)


def test_error_missing_zarr_array(saved):
  shutil.rmtree(saved / 'target.encoder.layers_0.mlp.wi_0.kernel')
  with pytest.raises(
    CheckpointError, match='missing array target/encoder/layers_0/mlp/wi_0/kernel'
  ):
    checkpoints.load_t5x_checkpoint(saved)


def test_error_corrupt_zarr_chunk(saved):
  array_dir = saved / 'target.token_embedder.embedding'
  for chunk in array_dir.iterdir():
    if not chunk.name.startswith('.'):
      chunk.write_bytes(b'not gzip')
  with pytest.raises(CheckpointError, match='cannot read array target/token_embedder/embedding'):
    checkpoints.load_t5x_checkpoint(saved)


def test_validate_params_names_problems():
  params = _small_params()
  expected = {k: v.shape for k, v in _flat(params).items()}
  checkpoints.validate_params(params, expected)
  expected['decoder/logits_dense/kernel'] = (4, 11)
  expected['token_embedder/embedding'] = (12, 4)
  del expected['encoder/encoder_norm/scale']
  with pytest.raises(CheckpointError) as info:
    checkpoints.validate_params(params, expected, name='ckpt X')
  # One line: the first array of another shape (else the first missing one), and the counts.
  assert str(info.value) == (
    'ckpt X do not match the model: token_embedder/embedding has shape (11, 4), the model '
    'expects (12, 4) (3 arrays differ: 1 of another shape, 1 missing, 1 not in the model)'
  )


def test_error_corrupt_params_file(tmp_path):
  (tmp_path / 'bad.msgpack').write_bytes(b'\xc1\xc1garbage')
  with pytest.raises(CheckpointError, match='corrupt params file'):
    checkpoints.load_params(tmp_path / 'bad.msgpack')
  with pytest.raises(FileNotFoundError, match='^params file does not exist: .*missing.msgpack$'):
    checkpoints.load_params(tmp_path / 'missing.msgpack')


def test_saved_checkpoint_restores_like_t5x(tmp_path):
  """Replays stock T5X's restore path (t5x.checkpoints `restore` + `_read_ts`) on our output.

  T5X turns each msgpack spec dict into a `ts.Spec`, drops metadata chunks/compressor, joins the
  relative kvstore path to the checkpoint dir, checks the metadata shape, optionally wraps a
  'cast' driver (restore_dtype) and reads with jax's `async_deserialize` onto a sharding.
  """
  import asyncio

  import jax
  from jax.experimental.array_serialization import serialization as array_serialization
  import tensorstore as ts

  params = _small_params()
  out = checkpoints.save_t5x_checkpoint(params, tmp_path, 2, dtype='bfloat16')
  contents = serialization.msgpack_restore((out / 'checkpoint').read_bytes())
  specs = flax.traverse_util.flatten_dict(
    contents['optimizer']['target'],
    is_leaf=lambda _, v: isinstance(v, dict) and 'driver' in v,
    sep='/',
  )
  assert specs.keys() == _flat(params).keys()
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  for name, spec_dict in specs.items():
    spec = ts.Spec(spec_dict).to_json()
    del spec['metadata']['chunks']
    del spec['metadata']['compressor']
    spec['kvstore']['path'] = os.path.join(str(out), spec['kvstore']['path'])
    assert tuple(spec['metadata']['shape']) == _flat(params)[name].shape
    spec = {'base': spec, 'driver': 'cast', 'dtype': 'float32'}  # restore_dtype=float32
    restored = asyncio.run(array_serialization.async_deserialize(sharding, spec))
    np.testing.assert_array_equal(
      np.asarray(restored), _flat(params)[name].astype(jnp.bfloat16).astype(np.float32)
    )


def test_relative_paths_with_parent_components_round_trip(tmp_path, monkeypatch):
  """tensorstore rejects '..' in file paths; save and load must resolve them first."""
  (tmp_path / 'cwd').mkdir()
  monkeypatch.chdir(tmp_path / 'cwd')
  params = {'layer': {'kernel': np.arange(12, dtype=np.float32).reshape(3, 4)}}
  checkpoints.save_t5x_checkpoint(params, '../model_dir', 7)
  restored = checkpoints.load_t5x_checkpoint('../model_dir')
  np.testing.assert_array_equal(restored['layer']['kernel'], params['layer']['kernel'])


# ------------------------------------------------------------------------------------------------
# Metadata: sha256 + model config recorded with the weights and verified on load.
# ------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Config:
  width: int = 4
  acts: tuple = ('gelu', 'linear')


def test_compute_only_fields_are_not_compared(tmp_path):
  # The activation dtype (and the logits/attention precision options, dropout) choose how the
  # weights are computed with, not what they mean: float32-trained weights run in bfloat16.
  from speculative.models.t5 import T5Config

  config = T5Config(
    vocab_size=16,
    emb_dim=4,
    num_heads=1,
    head_dim=4,
    mlp_dim=8,
    num_encoder_layers=1,
    num_decoder_layers=1,
  )
  path = checkpoints.save_params(_small_params(), tmp_path / 'w.msgpack', None, config=config)
  for change in (
    {'dtype': 'bfloat16'},
    {'logits_dtype': 'float32'},
    {'dropout_rate': 0.1},
    {'float32_attention_logits': True},
  ):
    checkpoints.check_config(path, dataclasses.replace(config, **change))
  with pytest.raises(CheckpointError, match=r'different model config:\n  mlp_dim: weights 8'):
    checkpoints.check_config(path, dataclasses.replace(config, mlp_dim=16, dtype='bfloat16'))


def test_params_file_records_and_verifies_sha256_and_config(tmp_path):
  path = checkpoints.save_params(_small_params(), tmp_path / 'w.msgpack', None, config=_Config())
  metadata = checkpoints.read_metadata(path)
  assert metadata['sha256'] == checkpoints.sha256_of(path)
  assert metadata['config'] == {'width': 4, 'acts': ['gelu', 'linear']}
  _assert_trees_equal(checkpoints.load_params(path, config=_Config()), _small_params())
  with pytest.raises(
    CheckpointError, match=r'different model config:\n  width: weights 4, given 5'
  ):
    checkpoints.load_params(path, config=_Config(width=5))
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 1  # one flipped bit inside an array: still parses, must be refused
  path.write_bytes(bytes(data))
  with pytest.raises(CheckpointError, match=f'{path} is corrupt or was changed'):
    checkpoints.load_params(path)


def test_zeros_are_refused_naming_the_file(tmp_path, caplog):
  zeros = tmp_path / 'zeros.msgpack'
  zeros.write_bytes(bytes(64 * 1024))
  with pytest.raises(CheckpointError, match=f'{zeros} looks corrupt: 4096\\+ zero bytes'):
    checkpoints.load_params(zeros)
  # 64 KiB of zeros written into a file without metadata (a legacy file): refused too.
  legacy = tmp_path / 'legacy.msgpack'
  legacy.write_bytes(
    serialization.msgpack_serialize(
      {'w': np.random.default_rng(0).normal(size=(200, 100)).astype(np.float32)}
    )
  )
  checkpoints.load_params(legacy)  # loads, with a warning, once per file and process
  checkpoints.check_weights('target_checkpoint', legacy)
  checkpoints.load_params(legacy)
  assert caplog.text.count(f'{legacy} has no metadata') == 1
  data = bytearray(legacy.read_bytes())
  data[1000 : 1000 + 64 * 1024] = bytes(64 * 1024)
  legacy.write_bytes(bytes(data))
  with pytest.raises(CheckpointError, match=f'{legacy} looks corrupt'):
    checkpoints.load_params(legacy)


def test_t5x_checkpoint_with_config_is_verified(tmp_path):
  out = checkpoints.save_t5x_checkpoint(
    _small_params(), tmp_path, 2, config=_Config(), extra_files={'extra.bin': b'abc'}
  )
  assert (out / 'extra.bin').read_bytes() == b'abc'
  assert checkpoints.read_metadata(out)['step'] == 2
  _assert_trees_equal(checkpoints.load_t5x_checkpoint(out, config=_Config()), _small_params())
  with pytest.raises(CheckpointError, match='width: weights 4, given 7'):
    checkpoints.load_params(out, config=_Config(width=7))
  (out / 'extra.bin').write_bytes(b'abd')
  with pytest.raises(CheckpointError, match='is corrupt or was changed'):
    checkpoints.load_t5x_checkpoint(out)


def test_stale_temporaries_are_removed(tmp_path):
  checkpoints.save_t5x_checkpoint(_small_params(), tmp_path, 1)
  (tmp_path / 'checkpoint_2.tmp-1-abc').mkdir()
  (tmp_path / 'checkpoint_1.old-x').mkdir()
  (tmp_path / 'best.msgpack.tmp-zz').write_bytes(b'half')
  removed = checkpoints.remove_stale_temporaries(tmp_path)
  assert sorted(removed) == ['best.msgpack.tmp-zz', 'checkpoint_1.old-x', 'checkpoint_2.tmp-1-abc']
  assert [p.name for p in tmp_path.iterdir()] == ['checkpoint_1']


def test_add_metadata_gives_an_old_params_file_its_sidecar(tmp_path):
  import model_utils

  from speculative.models.t5 import T5
  from speculative.models.t5 import T5Config

  config = T5Config(
    vocab_size=64,
    emb_dim=8,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=1,
    head_dim=4,
    mlp_dim=16,
  )
  path = tmp_path / "old.msgpack"
  # Random weights of the model's shapes (no initializer to compile): the test is about the file.
  checkpoints.save_params(model_utils.random_params(T5(config), 0), path)
  os.remove(checkpoints.metadata_path(path))  # as written before sidecars existed
  checkpoints.add_metadata(path, config)
  assert checkpoints.read_metadata(path)["config"]["emb_dim"] == 8
  checkpoints.load_params(path, config=config)  # verified: hash and config match
  with pytest.raises(CheckpointError, match="old.msgpack was saved with a different model config"):
    checkpoints.load_params(
      path, config=dataclasses.replace(config, relative_attention_max_distance=64)
    )
  with pytest.raises(CheckpointError, match="old.msgpack do not match the model"):
    checkpoints.add_metadata(path, dataclasses.replace(config, emb_dim=16))  # shapes differ


# ------------------------------------------------------------------------------------------------
# Weights whose metadata records no config: their arrays' shapes against the config's model.
# ------------------------------------------------------------------------------------------------
def _tiny_t5_config(**changes):
  from speculative.models.t5 import T5Config

  fields = dict(num_heads=2, num_encoder_layers=1, num_decoder_layers=1, head_dim=4, mlp_dim=16)
  return T5Config(**{'vocab_size': 64, 'emb_dim': 8, **fields, **changes})


@pytest.mark.parametrize('sidecar', ['none', 'without a config'])
def test_params_file_of_another_shape_is_refused_in_one_line_naming_the_setting(tmp_path, sidecar):
  import model_utils

  from speculative.models.t5 import T5

  config = _tiny_t5_config()
  path = tmp_path / 'w.msgpack'
  checkpoints.save_params(model_utils.random_params(T5(config), 0), path, config=None)
  if sidecar == 'none':
    os.remove(checkpoints.metadata_path(path))
  assert checkpoints.check_weights('target_checkpoint', path, config) == checkpoints.sha256_of(path)
  with pytest.raises(CheckpointError) as info:
    checkpoints.check_weights('target_checkpoint', path, dataclasses.replace(config, mlp_dim=32))
  assert str(info.value) == (
    f'target_checkpoint: {path} does not match the model config: '
    'decoder/layers_0/mlp/wi_0/kernel has shape (8, 16), the model expects (8, 32) '
    '(6 arrays differ: 6 of another shape)'
  )


def test_stock_t5x_checkpoint_of_another_shape_is_refused_in_one_line_naming_the_setting():
  import json

  from speculative.models.t5 import T5Config

  config = T5Config(**json.loads((FIXTURE / 'decode_results.json').read_text())['T5Config'])
  checkpoints.check_weights('draft_checkpoint', FIXTURE / 'ckpt', config)  # its own config: passes
  with pytest.raises(CheckpointError) as info:
    checkpoints.check_weights(
      'draft_checkpoint', FIXTURE / 'ckpt', dataclasses.replace(config, num_decoder_layers=3)
    )
  assert str(info.value) == (
    f'draft_checkpoint: {FIXTURE}/ckpt/checkpoint_0 does not match the model config: '
    'decoder/layers_2/encoder_decoder_attention/key/kernel (8, 12) is missing '
    '(14 arrays differ: 14 missing)'
  )


def test_validate_params_is_one_line_naming_the_first_difference():
  params = _small_params()
  expected = {k: v.shape for k, v in _flat(params).items()}
  del expected['encoder/encoder_norm/scale']
  with pytest.raises(CheckpointError) as info:
    checkpoints.validate_params(params, expected, name='ckpt X')
  assert str(info.value) == (
    'ckpt X do not match the model: encoder/encoder_norm/scale (4,) is not in the model'
  )


# ------------------------------------------------------------------------------------------------
# The fingerprint (sha256) of a T5X checkpoint covers every byte a load reads.
# ------------------------------------------------------------------------------------------------
def _replace_chunks(array_dir, data):
  """New bytes for an array's chunk files, each written to a new file renamed over it."""
  for chunk in Path(array_dir).iterdir():
    if not chunk.name.startswith('.'):
      fresh = chunk.with_name(chunk.name + '.new')
      fresh.write_bytes(data)
      os.replace(fresh, chunk)


def test_a_symlinked_array_folder_is_hashed_by_content(tmp_path):
  ckpt = checkpoints.save_t5x_checkpoint(_small_params(), tmp_path / 'model', 1)  # no metadata
  copied_in = checkpoints.check_weights('target_checkpoint', ckpt)
  array = ckpt / 'target.token_embedder.embedding'
  shutil.move(array, tmp_path / 'shared')
  os.symlink(tmp_path / 'shared', array)
  # Linked or copied in: the same bytes under the same names, the same fingerprint.
  assert checkpoints.check_weights('target_checkpoint', ckpt) == copied_in
  _replace_chunks(tmp_path / 'shared', b'other bytes')
  assert checkpoints.check_weights('target_checkpoint', ckpt) != copied_in


def test_a_link_looping_back_is_refused_naming_it(tmp_path):
  (tmp_path / 'w' / 'a').mkdir(parents=True)
  (tmp_path / 'w' / 'a' / 'f').write_bytes(b'x')
  os.symlink('..', tmp_path / 'w' / 'a' / 'up')
  with pytest.raises(CheckpointError) as info:
    checkpoints.sha256_of(tmp_path / 'w')
  assert str(info.value) == (
    f'cannot hash {tmp_path}/w: the link {tmp_path}/w/a/up loops back to {tmp_path}/w'
  )


@pytest.mark.parametrize('where', ['relative', 'absolute'])
def test_an_array_path_outside_the_checkpoint_is_refused_in_one_line(tmp_path, where):
  ckpt = checkpoints.save_t5x_checkpoint(_small_params(), tmp_path / 'model', 1)
  shutil.move(ckpt / 'target.token_embedder.embedding', tmp_path / 'outside')
  contents = serialization.msgpack_restore((ckpt / 'checkpoint').read_bytes())
  path = '../../outside' if where == 'relative' else str(tmp_path / 'outside')
  contents['optimizer']['target']['token_embedder']['embedding']['kvstore']['path'] = path
  (ckpt / 'checkpoint').write_bytes(serialization.msgpack_serialize(contents))
  refusal = (
    f'array target/token_embedder/embedding of {ckpt} has its path {path!r} outside the '
    'checkpoint directory (T5X writes every array inside it, and its sha256 covers only that); '
    "move the array's folder in, or link it in from inside"
  )
  with pytest.raises(CheckpointError) as info:
    checkpoints.check_weights('target_checkpoint', ckpt)
  assert str(info.value) == f'target_checkpoint: {refusal}'
  with pytest.raises(CheckpointError) as info:
    checkpoints.load_t5x_checkpoint(ckpt)
  assert str(info.value) == refusal
