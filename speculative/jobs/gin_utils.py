"""The runners' command line and gin: registration, parsing and the user's errors.

Runner modules (`speculative.train`, `speculative.infer`, `speculative.benchmark`) call
`register_configurables()` before parsing gin files; library modules never import gin. Each entry
of `CONFIGURABLES` is (python module, attribute, gin module), so `configs/models/t5_1_1_small.gin`
can say `t5_1_1_small/t5.T5Config.emb_dim = 512`. Add new configurables by appending to the list.

`run_gin_main` (`runner_parser`, then `run_parsed`) is the runners' command line, named after their
console scripts (`speculative-infer` also under `python -m speculative.infer`): `parse` checks the
run files and bindings (a missing file, a line or binding gin cannot parse, an unknown parameter, an
unused macro, a macro left `%gin.REQUIRED`), `--help` lists a run file's knobs (`format_knobs`), and
every user error leaves through one exit path, `call_with_user_errors`: one `<prog>: error:` line
and exit status 2; SIGINT and SIGTERM (`interrupts`) through the same one: one `<prog>:` line
saying how far the job got, exit status 130 or 143.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import inspect
import logging
import os
import re
import sys
import tempfile
from typing import Any
from typing import Callable
from typing import Sequence

from speculative.jobs import checks
from speculative.jobs import interrupts
from speculative.jobs import runtime

# (python module, attribute, gin module): registered as `<gin module>.<attribute>`.
CONFIGURABLES: list[tuple[str, str, str]] = [
  ('speculative.models.t5', 'T5Config', 't5'),
  ('speculative.models.t5', 'T5', 't5'),
]

# Set (to anything non-empty) for the traceback of a user error, as --debug does.
DEBUG_ENV = interrupts.DEBUG_ENV

_registered: set[tuple[str, str]] = set()
REPO_ROOT = checks.REPO_ROOT


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
  configurable references evaluated. Clears the global gin config first. `gin_file` and its
  includes are looked up as a runner's (`resolve_gin_file`: the working directory, then the
  repository); one found in neither is a FileNotFoundError naming the search path."""
  import gin  # deferred: only runners need gin

  register_configurables()
  gin.clear_config()
  with _quiet_file_readers():  # its includes, from any working directory (as `parse`)
    for prefix in search_paths():
      if prefix not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
        gin.add_config_file_search_path(prefix)
    gin.parse_config_file(resolve_gin_file(str(gin_file)))
  value = gin.query_parameter(f'%{macro}')
  if isinstance(value, gin.config.ConfigurableReference):
    value = value.scoped_configurable_fn()
  if expected_type is not None and not isinstance(value, expected_type):
    raise ValueError(
      f'{gin_file}: %{macro} is a {type(value).__name__}, not a {expected_type.__name__}'
    )
  return value


# Environment set before TensorFlow/XLA load: their C++ INFO and WARNING lines off, ERROR lines kept
# (TF_CPP_MIN_LOG_LEVEL 2, not 3: a real error of TF's or XLA's still shows); no oneDNN notice.
_QUIET_ENV = {
  'TF_CPP_MIN_LOG_LEVEL': '2',
  'TF_ENABLE_ONEDNN_OPTS': '0',
  'GRPC_VERBOSITY': 'ERROR',
}

# The start-up lines that TensorFlow, its CUDA stubs and SentencePiece print whatever the log level
# (before absl's logging is initialised, or at ERROR level for a GPU that is not there), none of
# them a problem of the job: `filtered_stderr` drops these and passes every other line through.
STARTUP_NOISE = re.compile(
  '|'.join(
    (
      r'All log messages before absl::InitializeLog\(\) is called are written to STDERR',
      r'cudart_stub\.cc.*Could not find cuda drivers',
      r'failed call to cuInit',  # TF's CUDA probe on a machine without a GPU driver
      r'Unable to register cu(DNN|FFT|BLAS) factory',  # TF and jax both bring CUDA plugins
      r'computation_placer\.cc.*already registered',
      r'TF-TRT Warning: Could not find TensorRT',
      r'cpu_feature_guard\.cc',
      r'^To enable the following instructions: ',  # cpu_feature_guard's second line
      r'oneDNN custom operations are on',
      r'normalizer\.cc.*precompiled_charsmap is empty',  # SentencePiece, identity normalization
    )
  )
)


