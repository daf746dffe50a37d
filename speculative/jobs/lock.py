"""Safety of batch jobs that write to an output directory: checks before any compute, one writer
per directory, and a manifest so that a re-run resumes only outputs made with the same settings.

Used by `speculative.infer` (and usable by any runner); no gin, no jax.

  check_int / check_float / check_choice    type and range of a knob, ValueError naming it
  check_readable / probe_writable            paths, checked in the first seconds
  OutputLock                                 fcntl.flock on `<dir>/.lock`: a second writer is
                                             refused with the holder's pid; a killed holder's lock
                                             is released by the OS, so it never blocks
  check_manifest                             compares the recorded manifest with the new one
"""

from __future__ import annotations

import errno
import fcntl
import json
import numbers
import os
from typing import Any
from typing import Mapping
from typing import Sequence

LOCK_FILE = '.lock'
MANIFEST_FILE = 'manifest.json'


# ----------------------------------------------------------------------------------------------
# Knobs.
# ----------------------------------------------------------------------------------------------
def check_int(
  name: str, value: Any, low: int | None = None, high: int | None = None, allow_none: bool = False
) -> int | None:
  """`value` as an int in [low, high]; ValueError naming `name` otherwise (bools and 2.5 refused)."""
  if value is None and allow_none:
    return None
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError(
      f'{name} must be an integer, got {value!r} ({type(value).__name__})'
      + (' or None' if allow_none else '')
    )
  _check_range(name, value, low, high, True, True)
  return int(value)


def check_float(
  name: str,
  value: Any,
  low: float | None = None,
  high: float | None = None,
  low_inclusive: bool = True,
  high_inclusive: bool = True,
) -> float:
  """`value` as a float in the range; ValueError naming `name` otherwise."""
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or value != value:
    raise ValueError(f'{name} must be a number, got {value!r} ({type(value).__name__})')
  _check_range(name, value, low, high, low_inclusive, high_inclusive)
  return float(value)


def _check_range(name, value, low, high, low_inclusive, high_inclusive) -> None:
  too_low = low is not None and (value < low if low_inclusive else value <= low)
  too_high = high is not None and (value > high if high_inclusive else value >= high)
  if too_low or too_high:
    left = '-inf' if low is None else f'{low}'
    right = 'inf' if high is None else f'{high}'
    interval = (
      ('[' if low_inclusive else '(') + f'{left}, {right}' + (']' if high_inclusive else ')')
    )
    raise ValueError(f'{name} must be in {interval}, got {value!r}')


def check_choice(name: str, value: Any, choices: Sequence[Any]) -> Any:
  if value not in choices:
    raise ValueError(f'unknown {name} {value!r}; expected one of {tuple(choices)}')
  return value


# ----------------------------------------------------------------------------------------------
# Paths.
# ----------------------------------------------------------------------------------------------
def check_readable(name: str, path: Any) -> str:
  """`path` (a file or directory) exists and is readable; FileNotFoundError/PermissionError
  naming `name` and the path otherwise."""
  if not isinstance(path, (str, os.PathLike)) or not str(path):
    raise ValueError(f'{name} must be a path, got {path!r}')
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{name} does not exist: {path}')
  if not os.access(path, os.R_OK) or (os.path.isdir(path) and not os.access(path, os.X_OK)):
    raise PermissionError(f'{name} is not readable: {path}')
  return path


def probe_writable(directory: str) -> None:
  """Creates `directory` if needed and writes+deletes a probe file in it, so that an unwritable
  output directory fails now rather than after the compute."""
  try:
    os.makedirs(directory, exist_ok=True)
    probe = os.path.join(directory, f'.write-probe-{os.getpid()}')
    with open(probe, 'w') as f:
      f.write('probe')
    os.remove(probe)
  except OSError as e:
    raise PermissionError(f'output directory {directory} is not writable: {e.strerror or e}') from e


# ----------------------------------------------------------------------------------------------
# One writer per output directory.
# ----------------------------------------------------------------------------------------------
class OutputLock:
  """An exclusive `fcntl.flock` on `<directory>/.lock` (holding the writer's pid).

  Use as a context manager. A second process is refused at once with a `RuntimeError` naming the
  holder's pid. The OS releases the lock when its holder exits or is killed, so a stale lock file
  never blocks a later run.
  """

  def __init__(self, directory: str):
    self.path = os.path.join(directory, LOCK_FILE)
    self._fd: int | None = None

  def acquire(self) -> 'OutputLock':
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      holder = os.pread(fd, 64, 0).decode(errors='replace').strip() or 'unknown'
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        raise RuntimeError(
          f'{os.path.dirname(self.path)} is in use by another run (pid {holder}, '
          f'lock {self.path}); wait for it or use another output directory'
        ) from None
      raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    self._fd = fd
    return self

  def release(self) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> 'OutputLock':
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


# ----------------------------------------------------------------------------------------------
# Manifest: everything that determines the outputs.
# ----------------------------------------------------------------------------------------------
def read_manifest(directory: str) -> dict | None:
  path = os.path.join(directory, MANIFEST_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path, encoding='utf-8') as f:
      return json.load(f)
  except ValueError as e:
    raise ValueError(f'{path} is corrupt ({e}); use a new output directory or overwrite') from e


def manifest_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
  """'field: was X, now Y' for every top-level field that differs (JSON-normalized)."""
  old = json.loads(json.dumps(old))
  new = json.loads(json.dumps(new))
  missing = object()
  return [
    f'{key}: was {json.dumps(old.get(key, None))}, now {json.dumps(new.get(key, None))}'
    for key in sorted(set(old) | set(new))
    if old.get(key, missing) != new.get(key, missing)
  ]


def check_manifest(directory: str, manifest: Mapping[str, Any], overwrite_hint: str) -> bool:
  """Whether `directory` holds outputs made with `manifest` (True: resume them).

  False if there is no manifest and no outputs; ValueError naming every differing field with its
  old and new value if the recorded manifest differs, or if there are outputs without a manifest.
  """
  old = read_manifest(directory)
  if old is None:
    leftovers = (
      [n for n in os.listdir(directory) if n not in (LOCK_FILE,)]
      if os.path.isdir(directory)
      else []
    )
    if leftovers:
      raise ValueError(
        f'{directory} holds outputs ({", ".join(sorted(leftovers)[:5])}) without a '
        f'{MANIFEST_FILE}, so they cannot be matched to these settings; use a new '
        f'output directory or {overwrite_hint}'
      )
    return False
  diffs = manifest_differences(old, manifest)
  if diffs:
    raise ValueError(
      f'{directory} holds outputs of different settings; refusing to mix them:\n  '
      + '\n  '.join(diffs)
      + f'\nUse a new output directory, or {overwrite_hint} (deletes the old outputs).'
    )
  return True
