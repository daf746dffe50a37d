"""Function-preserving growth of a T5 1.1-layout model, from a weights file to a float32 one.

The rule is speculative/models/grow.py's; the grown weights are the recipe's initial target (pass
them as `train.init_checkpoint`, docs/training.md).

    python -m speculative.train.grow --small ../runs/small_pair/small_target.msgpack \
      --small_gin configs/models/small_target.gin --small_macro SMALL_TARGET \
      --large_gin configs/models/embedded_target.gin --large_macro EMBEDDED_TARGET \
      --output ../runs/multitask_grown_init.msgpack
"""

from __future__ import annotations

import argparse
from typing import Sequence

import jax
import numpy as np

from speculative import checkpoints
from speculative.models import grow
from speculative.models import t5 as t5_lib


def main(argv: Sequence[str] | None = None) -> None:
  from speculative.jobs import gin_utils  # the command line only: the library stays free of gin

  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--small", required=True, help="weights of the small model (.msgpack)")
  parser.add_argument("--small_gin", required=True)
  parser.add_argument("--small_macro", required=True)
  parser.add_argument("--large_gin", required=True)
  parser.add_argument("--large_macro", required=True)
  parser.add_argument("--output", required=True)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  small = gin_utils.load_macro(args.small_gin, args.small_macro, t5_lib.T5Config)
  large = gin_utils.load_macro(args.large_gin, args.large_macro, t5_lib.T5Config)
  params = checkpoints.load_params(args.small, dtype=np.float32)
  checkpoints.validate_params(params, t5_lib.T5(small).param_shapes(), name=args.small)
  grown = grow.grow_params(params, small, large, args.seed)
  checkpoints.save_params(grown, args.output, dtype="float32", config=large)
  n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(grown))
  print(f"grew {args.small} into {n / 1e6:.2f}M params: {args.output}")


if __name__ == "__main__":
  main()