_native_logs = {'verbose': False}  # set by `quiet_native_logs`, read by `import_tensorflow`


def quiet_native_logs(verbose: bool = False) -> None:
  """Silences the C++ start-up lines of TensorFlow/XLA/CUDA stubs (unless `verbose`): sets
  `_QUIET_ENV` (values already in the environment win). TensorFlow itself is not imported here:
  only a job that reads a seqio task needs it, and `import_tensorflow` imports it there, with its
  start-up noise filtered (a job that reads a file never pays its seconds of import)."""
  _native_logs['verbose'] = verbose
  if not verbose:
    _set_quiet_env()


def _set_quiet_env() -> None:
  for key, value in _QUIET_ENV.items():
    os.environ.setdefault(key, value)  # values already in the environment win


def import_tensorflow() -> None:
  """Imports TensorFlow (for seqio) and initialises its devices inside `filtered_stderr`, which
  drops the known start-up noise (`STARTUP_NOISE`: e.g. TF's 'failed call to cuInit' on a machine
  without a GPU, logged at ERROR level at the first op otherwise) and passes any other line
  through; its GPUs are hidden (seqio's pipelines run on CPU). Call it before importing seqio.
  Nothing to do where TensorFlow is imported already or not installed, or after
  `quiet_native_logs(verbose=True)` (seqio then imports it with every line shown)."""
  if _native_logs['verbose']:
    return
  if 'tensorflow' in sys.modules or importlib.util.find_spec('tensorflow') is None:
    return
  _set_quiet_env()
  with filtered_stderr():
    import tensorflow  # pylint: disable=g-import-not-at-top

    tensorflow.config.set_visible_devices([], 'GPU')


@contextlib.contextmanager
def filtered_stderr(noise: re.Pattern = STARTUP_NOISE):
  """Points file descriptor 2 at a temporary file inside (native libraries log there with no switch
  of their own), then writes back to stderr every line that `noise` does not match, so a real
  error still shows. Python exceptions propagate (and print once stderr is restored)."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    try:
      os.dup2(captured.fileno(), 2)
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [
        line
        for line in captured.read().decode('utf-8', errors='replace').splitlines(keepends=True)
        if not noise.search(line)
      ]
      if kept:
        sys.stderr.write(''.join(kept))
        sys.stderr.flush()


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


def format_knobs(gin_files: Sequence[str], name: str) -> str:
  """The knobs of the current gin config, for `--help`: its macros ('  NAME = value', sorted;
  those left `%gin.REQUIRED` marked), then the bindings of the runner `name` that no macro sets
  ('  name.param = value'): the train and benchmark run files bind most of their knobs directly."""
  import gin  # deferred: only runners need gin

  files = ', '.join(gin_files)
  sections = []
  macros = sorted(_macros().items())
  if macros:
    lines = [
      f'  {macro} = {value!r}' + ('  (required: set it)' if _required_constant(value) else '')
      for macro, value in macros
    ]
    sections.append(
      f'macros of {files} (override with --gin_bindings="NAME = value"):\n' + '\n'.join(lines)
    )
  direct = sorted(
    (parameter, value)
    for (scope, selector), bindings in gin.config._CONFIG.items()  # pylint: disable=protected-access
    if not scope and (selector == name or selector.endswith(f'.{name}'))
    for parameter, value in bindings.items()
    if not _is_macro_reference(value)
  )
  if direct:
    lines = [f'  {name}.{parameter} = {value!r}' for parameter, value in direct]
    sections.append(
      f'{name} bindings of {files} (override with --gin_bindings="{name}.NAME = value"):\n'
      + '\n'.join(lines)
    )
  return '\n\n'.join(sections) or f'{files} sets no macro and no {name} binding'


def _is_macro_reference(value: Any) -> bool:
  """`value` is `%NAME`, a reference to a macro (listed with the macros)."""
  import gin  # deferred: only runners need gin

  return isinstance(value, gin.config.ConfigurableReference) and value.scoped_selector.endswith(
    'gin.macro'
  )


def _required_constant(value: Any) -> bool:
  """`value` is `%gin.REQUIRED`, gin's marker of a macro or parameter the user must set."""
  import gin  # deferred: only runners need gin

  return (
    isinstance(value, gin.config.ConfigurableReference)
    and value.configurable.wrapped == gin.config._retrieve_constant  # pylint: disable=protected-access,comparison-with-callable
    and value.scoped_configurable_fn() is gin.REQUIRED
  )


