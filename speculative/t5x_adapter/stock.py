"""Stock T5X itself, for timing beside our decoding (`speculative.bench`'s `stock_t5x` method).

Importing this module does not import t5x (the package's promise, `__init__`): `t5x_available`
only looks for it, and the other functions import it when called.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any
from typing import Callable

import jax
import jax.numpy as jnp

from speculative.data import tasks
from speculative.models import t5 as t5_lib


def t5x_available() -> bool:
  return importlib.util.find_spec('t5x') is not None


def register_gin_configurables() -> None:
  """Where t5x is importable, imports `t5x.models`, which registers T5X's gin configurables: a
  runner calls it before its config is parsed (and locked), not later in `make_stock_t5x_decode`."""
  if t5x_available():
    importlib.import_module('t5x.models')


# The fields of our T5Config that T5X's `network.T5Config` takes as they are (same names).
_T5X_NETWORK_FIELDS = (
  'vocab_size emb_dim num_heads num_encoder_layers num_decoder_layers head_dim mlp_dim '
  'logits_via_embedding'
).split()


def make_stock_t5x_decode(
  config: t5_lib.T5Config, params: Any, *, max_new_tokens: int, temperature: float
) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """Stock T5X's `temperature_sample` (topk=0 above temperature 0: its default is greedy)."""
  from t5x import decoding as t5x_decoding  # pylint: disable=g-import-not-at-top
  from t5x import models as t5x_models  # pylint: disable=g-import-not-at-top
  from t5x.examples.t5 import network as t5x_network  # pylint: disable=g-import-not-at-top

  net_config = t5x_network.T5Config(
    **{name: getattr(config, name) for name in _T5X_NETWORK_FIELDS},
    dtype=jnp.dtype(config.dtype),
    mlp_activations=tuple(config.mlp_activations),
    dropout_rate=0.0,
    float32_attention_logits=getattr(config, 'float32_attention_logits', False),
  )
  vocabulary = tasks.get_vocabulary()
  model = t5x_models.EncoderDecoderModel(
    module=t5x_network.Transformer(config=net_config),
    input_vocabulary=vocabulary,
    output_vocabulary=vocabulary,
    optimizer_def=None,
    decode_fn=t5x_decoding.temperature_sample,
  )
  decoder_params = {'temperature': float(temperature), 'topk': 0 if temperature > 0 else 1}

  @jax.jit
  def predict(params, encoder_tokens, rng):
    batch = {
      'encoder_input_tokens': encoder_tokens,
      'decoder_input_tokens': jnp.zeros((encoder_tokens.shape[0], max_new_tokens), jnp.int32),
    }
    decodes, _ = model.predict_batch_with_aux(
      params, batch, rng=rng, decoder_params=dict(decoder_params)
    )
    return decodes  # [B, max_new_tokens]

  return lambda encoder_tokens, rng: predict(params, encoder_tokens, rng)
