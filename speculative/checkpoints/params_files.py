"""Our own weight files: one flax-msgpack file per model (optionally stored as bfloat16/float16;
computation stays float32) with its metadata sidecar, the shape check of a parameter tree against
a model's, and `load_model`: a T5 with its float32 params from either kind of weights."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any
from typing import Mapping

import flax
from flax import serialization
import jax
import jax.numpy as jnp
import numpy as np

from speculative.checkpoints import files
from speculative.checkpoints import t5x_format
from speculative.checkpoints import weights_format

Params = Any
PathLike = str | os.PathLike


def save_params(
  params: Params,
  path: PathLike,
  dtype: Any | None = 'bfloat16',
  config: Any = None,
  extra: dict | None = None,
) -> Path:
  """Writes params as one flax-msgpack file, floats cast to `dtype` (None keeps them); atomic.

  The sidecar `<path>.json` records the file's sha256 and `config` (the model config dataclass,
  or None), which `load_params` verifies, and the JSON-serializable `extra` entries (e.g. the
  training provenance of exported weights). A crash between the two writes leaves the file without
  a sidecar (it then loads with a warning), never with a stale one.
  """
  path = Path(path)
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  tree = jax.tree.map(lambda x: weights_format.host_array(x, np_dtype), flax.core.unfreeze(params))
  data = serialization.msgpack_serialize(tree)
  sidecar = weights_format.metadata_path(path)
  if sidecar.exists():
    os.remove(sidecar)
  files.write_atomic(path, data)
  weights_format.write_metadata(
    path, hashlib.sha256(data).hexdigest(), config, {**(extra or {}), 'dtype': str(dtype)}
  )
  return path


def load_params(path: PathLike, dtype: Any | None = np.float32, config: Any = None) -> Params:
  """Reads params from a `save_params` file (or, if `path` is a directory, a T5X checkpoint).

  Floating-point arrays are cast to `dtype` (None keeps the stored dtype). The file is verified
  against its metadata (sha256, and `config` if given and recorded; `verify_weights`).
  """
  path = Path(path)
  if path.is_dir():
    return t5x_format.load_t5x_checkpoint(path, dtype=dtype, config=config)
  if not path.is_file():
    raise FileNotFoundError(f'params file does not exist: {path}')
  data = path.read_bytes()
  weights_format.verify_weights(path, config, data=data)
  tree = weights_format.restore_msgpack(data, f'params file {path}')
  if not isinstance(tree, dict):
    raise weights_format.CheckpointError(f'params file {path} does not hold a dict of arrays')
  if set(tree) == {'version', 'optimizer'}:
    raise weights_format.CheckpointError(
      f'{path} is a T5X checkpoint msgpack; pass its directory instead'
    )
  np_dtype = None if dtype is None else jnp.dtype(dtype)
  return jax.tree.map(lambda x: weights_format.host_array(x, np_dtype), tree)


def add_metadata(path: PathLike, config: Any, extra: dict | None = None) -> Path:
  """Writes the sidecar (sha256 + config) of a params file saved before sidecars existed, after
  checking that the file loads and its shapes match `config` (a T5Config). Returns the sidecar."""
  from speculative.models import t5 as t5_lib  # pylint: disable=g-import-not-at-top

  path = Path(path)
  params = load_params(path)
  validate_params(params, t5_lib.T5(config).param_shapes(), name=str(path))
  weights_format.write_metadata(path, hashlib.sha256(path.read_bytes()).hexdigest(), config, extra)
  return weights_format.metadata_path(path)


def _flat_shapes(tree_or_shapes: Any) -> dict[str, tuple[int, ...]]:
  if (
    isinstance(tree_or_shapes, Mapping)
    and tree_or_shapes
    and all(
      isinstance(k, str) and not isinstance(v, Mapping) and isinstance(v, (tuple, list))
      for k, v in tree_or_shapes.items()
    )
  ):
    return {k: tuple(int(d) for d in v) for k, v in tree_or_shapes.items()}
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(tree_or_shapes), sep='/')
  return {k: tuple(np.shape(v)) for k, v in flat.items()}


def validate_params(params: Params, expected_shapes: Any, *, name: str = 'params') -> None:
  """Raises `CheckpointError` if an array is missing, unexpected or mis-shaped: one line naming the
  first (`shape_difference`) and how many differ.

  Args:
    params: a nested dict of arrays.
    expected_shapes: flat {'encoder/layers_0/attention/query/kernel': shape} (e.g.
      `T5.param_shapes()`) or a nested tree of arrays / `jax.ShapeDtypeStruct`s.
    name: what `params` is, for the message (e.g. the checkpoint path).
  """
  difference = shape_difference(params, expected_shapes)
  if difference is not None:
    raise weights_format.CheckpointError(f'{name} do not match the model: {difference}')


def shape_difference(got: Any, want: Any) -> str | None:
  """How the arrays `got` differ from the model's `want` (each as `validate_params` takes them), in
  one line: the first array of another shape, else the first missing one, else the first one the
  model does not have (by name), and how many differ; None where they match."""
  got, want = _flat_shapes(got), _flat_shapes(want)
  mismatched = sorted(k for k in set(want) & set(got) if want[k] != got[k])
  missing = sorted(set(want) - set(got))
  unexpected = sorted(set(got) - set(want))
  if mismatched:
    key = mismatched[0]
    first = f'{key} has shape {got[key]}, the model expects {want[key]}'
  elif missing:
    first = f'{missing[0]} {want[missing[0]]} is missing'
  elif unexpected:
    first = f'{unexpected[0]} {got[unexpected[0]]} is not in the model'
  else:
    return None
  counts = [(len(mismatched), 'of another shape'), (len(missing), 'missing')]
  counts.append((len(unexpected), 'not in the model'))
  total = sum(n for n, _ in counts)
  if total > 1:
    first += f' ({total} arrays differ: {", ".join(f"{n} {what}" for n, what in counts if n)})'
  return first


def load_model(config: Any, checkpoint: PathLike) -> tuple[Any, Params]:
  """A `T5(config)` and its float32 params (jax arrays) from a T5X checkpoint dir or a `.msgpack`
  params file, verified against the weights' metadata and shape-checked."""
  from speculative.models import t5 as t5_lib  # pylint: disable=g-import-not-at-top

  if not checkpoint:
    raise ValueError('no checkpoint path given')
  if not os.path.exists(checkpoint):
    raise FileNotFoundError(f'checkpoint does not exist: {checkpoint}')
  model = t5_lib.T5(config)
  params = load_params(checkpoint, dtype=np.float32, config=config)
  validate_params(params, model.param_shapes(), name=checkpoint)
  return model, jax.tree_util.tree_map(jnp.asarray, params)