def check_required() -> None:
  """Raises ValueError naming every macro (and parameter) that the run files leave
  `%gin.REQUIRED` (e.g. CHECKPOINT_PATH of configs/runs/infer.gin) and no binding set: the job
  would otherwise be handed gin's bare sentinel, `<object object at 0x...>`. (gin checks this only
  when a config is finalized, without naming the way forward.)"""
  import gin  # deferred: only runners need gin

  used = _referenced_macros()
  names = [m for m, value in sorted(_macros().items()) if m in used and _required_constant(value)]
  names += sorted(
    f'{selector}.{parameter}' if not scope else f'{scope}/{selector}.{parameter}'
    for (scope, selector), bindings in gin.config._CONFIG.items()  # pylint: disable=protected-access
    if selector != 'gin.macro'
    for parameter, value in bindings.items()
    if _required_constant(value)
  )
  if not names:
    return
  listed = names[0] if len(names) == 1 else ', '.join(names[:-1]) + ' and ' + names[-1]
  raise ValueError(
    f'{listed} {"is" if len(names) == 1 else "are"} required: the run files leave '
    f'{"it" if len(names) == 1 else "them"} %gin.REQUIRED; set '
    f'{"it" if len(names) == 1 else "each"} with --gin_bindings="{names[0]} = ..." (strings in '
    f'quotes; the run file\'s header says what each is)'
  )


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
  # One line: gin's own text ("In bindings string line 1" and the binding) would add three.
  return ValueError(
    f'{match.group(1)} has no parameter {match.group(2)!r}'
    f'{closest(match.group(2), names)}; its parameters: {", ".join(names)}'
  )


def _syntax_error(error: Exception, gin_file: str | None = None, binding: str | None = None):
  """ValueError naming the run-file line (`gin_file`) or the `--gin_bindings` value (`binding`)
  that gin cannot parse (its SyntaxError names neither the binding nor the way forward), with the
  likely fix (`_syntax_hint`)."""
  reason = getattr(error, 'msg', None) or (error.args[0] if error.args else str(error))
  reason = re.sub(r':? <ast\.\w+ object at 0x[0-9a-f]+>', '', str(reason))  # no object addresses
  if binding is not None:
    shown = ' '.join(binding.split())  # one line
    hint = _syntax_hint(binding, reason, from_command_line=True)
    return ValueError(f'--gin_bindings "{shown}": gin cannot parse the value ({hint})')
  line, text = getattr(error, 'lineno', None), (getattr(error, 'text', None) or '').strip()
  where = f'{gin_file}:{line}' if line else gin_file
  if not text:
    return ValueError(f'{where}: gin cannot parse it: {reason}')
  return ValueError(f'{where}: gin cannot parse {text!r} ({_syntax_hint(text, reason)})')


def _syntax_hint(statement: str, reason: str, from_command_line: bool = False) -> str:
  """The likely fix of a `NAME = value` statement gin cannot parse: quotes around a string, or a
  value after `=` (on the command line, the run files' value of that macro shown); else gin's
  reason."""
  match = re.fullmatch(r'\s*([\w./]+)\s*=\s*(.*?)\s*', statement, re.DOTALL)
  if match and not match.group(2):
    name, macros = match.group(1), _macros()
    known = from_command_line and name in macros
    return 'no value after =' + (f'; the run file has {name} = {macros[name]!r}' if known else '')
  if match and match.group(2)[0] not in '\'"([{%@-+.0123456789':
    return f'strings need quotes: {match.group(1)} = {match.group(2)!r}'
  return f'gin: {reason}'


