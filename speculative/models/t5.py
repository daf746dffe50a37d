"""T5 v1.1 encoder-decoder in Flax with the T5X `t5x/examples/t5` parameter tree and numerics.

The parameter tree is exactly T5X's (`token_embedder/embedding`,
`encoder/layers_{i}/attention/query/kernel` [d, H*dh], ..., `decoder/logits_dense/kernel` [d, V]),
so the `target` of a T5X checkpoint loads into it unchanged (see `speculative.checkpoints`).
Numerics follow T5X: RMS layer norm (eps 1e-6, scale only), no sqrt(d) embedding scaling, gated
GELU (tanh approximation, `wi_0` gelu times `wi_1` linear), 1/sqrt(head_dim) folded into the query
initialisation, T5 relative position buckets (bidirectional in the encoder, causal in the decoder,
shared across layers), masks as a -1e10 additive bias, logits in float32. Initialisers are T5X's,
and parameters carry T5X's logical axis names ('vocab', 'embed', 'joined_kv', 'heads', 'mlp',
'relpos_buckets') so `jax.sharding` meshes can lay them out.

`T5` wraps the Flax module as a frozen, hashable dataclass implementing the `CachedLM` protocol
(`speculative.models.interface`):
  * `forward`: the full teacher-forced forward used for training (T5X `Transformer.__call__`).
  * `init_cache`: runs the encoder once and (unless `cache_cross_kv=False`) every decoder layer's
    cross-attention keys/values once. Stock T5X recomputes those at every decoding step (inside
    one jitted `lax.while_loop` XLA usually hoists that loop-invariant work out of the loop anyway;
    the cache matters when steps are separate calls).
  * `extend`: a cached forward over T new decoder tokens starting at per-row positions `start[B]`
    (T=1 ordinary decoding, T=gamma+1 speculative verification). Relative position biases and the
    causal mask come from absolute query/key positions of each row, so chunked cached decoding
    equals the full forward.

Parameters are plain nested dicts WITHOUT a top-level 'params' key (the same tree as a T5X
checkpoint's `target`).
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any
from typing import Callable
from typing import Sequence

import flax
from flax import linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
Params = Any
Initializer = Callable[..., Array]

# T5X's standard logical axis rules (`t5x.partitioning.standard_logical_axis_rules` with 1-D model
# parallelism over a 'model' mesh axis and data parallelism over 'data').
DEFAULT_LOGICAL_AXIS_RULES: tuple[tuple[str, str | None], ...] = (
  ('batch', 'data'),
  ('vocab', 'model'),
  ('embed', None),
  ('mlp', 'model'),
  ('heads', 'model'),
  ('kv', None),
  ('joined_kv', 'model'),
  ('relpos_buckets', None),
  ('length', None),
)

# Added to masked attention logits (T5X's value; exp underflows to exactly 0 in float32).
_MASK_BIAS = -1e10


@dataclasses.dataclass(frozen=True)
class T5Config:
  """T5 hyperparameters; field names follow T5X's `network.T5Config` (plus position/special ids).

  `dtype` is the activation dtype name ('float32' or 'bfloat16'); parameters are always stored in
  float32 and logits are always float32.

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


# ----------------------------------------------------------------------------------------------
# Relative position buckets.
# ----------------------------------------------------------------------------------------------
def relative_position_bucket(
  relative_position: np.ndarray,
  *,
  bidirectional: bool,
  num_buckets: int = 32,
  max_distance: int = 128,
) -> np.ndarray:
  """T5's bucket of `relative_position = key_position - query_position` (numpy, as in T5X).

  Half of the buckets (all of them if not bidirectional) hold exact distances 0..max_exact-1, the
  rest are logarithmically spaced up to `max_distance`; larger distances share the last bucket.
  Without `bidirectional`, keys after the query (positive relative positions) all map to bucket 0.
  Evaluated in numpy exactly as T5X does (float32 logs), so bucket edges agree bit for bit.
  """
  relative_position = np.asarray(relative_position, dtype=np.int32)
  distance = -relative_position  # how far back the key is
  bucket = np.zeros_like(distance)
  if bidirectional:
    num_buckets //= 2
    bucket += (distance < 0).astype(np.int32) * num_buckets
    distance = np.abs(distance)
  else:
    distance = np.maximum(distance, 0)
  max_exact = num_buckets // 2
  log_ratio = np.log(distance.astype(np.float32) / max_exact + np.finfo(np.float32).eps)
  large = max_exact + (
    log_ratio / np.log(max_distance / max_exact) * (num_buckets - max_exact)
  ).astype(np.int32)
  large = np.minimum(large, num_buckets - 1)
  return bucket + np.where(distance < max_exact, distance, large)


@functools.cache
def _bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
  """Buckets of relative positions -max_distance..max_distance (index = rel + max_distance).

  All |relative positions| >= max_distance share a bucket, so clipping to this range is exact.
  """
  rel = np.arange(-max_distance, max_distance + 1, dtype=np.int32)
  return relative_position_bucket(
    rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
  ).astype(np.int32)


