"""Function-preserving growth of a T5 1.1-layout model: wider residual, more heads, wider MLP, more
layers, same vocabulary, head_dim and relative-position buckets.

The grown model computes the same logits as the small one (up to float rounding):
  * every kernel's old block is copied into the top-left corner of the new kernel;
  * weights that WRITE to the residual stream (token embedding, attention `out`, MLP `wo`) are zero
    in the new residual dims, so those dims stay exactly 0; new heads' `out` rows and new MLP
    hidden units' `wo` rows are zero, so they add nothing;
  * RMS norm over [h, 0] (new width D, old width d) gives rms(h) * sqrt(d / D), so the norm scales'
    old dims are multiplied by sqrt(d / D) to give the old outputs (but the final decoder norm's
    where the logits head is tied to the embedding: that head divides by sqrt(D) itself);
  * a new layer (appended after the old ones) has zero attention `out` and MLP `wo` kernels: with
    the residual connections it is the identity.
Weights that only READ (query/key/value/wi rows of the new residual dims, the new heads' and hidden
units' columns, the logits rows of the new dims, new layers' read kernels, new heads' relative
position biases) keep the fresh T5X initialisation instead of zero: a zero read path behind a zero
write path is a saddle where both gradients vanish, while a random read path gives the zero write
weights a gradient on the first step.

`grow_params` grows on the host in float32 (the recipe's grown initial target: the command line
`python -m speculative.train.grow`); `grow_params_in_memory` applies the same rule on the device,
in the model's dtype, for shapes whose float32 host copy would not fit (T5 1.1 XXL's shape: the
paper-shape benchmark, speculative/bench/paper_shape.py, and a job's `infer.grow_target_to`).
"""

from __future__ import annotations

from typing import Any
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import t5 as t5_lib

# Parameter names by what they do to the residual stream (the last path component's parent).
_WRITE_KERNELS = ("out", "wo")  # [in, emb]: rows = head dims / hidden units, cols = residual


def check_growable(small: t5_lib.T5Config, large: t5_lib.T5Config) -> None:
  """Raises ValueError (one line naming the field) unless `large` can be grown from `small`."""
  # Everything that sets a logit besides the grown widths and depths (the relative-position
  # buckets depend on both the bucket count and the max distance).
  same = (
    "vocab_size",
    "head_dim",
    "relative_attention_num_buckets",
    "relative_attention_max_distance",
    "logits_via_embedding",
  )
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


def _flatten(tree: dict, prefix: str = "", convert: Callable[[Any], Any] = np.asarray) -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}/", convert))
    else:
      out[prefix + key] = convert(value)
  return out


def _unflatten(flat: dict) -> dict:
  tree: dict = {}
  for path, value in flat.items():
    node = tree
    *parents, leaf = path.split("/")
    for key in parents:
      node = node.setdefault(key, {})
    node[leaf] = value
  return tree


# assign(array, index, value) -> the array with array[index] = value (in place for numpy, a new
# array for jax): the one growth rule below runs on host numpy arrays and on device jax arrays.
Assign = Callable[[Any, tuple, Any], Any]


def _grow_leaf(
  path: str, fresh, old, small: t5_lib.T5Config, large: t5_lib.T5Config, assign: Assign
):
  """The grown value of one parameter (the module docstring's rule): `fresh` is the large model's
  initial value, `old` the small model's (None: a parameter the small model lacks)."""
  parts = path.split("/")
  d = small.emb_dim
  new = fresh
  if old is not None:
    block = old
    # RMS norm over the wider, zero-padded residual; the tied logits head divides by the square
    # root of the wider width itself, which the final norm then must not undo twice.
    tied_head = large.logits_via_embedding and path == "decoder/decoder_norm/scale"
    if parts[-1] == "scale" and not tied_head:
      block = block * np.float32(np.sqrt(d / large.emb_dim))
    new = assign(new, tuple(slice(0, n) for n in old.shape), block)
  if parts[-1] == "embedding":
    new = assign(new, (slice(None), slice(d, None)), 0.0)  # the embedding writes the residual
  elif len(parts) >= 2 and parts[-2] in _WRITE_KERNELS:
    if old is not None:
      new = assign(new, (slice(None), slice(d, None)), 0.0)  # nothing writes the new residual dims
      new = assign(new, (slice(old.shape[0], None), slice(None)), 0.0)  # new heads / units: nothing
    else:
      new = assign(new, (slice(None),), 0.0)  # a new layer is the identity
  return new


def _assign_numpy(array: np.ndarray, index: tuple, value) -> np.ndarray:
  array[index] = value
  return array


def _assign_jax(array: jax.Array, index: tuple, value) -> jax.Array:
  return array.at[index].set(jnp.asarray(value, jnp.float32).astype(array.dtype))


def grow_params(
  small_params: dict,
  small: t5_lib.T5Config,
  large: t5_lib.T5Config,
  seed: int = 0,
) -> dict:
  """The grown float32 parameter tree on the host (see the module docstring); `small_params` is not
  changed. Holds a float32 host copy of the large model: for models up to a few billion
  parameters; `grow_params_in_memory` grows on the device, in bfloat16."""
  check_growable(small, large)
  fresh = _flatten(jax.device_get(t5_lib.T5(large).init_params(jax.random.PRNGKey(seed))))
  old = _flatten(small_params)
  grown = {}
  for path, init in fresh.items():
    block = np.asarray(old[path], np.float32) if path in old else None
    grown[path] = _grow_leaf(path, np.array(init, np.float32), block, small, large, _assign_numpy)
  return _unflatten(grown)


def grow_params_in_memory(
  small_params: dict,
  small: t5_lib.T5Config,
  large: t5_lib.T5Config,
  seed: int = 0,
  dtype: str = "bfloat16",
) -> dict:
  """The grown parameter tree (the same rule as `grow_params`) on jax's default device, stored in
  `dtype`: the fresh large tree is initialised in `dtype` on the device (`T5.init_params`), then
  grown one leaf at a time, so the peak is one large tree in `dtype` plus a leaf, with no host
  copy (T5 1.1 XXL's shape: ~22 GB in bfloat16 where `grow_params` needs ~44 GB of float32 twice
  over on the host). The small model's values are rounded to `dtype` once (a norm scale after its
  sqrt(d / D) factor, in float32): the grown model computes the small one's logits up to that
  rounding. Refused (ValueError, before any compute) where `check_growable` refuses."""
  check_growable(small, large)
  fresh = _flatten(
    t5_lib.T5(large).init_params(jax.random.PRNGKey(seed), dtype), convert=lambda x: x
  )
  old = _flatten(small_params)
  grown = {}
  for path in list(fresh):
    init = fresh.pop(path)  # the fresh leaf is freed as its grown value is made
    block = jnp.asarray(old[path], jnp.float32) if path in old else None
    grown[path] = _grow_leaf(path, init, block, small, large, _assign_jax)
    del init
  return _unflatten(grown)
