"""One writer per output directory, and a manifest so that a re-run resumes only outputs made
with the same settings. Used by `speculative.infer` and `speculative.train`; no gin, no jax.

  OutputLock       fcntl.flock on `<dir>/.lock`: a second writer is refused with the holder's pid;
                   a killed holder's lock is released by the OS, so it never blocks
  check_manifest   compares the recorded manifest with the new one
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from typing import Any
from typing import Mapping
from typing import Sequence

LOCK_FILE = '.lock'
MANIFEST_FILE = 'manifest.json'
# What a killed writer can leave that is no output: an atomic write's temporary
# (`<name>.tmp-*`, checkpoints/files.write_atomic) and a writability probe (`checks`).
WRITE_PROBE = '.write-probe-'
TEMPORARY_MARKS = ('.tmp-', WRITE_PROBE)


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
    self.created = False  # this run created the lock file (it was not there before)

  def acquire(self) -> 'OutputLock':
    while True:
      existed = os.path.exists(self.path)
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
      if _same_file(fd, self.path):
        break
      # The holder removed the lock file (`release(remove=True)`) between our open and our
      # flock: this lock is on a file no other run sees. Take the one at the path instead.
      os.close(fd)
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    self._fd = fd
    self.created = not existed
    return self

  def release(self, remove: bool = False) -> None:
    """Unlocks; `remove`: also deletes the lock file (while still holding it), so that a run that
    failed before writing leaves its output directory as it found it."""
    if self._fd is not None:
      if remove and _same_file(self._fd, self.path):
        os.remove(self.path)
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None

  def __enter__(self) -> 'OutputLock':
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def _same_file(fd: int, path: str) -> bool:
  """The open file `fd` is the file at `path` (not one removed since it was opened)."""
  try:
    st = os.stat(path)
  except FileNotFoundError:
    return False
  own = os.fstat(fd)
  return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


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


def check_manifest(
  directory: str, manifest: Mapping[str, Any], overwrite_hint: str, ignore: Sequence[str] = ()
) -> bool:
  """Whether `directory` holds outputs made with `manifest` (True: resume them).

  False if there is no manifest and no outputs; ValueError naming every differing field with its
  old and new value if the recorded manifest differs, or if there are outputs without a manifest.
  """
  old = read_manifest(directory)
  if old is None:
    # A run killed while writing its first manifest leaves only temporaries: none is an output.
    leftovers = (
      [
        n
        for n in os.listdir(directory)
        if n != LOCK_FILE and not any(mark in n for mark in TEMPORARY_MARKS)
      ]
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
  diffs = manifest_differences({k: v for k, v in old.items() if k not in ignore}, manifest)
  if diffs:
    raise ValueError(
      f'{directory} holds outputs of different settings; refusing to mix them:\n  '
      + '\n  '.join(diffs)
      + f'\nUse a new output directory, or {overwrite_hint} (deletes the old outputs).'
    )
  return True
