"""Training a T5 (T5X parameter tree) on a parallel TSV corpus; optional draft distillation.

python -m speculative.train --gin_file=configs/train/small_target.gin

run          `train` (the gin configurable) and `main`
data         length buckets and batches of a TSV corpus
checkpoints  the training state's checkpoints, their origin and forks
grow         the command line of function-preserving growth (the rule: speculative/models/grow.py)
"""

from speculative.train.run import export_params
from speculative.train.run import main
from speculative.train.run import train

__all__ = ['export_params', 'main', 'train']
