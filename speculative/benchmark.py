"""`python -m speculative.benchmark`: the walltime benchmark (speculative.bench.main)."""

from speculative.bench.main import benchmark
from speculative.bench.main import main

__all__ = ['benchmark', 'main']

if __name__ == '__main__':
  main()
