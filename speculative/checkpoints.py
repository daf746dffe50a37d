"""Reading and writing T5X checkpoints without t5x, plus compact weight files.

T5X checkpoint layout (`t5x.checkpoints.Checkpointer`, format version 3):

  <model_dir>/checkpoint_<step>/
    checkpoint                       msgpack (flax serialization) of
                                     {'version': 3, 'optimizer': {'target': params,
                                      'state': {'step': step, 'param_states': ...}}}
    target.encoder.layers_0.mlp.wi_0.kernel/   one gzip-compressed zarr array per large leaf,
    ...                                        named by its path with '.' for '/'

In the msgpack a leaf stored in tensorstore is a spec dict `{'driver': 'zarr', 'kvstore': {'driver':
'file', 'path': 'target....'}, 'metadata': {...}, 'dtype': ...}` whose path is relative to the
checkpoint directory; other leaves are inline arrays (msgpack ext type 1, flax serialization).

`load_t5x_checkpoint` returns the `target` tree (the model parameters, no 'params' key), which is
exactly the `speculative.models.t5.T5` parameter tree. `save_t5x_checkpoint` writes the same layout
atomically (temp dir + rename) so that stock T5X restores it. `save_params`/`load_params` read and
write a single flax-msgpack file (optionally bfloat16/float16 storage) for shipping weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
import re
import shutil
import tempfile
import time
from typing import Any
from typing import Mapping

import flax
from flax import serialization
import jax
import jax.numpy as jnp
import msgpack
import numpy as np

Params = Any
PathLike = str | os.PathLike

T5X_CHECKPOINT_VERSION = 3
_CHECKPOINT_FILE = 'checkpoint'
_STEP_DIR = re.compile(r'checkpoint_(\d+)')
# T5X aims for 64 MiB zarr chunks.
_CHUNK_BYTES = 64 * 1024 * 1024


class CheckpointError(ValueError):
  """A checkpoint is missing, corrupt, or does not match the model."""


# ----------------------------------------------------------------------------------------------
# Content hashes and metadata (model config + sha256), so that corrupt or mismatched weights are
# refused instead of loaded. A params file `w.msgpack` carries them in the sidecar `w.msgpack.json`;
# a checkpoint directory in `speculative_metadata.json` inside it. Files written before metadata
# existed still load, with a warning.
# ----------------------------------------------------------------------------------------------
METADATA_FORMAT = 'speculative-weights/1'
_DIR_METADATA = 'speculative_metadata.json'
# A legacy file (no metadata) with a run of this many zero bytes is refused as corrupt: trained
# float weights essentially never hold thousands of consecutive exact zero bytes.
_ZERO_RUN_BYTES = 4096


def sha256_of(path: PathLike, *, exclude: tuple[str, ...] = (_DIR_METADATA,)) -> str:
  """sha256 of a file's bytes, or of a directory's files (relative names and contents, sorted).

  `exclude`: file names (in any subdirectory) left out of a directory's hash.
  """
  path = Path(path)
  digest = hashlib.sha256()
  if path.is_file():
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
    return digest.hexdigest()
  if not path.is_dir():
    raise FileNotFoundError(f'cannot hash {path}: it does not exist')
  for root, dirs, files in os.walk(path):
    dirs.sort()
    for name in sorted(files):
      if name in exclude:
        continue
      file = Path(root) / name
      relative = file.relative_to(path).as_posix()
      digest.update(relative.encode() + b'\0')
      digest.update(sha256_of(file).encode())
  return digest.hexdigest()


def config_dict(config: Any) -> dict | None:
  """A dataclass config (e.g. `T5Config`) as a JSON-able dict (tuples become lists); None stays."""
  if config is None:
    return None
  if not dataclasses.is_dataclass(config):
    raise TypeError(f'config must be a dataclass (e.g. T5Config), got {type(config).__name__}')
  return json.loads(json.dumps(dataclasses.asdict(config)))


def metadata_path(path: PathLike) -> Path:
  """Where the metadata of a params file or checkpoint directory lives."""
  path = Path(path)
  return path / _DIR_METADATA if path.is_dir() else path.with_name(path.name + '.json')


def read_metadata(path: PathLike) -> dict | None:
  """The metadata of a params file or checkpoint directory; None if it has none (older files)."""
  file = metadata_path(path)
  if not file.is_file():
    return None
  try:
    metadata = json.loads(file.read_text(encoding='utf-8'))
  except (ValueError, UnicodeDecodeError) as e:
    raise CheckpointError(f'corrupt weights metadata {file}: {e}') from e
  if not isinstance(metadata, dict) or metadata.get('format') != METADATA_FORMAT:
    raise CheckpointError(f'{file} is not {METADATA_FORMAT} metadata')
  return metadata


def add_metadata(path: PathLike, config: Any, extra: dict | None = None) -> Path:
  """Writes the sidecar (sha256 + config) of a params file saved before sidecars existed, after
  checking that the file loads and its shapes match `config` (a T5Config). Returns the sidecar."""
  from speculative.models import t5 as t5_lib  # pylint: disable=g-import-not-at-top

  path = Path(path)
  params = load_params(path)
  validate_params(params, t5_lib.T5(config).param_shapes(), name=str(path))
  _write_metadata(path, hashlib.sha256(path.read_bytes()).hexdigest(), config, extra)
  return metadata_path(path)


def _write_metadata(path: Path, sha256: str, config: Any, extra: dict | None) -> None:
  metadata = {
    'format': METADATA_FORMAT,
    'sha256': sha256,
    'config': config_dict(config),
    **(extra or {}),
  }
  write_atomic(metadata_path(path), (json.dumps(metadata, indent=2) + '\n').encode())


# Config fields that choose how the weights are computed with, not what they mean: the activation
# dtype, the logits/attention-logits precision options and the training-only dropout rate. Weights
# saved under one value load under another (e.g. the shipped float32-trained target run in
# bfloat16), so `check_config` does not compare them.
COMPUTE_ONLY_FIELDS = frozenset(
  {'dtype', 'logits_dtype', 'float32_attention_logits', 'dropout_rate'}
)


def check_config(path: PathLike, config: Any, metadata: dict | None = None) -> None:
  """Raises `CheckpointError` if the config recorded with the weights at `path` differs from
  `config` (a dataclass), naming each differing field. Weights without a recorded config pass;
  `COMPUTE_ONLY_FIELDS` are not compared."""
  metadata = read_metadata(path) if metadata is None else metadata
  recorded = (metadata or {}).get('config')
  if recorded is None or config is None:
    return
  wanted = config_dict(config)
  fields = sorted((set(recorded) | set(wanted)) - COMPUTE_ONLY_FIELDS)
  diffs = [
    f'{k}: weights {recorded.get(k)!r}, given {wanted.get(k)!r}'
    for k in fields
    if recorded.get(k) != wanted.get(k)
  ]
  if diffs:
    raise CheckpointError(
      f'{path} was saved with a different model config:\n  ' + '\n  '.join(diffs)
    )


def verify_weights(path: PathLike, config: Any = None, *, data: bytes | None = None) -> str:
  """Checks the weights at `path` against their metadata; returns their sha256.

  Refuses (CheckpointError naming the file) a content hash that differs from the recorded one
  (corrupt or changed after export), a recorded config that differs from `config`, and a legacy
  params file (no metadata, which only warns) that holds a long run of zero bytes.
  `data`: the file's bytes if already read.
  """
  path = Path(path)
  if not path.exists():
    raise FileNotFoundError(f'weights do not exist: {path}')
  metadata = read_metadata(path)
  if data is not None:
    digest = hashlib.sha256(data).hexdigest()
  else:
    digest = sha256_of(path)
  if metadata is None:
    # Stock T5X checkpoints never have metadata: only a params file's lack of it is worth a warning.
    (logging.warning if path.is_file() else logging.info)(
      '%s has no metadata (%s): its content and model config cannot be verified; re-save it '
      'with speculative.checkpoints to add them',
      path,
      metadata_path(path).name,
    )
    if path.is_file():
      if data is None:
        data = path.read_bytes()
      at = data.find(b'\0' * _ZERO_RUN_BYTES)
      if at >= 0:
        raise CheckpointError(
          f'{path} looks corrupt: {_ZERO_RUN_BYTES}+ zero bytes at offset {at} '
          '(and it has no metadata to verify it against)'
        )
    return digest
  if metadata.get('sha256') != digest:
    raise CheckpointError(
      f'{path} is corrupt or was changed after it was saved: its sha256 is '
      f'{digest}, its metadata {metadata_path(path)} records '
      f"{metadata.get('sha256')}"
    )
  check_config(path, config, metadata)
  return digest


# ----------------------------------------------------------------------------------------------
# Locating checkpoints.
# ----------------------------------------------------------------------------------------------
def checkpoint_steps(model_dir: PathLike) -> list[int]:
  """Steps of the complete `checkpoint_<step>` directories in `model_dir`, ascending."""
  model_dir = Path(model_dir)
  steps = []
  for child in model_dir.iterdir():
    match = _STEP_DIR.fullmatch(child.name)
    if match and (child / _CHECKPOINT_FILE).is_file():
      steps.append(int(match.group(1)))
  return sorted(steps)


def find_checkpoint_dir(path: PathLike) -> Path:
  """Resolves `path` to a `checkpoint_<step>` directory.

  `path` may be a checkpoint directory, its `checkpoint` msgpack file, or a model directory holding
  `checkpoint_<step>` subdirectories (the latest complete step is chosen).
  """
  path = Path(path)
  if not path.exists():
    raise FileNotFoundError(f'T5X checkpoint path does not exist: {path}')
  if path.is_file():
    if path.name != _CHECKPOINT_FILE:
      raise CheckpointError(
        f'not a T5X checkpoint file (expected a file named '
        f'{_CHECKPOINT_FILE!r} or a checkpoint directory): {path}'
      )
    return path.parent
  if (path / _CHECKPOINT_FILE).is_file():
    return path
  if _STEP_DIR.fullmatch(path.name):
    hint = ''
    if (path / 'state').is_dir() or (path / '_CHECKPOINT_METADATA').exists():
      hint = ' (this looks like an Orbax checkpoint, which is not supported)'
    raise FileNotFoundError(
      f'T5X checkpoint directory {path} has no {_CHECKPOINT_FILE!r} msgpack '
      f'file{hint}; it may be incomplete'
    )
  steps = checkpoint_steps(path)
  if not steps:
    raise FileNotFoundError(
      f'no T5X checkpoint in {path}: neither a {_CHECKPOINT_FILE!r} file nor '
      'complete checkpoint_<step> subdirectories'
    )
  return path / f'checkpoint_{steps[-1]}'


# ----------------------------------------------------------------------------------------------
# Reading.
# ----------------------------------------------------------------------------------------------
def _is_ts_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and 'driver' in value and 'kvstore' in value


def _read_msgpack(checkpoint_dir: Path) -> dict:
  file = checkpoint_dir / _CHECKPOINT_FILE
  data = file.read_bytes()
  try:
    contents = serialization.msgpack_restore(data)
  except (
    msgpack.exceptions.UnpackException,
    msgpack.exceptions.ExtraData,
    ValueError,
    TypeError,
    KeyError,
  ) as e:
    raise CheckpointError(f'corrupt T5X checkpoint msgpack {file}: {type(e).__name__}: {e}') from e
  if not isinstance(contents, dict) or 'optimizer' not in contents:
    keys = sorted(contents) if isinstance(contents, dict) else type(contents).__name__
    raise CheckpointError(
      f'{file} is not a T5X checkpoint: expected top-level keys '
      f"'version' and 'optimizer', got {keys}"
    )
  version = contents.get('version', 0)
  if int(np.asarray(version)) < 3:
    raise CheckpointError(
      f'{file}: T5X checkpoint version {version} is not supported (need 3; '
      'version 2 stored bfloat16 as uint16)'
    )
  optimizer = contents['optimizer']
  if not isinstance(optimizer, dict) or 'target' not in optimizer:
    raise CheckpointError(f"{file}: 'optimizer' has no 'target' (the model parameters)")
  return contents


def _absolute_spec(spec: Mapping[str, Any], checkpoint_dir: Path, name: str) -> tuple[dict, Path]:
  """A tensorstore spec with the kvstore path made absolute (file driver), and that path."""
  spec = dict(spec)
  kvstore = dict(spec['kvstore']) if isinstance(spec['kvstore'], Mapping) else {}
  # T5X writes GCS specs with the path at the top level; read them from the local directory.
  relative = kvstore.get('path', spec.pop('path', None))
  if relative is None:
    raise CheckpointError(f'tensorstore spec for {name} has no path: {spec}')
  array_dir = checkpoint_dir / str(relative)
  spec['kvstore'] = {'driver': 'file', 'path': str(array_dir)}
  return spec, array_dir


def _read_tree(tree: Any, checkpoint_dir: Path, prefix: str, dtype: np.dtype | None) -> Any:
  """Replaces every leaf of `tree` (inline array or tensorstore spec) by a numpy array."""
  import tensorstore as ts  # deferred: only checkpoint I/O needs it

  flat = flax.traverse_util.flatten_dict(tree, is_leaf=lambda _, v: _is_ts_spec(v), sep='/')
  pending = {}
  out = {}
  for key, leaf in flat.items():
    name = f'{prefix}/{key}'
    if _is_ts_spec(leaf):
      spec, array_dir = _absolute_spec(leaf, checkpoint_dir, name)
      if not (array_dir / '.zarray').is_file():
        raise CheckpointError(
          f'missing array {name}: zarr directory {array_dir} does not exist '
          'or has no .zarray (incomplete or corrupt checkpoint)'
        )
      try:
        store = ts.open(spec, open=True, read=True).result()
        pending[key] = store.read()
      except Exception as e:  # tensorstore raises ValueError/RuntimeError subclasses
        raise CheckpointError(f'cannot open array {name} at {array_dir}: {e}') from e
    else:
      out[key] = np.asarray(leaf)
  for key, future in pending.items():
    try:
      out[key] = np.asarray(future.result())
    except Exception as e:
      raise CheckpointError(f'cannot read array {prefix}/{key}: {e}') from e
  if dtype is not None:
    out = {k: (v.astype(dtype) if _is_float(v) and v.dtype != dtype else v) for k, v in out.items()}
  return flax.traverse_util.unflatten_dict({tuple(k.split('/')): v for k, v in out.items()})


def _is_float(x: np.ndarray) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)


def read_t5x_checkpoint(
  path: PathLike, *, dtype: Any | None = np.float32, include_state: bool = False, config: Any = None
) -> dict[str, Any]:
  """Reads a T5X checkpoint into numpy arrays.

  Args:
    path: checkpoint dir, its `checkpoint` file, or a model dir (latest step).
    dtype: cast floating-point parameters to this dtype (None keeps the stored dtype).
    include_state: also read `state` (step and optimizer `param_states`, stored dtypes).
    config: the model config the checkpoint must have been saved with (checked when it recorded
      one, see `verify_weights`).

  Returns:
    {'target': params, 'step': int, 'path': checkpoint dir} plus 'state' if requested.
  """
  checkpoint_dir = Path(os.path.abspath(find_checkpoint_dir(path)))  # tensorstore rejects ".."
  contents = _read_msgpack(checkpoint_dir)
  if read_metadata(checkpoint_dir) is not None:
    verify_weights(checkpoint_dir, config)
  optimizer = contents['optimizer']
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  result = {
    'target': _read_tree(optimizer['target'], checkpoint_dir, 'target', np_dtype),
    'path': checkpoint_dir,
  }
  state = optimizer.get('state', {})
  step = state.get('step') if isinstance(state, dict) else None
  match = _STEP_DIR.fullmatch(checkpoint_dir.name)
  result['step'] = (
    int(np.asarray(step))
    if step is not None and not _is_ts_spec(step)
    else (int(match.group(1)) if match else None)
  )
  if include_state:
    result['state'] = _read_tree(state, checkpoint_dir, 'state', None) if state else {}
  return result


def load_t5x_checkpoint(
  path: PathLike, *, dtype: Any | None = np.float32, config: Any = None
) -> Params:
  """The model parameters (T5X `target`) of a T5X checkpoint, as a nested dict of numpy arrays.

  Optimizer state is not read. Floating-point arrays are cast to `dtype` (e.g. bfloat16 -> float32);
  `dtype=None` keeps the stored dtypes.
  """
  return read_t5x_checkpoint(path, dtype=dtype, config=config)['target']


# ----------------------------------------------------------------------------------------------
# Validation.
# ----------------------------------------------------------------------------------------------
def _flat_shapes(tree_or_shapes: Any) -> dict[str, tuple[int, ...]]:
  if (
    isinstance(tree_or_shapes, Mapping)
    and tree_or_shapes
    and all(
      isinstance(k, str) and not isinstance(v, Mapping) and isinstance(v, (tuple, list))
      for k, v in tree_or_shapes.items()
    )
  ):
    return {k: tuple(int(d) for d in v) for k, v in tree_or_shapes.items()}
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(tree_or_shapes), sep='/')
  return {k: tuple(np.shape(v)) for k, v in flat.items()}


def validate_params(params: Params, expected_shapes: Any, *, name: str = 'params') -> None:
  """Raises `CheckpointError` naming every missing, unexpected or mis-shaped array.

  Args:
    params: a nested dict of arrays.
    expected_shapes: flat {'encoder/layers_0/attention/query/kernel': shape} (e.g.
      `T5.param_shapes()`) or a nested tree of arrays / `jax.ShapeDtypeStruct`s.
    name: what `params` is, for the message (e.g. the checkpoint path).
  """
  got = _flat_shapes(params)
  want = _flat_shapes(expected_shapes)
  missing = sorted(set(want) - set(got))
  unexpected = sorted(set(got) - set(want))
  mismatched = sorted(k for k in set(want) & set(got) if want[k] != got[k])
  if not (missing or unexpected or mismatched):
    return
  lines = [f'{name} do not match the model:']

  def listing(title, keys, fmt):
    if keys:
      shown = ', '.join(fmt(k) for k in keys[:10])
      more = f' ... and {len(keys) - 10} more' if len(keys) > 10 else ''
      lines.append(f'  {len(keys)} {title}: {shown}{more}')

  listing('missing', missing, lambda k: f'{k} {want[k]}')
  listing('unexpected', unexpected, lambda k: f'{k} {got[k]}')
  listing('shape mismatch', mismatched, lambda k: f'{k} has {got[k]}, model expects {want[k]}')
  raise CheckpointError('\n'.join(lines))


# ----------------------------------------------------------------------------------------------
# Writing.
# ----------------------------------------------------------------------------------------------
def _chunk_shape(shape: tuple[int, ...], itemsize: int) -> list[int]:
  """Largest chunk (by shrinking the biggest dims to divisors) within T5X's 64 MiB target."""
  target = max(1, _CHUNK_BYTES // itemsize)
  divisors = [[d for d in range(1, size + 1) if size % d == 0] or [1] for size in shape]
  while int(np.prod([d[-1] for d in divisors])) > target:
    biggest = max(range(len(shape)), key=lambda i: divisors[i][-1])
    divisors[biggest].pop()
  return [d[-1] for d in divisors]


def _to_numpy(x: Any, dtype: np.dtype | None) -> np.ndarray:
  arr = np.asarray(jax.device_get(x))
  if dtype is not None and _is_float(arr) and arr.dtype != dtype:
    arr = arr.astype(dtype)
  return arr


def _write_tree(
  tree: Any, checkpoint_dir: Path, prefix: str, dtype: np.dtype | None, min_tensorstore_size: int
) -> Any:
  """Writes large leaves as zarr arrays; returns the tree to serialize (specs or inline arrays)."""
  import tensorstore as ts  # deferred: only checkpoint I/O needs it

  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep='/', keep_empty_nodes=True)
  written = {}
  futures = []
  for key, leaf in flat.items():
    if isinstance(leaf, Mapping) or leaf is flax.traverse_util.empty_node:
      written[key] = {}
      continue
    arr = _to_numpy(leaf, dtype)
    if arr.ndim == 0 or arr.size < min_tensorstore_size:
      written[key] = arr
      continue
    relative = f'{prefix}/{key}'.replace('/', '.')
    spec = {
      'driver': 'zarr',
      'dtype': jnp.dtype(arr.dtype).name,
      'kvstore': {'driver': 'file', 'path': relative},
      'metadata': {
        'compressor': {'id': 'gzip', 'level': 1},
        'shape': list(arr.shape),
        'chunks': _chunk_shape(arr.shape, arr.dtype.itemsize),
      },
    }
    absolute = dict(spec, kvstore={'driver': 'file', 'path': str(checkpoint_dir / relative)})
    store = ts.open(absolute, create=True, open=True).result()
    futures.append(store.write(arr))
    written[key] = spec
  for future in futures:
    future.result()
  return flax.traverse_util.unflatten_dict({tuple(k.split('/')): v for k, v in written.items()})


