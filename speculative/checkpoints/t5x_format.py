"""T5X checkpoints read and written without t5x (`t5x.checkpoints.Checkpointer`, format version 3):

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
atomically (temp dir + rename) so that stock T5X restores it.
"""

from __future__ import annotations

import json
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
import jax.numpy as jnp
import numpy as np

from speculative.checkpoints import files
from speculative.checkpoints import weights_format

Params = Any
PathLike = str | os.PathLike

T5X_CHECKPOINT_VERSION = 3
CHECKPOINT_FILE = 'checkpoint'  # the msgpack file of a checkpoint directory
_STEP_DIR = re.compile(r'checkpoint_(\d+)')
# T5X aims for 64 MiB zarr chunks.
_CHUNK_BYTES = 64 * 1024 * 1024


# ----------------------------------------------------------------------------------------------
# Locating checkpoints.
# ----------------------------------------------------------------------------------------------
def checkpoint_steps(model_dir: PathLike) -> list[int]:
  """Steps of the complete `checkpoint_<step>` directories in `model_dir`, ascending."""
  model_dir = Path(model_dir)
  steps = []
  for child in model_dir.iterdir():
    match = _STEP_DIR.fullmatch(child.name)
    if match and (child / CHECKPOINT_FILE).is_file():
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
    if path.name != CHECKPOINT_FILE:
      raise weights_format.CheckpointError(
        f'not a T5X checkpoint file (expected a file named '
        f'{CHECKPOINT_FILE!r} or a checkpoint directory): {path}'
      )
    return path.parent
  if (path / CHECKPOINT_FILE).is_file():
    return path
  if _STEP_DIR.fullmatch(path.name):
    hint = ''
    if (path / 'state').is_dir() or (path / '_CHECKPOINT_METADATA').exists():
      hint = ' (this looks like an Orbax checkpoint, which is not supported)'
    raise FileNotFoundError(
      f'T5X checkpoint directory {path} has no {CHECKPOINT_FILE!r} msgpack '
      f'file{hint}; it may be incomplete'
    )
  steps = checkpoint_steps(path)
  if not steps:
    raise FileNotFoundError(
      f'no T5X checkpoint in {path}: neither a {CHECKPOINT_FILE!r} file nor '
      'complete checkpoint_<step> subdirectories'
    )
  return path / f'checkpoint_{steps[-1]}'


# ----------------------------------------------------------------------------------------------
# Reading.
# ----------------------------------------------------------------------------------------------
def _is_ts_spec(value: Any) -> bool:
  return isinstance(value, Mapping) and 'driver' in value and 'kvstore' in value


def _read_msgpack(checkpoint_dir: Path) -> dict:
  file = checkpoint_dir / CHECKPOINT_FILE
  data = file.read_bytes()
  contents = weights_format.restore_msgpack(data, f'T5X checkpoint msgpack {file}')
  if not isinstance(contents, dict) or 'optimizer' not in contents:
    keys = sorted(contents) if isinstance(contents, dict) else type(contents).__name__
    raise weights_format.CheckpointError(
      f'{file} is not a T5X checkpoint: expected top-level keys '
      f"'version' and 'optimizer', got {keys}"
    )
  version = contents.get('version', 0)
  if int(np.asarray(version)) < 3:
    raise weights_format.CheckpointError(
      f'{file}: T5X checkpoint version {version} is not supported (need 3; '
      'version 2 stored bfloat16 as uint16)'
    )
  optimizer = contents['optimizer']
  if not isinstance(optimizer, dict) or 'target' not in optimizer:
    raise weights_format.CheckpointError(
      f"{file}: 'optimizer' has no 'target' (the model parameters)"
    )
  return contents


def _absolute_spec(spec: Mapping[str, Any], checkpoint_dir: Path, name: str) -> tuple[dict, Path]:
  """A tensorstore spec with the kvstore path made absolute (file driver), and that path, which
  must lie inside the (absolute) `checkpoint_dir`: T5X writes every array there, relative to it,
  and the checkpoint's fingerprint (`weights_format.sha256_of`, which follows links inside the
  directory) covers only what is there, so a path leading outside ('..', or absolute) is refused."""
  spec = dict(spec)
  kvstore = dict(spec['kvstore']) if isinstance(spec['kvstore'], Mapping) else {}
  # T5X writes GCS specs with the path at the top level; read them from the local directory.
  relative = kvstore.get('path', spec.pop('path', None))
  if relative is None:
    raise weights_format.CheckpointError(f'tensorstore spec for {name} has no path: {spec}')
  array_dir = Path(os.path.normpath(checkpoint_dir / str(relative)))
  if array_dir == checkpoint_dir or checkpoint_dir not in array_dir.parents:
    raise weights_format.CheckpointError(
      f'array {name} of {checkpoint_dir} has its path {str(relative)!r} outside the checkpoint '
      'directory (T5X writes every array inside it, and its sha256 covers only that); move the '
      "array's folder in, or link it in from inside"
    )
  spec['kvstore'] = {'driver': 'file', 'path': str(array_dir)}
  return spec, array_dir


def _checked_spec(leaf: Mapping[str, Any], checkpoint_dir: Path, name: str) -> tuple[dict, Path]:
  """`_absolute_spec` of a leaf whose zarr array is on disk; CheckpointError naming it if not."""
  spec, array_dir = _absolute_spec(leaf, checkpoint_dir, name)
  if not (array_dir / '.zarray').is_file():
    raise weights_format.CheckpointError(
      f'missing array {name}: zarr directory {array_dir} does not exist '
      'or has no .zarray (incomplete or corrupt checkpoint)'
    )
  return spec, array_dir


