"""Which matmul path a job runs: the kernels or XLA's dot, chosen once per job, never per call.

A job's 1-token steps and its (gamma+1)-token verifies must go through the same arithmetic (that is
what makes greedy speculative decoding token-identical to the baseline), so the choice is made
before the models load, from the job's settings, and recorded in its manifest: a resume on the
other path is refused like any other changed setting.

  'on'    the kernels; an error (one line, before any compute) if they are not available
  'off'   XLA's dot
  'auto'  the kernels where they are available and the batch size is at most `AUTO_MAX_BATCH`
          (above it XLA's dot was faster; docs/cpu_runtime.md), else XLA

`SPECULATIVE_KERNELS=0` in the environment switches the kernels off for every job ('on' is then an
error that says so).
"""

from __future__ import annotations

import dataclasses

from speculative.kernels import library

SETTINGS = ('auto', 'on', 'off')
KERNELS = 'kernels'
XLA = 'xla'
# The largest batch at which the kernels were measured faster than XLA's dot (docs/cpu_runtime.md).
AUTO_MAX_BATCH = 8


@dataclasses.dataclass(frozen=True)
class Path:
  """The chosen path: `name` is 'kernels' or 'xla' (what a manifest records), `line` says why."""

  name: str
  line: str

  @property
  def kernels(self) -> bool:
    return self.name == KERNELS


def check_setting(setting: str) -> None:
  if setting not in SETTINGS:
    raise ValueError(f'kernels must be one of {SETTINGS}, got {setting!r}')


def choose(setting: str, batch_size: int) -> Path:
  """The path of a job with this `kernels` setting and batch size (raises ValueError for 'on'
  where the kernels are unavailable)."""
  check_setting(setting)
  if setting == 'off':
    return Path(XLA, 'XLA dot (kernels = off)')
  if not library.available():
    if setting == 'on':
      raise ValueError(f'kernels = on, but {library.status()}')
    return Path(XLA, f'XLA dot ({library.status()})')
  isa = library.best_isa()
  if setting == 'on':
    return Path(KERNELS, f'CPU kernels, {isa} (kernels = on)')
  if batch_size > AUTO_MAX_BATCH:
    return Path(XLA, f'XLA dot (kernels = auto: batch {batch_size} > {AUTO_MAX_BATCH})')
  return Path(
    KERNELS, f'CPU kernels, {isa} (kernels = auto: batch {batch_size} <= {AUTO_MAX_BATCH})'
  )