def save_t5x_checkpoint(
  params: Params,
  directory: PathLike,
  step: int,
  *,
  dtype: Any | None = None,
  optimizer_state: Params | None = None,
  overwrite: bool = False,
  config: Any = None,
  extra_files: Mapping[str, bytes] | None = None,
) -> Path:
  """Writes `params` as a T5X checkpoint `<directory>/checkpoint_<step>/` and returns its path.

  Every parameter is a gzip zarr array (as T5X writes partitioned parameters); the msgpack holds
  `{'version': 3, 'optimizer': {'target': specs, 'state': {'step': step, 'param_states': ...}}}`.
  The checkpoint is built in a temporary sibling directory and renamed into place, so a crash never
  leaves a half-written `checkpoint_<step>`.

  Args:
    params: the model parameters (nested dict, no 'params' key).
    directory: the model directory.
    step: the training step (names the directory; stored as int32).
    dtype: cast floating-point parameters to this storage dtype (e.g. 'bfloat16'); None keeps them.
    optimizer_state: T5X `param_states` tree to store (e.g. Adafactor m/v/v_row/v_col); None
      writes an empty one (enough for T5X inference/eval restores, which read only the target).
    overwrite: replace an existing `checkpoint_<step>` (otherwise FileExistsError).
    config: the model config (a dataclass); if given, `speculative_metadata.json` records it with
      the directory's sha256, and loading verifies both (`verify_weights`).
    extra_files: {file name: bytes} written into the checkpoint before the rename (e.g. the
      optimizer state of `speculative.train`), so they are part of the same atomic step.
  """
  step = int(step)
  if step < 0:
    raise ValueError(f'step must be >= 0, got {step}')
  if not isinstance(params, Mapping) or not params:
    raise ValueError('params must be a non-empty nested dict of arrays')
  if 'params' in params and len(params) == 1:
    raise ValueError(
      "params has a single 'params' key; pass params['params'] (T5X's target tree "
      "has no 'params' level)"
    )
  directory = Path(os.path.abspath(directory))  # tensorstore rejects ".." in relative paths
  directory.mkdir(parents=True, exist_ok=True)
  final_dir = directory / f'checkpoint_{step}'
  if final_dir.exists() and not overwrite:
    raise FileExistsError(f'checkpoint already exists: {final_dir} (pass overwrite=True)')
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  tmp_dir = Path(
    tempfile.mkdtemp(prefix=f'checkpoint_{step}.tmp-{int(time.time())}-', dir=directory)
  )
  try:
    target = _write_tree(params, tmp_dir, 'target', np_dtype, min_tensorstore_size=1)
    param_states = {}
    if optimizer_state is not None:
      # T5X keeps tiny factored-away states (shape [1]) inline in the msgpack.
      param_states = _write_tree(
        optimizer_state, tmp_dir, 'state/param_states', None, min_tensorstore_size=2
      )
    contents = {
      'version': T5X_CHECKPOINT_VERSION,
      'optimizer': {
        'target': target,
        'state': {'step': np.asarray(step, np.int32), 'param_states': param_states},
      },
    }
    with open(tmp_dir / _CHECKPOINT_FILE, 'wb') as f:
      f.write(serialization.msgpack_serialize(contents))
      f.flush()
      os.fsync(f.fileno())
    for name, data in (extra_files or {}).items():
      if '/' in name or name in (_CHECKPOINT_FILE, _DIR_METADATA):
        raise ValueError(f'extra file name {name!r} is not allowed')
      write_atomic(tmp_dir / name, data)
    if config is not None:
      _write_metadata(tmp_dir, sha256_of(tmp_dir), config, {'step': step})
    if final_dir.exists():  # overwrite: move the old one aside first, drop it after the rename
      old_dir = Path(tempfile.mkdtemp(prefix=f'checkpoint_{step}.old-', dir=directory))
      os.rename(final_dir, old_dir / 'old')
      os.rename(tmp_dir, final_dir)
      shutil.rmtree(old_dir, ignore_errors=True)
    else:
      os.rename(tmp_dir, final_dir)
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  return final_dir