# ----------------------------------------------------------------------------------------------
# Layers (names and initialisers as in T5X `examples/t5/layers.py`).
# ----------------------------------------------------------------------------------------------
_attention_kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'normal')
_mlp_kernel_init = nn.initializers.variance_scaling(1.0, 'fan_in', 'truncated_normal')
_relpos_init = nn.initializers.variance_scaling(1.0, 'fan_avg', 'uniform')


def _param(
  module: nn.Module, name: str, init: Initializer, shape: tuple[int, ...], axes: tuple[str, ...]
) -> Array:
  """A float32 parameter annotated with logical axis names."""
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


class DenseGeneral(nn.Module):
  """Bias-free linear map of the last axis with a 2-D kernel [in, features] (T5X layout)."""

  features: int
  kernel_axes: tuple[str, str]
  kernel_init: Initializer = _mlp_kernel_init
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array) -> Array:
    inputs = jnp.asarray(inputs, self.dtype)
    kernel = _param(
      self, 'kernel', self.kernel_init, (inputs.shape[-1], self.features), self.kernel_axes
    )
    kernel = jnp.asarray(kernel, self.dtype)
    return lax.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))


class LayerNorm(nn.Module):
  """T5 RMS layer norm: no mean subtraction, no bias; statistics in float32."""

  epsilon: float = 1e-6
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    x = jnp.asarray(x, jnp.float32)
    mean2 = jnp.mean(lax.square(x), axis=-1, keepdims=True)
    y = jnp.asarray(x * lax.rsqrt(mean2 + self.epsilon), self.dtype)
    scale = _param(self, 'scale', nn.initializers.ones, (x.shape[-1],), ('embed',))
    return y * jnp.asarray(scale, self.dtype)


class Embed(nn.Module):
  """Token embedding [vocab, d], shared by encoder and decoder (T5X `token_embedder`)."""

  num_embeddings: int
  features: int
  dtype: Any = jnp.float32

  def setup(self):
    self.embedding = _param(
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


class RelativePositionBiases(nn.Module):
  """Per-head attention bias from bucketed relative positions (T5X `relpos_bias`)."""

  num_buckets: int
  max_distance: int
  num_heads: int
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, query_positions: Array, key_positions: Array, bidirectional: bool) -> Array:
    """Bias for queries at `query_positions` [..., Tq] and keys at `key_positions` [Tk].

    Returns [..., H, Tq, Tk] (leading dims of `query_positions` kept).
    """
    rel_embedding = _param(
      self,
      'rel_embedding',
      _relpos_init,
      (self.num_heads, self.num_buckets),
      ('heads', 'relpos_buckets'),
    )
    relative = key_positions[..., None, :] - query_positions[..., :, None]  # [..., Tq, Tk]
    relative = jnp.clip(relative, -self.max_distance, self.max_distance)
    table = jnp.asarray(_bucket_table(bidirectional, self.num_buckets, self.max_distance))
    bucket = table[relative + self.max_distance]  # [..., Tq, Tk]
    bias = jnp.take(jnp.asarray(rel_embedding, self.dtype).T, bucket, axis=0)  # [..., Tq, Tk, H]
    return jnp.moveaxis(bias, -1, -3)  # [..., H, Tq, Tk]


def _mask_to_bias(mask: Array, dtype: Any) -> Array:
  return lax.select(mask, jnp.zeros(mask.shape, dtype), jnp.full(mask.shape, _MASK_BIAS, dtype))


