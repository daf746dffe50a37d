"""Stub of `t5x.examples.t5.network`: the config and the module type that gin files bind.

`T5Config` has T5X's fields and defaults; `Transformer` holds one, as T5X's does. The adapter only
reads `Transformer.config` (its own `T5XTransformer` computes), so this `Transformer` has no layers.
"""

from __future__ import annotations

from typing import Any
from typing import Sequence

from flax import linen as nn
from flax import struct
import jax.numpy as jnp


@struct.dataclass
class T5Config:
  """T5X's network hyperparameters (same fields, same defaults)."""

  vocab_size: int
  dtype: Any = jnp.float32
  emb_dim: int = 512
  num_heads: int = 8
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  head_dim: int = 64
  mlp_dim: int = 2048
  mlp_activations: Sequence[str] = ('relu',)
  dropout_rate: float = 0.1
  logits_via_embedding: bool = False
  float32_attention_logits: bool = False


class Transformer(nn.Module):
  """T5X's encoder-decoder module type, without layers (calling it is an error)."""

  config: T5Config

  def __call__(self, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError('t5x stub: network.Transformer has no layers (only real t5x)')
