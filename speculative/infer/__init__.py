"""Batch inference: speculative decoding (and the baseline) over a task or an input file.

  python -m speculative.infer --gin_file=configs/local/run.gin

The job's parts, one module each:
  run       `infer` (the gin configurable) and `main`: the job, from its checks to its summary
  batches   the modes over the batches, timed, each batch written as soon as it is done
  settings  InferSettings and its checks, made before any weights load
  inputs    task or file examples
  outputs   the manifest, predictions and timings, and the resume of an interrupted job
  report    the summary and report.md
  auto_gamma  GAMMA = 'auto': each batch's gamma from the costs measured on the job's batches
  compare   two greedy jobs of one target row by row, every divergence audited
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any
from typing import Sequence

from speculative.jobs import interrupts

if TYPE_CHECKING:  # at run time, `__getattr__` below
  from speculative.infer.run import infer

__all__ = ['infer', 'main']


def main(argv: Sequence[str] | None = None) -> Any:
  """`speculative-infer` and `python -m speculative.infer`: speculative.infer.run.main, inside
  `interrupts.before_job` (a Ctrl-C while jax imports: one line, exit status 130)."""
  return interrupts.run_main('speculative-infer', 'speculative.infer.run', argv)


def __getattr__(name: str) -> Any:
  # `infer` lives in speculative.infer.run, which imports jax: loaded when first asked for, so that
  # the entry's import of `main` takes milliseconds, before `interrupts.before_job`.
  if name == 'infer':
    return getattr(importlib.import_module('speculative.infer.run'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