class MultiHeadDotProductAttention(nn.Module):
  """Multi-head attention with T5X's projections (query/key/value/out, 2-D kernels)."""

  num_heads: int
  head_dim: int
  emb_dim: int
  dtype: Any = jnp.float32
  dropout_rate: float = 0.0
  float32_logits: bool = False

  def setup(self):
    depth_scaling = jnp.sqrt(self.head_dim).astype(self.dtype)
    # T5 does not scale logits by 1/sqrt(head_dim) at run time; it is folded into the query init.
    query_init = lambda *args: _attention_kernel_init(*args) / depth_scaling
    joined = self.num_heads * self.head_dim
    self.query = DenseGeneral(joined, ('embed', 'joined_kv'), query_init, self.dtype)
    self.key = DenseGeneral(joined, ('embed', 'joined_kv'), _attention_kernel_init, self.dtype)
    self.value = DenseGeneral(joined, ('embed', 'joined_kv'), _attention_kernel_init, self.dtype)
    self.out = DenseGeneral(
      self.emb_dim, ('joined_kv', 'embed'), _attention_kernel_init, self.dtype
    )

  def _split_heads(self, x: Array) -> Array:
    return x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim))  # [B, T, H, dh]

  def project_query(self, inputs_q: Array) -> Array:
    return self._split_heads(self.query(inputs_q))  # [B, Tq, H, dh]

  def project_key_value(self, inputs_kv: Array) -> tuple[Array, Array]:
    key = self._split_heads(self.key(inputs_kv))  # [B, Tk, H, dh]
    value = self._split_heads(self.value(inputs_kv))  # [B, Tk, H, dh]
    return key, value

  def attend(
    self,
    query: Array,
    key: Array,
    value: Array,
    bias: Array,
    deterministic: bool,
    heads_first: bool = False,
  ) -> Array:
    """Attention of query [B,Tq,H,dh] over key/value [B,Tk,H,dh]; bias [B|1,H|1,Tq,Tk] is added.

    With `heads_first`, key/value are [B,H,dh,Tk] (the decoding caches' layout, as T5X's
    examples): the layout XLA's CPU dots (batch dims b, h) put [B,Tk,H,dh] operands in anyway, so
    the same products are read in place instead of from a transposed copy of the whole cache at
    every step, with bit-identical results (docs/batch_performance.md).
    """
    if self.float32_logits:
      query = query.astype(jnp.float32)
      key = key.astype(jnp.float32)
    kv = 'bhdk' if heads_first else 'bkhd'
    weights = jnp.einsum(f'bqhd,{kv}->bhqk', query, key)  # [B, H, Tq, Tk]
    weights = weights + bias.astype(weights.dtype)
    weights = jax.nn.softmax(weights).astype(self.dtype)
    if not deterministic and self.dropout_rate > 0.0:
      keep_prob = 1.0 - self.dropout_rate
      # Broadcast along the query axis, as T5X does.
      keep_shape = weights.shape[:-2] + (1,) + weights.shape[-1:]
      keep = jax.random.bernoulli(self.make_rng('dropout'), keep_prob, keep_shape)
      weights = weights * (keep.astype(weights.dtype) / jnp.asarray(keep_prob, self.dtype))
    x = jnp.einsum(f'bhqk,{kv}->bqhd', weights, value)  # [B, Tq, H, dh]
    return self.out(x.reshape(x.shape[:-2] + (self.num_heads * self.head_dim,)))  # [B, Tq, d]

  def __call__(self, inputs_q: Array, inputs_kv: Array, bias: Array, deterministic: bool) -> Array:
    key, value = self.project_key_value(inputs_kv)
    return self.attend(self.project_query(inputs_q), key, value, bias, deterministic)


class MlpBlock(nn.Module):
  """Gated MLP: prod_i act_i(x W_i) then W_o (T5X names wi_0, wi_1, wo; 'wi' if one activation)."""

  intermediate_dim: int
  emb_dim: int
  activations: Sequence[str]
  dropout_rate: float = 0.0
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, inputs: Array, deterministic: bool) -> Array:
    hidden = []
    for idx, act in enumerate(self.activations):
      name = 'wi' if len(self.activations) == 1 else f'wi_{idx}'
      x = DenseGeneral(
        self.intermediate_dim, ('embed', 'mlp'), _mlp_kernel_init, self.dtype, name=name
      )(inputs)
      hidden.append(x if act == 'linear' else getattr(nn, act)(x))
    x = functools.reduce(operator.mul, hidden)  # [B, T, f]
    x = _dropout(self, self.dropout_rate, x, deterministic)
    return DenseGeneral(self.emb_dim, ('mlp', 'embed'), _mlp_kernel_init, self.dtype, name='wo')(x)


def _attention(cfg: T5Config) -> MultiHeadDotProductAttention:
  # Modules built in `setup` are named by the attribute they are assigned to.
  return MultiHeadDotProductAttention(
    num_heads=cfg.num_heads,
    head_dim=cfg.head_dim,
    emb_dim=cfg.emb_dim,
    dtype=jnp.dtype(cfg.dtype),
    dropout_rate=cfg.dropout_rate,
    float32_logits=cfg.float32_attention_logits,
  )


def _mlp(cfg: T5Config) -> MlpBlock:
  return MlpBlock(
    intermediate_dim=cfg.mlp_dim,
    emb_dim=cfg.emb_dim,
    activations=cfg.mlp_activations,
    dropout_rate=cfg.dropout_rate,
    dtype=jnp.dtype(cfg.dtype),
  )


