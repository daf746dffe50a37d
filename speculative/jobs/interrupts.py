"""SIGINT (Ctrl-C) and SIGTERM as a job's clean end: one line and exit status 128 + the signal (130,
143), never a traceback; no gin, no jax.

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
import signal
import threading
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
  """A job stopped by a signal (`signum`); `message`, where the job set it, says how far it got."""

  def __init__(self, signum: int = signal.SIGINT, message: str | None = None):
    super().__init__(message or signal.Signals(signum).name)
    self.signum = int(signum)
    self.message = message


_state = {'depth': 0, 'pending': None}


def _raise(signum: int, frame) -> None:
  del frame
  if _state['depth']:  # inside `deferred`: raised when it ends
    _state['pending'] = _state['pending'] or signum
    return
  raise Interrupted(signum)


@contextlib.contextmanager
def installed() -> Iterator[None]:
  """Inside, SIGINT and SIGTERM raise `Interrupted` (in the main thread, where Python runs
  handlers; elsewhere nothing changes); the previous handlers are restored after. A signal the
  process was started ignoring (SIGINT under `nohup` or `&` in a script) stays ignored."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {
    signum: signal.signal(signum, _raise)
    for signum in SIGNALS
    if signal.getsignal(signum) is not signal.SIG_IGN
  }
  try:
    yield
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
  """A signal that arrives inside the block is raised when the block ends, not inside it."""
  _state['depth'] += 1
  try:
    yield
  finally:
    _state['depth'] -= 1
    pending = _state['pending']
    if not _state['depth'] and pending is not None:
      _state['pending'] = None
      raise Interrupted(pending)


def exit_line(error: KeyboardInterrupt) -> tuple[str, int]:
  """(the line to print, the exit status) of a job ended by `error`: its message where the job set
  one, else 'interrupted'; 128 + the signal (a plain KeyboardInterrupt: SIGINT, 130)."""
  signum = getattr(error, 'signum', signal.SIGINT)
  return getattr(error, 'message', None) or 'interrupted', 128 + int(signum)
