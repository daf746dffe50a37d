"""`python -m speculative.benchmark`: the walltime benchmark (speculative.bench.main)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING
from typing import Any
from typing import Sequence

from speculative.jobs import interrupts

if TYPE_CHECKING:  # at run time, `__getattr__` below
  from speculative.bench.main import benchmark

__all__ = ['benchmark', 'main']


def main(argv: Sequence[str] | None = None) -> Any:
  """`speculative-benchmark` and `python -m speculative.benchmark`: speculative.bench.main.main,
  inside `interrupts.before_job` (a Ctrl-C while jax imports: one line, exit status 130)."""
  return interrupts.run_main('speculative-benchmark', 'speculative.bench.main', argv)


def __getattr__(name: str) -> Any:
  # `benchmark` lives in speculative.bench.main, which imports jax: loaded when first asked for, so
  # that the entry's import of `main` takes milliseconds, before `interrupts.before_job`.
  if name == 'benchmark':
    return getattr(importlib.import_module('speculative.bench.main'), name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


if __name__ == '__main__':
  main()
