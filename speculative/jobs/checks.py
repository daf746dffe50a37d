"""Checks of a job's knobs and paths, made in the first seconds, before any compute: each raises
an error that names the knob. No gin, no jax.

  check_int / check_float / check_choice    type and range of a knob, ValueError naming it
  check_readable / probe_writable            paths: readable inputs, a writable output directory
  remove_created                             the output directory a failed job created, removed
  resolve_input_path                         a relative input path missing here, found under the repo
  resolve_input_fields                       resolve_input_path on a settings object's input fields
  check_not_tracked                          an output path that is no file git tracks here
  user_errors                                marks the errors of a job's checks as the user's to fix
  settings_entry                             a runner whose keyword arguments are its settings' fields
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import numbers
import os
from pathlib import Path
import subprocess
from typing import Any
from typing import Callable
from typing import Sequence

from speculative.jobs import lock

# The checkout this package runs from (configs/, models/ and data/ are looked up from it).
REPO_ROOT = Path(__file__).resolve().parents[2]


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
def check_readable(name: str, path: Any, file: bool = False) -> str:
  """`path` (a file or directory; only a file if `file`) exists and is readable;
  FileNotFoundError/IsADirectoryError/PermissionError naming `name` and the path otherwise."""
  if not isinstance(path, (str, os.PathLike)) or not str(path):
    raise ValueError(f'{name} must be a path, got {path!r}')
  path = os.fspath(path)
  if not os.path.exists(path):
    raise FileNotFoundError(f'{name} does not exist: {path}')
  if file and os.path.isdir(path):
    raise IsADirectoryError(f'{name} is a directory, not a file: {path}')
  if not os.access(path, os.R_OK) or (os.path.isdir(path) and not os.access(path, os.X_OK)):
    raise PermissionError(f'{name} is not readable: {path}')
  return path


def resolve_input_path(path: Any, repo_root: str | os.PathLike = REPO_ROOT) -> Any:
  """`path` under `repo_root` if it is relative, does not exist relative to the working directory
  and does exist under the repository root; `path` unchanged otherwise (absolute, existing here,
  missing in both, or not a path). The shipped run files name repository paths
  (`models/embedded/target.msgpack`), so a job started from another directory still finds them,
  while a user's own relative path that exists here keeps meaning the one here."""
  if not isinstance(path, (str, os.PathLike)) or not str(path):
    return path
  path = os.fspath(path)
  if os.path.isabs(path) or os.path.exists(path):
    return path
  candidate = os.path.join(os.fspath(repo_root), path)
  return candidate if os.path.exists(candidate) else path


def resolve_input_fields(settings: Any, names: Sequence[str]) -> None:
  """Replaces each named field of the (frozen) dataclass `settings` by its `resolve_input_path`
  (each element, for a list or tuple of paths): the jobs' one rule for their input paths (infer,
  train, the benchmark), applied in their settings before any check reads a path."""
  for name in names:
    value = getattr(settings, name)
    if isinstance(value, (list, tuple)):
      value = type(value)(resolve_input_path(item) for item in value)
    else:
      value = resolve_input_path(value)
    object.__setattr__(settings, name, value)


def probe_writable(directory: str) -> str | None:
  """Creates `directory` if needed and writes+deletes a probe file in it, so that an unwritable
  output directory fails now rather than after the compute. Returns the outermost directory it
  created (None: `directory` existed), which a job that fails before writing removes
  (`remove_created`). A path that is, or lies under, a file is refused naming that file."""
  absolute = os.path.abspath(directory)
  existing = absolute
  while not os.path.lexists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise NotADirectoryError(
      f'output directory {directory} is a file, not a directory'
      if existing == absolute
      else f'output directory {directory} cannot be created: {existing} is a file'
    )
  created = None
  if existing != absolute:  # the first missing directory below the deepest existing one
    created = os.path.join(existing, os.path.relpath(absolute, existing).split(os.sep)[0])
  try:
    os.makedirs(directory, exist_ok=True)
    probe = os.path.join(directory, f'{lock.WRITE_PROBE}{os.getpid()}')
    with open(probe, 'w') as f:
      f.write('probe')
    os.remove(probe)
  except OSError as e:
    raise PermissionError(f'output directory {directory} is not writable: {e.strerror or e}') from e
  return created


