"""`python -m speculative.infer`: the batch inference job (speculative.infer.run)."""

from speculative.infer import run

if __name__ == '__main__':
  run.main()
