"""Batch inference: speculative decoding (and the baseline) over a task or an input file.

  python -m speculative.infer --gin_file=configs/local/run.gin

The job's parts, one module each:
  run       `infer` (the gin configurable) and `main`: the modes over the batches
  settings  InferSettings and its checks, made before any weights load
  inputs    task or file examples
  outputs   the manifest, predictions and timings, and the resume of an interrupted job
  report    the summary and report.md
  auto_gamma  GAMMA = 'auto': each batch's gamma from the costs measured on the job's batches
  compare   two greedy jobs of one target row by row, every divergence audited
"""

from speculative.infer.run import infer
from speculative.infer.run import main

__all__ = ['infer', 'main']
