"""What weights on disk share, T5X checkpoint directories and our params files alike: the content
hash and the metadata sidecar (model config + sha256) that is verified before weights load, msgpack
decoding that names a corrupt file, and the host arrays written in a storage dtype.

A params file `w.msgpack` carries its metadata in the sidecar `w.msgpack.json`; a checkpoint
directory in `speculative_metadata.json` inside it. Corrupt or mismatched weights are refused
instead of loaded; files written before metadata existed still load, with a warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from flax import serialization
import jax
import jax.numpy as jnp
import msgpack
import numpy as np

from speculative.checkpoints import files as checkpoints_files

PathLike = str | os.PathLike


class CheckpointError(ValueError):
  """A checkpoint is missing, corrupt, or does not match the model."""


METADATA_FORMAT = 'speculative-weights/1'
DIR_METADATA = 'speculative_metadata.json'
# A legacy file (no metadata) with a run of this many zero bytes is refused as corrupt: trained
# float weights essentially never hold thousands of consecutive exact zero bytes.
ZERO_RUN_BYTES = 4096


def sha256_of(path: PathLike, *, exclude: tuple[str, ...] = (DIR_METADATA,)) -> str:
  """sha256 of a file's bytes, or of a directory's files (relative names and contents, sorted).

  A directory's symlinks are followed, to files and to directories alike: what a link points to is
  hashed under the link's name, as a load reads it through the link. So the fingerprint changes
  whenever the bytes a load reads change, wherever a link puts them, and a T5X checkpoint whose
  array folders link elsewhere has the fingerprint of the same checkpoint with the folders copied
  in. (The arrays a T5X checkpoint's msgpack names are inside its directory: one whose path leads
  outside it is refused, `t5x_format.check_structure`.) A link that loops back to a directory above
  it is a CheckpointError, a dangling link a FileNotFoundError, an unreadable folder an OSError,
  each naming the path: nothing is left out of the hash unsaid.

  `exclude`: file names (in any subdirectory) left out of a directory's hash.
  """
  path = Path(path)
  digest = hashlib.sha256()
  if path.is_file():
    return _file_sha256(path)
  if not path.is_dir():
    raise FileNotFoundError(f'cannot hash {path}: it does not exist')
  above = {str(path): frozenset()}  # the real paths of each folder's ancestors (for link loops)

  def unreadable(error: OSError) -> None:
    raise error

  for root, dirs, files in os.walk(path, onerror=unreadable, followlinks=True):
    dirs.sort()
    seen = above.pop(root) | {os.path.realpath(root)}
    for name in dirs:
      child = os.path.join(root, name)
      if os.path.realpath(child) in seen:
        raise CheckpointError(
          f'cannot hash {path}: the link {child} loops back to {os.path.realpath(child)}'
        )
      above[child] = seen
    for name in sorted(files):
      if name in exclude:
        continue
      file = Path(root) / name
      relative = file.relative_to(path).as_posix()
      digest.update(relative.encode() + b'\0')
      digest.update(sha256_of(file).encode())
  return digest.hexdigest()


# {(device, inode, size, mtime_ns): sha256} of the files hashed in this process: a job's check of
# its weights and its manifest hash the same file once (a params file's load verifies the bytes it
# read, hashing them again).
_FILE_DIGESTS: dict[tuple[int, int, int, int], str] = {}


def _file_sha256(path: Path) -> str:
  stat = path.stat()
  key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
  if key not in _FILE_DIGESTS:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
      for block in iter(lambda: f.read(1 << 20), b''):
        digest.update(block)
    _FILE_DIGESTS[key] = digest.hexdigest()
  return _FILE_DIGESTS[key]


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
  return path / DIR_METADATA if path.is_dir() else path.with_name(path.name + '.json')


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


def write_metadata(path: Path, sha256: str, config: Any, extra: dict | None) -> None:
  metadata = {
    'format': METADATA_FORMAT,
    'sha256': sha256,
    'config': config_dict(config),
    **(extra or {}),
  }
  checkpoints_files.write_atomic(
    metadata_path(path), (json.dumps(metadata, indent=2) + '\n').encode()
  )


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
    _check_legacy_weights(path, data)
    return digest
  if metadata.get('sha256') != digest:
    raise CheckpointError(
      f'{path} is corrupt or was changed after it was saved: its sha256 is '
      f'{digest}, its metadata {metadata_path(path)} records '
      f"{metadata.get('sha256')}"
    )
  check_config(path, config, metadata)
  return digest


_UNVERIFIED: set[str] = set()  # the weights without metadata this process has said so of


def _check_legacy_weights(path: Path, data: bytes | None) -> None:
  """Weights without metadata load with a warning (once per file and process: a job checks its
  weights with its settings, for its manifest and at the load), unless a params file holds a long
  zero run."""
  if os.path.realpath(path) not in _UNVERIFIED:
    _UNVERIFIED.add(os.path.realpath(path))
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
    at = data.find(b'\0' * ZERO_RUN_BYTES)
    if at >= 0:
      raise CheckpointError(
        f'{path} looks corrupt: {ZERO_RUN_BYTES}+ zero bytes at offset {at} '
        '(and it has no metadata to verify it against)'
      )


def restore_msgpack(data: bytes, what: str) -> Any:
  """flax msgpack `data` restored; CheckpointError('corrupt <what>: ...') if it does not decode."""
  try:
    return serialization.msgpack_restore(data)
  except (
    msgpack.exceptions.UnpackException,
    msgpack.exceptions.ExtraData,
    ValueError,
    TypeError,
    KeyError,
  ) as e:
    raise CheckpointError(f'corrupt {what}: {type(e).__name__}: {e}') from e


def is_float(x: np.ndarray) -> bool:
  return jnp.issubdtype(x.dtype, jnp.floating)


def host_array(x: Any, dtype: np.dtype | None) -> np.ndarray:
  arr = np.asarray(jax.device_get(x))
  if dtype is not None and is_float(arr) and arr.dtype != dtype:
    arr = arr.astype(dtype)
  return arr