def _dropout(
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


def _relpos(cfg: T5Config) -> RelativePositionBiases:
  return RelativePositionBiases(
    num_buckets=cfg.relative_attention_num_buckets,
    max_distance=cfg.relative_attention_max_distance,
    num_heads=cfg.num_heads,
    dtype=jnp.dtype(cfg.dtype),
  )


class EncoderLayer(nn.Module):
  """Pre-norm self-attention + gated MLP block."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    self.pre_attention_layer_norm = LayerNorm(dtype=dtype)
    self.attention = _attention(cfg)
    self.pre_mlp_layer_norm = LayerNorm(dtype=dtype)
    self.mlp = _mlp(cfg)

  def __call__(self, inputs: Array, bias: Array, deterministic: bool) -> Array:
    cfg = self.config
    x = self.pre_attention_layer_norm(inputs)
    x = self.attention(x, x, bias, deterministic)
    x = _dropout(self, cfg.dropout_rate, x, deterministic) + inputs
    y = self.mlp(self.pre_mlp_layer_norm(x), deterministic)
    return _dropout(self, cfg.dropout_rate, y, deterministic) + x


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, cross-attention and gated MLP block."""

  config: T5Config

  def setup(self):
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    self.pre_self_attention_layer_norm = LayerNorm(dtype=dtype)
    self.self_attention = _attention(cfg)
    self.pre_cross_attention_layer_norm = LayerNorm(dtype=dtype)
    self.encoder_decoder_attention = _attention(cfg)
    self.pre_mlp_layer_norm = LayerNorm(dtype=dtype)
    self.mlp = _mlp(cfg)

  def cross_key_value(self, encoded: Array) -> tuple[Array, Array]:
    """Cross-attention keys/values of the encoder output, each heads-first [B, H, dh, S]."""
    key, value = self.encoder_decoder_attention.project_key_value(encoded)  # [B, S, H, dh]
    return jnp.moveaxis(key, 1, 3), jnp.moveaxis(value, 1, 3)  # [B, H, dh, S]

  def __call__(
    self,
    inputs: Array,
    self_bias: Array,
    cross_bias: Array,
    deterministic: bool,
    *,
    encoded: Array | None = None,
    cross_kv: tuple[Array, Array] | None = None,
    self_kv_cache: tuple[Array, Array] | None = None,
    write_positions: Array | None = None,
  ):
    """One decoder layer.

    Args:
      inputs: [B, T, d].
      self_bias: [B|1, H, T, K] mask + relative-position bias of the self-attention (K = T without
        a cache, K = cache length with one).
      cross_bias: [B, 1, T|1, S] mask bias of the cross-attention.
      deterministic: no dropout if True.
      encoded: [B, S, d] encoder output (used when `cross_kv` is None).
      cross_kv: precomputed cross-attention (key, value), each [B, H, dh, S].
      self_kv_cache: (key, value) caches, each [B, H, dh, K]; the new keys/values are written at
        `write_positions` and attention runs over the whole cache.
      write_positions: [B, T] int32 cache positions of the T new tokens, or [T] when all rows
        write at the same positions (see `_write_rows`).

    Returns:
      ([B, T, d] outputs, updated (key, value) cache or None).
    """
    cfg = self.config
    x = self.pre_self_attention_layer_norm(inputs)
    query = self.self_attention.project_query(x)
    key, value = self.self_attention.project_key_value(x)
    new_cache = None
    if self_kv_cache is not None:
      key = _write_rows(self_kv_cache[0], key, write_positions)  # [B, H, dh, K]
      value = _write_rows(self_kv_cache[1], value, write_positions)
      new_cache = (key, value)
    x = self.self_attention.attend(
      query, key, value, self_bias, deterministic, heads_first=self_kv_cache is not None
    )
    x = _dropout(self, cfg.dropout_rate, x, deterministic) + inputs

    y = self.pre_cross_attention_layer_norm(x)
    if cross_kv is None:
      cross_kv = self.cross_key_value(encoded)
    y = self.encoder_decoder_attention.attend(
      self.encoder_decoder_attention.project_query(y),
      cross_kv[0],
      cross_kv[1],
      cross_bias,
      deterministic,
      heads_first=True,
    )
    y = _dropout(self, cfg.dropout_rate, y, deterministic) + x

    z = self.mlp(self.pre_mlp_layer_norm(y), deterministic)
    z = _dropout(self, cfg.dropout_rate, z, deterministic) + y
    return z, new_cache


def _write_rows(cache: Array, new: Array, positions: Array) -> Array:
  """cache[b, :, :, positions[b, t]] = new[b, t]; positions outside the cache are dropped.

  cache: [B, H, dh, K] (heads first, positions last); new: [B, T, H, dh]; positions: [B, T] int32
  (ragged: a per-row scatter) or [T] int32 = start + arange(T), shared by all rows (lockstep: one
  dynamic_update_slice, in place).
  """
  new = new.astype(cache.dtype)
  num_new = new.shape[1]
  if positions.ndim == 1 and num_new <= cache.shape[3]:
    # dynamic_update_slice clamps its start into [0, K - T]; where it moved, slot j of the clamped
    # window keeps its old value unless it is one of the positions being written, so the result
    # is the dropping scatter's. (A lax.cond fallback instead made XLA copy the whole cache.)
    window_start = jnp.clip(positions[0], 0, cache.shape[3] - num_new)
    source = jnp.arange(num_new, dtype=jnp.int32) + (window_start - positions[0])  # [T]
    in_range = (source >= 0) & (source < num_new)  # [T]
    new = jnp.moveaxis(new, 1, 3)  # [B, H, dh, T]
    old = lax.dynamic_slice(cache, (0, 0, 0, window_start), new.shape)  # [B, H, dh, T]
    window = jnp.where(in_range, jnp.take(new, jnp.clip(source, 0, num_new - 1), axis=3), old)
    return lax.dynamic_update_slice(cache, window, (0, 0, 0, window_start))
  if positions.ndim == 1:
    positions = jnp.broadcast_to(positions, new.shape[:2])  # [B, T]
  rows = jnp.arange(cache.shape[0], dtype=jnp.int32)[:, None]  # [B, 1]
  # Advanced indices around slices: the indexed view is [B, T, H, dh], new's layout.
  return cache.at[rows, :, :, positions].set(new, mode='drop')


class Encoder(nn.Module):
  """Embedding (shared) -> encoder layers -> final RMS norm."""

  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = _relpos(cfg)
    self.layers = [EncoderLayer(cfg) for i in range(cfg.num_encoder_layers)]
    self.encoder_norm = LayerNorm(dtype=jnp.dtype(cfg.dtype))

  def __call__(self, encoder_tokens: Array, deterministic: bool) -> Array:
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    assert encoder_tokens.ndim == 2, encoder_tokens.shape  # [B, S]
    length = encoder_tokens.shape[1]
    valid = encoder_tokens > 0  # [B, S]
    mask = valid[:, None, :, None] & valid[:, None, None, :]  # [B, 1, S, S]
    positions = jnp.arange(length, dtype=jnp.int32)
    relpos = self.relpos_bias(positions, positions, True)[None]  # [1, H, S, S]
    bias = _mask_to_bias(mask, dtype) + relpos  # [B, H, S, S]
    x = self.shared_embedding(encoder_tokens.astype(jnp.int32))  # [B, S, d]
    x = _dropout(self, cfg.dropout_rate, x, deterministic).astype(dtype)
    for layer in self.layers:
      x = layer(x, bias, deterministic)
    x = self.encoder_norm(x)
    return _dropout(self, cfg.dropout_rate, x, deterministic, broadcast=False)  # [B, S, d]


class Decoder(nn.Module):
  """Embedding (shared) -> decoder layers -> final RMS norm -> float32 logits."""

  config: T5Config
  shared_embedding: nn.Module

  def setup(self):
    cfg = self.config
    self.relpos_bias = _relpos(cfg)
    self.layers = [DecoderLayer(cfg) for i in range(cfg.num_decoder_layers)]
    # The logits head's dtype (T5Config.logits_dtype); shared by `__call__` and `extend`.
    self.decoder_norm = LayerNorm(dtype=jnp.dtype(cfg.logits_dtype or cfg.dtype))
    if not cfg.logits_via_embedding:
      self.logits_dense = DenseGeneral(
        cfg.vocab_size, ('embed', 'vocab'), _mlp_kernel_init, jnp.float32
      )

  def cross_key_values(self, encoded: Array) -> tuple[tuple[Array, Array], ...]:
    """Every layer's cross-attention (key, value), each [B, H, dh, S]."""
    return tuple(layer.cross_key_value(encoded) for layer in self.layers)

  def _logits(self, y: Array, deterministic: bool) -> Array:
    cfg = self.config
    y = self.decoder_norm(y)
    y = _dropout(self, cfg.dropout_rate, y, deterministic)
    if cfg.logits_via_embedding:
      return self.shared_embedding.attend(y) / jnp.sqrt(y.shape[-1])
    return self.logits_dense(y)  # [B, T, V] float32

  def __call__(
    self,
    encoded: Array,
    encoder_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array | None,
    deterministic: bool,
  ) -> Array:
    """Teacher-forced decoder over the whole target (T5X training mode). Returns [B, T, V]."""
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    assert decoder_input_tokens.ndim == 2, decoder_input_tokens.shape  # [B, T]
    length = decoder_input_tokens.shape[1]
    positions = jnp.arange(length, dtype=jnp.int32)
    causal = positions[:, None] >= positions[None, :]  # [T, T]
    self_mask = causal[None, None]  # [1, 1, T, T]
    query_valid = jnp.ones(decoder_input_tokens.shape, bool)  # [B, T]
    if decoder_target_tokens is not None:
      # T5X masks decoder padding by the targets (both query and key side).
      query_valid = decoder_target_tokens > 0
      self_mask = self_mask & query_valid[:, None, :, None] & query_valid[:, None, None, :]
    relpos = self.relpos_bias(positions, positions, False)[None]  # [1, H, T, T]
    self_bias = _mask_to_bias(self_mask, dtype) + relpos  # [B|1, H, T, T]
    cross_mask = query_valid[:, None, :, None] & (encoder_tokens > 0)[:, None, None, :]
    cross_bias = _mask_to_bias(cross_mask, dtype)  # [B, 1, T, S]

    y = self.shared_embedding(decoder_input_tokens.astype(jnp.int32))  # [B, T, d]
    y = _dropout(self, cfg.dropout_rate, y, deterministic).astype(dtype)
    for layer in self.layers:
      y, _ = layer(y, self_bias, cross_bias, deterministic, encoded=encoded)
    return self._logits(y, deterministic)

  def extend(
    self,
    tokens: Array,
    start: Array,
    self_kv: tuple[tuple[Array, Array], ...],
    encoder_mask: Array,
    encoded: Array | None,
    cross_kv: tuple[tuple[Array, Array], ...] | None,
  ):
    """Cached decoder over T new tokens at per-row positions start[b] + t. See `T5.extend`."""
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    num_new = tokens.shape[1]
    cache_length = self_kv[0][0].shape[3]  # [B, H, dh, K]
    # start [B]: per-row positions (ragged). start []: every row at the same position (lockstep);
    # the bias below is then shared by all rows ([1, H, T, K]) and the layers write the cache with
    # one dynamic_update_slice instead of a per-row scatter (`_write_rows`).
    query_positions = start[..., None] + jnp.arange(num_new, dtype=jnp.int32)  # [B|-, T]
    key_positions = jnp.arange(cache_length, dtype=jnp.int32)  # [K]
    # A query at position j sees cache positions 0..j of its own row; later entries are stale.
    self_mask = key_positions <= query_positions[..., None]  # [B|-, T, K]
    relpos = self.relpos_bias(query_positions, key_positions, False)  # [B|-, H, T, K]
    self_bias = _mask_to_bias(self_mask[..., None, :, :], dtype) + relpos  # [B|-, H, T, K]
    if start.ndim == 0:
      self_bias = self_bias[None]  # [1, H, T, K]
    cross_bias = _mask_to_bias(encoder_mask[:, None, None, :], dtype)  # [B, 1, 1, S]

    y = self.shared_embedding(tokens.astype(jnp.int32)).astype(dtype)  # [B, T, d]
    new_self_kv = []
    for i, layer in enumerate(self.layers):
      y, layer_cache = layer(
        y,
        self_bias,
        cross_bias,
        True,
        encoded=encoded,
        cross_kv=None if cross_kv is None else cross_kv[i],
        self_kv_cache=self_kv[i],
        write_positions=query_positions,
      )
      new_self_kv.append(layer_cache)
    return self._logits(y, True), tuple(new_self_kv)  # [B, T, V] float32


class Transformer(nn.Module):
  """The T5 encoder-decoder (T5X `network.Transformer` parameter tree)."""

  config: T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = Embed(
      num_embeddings=cfg.vocab_size, features=cfg.emb_dim, dtype=jnp.dtype(cfg.dtype)
    )
    self.encoder = Encoder(cfg, shared_embedding=self.token_embedder)
    self.decoder = Decoder(cfg, shared_embedding=self.token_embedder)

  def encode(self, encoder_tokens: Array, deterministic: bool = True) -> Array:
    return self.encoder(encoder_tokens, deterministic)

  def cross_key_values(self, encoded: Array):
    return self.decoder.cross_key_values(encoded)

  def extend(self, *args, **kwargs):
    return self.decoder.extend(*args, **kwargs)

  def __call__(
    self,
    encoder_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array | None = None,
    deterministic: bool = True,
  ) -> Array:
    encoded = self.encoder(encoder_tokens, deterministic)
    return self.decoder(
      encoded, encoder_tokens, decoder_input_tokens, decoder_target_tokens, deterministic
    )


# ----------------------------------------------------------------------------------------------
# The CachedLM wrapper.
# ----------------------------------------------------------------------------------------------
@flax.struct.dataclass
class T5Cache:
  """Decoding cache of `T5` (a pytree; B = batch, K = max_length, S = encoder length).

  Keys and values are stored [B, H, dh, positions] (as T5X's examples), the layout XLA's
  attention dots use, so they are read in place (the [B, K, H, dh] layout made XLA transpose every
  cache at every step; docs/batch_performance.md).

  Fields:
    self_key: tuple over decoder layers of [B, H, dh, K] (config dtype) self-attention keys.
    self_value: tuple over decoder layers of [B, H, dh, K] (config dtype) self-attention values.
    cross_key: tuple over decoder layers of [B, H, dh, S] cross-attention keys (empty tuple when
      the model recomputes them each step, `cache_cross_kv=False`).
    cross_value: like `cross_key`, for the values.
    encoded: [B, S, d] (config dtype) encoder output.
    encoder_mask: [B, S] bool, True at non-padding encoder positions (token != 0).
  """

  self_key: tuple[Array, ...]
  self_value: tuple[Array, ...]
  cross_key: tuple[Array, ...]
  cross_value: tuple[Array, ...]
  encoded: Array
  encoder_mask: Array

  @property
  def max_length(self) -> int:
    return self.self_key[0].shape[3]


def _unbox(tree):
  return nn.meta.unbox(tree)


@dataclasses.dataclass(frozen=True)
class T5:
  """T5 v1.1 as a `CachedLM` (static config only; hashable, usable as a jit static argument).

  Attributes:
    config: network hyperparameters.
    cache_cross_kv: compute each decoder layer's cross-attention keys/values once in `init_cache`
      (True) or recompute them from the encoder output at every `extend` call, as stock T5X does
      (False). Outputs are identical; only speed differs.
  """

  config: T5Config
  cache_cross_kv: bool = True

  # `extend` accepts a scalar `start` (all rows at one position), used by the baseline loop when
  # its rows advance together (`decoding.autoregressive_decode`); not a dataclass field.
  lockstep_extend = True

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def module(self) -> Transformer:
    return Transformer(self.config)

  # -- parameters -----------------------------------------------------------------------------
  def _init_boxed(self, rng: Array):
    tokens = jnp.ones((1, 1), jnp.int32)
    return self.module.init({'params': rng}, tokens, tokens)['params']

  def init_params(self, rng: Array) -> Params:
    """Fresh parameters with T5X's initialisers: a nested dict of float32 arrays, no 'params' key.

    Jit-compiled (once per config), so large models initialise quickly.
    """
    return _init_params_jit(self, rng)

  def param_shapes(self) -> dict[str, tuple[int, ...]]:
    """Flat {'encoder/layers_0/attention/query/kernel': shape, ...} of this config (no compute)."""
    shapes = jax.eval_shape(self.init_params, jax.random.PRNGKey(0))
    flat = flax.traverse_util.flatten_dict(shapes, sep='/')
    return {k: tuple(v.shape) for k, v in flat.items()}

  def logical_axes(self) -> Params:
    """Same tree as the params, each leaf a `PartitionSpec` of logical axis names."""
    boxed = jax.eval_shape(self._init_boxed, jax.random.PRNGKey(0))
    return flax.core.unfreeze(nn.get_partition_spec(boxed))

  def partition_specs(
    self, rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES
  ) -> Params:
    """Mesh `PartitionSpec` per parameter under logical axis `rules` (T5X-style)."""
    return nn.logical_to_mesh(self.logical_axes(), rules)

  def param_shardings(
    self, mesh: jax.sharding.Mesh, rules: Sequence[tuple[str, Any]] = DEFAULT_LOGICAL_AXIS_RULES
  ) -> Params:
    """`NamedSharding` per parameter on `mesh` (use with `jax.device_put(params, shardings)`)."""
    specs = self.partition_specs(rules)
    return jax.tree.map(
      lambda spec: jax.sharding.NamedSharding(mesh, spec),
      specs,
      is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec),
    )

  # -- compute --------------------------------------------------------------------------------
  def _apply(self, params: Params, *args, method=None, rngs=None, **kwargs):
    return self.module.apply({'params': params}, *args, method=method, rngs=rngs, **kwargs)

  def encode(self, params: Params, encoder_tokens: Array) -> Array:
    """Encoder output [B, S, d] for encoder_tokens [B, S] int32 (0 = padding)."""
    _check_tokens('encoder_tokens', encoder_tokens)
    return self._apply(params, encoder_tokens, method=Transformer.encode)

  def forward(
    self,
    params: Params,
    encoder_tokens: Array,
    decoder_input_tokens: Array,
    *,
    decoder_target_tokens: Array | None = None,
    dropout_rng: Array | None = None,
  ) -> Array:
    """Full teacher-forced forward (training): logits [B, T, V] float32.

    Args:
      params: parameters (no 'params' key).
      encoder_tokens: [B, S] int32, 0 = padding (masked in encoder and cross-attention).
      decoder_input_tokens: [B, T] int32, the targets shifted right with 0 (the decoder start
        token) first, as in T5X. The decoder self-attention is causal.
      decoder_target_tokens: optional [B, T] int32; if given, positions with target 0 are padding
        and are masked as in T5X training (outputs at non-padding positions are unchanged).
      dropout_rng: enables dropout (at `config.dropout_rate`) with this key; None = deterministic.
    """
    _check_tokens('encoder_tokens', encoder_tokens)
    _check_tokens('decoder_input_tokens', decoder_input_tokens)
    if decoder_target_tokens is not None and (
      decoder_target_tokens.shape != decoder_input_tokens.shape
    ):
      raise ValueError(
        f'decoder_target_tokens shape {decoder_target_tokens.shape} != '
        f'decoder_input_tokens shape {decoder_input_tokens.shape}'
      )
    if encoder_tokens.shape[0] != decoder_input_tokens.shape[0]:
      raise ValueError(
        f'batch sizes differ: encoder_tokens {encoder_tokens.shape}, '
        f'decoder_input_tokens {decoder_input_tokens.shape}'
      )
    deterministic = dropout_rng is None or self.config.dropout_rate == 0.0
    rngs = None if deterministic else {'dropout': dropout_rng}
    return self._apply(
      params, encoder_tokens, decoder_input_tokens, decoder_target_tokens, deterministic, rngs=rngs
    )

  def init_cache(
    self, params: Params, batch_size: int, max_length: int, encoder_tokens: Array | None = None
  ) -> T5Cache:
    """Runs the encoder once (and the cross-attention K/V once) and allocates `max_length` slots.

    Args:
      params: parameters.
      batch_size: B; must equal encoder_tokens.shape[0].
      max_length: decoder positions to hold (K). Tokens fed at positions >= K are not stored.
      encoder_tokens: [B, S] int32, 0 = padding.
    """
    if encoder_tokens is None:
      raise ValueError('T5.init_cache needs encoder_tokens (an encoder-decoder model)')
    _check_tokens('encoder_tokens', encoder_tokens)
    if encoder_tokens.shape[0] != batch_size:
      raise ValueError(f'batch_size {batch_size} != encoder_tokens batch {encoder_tokens.shape[0]}')
    if max_length < 1:
      raise ValueError(f'max_length must be >= 1, got {max_length}')
    cfg = self.config
    dtype = jnp.dtype(cfg.dtype)
    encoded = self.encode(params, encoder_tokens)  # [B, S, d]
    if self.cache_cross_kv:
      cross = self._apply(params, encoded, method=Transformer.cross_key_values)
      cross_key = tuple(k for k, _ in cross)  # each [B, H, dh, S]
      cross_value = tuple(v for _, v in cross)
    else:
      cross_key, cross_value = (), ()
    shape = (batch_size, cfg.num_heads, cfg.head_dim, max_length)
    zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_decoder_layers))
    return T5Cache(
      self_key=zeros(),
      self_value=zeros(),
      cross_key=cross_key,
      cross_value=cross_value,
      encoded=encoded,
      encoder_mask=encoder_tokens > 0,
    )

  def extend(
    self, params: Params, cache: T5Cache, tokens: Array, start: Array
  ) -> tuple[Array, T5Cache]:
    """Cached decoder forward over T new tokens per row (see `CachedLM.extend`).

    Args:
      params: parameters.
      cache: from `init_cache` or a previous `extend`.
      tokens: [B, T] int32; position 0 of the decoder stream holds the start token (0).
      start: [B] int32, the decoder position of tokens[:, 0] in each row; or a scalar [] int32
        when every row is at the same position (lockstep, e.g. a batch decoded one token per step
        from equal-length prompts): same logits and cache bit for bit, but the cache is written
        with a dynamic_update_slice instead of a per-row scatter and the attention bias is shared
        by the rows, which is faster at batch > 1 (docs/batch_performance.md).

    Returns:
      logits [B, T, V] float32 (logits[b, t] predicts position start[b] + t + 1) and the cache with
      the new keys/values written at positions start[b] .. start[b] + T - 1.
    """
    assert tokens.ndim == 2, f'tokens must be [B, T], got {tokens.shape}'
    assert start.ndim == 0 or start.shape == tokens.shape[:1], (start.shape, tokens.shape)
    self_kv = tuple(zip(cache.self_key, cache.self_value))
    if self.cache_cross_kv:
      if not cache.cross_key:
        raise ValueError('cache has no cross-attention K/V; it was made with cache_cross_kv=False')
      cross_kv = tuple(zip(cache.cross_key, cache.cross_value))
      encoded = None
    else:
      cross_kv, encoded = None, cache.encoded
    logits, new_self_kv = self._apply(
      params,
      tokens,
      start.astype(jnp.int32),
      self_kv,
      cache.encoder_mask,
      encoded,
      cross_kv,
      method=Transformer.extend,
    )
    cache = cache.replace(
      self_key=tuple(k for k, _ in new_self_kv), self_value=tuple(v for _, v in new_self_kv)
    )
    return logits, cache  # [B, T, V] float32


@functools.partial(jax.jit, static_argnums=0)
def _init_params_jit(model: T5, rng: Array) -> Params:
  return flax.core.unfreeze(_unbox(model._init_boxed(rng)))


def _check_tokens(name: str, tokens: Array) -> None:
  if tokens.ndim != 2:
    raise ValueError(f'{name} must be [batch, length], got shape {tokens.shape}')
  if not jnp.issubdtype(tokens.dtype, jnp.integer):
    raise ValueError(f'{name} must be integer token ids, got dtype {tokens.dtype}')
  if tokens.shape[1] == 0:
    raise ValueError(f'{name} is empty (length 0)')


def shift_right(targets: Array, start_token_id: int = 0) -> Array:
  """Decoder inputs from targets [B, T]: start token first, last target dropped (T5X style)."""
  start = jnp.full(targets.shape[:-1] + (1,), start_token_id, targets.dtype)
  return jnp.concatenate([start, targets[..., :-1]], axis=-1)
