"""GPT-like decoder-only language model with a chunked, per-row-offset KV cache.

The paper's lm1b setup uses decoder-only Transformers (a ~97M target, ~6M draft); the shapes live in
configs/models/lm1b_{target,draft}.gin. Architecture: token embedding (+ learned positions, or
rotary positions applied to queries/keys), pre-norm blocks (RMSNorm or LayerNorm) of causal
multi-head self-attention and a GELU MLP, a final norm and an untied (or tied) output projection.
Logits are float32; so is everything else.

`DecoderOnlyLM(config)` is the frozen, hashable wrapper implementing the `CachedLM` protocol
(speculative/models/interface.py): `init_params`, `init_cache`, `extend` (cached forward over T new
tokens at per-row offsets) and `forward` (the full no-cache causal forward, for tests and training).
Cache: per layer, keys and values [B, max_length, heads, head_dim] float32; `extend` writes the T
new entries of row b at start[b].. with a per-row `dynamic_update_slice` and masks keys by position
(key position <= query position), so stale entries beyond a row's length are never read.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from speculative.models import interface

Params = Any
# One (keys, values) pair per layer, each [B, max_length, heads, head_dim] float32.
Cache = tuple[tuple[jax.Array, jax.Array], ...]

_POSITIONS = ('learned', 'rotary')
_NORMS = ('rmsnorm', 'layernorm')


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
  """Static shape/architecture of a decoder-only LM (hashable).

  Attributes:
    vocab_size: V.
    d_model: residual width.
    d_ff: MLP hidden width.
    num_layers: number of blocks.
    num_heads: attention heads.
    head_dim: per-head width (default d_model // num_heads).
    positions: 'rotary' (no length limit) or 'learned' (a [max_positions, d_model] table).
    max_positions: the longest stream a 'learned' model can embed (init_cache checks it).
    norm: 'rmsnorm' or 'layernorm' (pre-norm in every block, plus a final norm).
    tie_embeddings: output logits via the transposed token embedding instead of a separate kernel.
    rotary_base: the RoPE frequency base.
  """

  vocab_size: int = 8192
  d_model: int = 768
  d_ff: int = 3072
  num_layers: int = 12
  num_heads: int = 12
  head_dim: int | None = None
  positions: str = 'rotary'
  max_positions: int = 2048
  norm: str = 'rmsnorm'
  tie_embeddings: bool = False
  rotary_base: float = 10000.0

  def __post_init__(self):
    for name in ('vocab_size', 'd_model', 'd_ff', 'num_layers', 'num_heads', 'max_positions'):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f'DecoderOnlyConfig.{name} must be a positive int, got {value!r}')
    if self.head_dim is None and self.d_model % self.num_heads:
      raise ValueError(
        f'd_model={self.d_model} is not divisible by num_heads={self.num_heads}; '
        'set head_dim explicitly'
      )
    if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim < 1):
      raise ValueError(f'DecoderOnlyConfig.head_dim must be a positive int, got {self.head_dim!r}')
    if self.positions not in _POSITIONS:
      raise ValueError(
        f'DecoderOnlyConfig.positions must be one of {_POSITIONS}, got {self.positions!r}'
      )
    if self.positions == 'rotary' and self.dims_per_head % 2:
      raise ValueError(f'rotary positions need an even head_dim, got {self.dims_per_head}')
    if self.norm not in _NORMS:
      raise ValueError(f'DecoderOnlyConfig.norm must be one of {_NORMS}, got {self.norm!r}')

  @property
  def dims_per_head(self) -> int:
    return self.head_dim if self.head_dim is not None else self.d_model // self.num_heads


def _rotary(x: jax.Array, positions: jax.Array, base: float) -> jax.Array:
  """RoPE (rotate-half form): x [B, T, H, D], positions [B, T] -> [B, T, H, D]."""
  half = x.shape[-1] // 2
  inv_freq = 1.0 / (base ** (jnp.arange(half, dtype=jnp.float32) / half))  # [D/2]
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
  sin = jnp.sin(angles)[:, :, None, :]
  cos = jnp.cos(angles)[:, :, None, :]
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _write_rows(cache: jax.Array, update: jax.Array, start: jax.Array) -> jax.Array:
  """cache [B, S, ...] <- update [B, T, ...] at per-row offsets start [B]."""

  def write_one(row_cache, row_update, row_start):
    index = (row_start,) + (0,) * (row_cache.ndim - 1)
    return jax.lax.dynamic_update_slice(row_cache, row_update, index)

  return jax.vmap(write_one)(cache, update, start)


def _check_write(length: int, start: jax.Array, max_length: int) -> None:
  """ValueError (one line) where `extend`'s write of `length` tokens at `start` [B] can be seen to
  leave a cache of `max_length` positions: from the static shapes, or from a concrete `start`."""
  if length > max_length:
    raise ValueError(f'extend: {length} new tokens do not fit a cache of {max_length} positions')
  if isinstance(start, jax.core.Tracer):
    return
  start = np.asarray(start)
  if start.size and (start.min() < 0 or start.max() + length > max_length):
    raise ValueError(
      f'extend: {length} new tokens at start {start.min()}..{start.max()} leave a cache of '
      f'{max_length} positions (start must be in [0, {max_length - length}])'
    )


class _Norm(nn.Module):
  kind: str

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    if self.kind == 'rmsnorm':
      return nn.RMSNorm(epsilon=1e-6, dtype=jnp.float32, name='norm')(x)
    return nn.LayerNorm(epsilon=1e-6, dtype=jnp.float32, name='norm')(x)


class SelfAttention(nn.Module):
  """Causal multi-head self-attention over the new tokens, optionally through a KV cache."""

  config: DecoderOnlyConfig

  @nn.compact
  def __call__(self, x, positions, cache_kv=None, start=None):
    """x [B, T, d], positions [B, T]; cache_kv = (keys, values) [B, S, H, D] or None.

    Returns (y [B, T, d], new (keys, values) or None).
    """
    cfg = self.config
    heads, head_dim = cfg.num_heads, cfg.dims_per_head
    dense = lambda name: nn.DenseGeneral(
      (heads, head_dim), use_bias=False, dtype=jnp.float32, name=name
    )
    query = dense('query')(x)  # [B, T, H, D]
    key = dense('key')(x)
    value = dense('value')(x)
    if cfg.positions == 'rotary':
      query = _rotary(query, positions, cfg.rotary_base)
      key = _rotary(key, positions, cfg.rotary_base)
    if cache_kv is None:
      keys, values = key, value  # [B, T, H, D]
      key_positions = positions  # [B, T]
      new_cache = None
    else:
      keys = _write_rows(cache_kv[0], key, start)  # [B, S, H, D]
      values = _write_rows(cache_kv[1], value, start)
      key_positions = jnp.broadcast_to(
        jnp.arange(keys.shape[1], dtype=jnp.int32), keys.shape[:2]
      )  # [B, S]
      new_cache = (keys, values)
    # Causal mask from positions: a query at j sees keys at positions <= j of its own row.
    mask = key_positions[:, None, :] <= positions[:, :, None]  # [B, T, S]
    scores = jnp.einsum('bthd,bshd->bhts', query, keys) / math.sqrt(head_dim)  # [B, H, T, S]
    scores = jnp.where(mask[:, None], scores, jnp.finfo(jnp.float32).min)
    weights = jax.nn.softmax(scores, axis=-1)
    attended = jnp.einsum('bhts,bshd->bthd', weights, values)  # [B, T, H, D]
    y = nn.DenseGeneral(cfg.d_model, axis=(-2, -1), use_bias=False, dtype=jnp.float32, name='out')(
      attended
    )  # [B, T, d]
    return y, new_cache


class MlpBlock(nn.Module):
  config: DecoderOnlyConfig

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.config.d_ff, dtype=jnp.float32, name='wi')(x)  # [B, T, d_ff]
    h = jax.nn.gelu(h)
    return nn.Dense(self.config.d_model, dtype=jnp.float32, name='wo')(h)  # [B, T, d]


class DecoderLayer(nn.Module):
  config: DecoderOnlyConfig

  @nn.compact
  def __call__(self, x, positions, cache_kv=None, start=None):
    h, new_cache = SelfAttention(self.config, name='attention')(
      _Norm(self.config.norm, name='pre_attention_norm')(x), positions, cache_kv, start
    )
    x = x + h
    x = x + MlpBlock(self.config, name='mlp')(_Norm(self.config.norm, name='pre_mlp_norm')(x))
    return x, new_cache


class DecoderOnlyTransformer(nn.Module):
  """tokens [B, T], positions [B, T] (+ optional cache) -> logits [B, T, V] float32."""

  config: DecoderOnlyConfig

  @nn.compact
  def __call__(self, tokens, positions, cache=None, start=None):
    cfg = self.config
    embed = nn.Embed(
      cfg.vocab_size,
      cfg.d_model,
      dtype=jnp.float32,
      embedding_init=nn.initializers.normal(stddev=1.0),
      name='token_embedder',
    )
    x = embed(tokens)  # [B, T, d]
    if cfg.positions == 'learned':
      x = x + nn.Embed(
        cfg.max_positions,
        cfg.d_model,
        dtype=jnp.float32,
        embedding_init=nn.initializers.normal(stddev=0.02),
        name='position_embedder',
      )(positions)
    new_cache = []
    for i in range(cfg.num_layers):
      layer_cache = None if cache is None else cache[i]
      x, layer_new = DecoderLayer(cfg, name=f'layers_{i}')(x, positions, layer_cache, start)
      new_cache.append(layer_new)
    x = _Norm(cfg.norm, name='final_norm')(x)
    if cfg.tie_embeddings:
      logits = embed.attend(x) / math.sqrt(cfg.d_model)
    else:
      logits = nn.Dense(cfg.vocab_size, use_bias=False, dtype=jnp.float32, name='logits_dense')(x)
    logits = logits.astype(jnp.float32)  # [B, T, V]
    return logits, (None if cache is None else tuple(new_cache))


@dataclasses.dataclass(frozen=True)
class DecoderOnlyLM(interface.ModuleLM):
  """CachedLM wrapper (frozen, hashable: a valid jit static argument)."""

  config: DecoderOnlyConfig
  module_type = DecoderOnlyTransformer

  def init_params(self, rng: jax.Array) -> Params:
    tokens = jnp.zeros((1, 1), jnp.int32)
    return self.module.init(rng, tokens, jnp.zeros((1, 1), jnp.int32))['params']

  def init_cache(
    self, params: Params, batch_size: int, max_length: int, encoder_tokens: jax.Array | None = None
  ) -> Cache:
    """The empty cache of `max_length` positions (see interface.CachedLM.init_cache). With learned
    positions, a decode whose cache (decode/state.py's `buffer_length`) feeds more positions than
    max_positions is refused: it feeds `max_length - interface.UNFED_POSITIONS` of them for the rows
    it keeps (the draft model of a speculative decode one fewer); a position >= max_positions fed
    all the same (a finished row's, or a direct `extend`'s) embeds as NaN."""
    del params
    if encoder_tokens is not None:
      raise ValueError(
        'DecoderOnlyLM has no encoder: encoder_tokens must be None '
        '(put the prompt in the decoder stream instead)'
      )
    if max_length < 1 or batch_size < 1:
      raise ValueError(
        f'init_cache needs batch_size >= 1 and max_length >= 1, got {batch_size}, {max_length}'
      )
    fed = max_length - interface.UNFED_POSITIONS  # prompt + max_new_tokens - 1 + gamma
    if self.config.positions == 'learned' and fed > self.config.max_positions:
      raise ValueError(
        f'a decode with a {max_length}-position cache feeds {fed} positions (prompt + '
        f'max_new_tokens - 1 + gamma), more than the model\'s max_positions='
        f'{self.config.max_positions}'
      )
    shape = (batch_size, max_length, self.config.num_heads, self.config.dims_per_head)
    return tuple(
      (jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32))
      for _ in range(self.config.num_layers)
    )

  def extend(
    self, params: Params, cache: Cache, tokens: jax.Array, start: jax.Array
  ) -> tuple[jax.Array, Cache]:
    """Cached forward over T new tokens at per-row offsets; see interface.CachedLM.extend.

    Contract: 0 <= start[b] and start[b] + T <= the cache's max_length for every row. Past it,
    the write is NOT dropped: `dynamic_update_slice` clamps row b's start to max_length - T, so
    the new keys/values land on earlier positions, overwriting entries later calls read, and
    nothing says so. Refused (ValueError) where it can be seen without a run-time cost: T above
    max_length (static shapes, at trace time) and a concrete `start` (an eager call). A traced
    `start` (every jitted decode loop) is not checked; the loops size their caches so their
    longest write, gamma + 1 tokens at a finished row's last position prompt + max_new_tokens - 1,
    ends inside (decode/state.py's `buffer_length`; tests/decode/test_decoding.py checks it).
    """
    assert tokens.ndim == 2, tokens.shape
    batch, length = tokens.shape
    assert start.shape == (batch,), (start.shape, tokens.shape)
    assert len(cache) == self.config.num_layers
    _check_write(length, start, cache[0][0].shape[1])  # keys [B, max_length, H, D]
    positions = start.astype(jnp.int32)[:, None] + jnp.arange(length, dtype=jnp.int32)  # [B, T]
    logits, cache = self.module.apply(
      {'params': params}, tokens.astype(jnp.int32), positions, cache, start.astype(jnp.int32)
    )
    return logits, cache  # [B, T, V]

  def forward(self, params: Params, tokens: jax.Array) -> jax.Array:
    """Full causal forward without a cache: tokens [B, T] -> logits [B, T, V] float32."""
    assert tokens.ndim == 2, tokens.shape
    positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    logits, _ = self.module.apply({'params': params}, tokens.astype(jnp.int32), positions)
    return logits
