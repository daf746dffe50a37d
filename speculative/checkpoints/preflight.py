"""The check of a weights path made before any compute, by the settings of the jobs, training and
the benchmarks (infer, train, the benchmark's methods, paper_shape):
`check_weights` refuses, with one line naming the setting, the file and what is wrong, a path that
is not weights (missing, empty, neither a params file nor a T5X checkpoint directory), a T5X
checkpoint directory without its structure, weights that differ from their metadata (sha256,
model config) and, where no metadata records the config, weights whose arrays' shapes differ from
the config's model. A params file without a sidecar is walked as msgpack without building its
arrays, so a truncated or otherwise broken file is refused here too; what still fails to parse at
load is a `CheckpointError` naming the file (`LOAD_ERRORS` marks it as the user's to fix)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from speculative.checkpoints import params_files
from speculative.checkpoints import t5x_format
from speculative.checkpoints import weights_format

PathLike = str | os.PathLike

# The errors a weights load raises for a file that is not what it should be (a corrupt, truncated or
# mismatched file; a path gone since the check): the user's to fix, never a traceback.
LOAD_ERRORS = (weights_format.CheckpointError, OSError)


def check_weights(name: str, path: Any, config: Any = None) -> str:
  """Checks the weights `path` (the setting `name`, e.g. 'draft_checkpoint') before anything loads;
  returns their sha256. `config`: the model config they must have been saved with, where their
  metadata records one.

  FileNotFoundError / PermissionError '<name> does not exist: <path>' / '... is not readable';
  CheckpointError '<name>: <path> <what is wrong>' for an empty file, a file that is not msgpack
  weights or ends inside its data, a directory that is no T5X checkpoint (no `checkpoint` msgpack,
  a missing zarr array), weights whose sha256 or model config differ from their metadata and,
  where no metadata records a config, weights (a T5's) whose arrays' shapes differ from `config`'s
  model: '<name>: <path> does not match the model config: <the first array that differs>'.
  """
  if not isinstance(path, (str, os.PathLike)) or not str(path):
    raise ValueError(f'{name} must be a path, got {path!r}')
  path = Path(path)
  if not path.exists():
    raise FileNotFoundError(f'{name} does not exist: {path}')
  if not os.access(path, os.R_OK) or (path.is_dir() and not os.access(path, os.X_OK)):
    raise PermissionError(f'{name} is not readable: {path}')
  try:
    if path.is_dir() or path.name == t5x_format.CHECKPOINT_FILE:
      return _check_t5x_checkpoint(path, config)
    if not path.is_file():
      raise weights_format.CheckpointError(f'{path} is neither a file nor a directory')
    return _check_params_file(path, config)
  except (weights_format.CheckpointError, FileNotFoundError) as e:  # each names the file
    raise weights_format.CheckpointError(f'{name}: {e}') from None


def _check_params_file(path: Path, config: Any) -> str:
  size = path.stat().st_size
  if size == 0:
    raise weights_format.CheckpointError(f'{path} is empty (0 bytes), not a weights file')
  metadata = weights_format.read_metadata(path)
  if metadata is None:  # nothing to verify it against: walk its msgpack
    check_msgpack_structure(path, size)  # first: a file refused here gets no 'no metadata' warning
  digest = weights_format.verify_weights(path, config)
  if (metadata or {}).get('config') is None:
    _check_shapes(path, lambda: msgpack_shapes(path), config)
  return digest


def check_msgpack_structure(path: Path, size: int | None = None) -> None:
  """Walks the msgpack of a params file without building its arrays: CheckpointError if it is not
  one map (flax's dict of arrays), ends inside its data (truncated) or has bytes after it."""
  size = path.stat().st_size if size is None else size
  with open(path, 'rb') as f:
    first = f.read(1)
    # A msgpack map: fixmap (0x80-0x8f), map 16 (0xde) or map 32 (0xdf).
    if not first or not (0x80 <= first[0] <= 0x8F or first[0] in (0xDE, 0xDF)):
      raise weights_format.CheckpointError(
        f'{path} is not a weights file: it does not start with a msgpack map (a dict of arrays)'
      )
    f.seek(0)
    unpacker = msgpack.Unpacker(f, max_buffer_size=0)
    try:
      unpacker.skip()
    except msgpack.OutOfData:
      raise weights_format.CheckpointError(
        f'{path} is truncated: its msgpack data ends early ({size} bytes)'
      ) from None
    except (msgpack.exceptions.UnpackException, ValueError) as e:
      raise weights_format.CheckpointError(f'{path} is not valid msgpack: {e}') from None
    end = unpacker.tell()
  if end != size:
    raise weights_format.CheckpointError(
      f'{path} has {size - end} bytes after its msgpack data (not one weights file)'
    )


def _check_t5x_checkpoint(path: Path, config: Any) -> str:
  checkpoint_dir = t5x_format.find_checkpoint_dir(path)
  msgpack_file = checkpoint_dir / t5x_format.CHECKPOINT_FILE
  if msgpack_file.stat().st_size == 0:
    raise weights_format.CheckpointError(f'{msgpack_file} is empty (0 bytes)')
  metadata = weights_format.read_metadata(checkpoint_dir)
  if metadata is not None:  # the sha256 covers every file
    digest = weights_format.verify_weights(checkpoint_dir, config)
    if metadata.get('config') is not None:  # compared with `config`: the shapes follow from it
      return digest
    _check_shapes(checkpoint_dir, lambda: t5x_format.check_structure(checkpoint_dir), config)
    return digest
  shapes = t5x_format.check_structure(checkpoint_dir)
  _check_shapes(checkpoint_dir, lambda: shapes, config)
  return weights_format.sha256_of(checkpoint_dir)


def _check_shapes(path: Path, shapes: Any, config: Any) -> None:
  """CheckpointError naming `path` and the first array whose shape differs from the model of
  `config` (a T5Config; any other config is not checked), where `shapes()` (the weights' flat
  {name: shape}, read without building an array) differs from it."""
  expected = _model_shapes(config)
  if expected is None:
    return
  difference = params_files.shape_difference(shapes(), expected)
  if difference is not None:
    raise weights_format.CheckpointError(f'{path} does not match the model config: {difference}')


def _model_shapes(config: Any) -> dict[str, tuple[int, ...]] | None:
  """The flat {name: shape} of a T5Config's model (traced once per config); None for any other."""
  from speculative.models import t5 as t5_lib  # pylint: disable=g-import-not-at-top

  if not isinstance(config, t5_lib.T5Config):
    return None
  return t5_lib.config_param_shapes(config)


class _ArrayShape(tuple):
  """An array leaf of a params file, as `msgpack_shapes` reads it: its shape alone."""


def _ext_shape(code: int, data: bytes) -> Any:
  # flax's msgpack arrays (ext type 1, numpy scalars 3) are the msgpack of (shape, dtype name,
  # bytes): the shape is read, the array's bytes are not.
  if code in (1, 3):
    unpacker = msgpack.Unpacker(io.BytesIO(data), raw=True)
    unpacker.read_array_header()
    return _ArrayShape(int(d) for d in unpacker.unpack())
  return msgpack.ExtType(code, data)


def msgpack_shapes(path: Path) -> dict[str, tuple[int, ...]]:
  """The flat {name: shape} of a params file's arrays ('encoder/.../kernel'), read from its msgpack
  without building an array (flax's chunked arrays, over 1 GiB, by their recorded shape)."""
  with open(path, 'rb') as f:
    unpacker = msgpack.Unpacker(
      f, ext_hook=_ext_shape, raw=False, strict_map_key=False, max_buffer_size=0
    )
    try:
      tree = unpacker.unpack()
    except (msgpack.exceptions.UnpackException, ValueError, TypeError) as e:
      raise weights_format.CheckpointError(f'{path} is not valid msgpack: {e}') from None
  if isinstance(tree, dict) and set(tree) == {'version', 'optimizer'}:
    raise weights_format.CheckpointError(
      f'{path} is a T5X checkpoint msgpack; pass its directory instead'
    )
  shapes = {}

  def walk(node: Any, prefix: str) -> None:
    if isinstance(node, dict) and '__msgpack_chunked_array__' in node:
      shape = node.get('shape', {})
      shapes[prefix] = tuple(int(shape[str(i)]) for i in range(len(shape)))
    elif isinstance(node, dict):
      for key, value in node.items():
        walk(value, f'{prefix}/{key}' if prefix else str(key))
    else:
      shapes[prefix] = tuple(node) if isinstance(node, _ArrayShape) else tuple(np.shape(node))

  walk(tree, '')
  return shapes
