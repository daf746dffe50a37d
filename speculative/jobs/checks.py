"""Checks of a job's knobs and paths, made in the first seconds, before any compute: each raises
an error that names the knob. No gin, no jax.

  check_int / check_float / check_choice    type and range of a knob, ValueError naming it
  check_readable / probe_writable            paths: readable inputs, a writable output directory
  user_errors                                marks the errors of a job's checks as the user's to fix
"""

from __future__ import annotations

import contextlib
import numbers
import os
from typing import Any
from typing import Sequence


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


@contextlib.contextmanager
def user_errors():
  """Marks a ValueError, OSError or RuntimeError raised inside as the user's to fix (a bad setting,
  path or input file, a refused resume, a locked output directory): the runners' command line
  (`gin_utils.run_gin_main`) prints its message alone and exits non-zero, without a traceback.
  The exception itself is re-raised unchanged, so Python callers catch it as before. Wrap a job's
  checks, which run before any compute, and nothing else."""
  try:
    yield
  except (ValueError, OSError, RuntimeError) as e:
    e.user_message = str(e)
    raise


def user_message(error: BaseException) -> str | None:
  """The message of an error raised inside `user_errors` (through gin's wrapping), else None."""
  return getattr(error, 'user_message', None)
