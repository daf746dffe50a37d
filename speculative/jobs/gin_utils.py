"""Gin registration of the project's configurable classes.

Runner modules (`speculative.train`, `speculative.infer`, `speculative.benchmark`) call
`register_configurables()` before parsing gin files; library modules never import gin. Each entry
of `CONFIGURABLES` is (python module, attribute, gin module), so `configs/models/t5_1_1_small.gin`
can say `t5_1_1_small/t5.T5Config.emb_dim = 512`. Add new configurables by appending to the list.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import logging
import os
from pathlib import Path
import re
import sys
from typing import Any
from typing import Callable
from typing import Sequence

from speculative.jobs import checks
from speculative.jobs import runtime

# (python module, attribute, gin module): registered as `<gin module>.<attribute>`.
CONFIGURABLES: list[tuple[str, str, str]] = [
  ('speculative.models.t5', 'T5Config', 't5'),
  ('speculative.models.t5', 'T5', 't5'),
]

# Set (to anything non-empty) for the traceback of a user error, as --debug does.
DEBUG_ENV = 'SPECULATIVE_DEBUG'

_registered: set[tuple[str, str]] = set()
REPO_ROOT = Path(__file__).resolve().parents[2]


def register_configurables() -> None:
  """Registers every entry of `CONFIGURABLES` with gin (idempotent)."""
  import gin  # deferred: only runners need gin

  for module_name, attribute, gin_module in CONFIGURABLES:
    if (gin_module, attribute) in _registered:
      continue
    target = getattr(importlib.import_module(module_name), attribute)
    gin.external_configurable(target, attribute, module=gin_module)
    _registered.add((gin_module, attribute))


def load_macro(gin_file: str, macro: str, expected_type: type | None = None) -> Any:
  """The value a gin file binds to `macro` (e.g. EMBEDDED_TARGET in configs/models/*.gin), with
  configurable references evaluated. Clears the global gin config first."""
  import gin  # deferred: only runners need gin

  register_configurables()
  gin.clear_config()
  gin.parse_config_file(str(gin_file))
  value = gin.query_parameter(f'%{macro}')
  if isinstance(value, gin.config.ConfigurableReference):
    value = value.scoped_configurable_fn()
  if expected_type is not None and not isinstance(value, expected_type):
    raise ValueError(
      f'{gin_file}: %{macro} is a {type(value).__name__}, not a {expected_type.__name__}'
    )
  return value


# Environment that silences TensorFlow/XLA/oneDNN/absl C++ start-up logging (set before they load).
_QUIET_ENV = {
  'TF_CPP_MIN_LOG_LEVEL': '3',
  'TF_ENABLE_ONEDNN_OPTS': '0',
  'GRPC_VERBOSITY': 'ERROR',
  'GLOG_minloglevel': '3',
  'ABSL_MIN_LOG_LEVEL': '3',
}


def quiet_native_logs(verbose: bool = False) -> None:
  """Silences the C++ log lines of TensorFlow/XLA/CUDA stubs on start-up (unless `verbose`).

  Values already in the environment win. TensorFlow (used by seqio for the tasks) prints a few
  lines before its logging is configured, so it is imported here with stderr muted; Python
  exceptions still propagate.
  """
  if verbose:
    return
  for key, value in _QUIET_ENV.items():
    os.environ.setdefault(key, value)
  if 'tensorflow' in sys.modules or importlib.util.find_spec('tensorflow') is None:
    return
  with muted_stderr():
    import tensorflow  # pylint: disable=g-import-not-at-top

    # Initialise TF's devices now, muted: on a CPU machine its CUDA probe logs an E-level
    # "failed call to cuInit" line at the first op otherwise. seqio's pipelines run on CPU.
    tensorflow.config.set_visible_devices([], 'GPU')


@contextlib.contextmanager
def muted_stderr():
  """Points file descriptor 2 at /dev/null inside, for native libraries that log there with no
  switch of their own; Python exceptions still propagate (and print once it is restored)."""
  sys.stderr.flush()
  saved = os.dup(2)
  try:
    with open(os.devnull, 'w') as devnull:
      os.dup2(devnull.fileno(), 2)
      yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)


def search_paths() -> list[str]:
  """Where gin files and their includes are looked up: the working directory, then the repository
  root of this package (so the console scripts find configs/ from anywhere in the checkout)."""
  import gin  # deferred: only runners need gin

  paths = [os.getcwd()]
  for prefix in [str(REPO_ROOT)] + list(gin.config._LOCATION_PREFIXES):  # pylint: disable=protected-access
    if prefix and prefix not in paths:
      paths.append(prefix)
  return paths


def resolve_gin_file(gin_file: str) -> str:
  """The path of `gin_file` (absolute, or relative to a search path); FileNotFoundError naming it
  and the search path if it is in none."""
  if os.path.isabs(gin_file):
    if os.path.isfile(gin_file):
      return gin_file
  else:
    for prefix in search_paths():
      candidate = os.path.join(prefix, gin_file)
      if os.path.isfile(candidate):
        return candidate
  raise FileNotFoundError(f'gin file {gin_file!r} not found; searched: {search_paths()}')


def _macros() -> dict[str, Any]:
  """{name: value} of every macro in the current gin config."""
  import gin  # deferred: only runners need gin

  return {
    scope: bindings.get('value')
    for (scope, selector), bindings in gin.config._CONFIG.items()  # pylint: disable=protected-access
    if selector == 'gin.macro'
  }


def _referenced_macros() -> set[str]:
  """Names of the macros some binding (or another macro) refers to with `%NAME`."""
  import gin  # deferred: only runners need gin

  found = set()

  def visit(value):
    if isinstance(value, gin.config.ConfigurableReference):
      selector = value.scoped_selector
      if selector.endswith('gin.macro'):
        found.add(selector.split('/')[-2] if '/' in selector else selector)
    elif isinstance(value, dict):
      for item in value.values():
        visit(item)
    elif isinstance(value, (list, tuple, set)):
      for item in value:
        visit(item)

  for bindings in gin.config._CONFIG.values():  # pylint: disable=protected-access
    for value in bindings.values():
      visit(value)
  return found


def closest(name: str, known: Sequence[str]) -> str:
  """' (did you mean A or B?)' for the known names closest to `name`; '' if none is close."""
  matches = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
  return f' (did you mean {" or ".join(matches)}?)' if matches else ''


def check_unused_macros(command_line_macros: Sequence[str]) -> None:
  """Raises ValueError for macros set on the command line that no binding uses (a typo such as
  `GAMA = 5` would otherwise be silently ignored), naming the closest known macros."""
  macros = _macros()
  used = _referenced_macros()
  unused = [m for m in command_line_macros if m not in used]
  if unused:
    known = sorted(used & set(macros))
    lines = [f'macro {m} is not used by the run file{closest(m, known)}' for m in unused]
    raise ValueError('\n'.join(lines) + f'\nknown macros: {", ".join(known)}')


def format_macros() -> str:
  """'  NAME = value' lines for the macros of the current gin config, sorted by name."""
  return '\n'.join(f'  {name} = {value!r}' for name, value in sorted(_macros().items()))


def _explain_unknown_parameter(error: ValueError) -> ValueError:
  """Adds the closest parameter names to gin's "doesn't have a parameter named" error."""
  import gin  # deferred: only runners need gin

  match = re.search(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'", str(error))
  if not match:
    return error
  try:
    registered = gin.config._REGISTRY.get_match(match.group(1))  # pylint: disable=protected-access
    names = list(inspect.signature(registered.wrapped).parameters)
  except Exception:  # pylint: disable=broad-except
    return error
  return ValueError(
    f'{error}\n{match.group(1)} has no parameter {match.group(2)!r}'
    f'{closest(match.group(2), names)}; its parameters: {", ".join(names)}'
  )


def parse(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
  """Parses `gin_files` then `bindings` into a cleared gin config, refusing (before any compute)
  missing files (naming the search path), unknown parameters and command-line macros that no
  binding uses (naming the closest known names)."""
  import gin  # deferred: only runners need gin

  register_configurables()
  resolved = [resolve_gin_file(f) for f in gin_files]
  for prefix in search_paths():
    if prefix not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
      gin.add_config_file_search_path(prefix)
  try:
    for gin_file in resolved:
      gin.parse_config_file(gin_file)
    before = set(_macros())
    gin.parse_config(list(bindings))
  except OSError as e:
    raise FileNotFoundError(f'{e}; searched: {search_paths()}') from e
  except ValueError as e:
    raise _explain_unknown_parameter(e) from e
  # Command-line macros: new ones, and overrides of file macros (an override is used if the file's
  # macro is).
  command_line = [m for m in _macros() if m not in before]
  command_line += [
    m
    for m in before
    if any(
      re.match(rf'\s*{re.escape(m)}\s*=', b) for binding in bindings for b in binding.splitlines()
    )
  ]
  check_unused_macros(command_line)


def run_gin_main(
  fn: Callable[..., Any],
  name: str,
  description: str,
  argv: Sequence[str] | None = None,
  log_level: int = logging.WARNING,
  default_gin_files: Sequence[str] = (),
) -> Any:
  """The runners' command line: `--gin_file` (repeatable), `--gin_bindings`, `--verbose`,
  `--debug`, then `fn()`.

  `fn` is registered with gin as `name` (e.g. `infer`), so the gin files bind `name.arg = ...`.
  `--help` lists the macros (the knobs) of the given gin files, else of `default_gin_files`, with
  their values. Every binding is checked (`parse`) before `fn` runs. A user error (a bad run file
  or binding, or one that `fn` raises inside `checks.user_errors`: a refused setting, input file,
  resume or output lock) prints one `error:` line and exits with status 2; `--debug` (or the
  environment variable SPECULATIVE_DEBUG) shows its traceback instead.
  """
  import gin  # deferred: only runners need gin

  argv = list(sys.argv[1:] if argv is None else argv)
  parser = _runner_parser(description)
  args = parser.parse_args(argv)
  quiet_native_logs(args.verbose)
  runtime.apply_cpu_defaults()  # before jax starts a backend; the user's XLA_FLAGS win
  logging.basicConfig(level=logging.INFO if args.verbose else log_level)
  gin.clear_config()
  register_configurables()
  configurable = gin.external_configurable(fn, name)
  if args.help:
    files = args.gin_file or list(default_gin_files)
    parser.print_help()
    if files:
      parse(files, args.gin_bindings)
      print(
        f'\nmacros of {", ".join(files)} (override with --gin_bindings="NAME = value"):\n'
        + format_macros()
      )
    return None
  if not args.gin_file:
    parser.error(
      '--gin_file is required (e.g. --gin_file=configs/local/run.gin); '
      '--help lists the macros of a run file'
    )
  return parse_and_call(parser, configurable, args.gin_file, args.gin_bindings, args.debug)


def parse_and_call(
  parser, configurable: Callable[[], Any], gin_files: Sequence[str], bindings: Sequence[str], debug
) -> Any:
  """Parses the run files and bindings (`parse`), then calls `configurable`. A user error (a bad
  run file or binding, or one raised inside `checks.user_errors`) exits with status 2 and one
  `error:` line from `parser`, unless `debug`, which lets its traceback through."""
  try:
    parse(gin_files, bindings)
  except (ValueError, OSError) as e:  # a bad run file or binding: the message, not a traceback
    if debug:
      raise
    parser.exit(2, f'{parser.prog}: error: {e}\n')
  return call_with_user_errors(configurable, f'{parser.prog}: error: ', debug)


def call_with_user_errors(fn: Callable[[], Any], prefix: str, debug) -> Any:
  """Returns `fn()`. A user error (one raised inside `checks.user_errors`: a refused setting,
  path, input file, resume or lock) prints `prefix` and its message as one line to stderr and exits
  with status 2, unless `debug`, which lets its traceback through."""
  try:
    return fn()
  except Exception as e:  # pylint: disable=broad-except
    message = checks.user_message(e)
    if message is None or debug:
      raise
    print(f'{prefix}{message}', file=sys.stderr)
    sys.exit(2)


def _runner_parser(description: str):
  """The runners' argparse parser: --help, --gin_file, --gin_bindings, --verbose, --debug."""
  import argparse

  parser = argparse.ArgumentParser(
    description=description, add_help=False, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument('-h', '--help', action='store_true', help='show this help and the macros')
  parser.add_argument(
    '--gin_file',
    action='append',
    default=[],
    help='gin run file (repeatable), looked up in the working directory and the repository root',
  )
  parser.add_argument(
    '--gin_bindings',
    action='append',
    default=[],
    help='gin binding, e.g. "GAMMA = 5" (repeatable); applied after the files',
  )
  parser.add_argument(
    '--verbose',
    action='store_true',
    help='keep TensorFlow/XLA C++ start-up logging and log at INFO',
  )
  add_debug_flag(parser)
  return parser


def add_debug_flag(parser) -> None:
  """`--debug` (default: the environment variable SPECULATIVE_DEBUG): tracebacks of user errors."""
  parser.add_argument(
    '--debug',
    action='store_true',
    default=bool(os.environ.get(DEBUG_ENV)),
    help=f'show the traceback of a refused setting, input or resume (or set {DEBUG_ENV}=1)',
  )
