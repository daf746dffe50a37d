"""`python -m speculative.train`: training (speculative.train.run)."""

from speculative.train import run

if __name__ == '__main__':
  run.main()