def check_structure(checkpoint_dir: PathLike) -> dict[str, tuple[int, ...]]:
  """The structure of a checkpoint directory, checked without reading an array: its msgpack
  parses as a T5X checkpoint of a supported version, and every tensorstore array of its target has
  its zarr directory. CheckpointError naming the file or array otherwise. Returns the target's
  flat {name: shape} (a zarr array's from its .zarray header)."""
  checkpoint_dir = Path(os.path.abspath(checkpoint_dir))
  target = _read_msgpack(checkpoint_dir)['optimizer']['target']
  flat = flax.traverse_util.flatten_dict(target, is_leaf=lambda _, v: _is_ts_spec(v), sep='/')
  shapes = {}
  for key, leaf in flat.items():
    if not _is_ts_spec(leaf):
      shapes[key] = tuple(np.shape(leaf))
      continue
    _, array_dir = _checked_spec(leaf, checkpoint_dir, f'target/{key}')
    header = array_dir / '.zarray'
    try:
      shapes[key] = tuple(int(d) for d in json.loads(header.read_text(encoding='utf-8'))['shape'])
    except (ValueError, UnicodeDecodeError, KeyError, TypeError) as e:
      raise weights_format.CheckpointError(f'{header} is not a zarr array header: {e}') from None
  return shapes


def _read_tree(tree: Any, checkpoint_dir: Path, prefix: str, dtype: np.dtype | None) -> Any:
  """Replaces every leaf of `tree` (inline array or tensorstore spec) by a numpy array."""
  import tensorstore as ts  # deferred: only checkpoint I/O needs it

  flat = flax.traverse_util.flatten_dict(tree, is_leaf=lambda _, v: _is_ts_spec(v), sep='/')
  pending = {}
  out = {}
  for key, leaf in flat.items():
    name = f'{prefix}/{key}'
    if _is_ts_spec(leaf):
      spec, array_dir = _checked_spec(leaf, checkpoint_dir, name)
      try:
        store = ts.open(spec, open=True, read=True).result()
        pending[key] = store.read()
      except Exception as e:  # tensorstore raises ValueError/RuntimeError subclasses
        raise weights_format.CheckpointError(f'cannot open array {name} at {array_dir}: {e}') from e
    else:
      out[key] = np.asarray(leaf)
  for key, future in pending.items():
    try:
      out[key] = np.asarray(future.result())
    except Exception as e:
      raise weights_format.CheckpointError(f'cannot read array {prefix}/{key}: {e}') from e
  if dtype is not None:
    out = {
      k: (v.astype(dtype) if weights_format.is_float(v) and v.dtype != dtype else v)
      for k, v in out.items()
    }
  return flax.traverse_util.unflatten_dict({tuple(k.split('/')): v for k, v in out.items()})


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
  if weights_format.read_metadata(checkpoint_dir) is not None:
    weights_format.verify_weights(checkpoint_dir, config)
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
    arr = weights_format.host_array(leaf, dtype)
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
  _check_target_tree(params, step)
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
    _write_checkpoint_msgpack(params, optimizer_state, tmp_dir, step, np_dtype)
    for name, data in (extra_files or {}).items():
      if '/' in name or name in (CHECKPOINT_FILE, weights_format.DIR_METADATA):
        raise ValueError(f'extra file name {name!r} is not allowed')
      files.write_atomic(tmp_dir / name, data)
    if config is not None:
      weights_format.write_metadata(
        tmp_dir, weights_format.sha256_of(tmp_dir), config, {'step': step}
      )
    _move_into_place(tmp_dir, final_dir, step)
  except BaseException:
    shutil.rmtree(tmp_dir, ignore_errors=True)
    raise
  return final_dir


def _check_target_tree(params: Params, step: int) -> None:
  if step < 0:
    raise ValueError(f'step must be >= 0, got {step}')
  if not isinstance(params, Mapping) or not params:
    raise ValueError('params must be a non-empty nested dict of arrays')
  if 'params' in params and len(params) == 1:
    raise ValueError(
      "params has a single 'params' key; pass params['params'] (T5X's target tree "
      "has no 'params' level)"
    )


def _write_checkpoint_msgpack(
  params: Params, optimizer_state: Params | None, tmp_dir: Path, step: int, dtype: Any
) -> None:
  """The zarr arrays and the `checkpoint` msgpack that points at them, fsynced."""
  target = _write_tree(params, tmp_dir, 'target', dtype, min_tensorstore_size=1)
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
  with open(tmp_dir / CHECKPOINT_FILE, 'wb') as f:
    f.write(serialization.msgpack_serialize(contents))
    f.flush()
    os.fsync(f.fileno())


def _move_into_place(tmp_dir: Path, final_dir: Path, step: int) -> None:
  """Renames the finished `tmp_dir` to `final_dir`; an old `final_dir` is moved aside first and
  dropped after the rename (overwrite)."""
  if final_dir.exists():
    old_dir = Path(tempfile.mkdtemp(prefix=f'checkpoint_{step}.old-', dir=final_dir.parent))
    os.rename(final_dir, old_dir / 'old')
    os.rename(tmp_dir, final_dir)
    shutil.rmtree(old_dir, ignore_errors=True)
  else:
    os.rename(tmp_dir, final_dir)