def remove_stale_temporaries(directory: PathLike) -> list[str]:
  """Deletes what a killed writer left in `directory`: `<name>.tmp-*` files/dirs of `write_atomic`
  and `save_t5x_checkpoint`, and `checkpoint_<step>.old-*` dirs of an interrupted overwrite.

  Only call it while no other process writes to `directory`. Returns the names removed.
  """
  directory = Path(directory)
  if not directory.is_dir():
    return []
  removed = []
  for child in sorted(directory.iterdir()):
    if '.tmp-' in child.name or re.fullmatch(r'checkpoint_\d+\.old-.*', child.name):
      if child.is_dir() and not child.is_symlink():
        shutil.rmtree(child, ignore_errors=True)
      else:
        child.unlink(missing_ok=True)
      removed.append(child.name)
  return removed


# ----------------------------------------------------------------------------------------------
# Compact single-file weights.
# ----------------------------------------------------------------------------------------------
def save_params(
  params: Params, path: PathLike, dtype: Any | None = 'bfloat16', config: Any = None
) -> Path:
  """Writes params as one flax-msgpack file, floats cast to `dtype` (None keeps them); atomic.

  The sidecar `<path>.json` records the file's sha256 and `config` (the model config dataclass,
  or None), which `load_params` verifies. A crash between the two writes leaves the file without a
  sidecar (it then loads with a warning), never with a stale one.
  """
  path = Path(path)
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  tree = jax.tree.map(lambda x: _to_numpy(x, np_dtype), flax.core.unfreeze(params))
  data = serialization.msgpack_serialize(tree)
  sidecar = metadata_path(path)
  if sidecar.exists():
    os.remove(sidecar)
  write_atomic(path, data)
  _write_metadata(path, hashlib.sha256(data).hexdigest(), config, {'dtype': str(dtype)})
  return path


