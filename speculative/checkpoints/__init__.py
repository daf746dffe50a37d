"""Weights on disk, read and written without t5x: one import for the five parts.

  weights_format    the content hash and metadata sidecar (model config + sha256) verified before
                    weights load, msgpack decoding that names a corrupt file, storage dtypes
  t5x_format        T5X checkpoint directories (format version 3: msgpack + gzip zarr arrays),
                    read and written atomically so that stock T5X restores them
  params_files      our compact single-file weights (flax msgpack, optionally bfloat16), the
                    shape check of a parameter tree against a model's, and `load_model` (a T5
                    and its float32 params from either kind)
  files             atomic writes and the clean-up of a killed writer's temporaries
  preflight         `check_weights`: a weights path checked before any compute (one line naming
                    the setting, the file and what is wrong)

`load_t5x_checkpoint` returns the `target` tree (the model parameters, no 'params' key), which is
exactly the `speculative.models.t5.T5` parameter tree; `load_params` reads either kind.
"""

from flax import serialization  # noqa: F401  (tests patch serialization through this module)

from speculative.checkpoints.files import remove_stale_temporaries
from speculative.checkpoints.files import write_atomic
from speculative.checkpoints.params_files import add_metadata
from speculative.checkpoints.params_files import load_model
from speculative.checkpoints.params_files import load_params
from speculative.checkpoints.params_files import save_params
from speculative.checkpoints.params_files import validate_params
from speculative.checkpoints.preflight import LOAD_ERRORS
from speculative.checkpoints.preflight import check_weights
from speculative.checkpoints.t5x_format import T5X_CHECKPOINT_VERSION
from speculative.checkpoints.t5x_format import checkpoint_steps
from speculative.checkpoints.t5x_format import find_checkpoint_dir
from speculative.checkpoints.t5x_format import load_t5x_checkpoint
from speculative.checkpoints.t5x_format import read_t5x_checkpoint
from speculative.checkpoints.t5x_format import save_t5x_checkpoint
from speculative.checkpoints.weights_format import COMPUTE_ONLY_FIELDS
from speculative.checkpoints.weights_format import METADATA_FORMAT
from speculative.checkpoints.weights_format import CheckpointError
from speculative.checkpoints.weights_format import check_config
from speculative.checkpoints.weights_format import config_dict
from speculative.checkpoints.weights_format import metadata_path
from speculative.checkpoints.weights_format import read_metadata
from speculative.checkpoints.weights_format import sha256_of
from speculative.checkpoints.weights_format import verify_weights

__all__ = [
  'METADATA_FORMAT',
  'T5X_CHECKPOINT_VERSION',
  'COMPUTE_ONLY_FIELDS',
  'CheckpointError',
  'LOAD_ERRORS',
  'add_metadata',
  'check_config',
  'check_weights',
  'checkpoint_steps',
  'config_dict',
  'find_checkpoint_dir',
  'load_model',
  'load_params',
  'load_t5x_checkpoint',
  'metadata_path',
  'read_metadata',
  'read_t5x_checkpoint',
  'remove_stale_temporaries',
  'save_params',
  'save_t5x_checkpoint',
  'sha256_of',
  'validate_params',
  'verify_weights',
  'write_atomic',
]
