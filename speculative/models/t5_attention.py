"""T5 attention: relative position buckets and biases, masks as an additive bias, multi-head
dot-product attention with T5X's projections, and the per-row cache write of the decoding caches."""

from __future__ import annotations

import functools
from typing import Any

from flax import linen as nn
import jax
from jax import lax
import jax.numpy as jnp
import numpy as np

from speculative import kernels
from speculative.models import t5_layers

Array = jax.Array

# Added to masked attention logits (T5X's value; exp underflows to exactly 0 in float32).
MASK_BIAS = -1e10


def relative_position_bucket(
  relative_position: np.ndarray,
  *,
  bidirectional: bool,
  num_buckets: int = 32,
  max_distance: int = 128,
) -> np.ndarray:
  """T5's bucket of `relative_position = key_position - query_position` (numpy, as in T5X).

  Half of each direction's buckets (of all the buckets if not bidirectional) hold exact distances
  0..max_exact-1, the rest are logarithmically spaced up to `max_distance`; larger distances share
  the last bucket.
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
def bucket_table(bidirectional: bool, num_buckets: int, max_distance: int) -> np.ndarray:
  """Buckets of relative positions -max_distance..max_distance (index = rel + max_distance).

  All |relative positions| >= max_distance share a bucket, so clipping to this range is exact.
  """
  rel = np.arange(-max_distance, max_distance + 1, dtype=np.int32)
  return relative_position_bucket(
    rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
  ).astype(np.int32)


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
    rel_embedding = t5_layers.logical_param(
      self,
      'rel_embedding',
      t5_layers.relpos_init,
      (self.num_heads, self.num_buckets),
      ('heads', 'relpos_buckets'),
    )
    relative = key_positions[..., None, :] - query_positions[..., :, None]  # [..., Tq, Tk]
    relative = jnp.clip(relative, -self.max_distance, self.max_distance)
    table = jnp.asarray(bucket_table(bidirectional, self.num_buckets, self.max_distance))
    bucket = table[relative + self.max_distance]  # [..., Tq, Tk]
    bias = jnp.take(jnp.asarray(rel_embedding, self.dtype).T, bucket, axis=0)  # [..., Tq, Tk, H]
    return jnp.moveaxis(bias, -1, -3)  # [..., H, Tq, Tk]


def mask_to_bias(mask: Array, dtype: Any) -> Array:
  return lax.select(mask, jnp.zeros(mask.shape, dtype), jnp.full(mask.shape, MASK_BIAS, dtype))


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
    query_init = lambda *args: t5_layers.attention_kernel_init(*args) / depth_scaling
    joined = self.num_heads * self.head_dim
    self.query = t5_layers.DenseGeneral(joined, ('embed', 'joined_kv'), query_init, self.dtype)
    self.key = t5_layers.DenseGeneral(
      joined, ('embed', 'joined_kv'), t5_layers.attention_kernel_init, self.dtype
    )
    self.value = t5_layers.DenseGeneral(
      joined, ('embed', 'joined_kv'), t5_layers.attention_kernel_init, self.dtype
    )
    self.out = t5_layers.DenseGeneral(
      self.emb_dim, ('joined_kv', 'embed'), t5_layers.attention_kernel_init, self.dtype
    )

  def _split_heads(self, x: Array) -> Array:
    return x.reshape(x.shape[:-1] + (self.num_heads, self.head_dim))  # [B, T, H, dh]

  def project_query(self, inputs_q: Array) -> Array:
    return self._split_heads(self.query(inputs_q))  # [B, Tq, H, dh]

  def project_qkv(self, inputs: Array) -> tuple[Array, Array, Array]:
    """Query, key and value of self-attention, each [B, T, H, dh]. Where the job packed the three
    kernels side by side ('packed' 'qkv', [d, 3 H dh]) they are one kernel call: the same columns,
    so the same bits, as three calls."""
    if not self.has_variable(t5_layers.PACKED, 'qkv'):
      return (self.project_query(inputs), *self.project_key_value(inputs))
    joined = self.num_heads * self.head_dim
    packed = self.get_variable(t5_layers.PACKED, 'qkv')  # [ceil(3 H dh / 16), d, 16]
    name = '/'.join(self.scope.path) + '/qkv'
    qkv = kernels.matmul(inputs, packed, 3 * joined, name=name).astype(self.dtype)  # [B, T, 3 H dh]
    return tuple(self._split_heads(qkv[..., i * joined : (i + 1) * joined]) for i in range(3))

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
    num_keys: Array | None = None,
  ) -> Array:
    """Attention of query [B,Tq,H,dh] over key/value [B,Tk,H,dh]; bias [B|1,H|1,Tq,Tk] is added.

    `num_keys` [B] int32 (or None): `bias` masks every key at or after num_keys[b] for all of row
    b's queries (a decode step over a cache: the entries after its last new token). The CPU
    kernels then skip those keys (same bits, `kernels.decode_attention`); XLA's path needs no hint.

    With `heads_first`, key/value are [B,H,dh,Tk] (the decoding caches' layout, as T5X's
    examples): the layout XLA's CPU dots (batch dims b, h) put [B,Tk,H,dh] operands in anyway, so
    the same products are read in place instead of from a transposed copy of the whole cache at
    every step, with bit-identical results (docs/batch_performance.md).
    """
    if heads_first and deterministic and self.out.has_variable(t5_layers.PACKED, 'kernel'):
      # The job packed this decoder for the kernels: attention over the cache row by row, so a
      # T-token verify gives each row the bits of T one-token steps (`kernels.decode_attention`).
      x = kernels.decode_attention(query, key, value, bias, num_keys)  # [B, Tq, H, dh]
      x = x.astype(self.dtype)
      return self.out(x.reshape(x.shape[:-2] + (self.num_heads * self.head_dim,)))
    if self.float32_logits:
      query = query.astype(jnp.float32)
      key = key.astype(jnp.float32)
    kv = 'bhdk' if heads_first else 'bkhd'
    weights = jnp.einsum(f'bqhd,{kv}->bhqk', query, key)  # [B, H, Tq, Tk]
    weights = weights + bias.astype(weights.dtype)
    weights = jax.nn.softmax(weights).astype(self.dtype)
    # Kept only when the caller makes 'intermediates' mutable (T5.forward_with_attention); else a
    # no-op.
    self.sow('intermediates', 'attention_weights', weights)
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


def write_rows(cache: Array, new: Array, positions: Array) -> Array:
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
