"""T5 building blocks with T5X's names, initialisers and logical axes (`examples/t5/layers.py`):
linear maps, RMS layer norm, the token embedding, the gated MLP and T5X-style dropout."""

from __future__ import annotations

import functools
import operator
from typing import Any
from typing import Callable
from typing import Sequence

from flax import linen as nn
import jax
from jax import lax
import jax.numpy as jnp

from speculative import kernels

Array = jax.Array
Initializer = Callable[..., Array]

attention_kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
mlp_kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
relpos_init = nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform')


def logical_param(
  module: nn.Module, name: str, init: Initializer, shape: tuple[int, ...], axes: tuple[str, ...]
) -> Array:
  """A float32 parameter annotated with logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


PACKED = 'packed'  # variable collection of weights packed for `kernels.matmul` (see `t5.pack_decode_params`)


class DenseGeneral(nn.Module):
  """Bias-free linear map of the last axis with a 2-D kernel [in, features] (T5X layout).

  Where the caller passes this layer's kernel packed (collection 'packed', same path as the
  parameter), the product runs in `kernels.matmul`: float32 accumulation, one FMA chain per output
  element, so each row's result does not depend on how many rows the call has. Otherwise XLA's dot.
  """

  features: int
  kernel_axes: tuple[str, str]
  kernel_init: Initializer = mlp_kernel_init
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    inputs = jnp.asarray(inputs, self.dtype)
    kernel = logical_param(
      self, 'kernel', self.kernel_init, (inputs.shape[-1], self.features), self.kernel_axes
    )
    if self.has_variable(PACKED, 'kernel'):
      packed = self.get_variable(PACKED, 'kernel')  # [ceil(features/16), in, 16]
      name = '/'.join(self.scope.path)
      return kernels.matmul(inputs, packed, self.features, name=name).astype(self.dtype)
    kernel = jnp.asarray(kernel, self.dtype)
    return lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))


class LayerNorm(nn.Module):
  """T5 RMS layer norm: no mean subtraction, no bias; statistics in float32.

  With a 'packed' copy of its scale (`t5.pack_decode_params`) it runs in `kernels.rms_norm`, whose
  row results do not depend on the number of rows.
  """

  epsilon: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    if self.has_variable(PACKED, 'scale'):  # the job runs this model's decoder on the kernels
      scale = self.get_variable(PACKED, 'scale')  # [d] float32
      return kernels.rms_norm(x, scale, self.epsilon).astype(self.dtype)
    mean2 = jnp.mean(lax.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * lax.rsqrt(mean2 + self.epsilon), self.dtype)
    scale = logical_param(self, 'scale', nn.initializers.ones, (x.shape[-1],), ('embed',))
    return y * jnp.asarray(scale, self.dtype)


class Embed(nn.Module):
  """Token embedding [vocab, d], shared by encoder and decoder (T5X `token_embedder`)."""

  num_embeddings: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = logical_param(
      self,
      'embedding',
      nn.initializers.normal(stddev=1.0),
      (self.num_embeddings, self.features),
      ('vocab', 'embed'),
    )

  def __call__(self, tokens: Array) -> Array:
    if not jnp.issubdtype(tokens.dtype, jnp.integer):
      raise ValueError(f'token ids must be integers, got dtype {tokens.dtype}')
    # A gather returns the same values as T5X's one-hot matmul (x*1 + sum of y*0 is exact).
    return jnp.take(jnp.asarray(self.embedding, self.dtype), tokens, axis=0)

  def attend(self, query: Array) -> Array:
    return jnp.dot(query, jnp.asarray(self.embedding, jnp.float32).T)


class MlpBlock(nn.Module):
  """Gated MLP: prod_i act_i(x W_i) then W_o (T5X names wi_0, wi_1, wo; 'wi' if one activation)."""

  intermediate_dim: int
  emb_dim: int
  activations: Sequence[str]
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool) -> Array:
    n = len(self.activations)
    if self.has_variable(PACKED, 'wi_fused'):  # the job packed wi_0, wi_1, ... side by side
      packed = self.get_variable(PACKED, 'wi_fused')  # [ceil(n * f / 16), d, 16]
      name = '/'.join(self.scope.path) + '/wi_fused'
      joined = kernels.matmul(inputs, packed, n * self.intermediate_dim, name=name)
      joined = joined.astype(self.dtype)
      f = self.intermediate_dim
      parts = [joined[..., i * f : (i + 1) * f] for i in range(n)]  # each [B, T, f]
    else:
      parts = None
    hidden = []
    for idx, act in enumerate(self.activations):
      name = 'wi' if n == 1 else f'wi_{idx}'
      if parts is not None:
        x = parts[idx]
      else:
        x = DenseGeneral(
          self.intermediate_dim, ('embed', 'mlp'), mlp_kernel_init, self.dtype, name=name
        )(inputs)
      hidden.append(x if act == 'linear' else getattr(nn, act)(x))
    x = functools.reduce(operator.mul, hidden)  # [B, T, f]
    x = dropout(self, self.dropout_rate, x, deterministic)
    return DenseGeneral(self.emb_dim, ('mlp', 'embed'), mlp_kernel_init, self.dtype, name='wo')(x)


def dropout(
  module: nn.Module, rate: float, x: Array, deterministic: bool, broadcast: bool = True
) -> Array:
  """Inverted dropout like `nn.Dropout` (mask shared along the length axis when `broadcast`)."""
  if deterministic or rate == 0.0:
    return x
  keep_prob = 1.0 - rate
  mask_shape = list(x.shape)
  if broadcast:
    mask_shape[-2] = 1  # T5X broadcasts dropout masks along the length axis.
  keep = jax.random.bernoulli(module.make_rng('dropout'), keep_prob, mask_shape)
  keep = jnp.broadcast_to(keep, x.shape)
  return lax.select(keep, x / keep_prob, jnp.zeros_like(x))