def remove_created(directory: str, created: str | None) -> None:
  """Removes `directory` and its parents up to `created` (what `probe_writable` created), each only
  if it is empty: a job that failed before writing anything leaves no directory behind."""
  if created is None:
    return
  current, top = os.path.abspath(directory), os.path.abspath(created)
  while current.startswith(top):
    try:
      os.rmdir(current)
    except OSError:  # not empty (or gone): keep it and everything above
      return
    if current == top:
      return
    current = os.path.dirname(current)


def tracked_by_git(path: str | os.PathLike, repo_root: str | os.PathLike = REPO_ROOT) -> bool:
  """`path` is a file (or holds files) that git tracks in the repository at `repo_root`. False
  outside it, and where git or the repository is missing (an installed package)."""
  root = Path(repo_root).resolve()
  try:
    relative = Path(path).resolve().relative_to(root)
  except ValueError:  # outside the repository
    return False
  try:
    listed = subprocess.run(
      ['git', '-C', str(root), 'ls-files', '--error-unmatch', '--', str(relative)],
      capture_output=True,
      timeout=60,
    )
  except (OSError, subprocess.SubprocessError):  # no git
    return False
  return listed.returncode == 0


def check_not_tracked(name: str, path: Any, allowed_by: str, repo_root=REPO_ROOT) -> None:
  """ValueError naming `name`, the path and the knob `allowed_by` if the output `path` is a file
  git tracks in this repository (e.g. the shipped weights, models/embedded/*.msgpack), which a job
  would otherwise overwrite unasked."""
  if path is not None and tracked_by_git(path, repo_root):
    raise ValueError(
      f'{name} {os.fspath(path)} is a file tracked by git in {repo_root}: refusing to overwrite '
      f'it; write elsewhere (e.g. under ../runs/), or set {allowed_by} = True to replace it'
    )


USER_ERRORS = (ValueError, OSError, RuntimeError)


@contextlib.contextmanager
def user_errors(types: tuple[type[BaseException], ...] = USER_ERRORS):
  """Marks an error of `types` (default: a ValueError, OSError or RuntimeError) raised inside as the
  user's to fix (a bad setting, path or input file, a refused resume, a locked output directory):
  the runners' command line (`gin_utils.run_gin_main`) prints its message alone and exits
  non-zero, without a traceback. The exception itself is re-raised unchanged, so Python callers
  catch it as before. Wrap a job's checks, which run before any compute, and nothing else; a
  weights load, with the narrower `checkpoints.LOAD_ERRORS` (a file that fails to parse)."""
  try:
    yield
  except types as e:
    e.user_message = str(e)
    raise


def user_message(error: BaseException) -> str | None:
  """The message of an error raised inside `user_errors` (through gin's wrapping), else None."""
  return getattr(error, 'user_message', None)


def settings_entry(settings_type: type) -> Callable[[Callable[[Any], Any]], Callable[..., Any]]:
  """Decorator: `run(settings)` becomes the runner `entry(**fields)`, whose keyword-only arguments
  are the fields of the dataclass `settings_type` (names, defaults and annotations), so gin binds
  and checks them by name (`infer.batch_size = 8`) and `help()` lists them, each written once, in
  the dataclass. The entry builds `settings_type(**arguments)` inside `user_errors` (its checks run
  before any compute), then returns `run(settings)`."""

  def parameter(field: dataclasses.Field) -> inspect.Parameter:
    default = field.default
    if field.default_factory is not dataclasses.MISSING:
      default = field.default_factory()
    if default is dataclasses.MISSING:
      default = inspect.Parameter.empty
    return inspect.Parameter(
      field.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=field.type
    )

  def decorate(run: Callable[[Any], Any]) -> Callable[..., Any]:
    @functools.wraps(run)
    def entry(**arguments: Any) -> Any:
      with user_errors():
        settings = settings_type(**arguments)
      return run(settings)

    del entry.__wrapped__  # gin reads the parameters of the innermost function: these, not run's
    returns = inspect.signature(run).return_annotation
    entry.__signature__ = inspect.Signature(
      [parameter(f) for f in dataclasses.fields(settings_type)], return_annotation=returns
    )
    return entry

  return decorate
