"""Training a T5 (T5X parameter tree) on a parallel TSV corpus; optional draft distillation.

python -m speculative.train --gin_file=configs/train/small_target.gin

run          `train` (the gin configurable) and `main`
data         length buckets and batches of a TSV corpus
checkpoints  the training state's checkpoints, their origin and forks
grow         the command line of function-preserving growth (the rule: speculative/models/grow.py)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any
from typing import Sequence

from speculative.jobs import interrupts

if TYPE_CHECKING:  # at run time, `__getattr__` below
  from speculative.train.run import export_params
  from speculative.train.run import train

__all__ = ['export_params', 'main', 'train']


def main(argv: Sequence[str] | None = None) -> Any:
  """`speculative-train` and `python -m speculative.train`: speculative.train.run.main, inside
  `interrupts.before_job` (a Ctrl-C while jax imports: one line, exit status 130)."""
  return interrupts.run_main('speculative-train', 'speculative.train.run', argv)


def __getattr__(name: str) -> Any:
  # `export_params` and `train` live in speculative.train.run, which imports jax: loaded when first
  # asked for, so that the entry's import of `main` takes milliseconds, before `before_job`.
  if name in ('export_params', 'train'):
    return getattr(importlib.import_module('speculative.train.run'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