def write_atomic(path: PathLike, data: bytes) -> None:
  """Writes `data` to `path` via a temp file + fsync + rename: never a half-written file."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=path.name + '.tmp-', dir=path.parent)
  try:
    with os.fdopen(fd, 'wb') as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    # mkstemp creates 0600; give the file the mode a plain open() would (0666 minus umask).
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def load_params(path: PathLike, dtype: Any | None = np.float32, config: Any = None) -> Params:
  """Reads params from a `save_params` file (or, if `path` is a directory, a T5X checkpoint).

  Floating-point arrays are cast to `dtype` (None keeps the stored dtype). The file is verified
  against its metadata (sha256, and `config` if given and recorded; `verify_weights`).
  """
  path = Path(path)
  if path.is_dir():
    return load_t5x_checkpoint(path, dtype=dtype, config=config)
  if not path.is_file():
    raise FileNotFoundError(f'params file does not exist: {path}')
  data = path.read_bytes()
  verify_weights(path, config, data=data)
  try:
    tree = serialization.msgpack_restore(data)
  except (
    msgpack.exceptions.UnpackException,
    msgpack.exceptions.ExtraData,
    ValueError,
    TypeError,
    KeyError,
  ) as e:
    raise CheckpointError(f'corrupt params file {path}: {type(e).__name__}: {e}') from e
  if not isinstance(tree, dict):
    raise CheckpointError(f'params file {path} does not hold a dict of arrays')
  if set(tree) == {'version', 'optimizer'}:
    raise CheckpointError(f'{path} is a T5X checkpoint msgpack; pass its directory instead')
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  return jax.tree.map(lambda x: _to_numpy(x, np_dtype), tree)
