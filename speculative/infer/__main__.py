"""`python -m speculative.infer`: the batch inference job (speculative.infer.run)."""

from speculative.infer import main

if __name__ == '__main__':
  main()
