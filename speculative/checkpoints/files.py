"""Files that are never seen half-written: atomic writes (temp file + fsync + rename), and the
clean-up of what a killed writer leaves behind."""

from __future__ import annotations

import os
from pathlib import Path
import re
import shutil
import tempfile

PathLike = str | os.PathLike


def write_atomic(path: PathLike, data: bytes | str) -> None:
  """Writes `data` (text as UTF-8) to `path` via a temp file + fsync + rename: readers never see a
  half-written file."""
  if isinstance(data, str):
    data = data.encode('utf-8')
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
