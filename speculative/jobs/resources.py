"""What a job costs besides time: XLA compiles and peak resident memory.

A batch job should compile once per input shape and then only run; `CompileCounter` counts the XLA
backend compiles (every jitted program, however small) that happen while it is active, through
`jax.monitoring`, so a report can show "compiles after warm-up: 0". `PeakRss` reads the process's
resident-set high-water mark (VmHWM in /proc/self/status) and, on Linux, resets it first (writing
"5" to /proc/self/clear_refs), so that each phase of one process (one batch size, say) gets its own
peak. Where /proc is missing (not Linux) the peak is None and the reset is skipped.
"""

from __future__ import annotations

import dataclasses
import re
import threading

from jax import monitoring

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_active: list[CompileCounter] = []
_lock = threading.Lock()
_listening = False


@dataclasses.dataclass
class CompileCounter:
  """Counts XLA backend compiles (and their seconds) while used as a context manager.

  Attributes:
    count: compiles seen while active (int).
    seconds: their backend compile time, summed (float seconds).
  """

  count: int = 0
  seconds: float = 0.0

  def __enter__(self) -> CompileCounter:
    _listen()
    with _lock:
      _active.append(self)
    return self

  def __exit__(self, *exc) -> None:
    with _lock:
      _active.remove(self)


def _on_event(event: str, duration_secs: float, **_) -> None:
  if event != _BACKEND_COMPILE_EVENT:
    return
  with _lock:
    for counter in _active:
      counter.count += 1
      counter.seconds += duration_secs


def _listen() -> None:
  """Registers the one process-wide listener (jax.monitoring cannot unregister one)."""
  global _listening
  with _lock:
    if not _listening:
      monitoring.register_event_duration_secs_listener(_on_event)
      _listening = True


def _status_kib(field: str) -> int | None:
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      match = re.search(rf"^{field}:\s+(\d+)\s+kB", f.read(), re.MULTILINE)
  except OSError:
    return None
  return int(match.group(1)) if match else None


def reset_peak_rss() -> bool:
  """Resets the peak-RSS mark to the current RSS (Linux); False where that is not possible."""
  try:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
      f.write("5")
    return True
  except OSError:
    return False


def peak_rss_mib() -> float | None:
  """The process's peak resident set since start or the last `reset_peak_rss`, in MiB."""
  kib = _status_kib("VmHWM")
  return None if kib is None else kib / 1024


@dataclasses.dataclass
class PeakRss:
  """The peak RSS of the code inside the `with` block (a context manager).

  Attributes:
    mib: peak resident set in MiB (float), None where /proc is missing; includes what the process
      held before the block (RSS cannot be split by phase, only its high-water mark reset).
    reset: whether the mark was reset at entry (False: the peak is the whole process's so far).
  """

  mib: float | None = None
  reset: bool = False

  def __enter__(self) -> PeakRss:
    self.reset = reset_peak_rss()
    return self

  def __exit__(self, *exc) -> None:
    self.mib = peak_rss_mib()
