"""SIGINT (Ctrl-C) and SIGTERM as a job's clean end: one line and exit status 128 + the signal (130,
143), never a traceback; no gin, no jax.

  run_main      the console scripts' and `python -m`'s entry: a runner's module imported and its
                `main` called inside `before_job`
  before_job    until `installed` takes over: a signal prints '<prog>: interrupted' and exits at
                once (the imports of jax, the command line, the run files' parse write nothing)
  Interrupted   the exception both signals raise (a KeyboardInterrupt, so `except Exception` never
                swallows it); a job sets its `message` to how far it got ("interrupted after 3 of
                8 examples; the same command resumes")
  installed     both signals raise it inside (the runners' command line, `gin_utils.run_parsed`)
  deferred      a block a signal does not cut: it is raised when the block ends (a batch's records
                and their timings are written together or not at all)
  exit_line     (the line, the exit status) the runners print and exit with
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import threading
from typing import Any
from typing import Iterator
from typing import Sequence

SIGNALS = (signal.SIGINT, signal.SIGTERM)

# Set (to anything non-empty) for the traceback of a user error or an interrupt, as --debug does.
DEBUG_ENV = 'SPECULATIVE_DEBUG'


class Interrupted(KeyboardInterrupt):
  """A job stopped by a signal (`signum`); `message`, where the job set it, says how far it got."""

  def __init__(self, signum: int = signal.SIGINT, message: str | None = None):
    super().__init__(message or signal.Signals(signum).name)
    self.signum = int(signum)
    self.message = message


# depth: `deferred` blocks open; pending: a signal one of them holds; raised: a signal `_raise`
# raised outside them, kept until `installed` ends in case a handler swallowed it.
_state = {'depth': 0, 'pending': None, 'raised': None}


def _raise(signum: int, frame) -> None:
  del frame
  if _state['depth']:  # inside `deferred`: raised when it ends
    _state['pending'] = _state['pending'] or signum
    return
  # Raised where the signal found the main thread, which may be inside a callback whose errors are
  # printed and dropped (jax's gc callback: 'Exception ignored in ...', and the job ran on to its
  # end): the next `deferred` block raises it again, so the job ends at its next write.
  _state['raised'] = signum
  raise Interrupted(signum)


@contextlib.contextmanager
def installed() -> Iterator[None]:
  """Inside, SIGINT and SIGTERM raise `Interrupted` (in the main thread, where Python runs
  handlers; elsewhere nothing changes), and one that a callback drops is raised again at the next
  `deferred` block, not printed; the previous handlers are restored after. A signal the
  process was started ignoring (SIGINT under `nohup` or `&` in a script) stays ignored."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  hook = sys.unraisablehook

  def quiet(unraisable) -> None:
    # An Interrupted a callback dropped: `_raise` kept it for the next `deferred`; no traceback.
    if not isinstance(unraisable.exc_value, Interrupted):
      hook(unraisable)

  _state['raised'] = None
  sys.unraisablehook = quiet
  try:
    with _handled_by(_raise):
      yield
  finally:
    sys.unraisablehook = hook
    _state['raised'] = None


@contextlib.contextmanager
def _handled_by(handler) -> Iterator[None]:
  """SIGINT and SIGTERM go to `handler` inside (call from the main thread), to the previous
  handlers after; a signal the process ignores stays ignored."""
  previous = {
    signum: signal.signal(signum, handler)
    for signum in SIGNALS
    if signal.getsignal(signum) is not signal.SIG_IGN
  }
  try:
    yield
  finally:
    for signum, previous_handler in previous.items():
      signal.signal(signum, previous_handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
  """A signal that arrives inside the block is raised when the block ends, not inside it; so is
  one raised before the block that a callback swallowed (`_raise`)."""
  _state['depth'] += 1
  try:
    yield
  finally:
    _state['depth'] -= 1
    pending = _state['pending'] or _state['raised']
    if not _state['depth'] and pending is not None:
      _state['pending'] = _state['raised'] = None
      raise Interrupted(pending)


def exit_line(error: KeyboardInterrupt) -> tuple[str, int]:
  """(the line to print, the exit status) of a job ended by `error`: its message where the job set
  one, else 'interrupted'; 128 + the signal (a plain KeyboardInterrupt: SIGINT, 130)."""
  signum = getattr(error, 'signum', signal.SIGINT)
  return getattr(error, 'message', None) or 'interrupted', 128 + int(signum)


def run_main(prog: str, module: str, argv: Sequence[str] | None = None) -> Any:
  """`module.main(argv)` (a runner: 'speculative.infer.run', ...), imported and called inside
  `before_job(prog)`: the entry of the console script `prog` and of `python -m`, so that an
  interrupt while jax imports is one line too."""
  with before_job(prog, argv):
    return importlib.import_module(module).main(argv)


@contextlib.contextmanager
def before_job(prog: str, argv: Sequence[str] | None = None) -> Iterator[None]:
  """Inside, until `installed` takes over (the job's own handling), SIGINT and SIGTERM print
  '<prog>: interrupted' (`exit_line`) and exit with 130 / 143 at once, from the handler: before a
  job starts (its imports, command line and run files' parse) nothing is written, so nothing is
  left half-done, and a KeyboardInterrupt raised there can be lost (one raised inside jax's gc
  callback is printed as 'Exception ignored', with a traceback, and the job runs on). `--debug` in
  `argv` (None: sys.argv[1:]) or DEBUG_ENV set keeps Python's traceback, as the runners do. A signal
  the process ignores stays ignored; the previous handlers are restored after."""
  argv = sys.argv[1:] if argv is None else argv
  if threading.current_thread() is not threading.main_thread() or (
    os.environ.get(DEBUG_ENV) or '--debug' in argv
  ):
    yield
    return

  def leave(signum: int, frame) -> None:
    del frame
    line, status = exit_line(Interrupted(signum))
    with contextlib.suppress(Exception):  # what was printed before (--help) is not lost
      sys.stdout.flush()
    # os.write, not print: the handler may run inside a write to sys.stderr (a reentrant call).
    os.write(2, f'{prog}: {line}\n'.encode())
    os._exit(status)  # as the runners exit (gin_utils.call_with_user_errors)

  with _handled_by(leave):
    yield
