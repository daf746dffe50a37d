"""Function-preserving growth of a T5 1.1-layout model: wider residual, more heads, wider MLP, more
layers, same vocabulary, head_dim and relative-position buckets.

The grown model computes the same logits as the small one (up to float rounding):
  * every kernel's old block is copied into the top-left corner of the new kernel;
  * weights that WRITE to the residual stream (token embedding, attention `out`, MLP `wo`) are zero
    in the new residual dims, so those dims stay exactly 0; new heads' `out` rows and new MLP
    hidden units' `wo` rows are zero, so they add nothing;
  * RMS norm over [h, 0] (new width D, old width d) gives rms(h) * sqrt(d / D), so the norm scales'
    old dims are multiplied by sqrt(d / D) to give the old outputs;
  * a new layer (appended after the old ones) has zero attention `out` and MLP `wo` kernels: with
    the residual connections it is the identity.
Weights that only READ (query/key/value/wi rows of the new residual dims, the new heads' and hidden
units' columns, the logits rows of the new dims, new layers' read kernels, new heads' relative
position biases) keep the fresh T5X initialisation instead of zero: a zero read path behind a zero
write path is a saddle where both gradients vanish, while a random read path gives the zero write
weights a gradient on the first step.

    python -m speculative.train.grow --small ../runs/small_pair/small_target.msgpack \
      --small_gin configs/models/small_target.gin --small_macro SMALL_TARGET \
      --large_gin configs/models/embedded_target.gin --large_macro EMBEDDED_TARGET \
      --output ../runs/multitask_grown_init.msgpack

writes float32 weights to pass as `train.init_checkpoint`.
"""

from __future__ import annotations

import argparse
from typing import Sequence

import jax
import numpy as np

from speculative import checkpoints
from speculative.models import t5 as t5_lib

# Parameter names by what they do to the residual stream (the last path component's parent).
_WRITE_KERNELS = ("out", "wo")  # [in, emb]: rows = head dims / hidden units, cols = residual


def _check_growable(small: t5_lib.T5Config, large: t5_lib.T5Config) -> None:
  same = ("vocab_size", "head_dim", "relative_attention_num_buckets", "logits_via_embedding")
  for name in same:
    if getattr(small, name) != getattr(large, name):
      raise ValueError(
        f"cannot grow: {name} differs ({getattr(small, name)} vs {getattr(large, name)})"
      )
  if tuple(small.mlp_activations) != tuple(large.mlp_activations):
    raise ValueError("cannot grow: mlp_activations differ")
  for name in ("emb_dim", "num_heads", "mlp_dim", "num_encoder_layers", "num_decoder_layers"):
    if getattr(large, name) < getattr(small, name):
      raise ValueError(
        f"cannot grow: {name} shrinks ({getattr(small, name)} -> {getattr(large, name)})"
      )


def _flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}/"))
    else:
      out[prefix + key] = np.asarray(value)
  return out


def _unflatten(flat: dict[str, np.ndarray]) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


def grow_params(
  small_params: dict,
  small: t5_lib.T5Config,
  large: t5_lib.T5Config,
  seed: int = 0,
) -> dict:
  """The grown float32 parameter tree (see the module docstring); `small_params` is not changed."""
  _check_growable(small, large)
  fresh = _flatten(jax.device_get(t5_lib.T5(large).init_params(jax.random.PRNGKey(seed))))
  old = _flatten(small_params)
  d, big_d = small.emb_dim, large.emb_dim
  norm_factor = np.float32(np.sqrt(d / big_d))
  grown = {}
  for path, init in fresh.items():
    new = np.array(init, np.float32)
    parts = path.split("/")
    if path in old:
      block = np.asarray(old[path], np.float32)
      if parts[-1] == "scale":  # RMS norm over the wider, zero-padded residual
        block = block * norm_factor
      new[tuple(slice(0, n) for n in block.shape)] = block
    if parts[-1] == "embedding":
      new[:, d:] = 0.0  # the embedding writes the residual stream
    elif len(parts) >= 2 and parts[-2] in _WRITE_KERNELS:
      if path in old:
        new[:, d:] = 0.0  # nothing writes to the new residual dims
        new[old[path].shape[0] :, :] = 0.0  # new heads / hidden units write nothing
      else:
        new[:] = 0.0  # a new layer is the identity
    grown[path] = new
  return _unflatten(grown)


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
  grown = grow_params(params, small, large, args.seed)
  checkpoints.save_params(grown, args.output, dtype="float32", config=large)
  n = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(grown))
  print(f"grew {args.small} into {n / 1e6:.2f}M params: {args.output}")


if __name__ == "__main__":
  main()
