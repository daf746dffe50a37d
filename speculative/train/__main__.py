"""`python -m speculative.train`: training (speculative.train.run)."""

from speculative.train import main

if __name__ == '__main__':
  main()
