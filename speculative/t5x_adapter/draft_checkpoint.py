"""Restoring the draft model's weights alongside a stock T5X target checkpoint (no t5x import).

Why the draft lives in the parameter tree. T5X jit-compiles `predict_batch_with_aux(params, batch,
rng)` under its partitioner; anything the model closes over instead of receiving as an argument is
embedded in the compiled program as a constant, so the program grows with the weights (docs/design.md,
section 5). A T5-large draft (3 GB) cannot travel that way. So
`SpeculativeEncoderDecoderModel` declares the draft parameters as part of its parameter tree, under
the top-level key `'draft'` (next to T5X's `token_embedder`, `encoder`, `decoder`), with T5X logical
axis names; T5X then shards, places and passes them exactly like the target's.

Stock T5X checkpoints do not hold a `'draft'` subtree, so the run's restore config gets one more
state transformation, `add_draft_checkpoint`, bound in gin:

  utils.RestoreCheckpointConfig.state_transformation_fns = [@t5x_adapter.add_draft_checkpoint]
  t5x_adapter.add_draft_checkpoint.path = %DRAFT_CHECKPOINT_PATH

T5X applies it to the target checkpoint's state dict right after reading the msgpack, before any array
is read: it loads the draft checkpoint (a T5X checkpoint directory, its model directory, or a
`speculative.checkpoints.save_params` .msgpack file) with `speculative.checkpoints.load_params`,
checks every shape against the model's draft tree, and inserts the arrays (as host numpy arrays, which
T5X's restore then shards onto the mesh like any inline array). The target checkpoint is untouched.
"""

from __future__ import annotations

import os
from typing import Any
from typing import Mapping

import flax
import numpy as np

from speculative import checkpoints

# Top-level key of the draft parameters inside the model's parameter tree.
DRAFT_KEY = 'draft'


def _is_remote(path: str) -> bool:
  return '://' in str(path)


def load_draft_params(path: str, expected: Any | None = None, *, dtype: Any | None = None) -> dict:
  """Draft parameters as a nested dict of numpy arrays, shape-checked against `expected`.

  Args:
    path: a T5X checkpoint directory (`checkpoint_<step>/`), a model directory (latest step), or a
      `.msgpack` params file. Local paths only (copy gs:// checkpoints first, or use a gcsfuse mount).
    expected: the model's draft tree (arrays or `jax.ShapeDtypeStruct`s) or flat shapes; None skips
      the check.
    dtype: cast floating-point arrays to this dtype (None: to the dtype of the matching `expected`
      leaf when it has one, else keep the stored dtype).
  """
  if not path:
    raise ValueError('no draft checkpoint path given (bind DRAFT_CHECKPOINT_PATH)')
  path = os.fspath(path)
  if _is_remote(path):
    raise ValueError(
      f'draft checkpoint {path!r}: only local paths are supported; copy it to local '
      'disk (or a gcsfuse mount) and point DRAFT_CHECKPOINT_PATH there'
    )
  if not os.path.exists(path):
    raise FileNotFoundError(f'draft checkpoint does not exist: {path}')
  # Absolute: tensorstore's file driver rejects relative paths with '..' components.
  params = checkpoints.load_params(os.path.abspath(path), dtype=dtype)
  params = flax.core.unfreeze(params)
  if expected is not None:
    checkpoints.validate_params(params, expected, name=f'draft checkpoint {path}')
    if dtype is None:
      flat_expected = (
        flax.traverse_util.flatten_dict(flax.core.unfreeze(expected), sep='/')
        if not _is_flat_shapes(expected)
        else {}
      )
      flat = flax.traverse_util.flatten_dict(params, sep='/')
      for key, value in flat.items():
        want = getattr(flat_expected.get(key), 'dtype', None)
        if want is not None and np.issubdtype(value.dtype, np.floating) and value.dtype != want:
          flat[key] = value.astype(want)
      params = flax.traverse_util.unflatten_dict(flat, sep='/')
  return params


def _is_flat_shapes(tree: Any) -> bool:
  return (
    isinstance(tree, Mapping)
    and bool(tree)
    and all(isinstance(v, (tuple, list)) for v in tree.values())
  )


def add_draft_checkpoint(
  state_dict: Mapping[str, Any],
  target_state_dict: Mapping[str, Any],
  *,
  is_resuming: bool = False,
  path: str | None = None,
  key: str = DRAFT_KEY,
) -> dict:
  """T5X `RestoreStateTransformationFn`: puts the draft checkpoint's params under `target/<key>`.

  Args:
    state_dict: the checkpoint's optimizer state dict as T5X read it ({'target': params, 'state':
      ...}; large arrays are still tensorstore specs).
    target_state_dict: the state dict of the train state being restored (shapes and dtypes).
    is_resuming: part of T5X's protocol; unused.
    path: the draft checkpoint (see `load_draft_params`); bound in gin to %DRAFT_CHECKPOINT_PATH.
    key: the draft's top-level key in the model's parameter tree.

  Returns:
    A new state dict with `state_dict['target'][key]` = the draft parameters (numpy).
  """
  del is_resuming
  if 'target' not in state_dict:
    raise ValueError(
      f"checkpoint state has no 'target' parameters (keys: {sorted(state_dict)}); "
      'expected a T5X checkpoint'
    )
  expected_target = target_state_dict.get('target', {}) if target_state_dict else {}
  if key not in expected_target:
    raise ValueError(
      f'the model has no {key!r} parameters to restore a draft into; '
      'add_draft_checkpoint is only for SpeculativeEncoderDecoderModel'
    )
  if not path:
    if key in state_dict['target']:
      return dict(state_dict)  # a combined checkpoint that already holds the draft
    raise ValueError(
      'no draft checkpoint: bind DRAFT_CHECKPOINT_PATH (add_draft_checkpoint.path) '
      'to the draft T5X checkpoint directory'
    )
  draft = load_draft_params(path, expected_target[key])
  new_state = dict(state_dict)
  new_state['target'] = dict(state_dict['target'])
  new_state['target'][key] = draft
  return new_state
