"""The check of a weights path made before any compute, by the settings of the jobs, training and
the benchmarks (infer, train, the benchmark's methods, paper_shape):
`check_weights` refuses, with one line naming the setting, the file and what is wrong, a path that
is not weights (missing, empty, neither a params file nor a T5X checkpoint directory), a T5X
checkpoint directory without its structure, and weights that differ from their metadata (sha256,
model config). A params file without a sidecar is walked as msgpack without building its arrays, so
a truncated or otherwise broken file is refused here too; what still fails to parse at load is a
`CheckpointError` naming the file (`LOAD_ERRORS` marks it as the user's to fix)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgpack

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
  a missing zarr array), and weights whose sha256 or model config differ from their metadata.
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
  if weights_format.read_metadata(path) is None:  # nothing to verify it against: walk its msgpack
    check_msgpack_structure(path, size)  # first: a file refused here gets no 'no metadata' warning
  return weights_format.verify_weights(path, config)


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
  if weights_format.read_metadata(checkpoint_dir) is not None:  # the sha256 covers every file
    return weights_format.verify_weights(checkpoint_dir, config)
  t5x_format.check_structure(checkpoint_dir)
  return weights_format.sha256_of(checkpoint_dir)
