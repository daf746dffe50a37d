"""T5 v1.1 hyperparameters (`T5Config`, T5X's `network.T5Config` field names), validated."""

from __future__ import annotations

import dataclasses
from typing import Sequence

from flax import linen as nn
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class T5Config:
  """T5 hyperparameters; field names follow T5X's `network.T5Config` (plus position/special ids).

  `dtype` is the activation dtype name ('float32' or 'bfloat16'); parameters are created in float32
  (held in another dtype only where `T5.init_params` or `grow_params_in_memory` is given one) and
  logits are always float32.

  `logits_dtype` is the dtype of the logits head: the decoder's final RMS norm output that feeds
  the float32 vocabulary projection. None (default, as T5X) = `dtype`, so in bfloat16 the normed
  hidden state is rounded to bfloat16 before the float32 projection; 'float32' keeps it in float32.
  `float32_attention_logits` does the same for the attention scores and softmax. Both apply in
  every path (`forward`, 1-token and multi-token `extend`), so baseline decoding and speculative
  verification still run the same model (docs/exactness.md).
  """

  vocab_size: int = 32128
  dtype: str = 'float32'
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('gelu', 'linear')
  dropout_rate: float = 0.0
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False
  logits_dtype: str | None = None
  relative_attention_num_buckets: int = 32
  relative_attention_max_distance: int = 128
  decoder_start_token_id: int = 0
  eos_id: int = 1
  pad_id: int = 0

  def __post_init__(self):
    # Normalise so that equal configs hash equally (gin/JSON may give lists and dtype objects).
    object.__setattr__(self, 'mlp_activations', tuple(self.mlp_activations))
    object.__setattr__(self, 'dtype', jnp.dtype(self.dtype).name)
    if self.logits_dtype is not None:
      object.__setattr__(self, 'logits_dtype', jnp.dtype(self.logits_dtype).name)
      if self.logits_dtype != 'float32':
        raise ValueError(
          f"T5Config.logits_dtype must be None (= dtype) or 'float32', got {self.logits_dtype!r}"
        )
    for name in (
      'vocab_size',
      'emb_dim',
      'num_heads',
      'num_encoder_layers',
      'num_decoder_layers',
      'head_dim',
      'mlp_dim',
      'relative_attention_num_buckets',
      'relative_attention_max_distance',
    ):
      value = getattr(self, name)
      if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f'T5Config.{name} must be a positive integer, got {value!r}')
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(f'T5Config.dropout_rate must be in [0, 1), got {self.dropout_rate!r}')
    if not self.mlp_activations:
      raise ValueError('T5Config.mlp_activations must name at least one activation')
    for act in self.mlp_activations:
      if act != 'linear' and not callable(getattr(nn, act, None)):
        raise ValueError(f'T5Config.mlp_activations: unknown activation {act!r}')