class _NoGinPathNotFound(logging.Filter):
  """Drops gin's 'Path not found: <include>' ERROR lines (`_quiet_file_readers`)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith('Path not found:')


@contextlib.contextmanager
def _quiet_file_readers():
  """gin tries an `include` under each search path in turn (the working directory, then the
  repository root: `search_paths`), with each of its file readers. Its package-resource reader
  logs an ERROR 'Path not found' line for every path that lacks the file, even when a later one has
  it, and fails with a TypeError where the include's directory is a namespace package (configs/,
  with the repository on sys.path). While this is open, that check is silent and a failure means
  'not here'; an include found nowhere is still an error (`parse`: FileNotFoundError naming the
  paths)."""
  import gin  # deferred: only runners need gin

  def quiet(exists):
    def check(path):
      if exists in (os.path.isfile, os.path.exists):
        return exists(path)
      no_path_not_found = _NoGinPathNotFound()
      logging.getLogger().addFilter(no_path_not_found)  # gin logs through the root logger
      try:
        return exists(path)
      except (TypeError, ValueError, ImportError):
        return False
      finally:
        logging.getLogger().removeFilter(no_path_not_found)

    return check

  readers = gin.config._FILE_READERS  # pylint: disable=protected-access
  saved = list(readers)
  readers[:] = [(reader, quiet(exists)) for reader, exists in saved]
  try:
    yield
  finally:
    readers[:] = saved


def _parse_config(gin_files: Sequence[str], bindings: Sequence[str]) -> None:
  """gin's parse of the files, then of the bindings one at a time (so that an error names its
  binding); a line or binding gin cannot parse is a ValueError naming it (`_syntax_error`)."""
  import tokenize

  import gin  # deferred: only runners need gin

  for gin_file in gin_files:
    try:
      with _quiet_file_readers():
        gin.parse_config_file(gin_file)
    except (SyntaxError, tokenize.TokenError) as e:  # the line of the file (or an included one)
      raise _syntax_error(e, gin_file=getattr(e, 'filename', None) or gin_file) from e
  for binding in bindings:
    try:
      gin.parse_config(binding)
    except (SyntaxError, tokenize.TokenError) as e:
      raise _syntax_error(e, binding=binding) from e


def parse(gin_files: Sequence[str], bindings: Sequence[str], required: bool = True) -> None:
  """Parses `gin_files` then `bindings` into a cleared gin config, refusing (before any compute)
  missing files (naming the search path), a line or binding gin cannot parse (naming it and the
  likely fix), unknown parameters and command-line macros that no binding uses (naming the
  closest known names) and, if `required`, macros the run files leave `%gin.REQUIRED`
  (`check_required`; `--help` lists them instead)."""
  import gin  # deferred: only runners need gin

  register_configurables()
  resolved = [resolve_gin_file(f) for f in gin_files]
  for prefix in search_paths():
    if prefix not in gin.config._LOCATION_PREFIXES:  # pylint: disable=protected-access
      gin.add_config_file_search_path(prefix)
  try:
    _parse_config(resolved, [])
    before = set(_macros())
    _parse_config([], bindings)
  except OSError as e:
    raise FileNotFoundError(f'{e}; searched: {search_paths()}') from e
  except ValueError as e:
    explained = _explain_unknown_parameter(e)
    if explained is e:
      raise
    raise explained from e
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
  if required:
    check_required()


def run_gin_main(
  fn: Callable[..., Any],
  name: str,
  description: str,
  argv: Sequence[str] | None = None,
  log_level: int = logging.WARNING,
  default_gin_files: Sequence[str] = (),
) -> Any:
  """The runners' command line: `--gin_file` (repeatable), `--gin_bindings`, `--verbose`,
  `--debug`, then `fn()` (`runner_parser`, then `run_parsed`)."""
  parser = runner_parser(name, description)
  args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
  return run_parsed(parser, args, fn, name, log_level, default_gin_files)


def run_parsed(
  parser,
  args,
  fn: Callable[..., Any],
  name: str,
  log_level: int = logging.WARNING,
  default_gin_files: Sequence[str] = (),
  extra_gin_files: Sequence[str] = (),
) -> Any:
  """Runs the runner `fn` on the parsed command line `args` of `parser` (a `runner_parser`, to
  which a runner may add options of its own, as the benchmark does).

  `fn` is registered with gin as `name` (e.g. `infer`), so the gin files bind `name.arg = ...`;
  `extra_gin_files` are parsed after the given ones (the benchmark's `--quick`). `--help` lists the
  knobs (`format_knobs`: macros, and the bindings of `name` no macro sets) of the given gin files,
  else of `default_gin_files`, with their values. Every binding is checked (`parse`) before `fn`
  runs. A user error (a bad run file or binding, or one that `fn` raises inside
  `checks.user_errors`: a refused setting, input file, resume or output lock) prints one
  `<prog>: error:` line and exits with status 2 (`call_with_user_errors`); `--debug` (or the
  environment variable SPECULATIVE_DEBUG) shows its traceback instead.
  """
  import gin  # deferred: only runners need gin

  quiet_native_logs(args.verbose)
  runtime.apply_cpu_defaults()  # before jax starts a backend; the user's XLA_FLAGS win
  logging.basicConfig(level=logging.INFO if args.verbose else log_level)
  gin.clear_config()
  register_configurables()
  configurable = gin.external_configurable(fn, name)
  prefix = f'{parser.prog}: error: '
  if args.help:
    files = list(args.gin_file or default_gin_files) + list(extra_gin_files)
    parser.print_help()
    if files:

      def knobs() -> None:
        with checks.user_errors():  # a bad run file or binding
          parse(files, args.gin_bindings, required=False)  # required macros are listed, marked
        print('\n' + format_knobs(files, name))

      call_with_user_errors(knobs, prefix, args.debug)
    return None
  if not args.gin_file:
    example = default_gin_files[0] if default_gin_files else 'RUN_FILE.gin'
    parser.error(
      f'--gin_file is required (e.g. --gin_file={example}); --help lists the knobs of a run file'
    )
  with interrupts.installed():  # SIGINT/SIGTERM: one line, exit 130/143 (`call_with_user_errors`)
    return parse_and_call(
      parser, configurable, [*args.gin_file, *extra_gin_files], args.gin_bindings, args.debug
    )


def parse_and_call(
  parser, configurable: Callable[[], Any], gin_files: Sequence[str], bindings: Sequence[str], debug
) -> Any:
  """Parses the run files and bindings (`parse`), then calls `configurable`, through
  `call_with_user_errors`: a bad run file or binding is a user error as those `configurable`
  raises inside `checks.user_errors` are (one `<prog>: error:` line, exit status 2)."""

  def parse_then_call() -> Any:
    with checks.user_errors():  # a bad run file or binding: the message, not a traceback
      parse(gin_files, bindings)
    return configurable()

  return call_with_user_errors(parse_then_call, f'{parser.prog}: error: ', debug)


def call_with_user_errors(fn: Callable[[], Any], prefix: str, debug) -> Any:
  """Returns `fn()`. A user error (one raised inside `checks.user_errors`: a bad run file or
  binding, a refused setting, path, input file, resume or lock) prints `prefix` and its message to
  stderr and exits with status 2, unless `debug`, which lets its traceback through. The runners'
  one exit path for the user's errors."""
  try:
    return fn()
  except KeyboardInterrupt as e:  # SIGINT or SIGTERM (`interrupts`): one line, 128 + the signal
    if debug:
      raise
    line, status = interrupts.exit_line(e)
    print(f'{prefix.replace("error: ", "")}{line}', file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: the interpreter's shutdown with XLA's threads still at work on the discarded
    # batch can crash (a segmentation fault, exit status 139, measured with the shipped pair). The
    # job's files are complete (atomic writes) and the OS drops its lock.
    os._exit(status)
  except Exception as e:  # pylint: disable=broad-except
    message = checks.user_message(e)
    if message is None or debug:
      raise
    print(f'{prefix}{message}', file=sys.stderr)
    sys.exit(2)


def console_script(name: str) -> str:
  """The console script of the runner `name` (setup.py's entry points): its messages' program
  name, also under `python -m speculative.<name>`, whose argv[0] is `__main__.py`."""
  return f'speculative-{name}'


def runner_parser(name: str, description: str):
  """The argparse parser of the runner `name` (program name `console_script(name)`): --help,
  --gin_file, --gin_bindings, --verbose, --debug."""
  import argparse

  parser = argparse.ArgumentParser(
    prog=console_script(name),
    description=description,
    add_help=False,
    formatter_class=argparse.RawDescriptionHelpFormatter,
  )
  parser.add_argument(
    '-h', '--help', action='store_true', help='show this help and the knobs of the run file'
  )
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
    help=f'gin binding, e.g. "NAME = value" or "{name}.param = value" (repeatable; strings in '
    "quotes: \"NAME = 'text'\"); applied after the files",
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
