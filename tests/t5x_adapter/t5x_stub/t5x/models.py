"""Stub of `t5x.models`: the base classes `SpeculativeEncoderDecoderModel` extends.

Mirrors T5X's `BaseModel` -> `BaseTransformerModel` -> `EncoderDecoderModel`: the constructor
arguments and the attributes they set, `DecoderParams`, the vocabulary and `decode_fn` properties,
`predict_batch` and `score_batch` (T5X's computation: minus the token cross-entropy of the logits
`_compute_logits` returns, weighted by 'decoder_loss_weights', summed per row). What the adapter
overrides (`predict_batch_with_aux`, `get_initial_variables`, `_compute_logits`) and T5X's
training loss are not provided: calling them on this base raises NotImplementedError, so nothing
here decodes or trains; stock decoding is compared with the adapter only where real t5x exists.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any
from typing import Callable
from typing import Mapping

import jax
import jax.numpy as jnp
import seqio

_ONLY_REAL = 't5x stub: {} is only in real t5x'


class BaseModel(abc.ABC):
  """T5X's model interface (loss, eval, predict, score, initial variables)."""

  FEATURE_CONVERTER_CLS: Callable[..., seqio.FeatureConverter]

  def __init__(self, optimizer_def: Any):
    self.optimizer_def = optimizer_def

  def loss_fn(self, params: Any, batch: Mapping[str, jax.Array], dropout_rng: Any) -> Any:
    raise NotImplementedError(_ONLY_REAL.format('loss_fn'))

  def eval_fn(self, params: Any, batch: Mapping[str, jax.Array]) -> Any:
    return self.loss_fn(params=params, batch=batch, dropout_rng=None)

  def predict_batch(
    self, params: Any, batch: Mapping[str, jax.Array], rng: jax.Array | None = None
  ) -> jax.Array:
    return self.predict_batch_with_aux(params=params, batch=batch, rng=rng)[0]

  @abc.abstractmethod
  def predict_batch_with_aux(
    self, params: Any, batch: Mapping[str, jax.Array], rng: jax.Array | None = None
  ) -> Any:
    """Predictions and auxiliary outputs."""

  @abc.abstractmethod
  def score_batch(
    self, params: Any, batch: Mapping[str, jax.Array], return_intermediates: bool = False
  ) -> Any:
    """Per-row scores."""

  @abc.abstractmethod
  def get_initial_variables(
    self, rng: jax.Array, input_shapes: Mapping[str, Any], input_types: Any = None
  ) -> Any:
    """The model's initial variables."""


class BaseTransformerModel(BaseModel):
  """T5X's Transformer model base: module, vocabularies, decode_fn and loss settings."""

  def __init__(
    self,
    module: Any,
    input_vocabulary: seqio.Vocabulary,
    output_vocabulary: seqio.Vocabulary,
    optimizer_def: Any,
    decode_fn: Callable[..., Any] | None = None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    loss_normalizing_factor: Any = None,
  ):
    self.module = module
    self._input_vocabulary = input_vocabulary
    self._output_vocabulary = output_vocabulary
    self._decode_fn = decode_fn
    self._label_smoothing = label_smoothing
    self._z_loss = z_loss
    self._loss_normalizing_factor = loss_normalizing_factor
    super().__init__(optimizer_def=optimizer_def)

  @property
  def input_vocabulary(self):
    return self._input_vocabulary

  @property
  def output_vocabulary(self):
    return self._output_vocabulary

  @property
  def decode_fn(self):
    return self._decode_fn

  @abc.abstractmethod
  def _compute_logits(
    self,
    params: Any,
    batch: Mapping[str, jax.Array],
    dropout_rng: jax.Array | None = None,
  ) -> jax.Array:
    """Logits of a forward pass."""


@dataclasses.dataclass(frozen=True)
class DecoderParams:
  return_all_decodes: bool = False
  num_decodes: int = 1


class EncoderDecoderModel(BaseTransformerModel):
  """T5X's encoder-decoder model class: constructor, default decoder params and `score_batch`."""

  FEATURE_CONVERTER_CLS = seqio.EncDecFeatureConverter

  def __init__(
    self,
    module: Any,
    input_vocabulary: seqio.Vocabulary,
    output_vocabulary: seqio.Vocabulary,
    optimizer_def: Any,
    decode_fn: Callable[..., Any] | None = None,  # T5X: decoding.beam_search
    feature_converter_cls: Callable[..., seqio.FeatureConverter] | None = None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    loss_normalizing_factor: Any = None,
    default_decoder_params: DecoderParams | None = None,
  ):
    if feature_converter_cls is not None:
      self.FEATURE_CONVERTER_CLS = feature_converter_cls
    self._default_decoder_params = default_decoder_params or DecoderParams()
    super().__init__(
      module=module,
      input_vocabulary=input_vocabulary,
      output_vocabulary=output_vocabulary,
      optimizer_def=optimizer_def,
      decode_fn=decode_fn,
      label_smoothing=label_smoothing,
      z_loss=z_loss,
      loss_normalizing_factor=loss_normalizing_factor,
    )

  def get_initial_variables(
    self, rng: jax.Array, input_shapes: Mapping[str, Any], input_types: Any = None
  ) -> Any:
    raise NotImplementedError(_ONLY_REAL.format('EncoderDecoderModel.get_initial_variables'))

  def _compute_logits(
    self,
    params: Any,
    batch: Mapping[str, jax.Array],
    dropout_rng: jax.Array | None = None,
    mutable: Any = False,
    other_variables: Any = None,
  ) -> jax.Array:
    raise NotImplementedError(_ONLY_REAL.format('EncoderDecoderModel._compute_logits'))

  def predict_batch_with_aux(
    self,
    params: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array | None = None,
    decoder_params: Mapping[str, Any] | None = None,
    return_all_decodes: bool | None = None,
    num_decodes: int | None = None,
    prompt_with_targets: bool = False,
  ) -> Any:
    raise NotImplementedError(_ONLY_REAL.format('stock decoding (predict_batch_with_aux)'))

  def score_batch(
    self, params: Any, batch: Mapping[str, jax.Array], return_intermediates: bool = False
  ) -> jax.Array:
    """[B] sum over positions of the targets' log-probabilities times 'decoder_loss_weights'."""
    weights = batch['decoder_loss_weights']
    target_tokens = batch['decoder_target_tokens']
    if return_intermediates:
      logits, _ = self._compute_logits(params=params, batch=batch, mutable=['intermediates'])
      raise NotImplementedError(_ONLY_REAL.format('score_batch(return_intermediates=True)'))
    logits = self._compute_logits(params, batch)
    # T5X: -cross_entropy_with_logits(logits, onehot(targets), z_loss=0.0)[0] * weights.
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    token_scores = jnp.take_along_axis(log_probs, target_tokens[..., None], axis=-1)[..., 0]
    return (token_scores * weights).sum(-1)
