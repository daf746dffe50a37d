"""Which matmul path a job runs: the kernels or XLA's dot, chosen once per job, never per call.

A job's 1-token steps and its (gamma+1)-token verifies must go through the same arithmetic (that is
what makes greedy speculative decoding token-identical to the baseline), so the choice is made
before the models load, from the job's settings, and recorded in its manifest: a resume on the
other path is refused like any other changed setting.

  'on'    the kernels; an error (one line, before any compute) if they are not available or the
          job does not compute on CPU
  'off'   XLA's dot
  'auto'  the kernels where the job computes on CPU, they are available and the batch size is at
          most `AUTO_MAX_BATCH` (one AVX-512 row tile; see the constant), else XLA

The kernels are CPU code registered for XLA's 'cpu' platform, so where the job's arrays live on a
GPU or TPU (`backend`: jax's default backend, not the host's CPU features) there is no handler for
them: 'auto' takes XLA's dot there and says why, 'on' is refused.

`SPECULATIVE_KERNELS=0` in the environment switches the kernels off for every job ('on' is then an
error that says so).
"""

from __future__ import annotations

import dataclasses

import jax

from speculative.kernels import library

SETTINGS = ('auto', 'on', 'off')
KERNELS = 'kernels'
XLA = 'xla'
# The largest batch 'auto' runs on the kernels: up to 8 rows a step's matmuls are one AVX-512 row
# tile (matmul.cc), each weight streamed once; larger batches take XLA's dot.
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


def backend(platform: str | None = None) -> str:
  """The platform the job computes on: `platform` where given, else jax's default backend ('cpu',
  'gpu', 'tpu'), where the job's arrays live and its steps run. The one place that is detected
  (tests pass or monkeypatch another)."""
  return jax.default_backend() if platform is None else platform


def off_cpu(platform: str | None = None) -> str | None:
  """None where the job computes on CPU; elsewhere why the CPU kernels cannot run, in words
  ('this job computes on gpu: the CPU kernels run on cpu only')."""
  where = backend(platform)
  return (
    None if where == 'cpu' else f'this job computes on {where}: the CPU kernels run on cpu only'
  )


def choose(setting: str, batch_size: int, platform: str | None = None) -> Path:
  """The path of a job with this `kernels` setting and batch size on `platform` (default: the
  job's backend); raises ValueError for 'on' where the kernels are unavailable or the job does not
  compute on CPU."""
  check_setting(setting)
  if setting == 'off':
    return Path(XLA, 'XLA dot (kernels = off)')
  where = backend(platform)
  if where != 'cpu':
    if setting == 'on':
      raise ValueError(f"kernels = on, but {off_cpu(where)} (KERNELS = 'auto' or 'off')")
    return Path(
      XLA, f'XLA dot (kernels = auto: the job computes on {where}; the CPU kernels run on cpu only)'
    )
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
