"""The T5 v1.1 encoder-decoder network (T5X `network.Transformer` parameter tree): encoder and
decoder layers and stacks, with the decoder's multi-token cached `extend` at per-row offsets."""

from __future__ import annotations

from flax import linen as nn
import jax
import jax.numpy as jnp

from speculative.models import t5_attention
from speculative.models import t5_config
from speculative.models import t5_layers

Array = jax.Array


def _attention(cfg: t5_config.T5Config) -> t5_attention.MultiHeadDotProductAttention:
  # Modules built in `setup` are named by the attribute they are assigned to.
  return t5_attention.MultiHeadDotProductAttention(
    num_heads=cfg.num_heads,
    head_dim=cfg.head_dim,
    emb_dim=cfg.emb_dim,
    dtype=jnp.dtype(cfg.dtype),
    dropout_rate=cfg.dropout_rate,
    float32_logits=cfg.float32_attention_logits,
  )


def _mlp(cfg: t5_config.T5Config) -> t5_layers.MlpBlock:
  return t5_layers.MlpBlock(
    intermediate_dim=cfg.mlp_dim,
    emb_dim=cfg.emb_dim,
    activations=cfg.mlp_activations,
    dropout_rate=cfg.dropout_rate,
    dtype=jnp.dtype(cfg.dtype),
  )


def _norm(cfg: t5_config.T5Config) -> t5_layers.LayerNorm:
  return t5_layers.LayerNorm(dtype=jnp.dtype(cfg.dtype))


def _residual(layer: nn.Module, y: Array, x: Array, deterministic: bool) -> Array:
  """A sublayer's output `y` after dropout, plus the sublayer's input `x`."""
  return t5_layers.dropout(layer, layer.config.dropout_rate, y, deterministic) + x


def _mlp_sublayer(layer: nn.Module, x: Array, deterministic: bool) -> Array:
  """The layer's last sublayer: pre-norm gated MLP (`pre_mlp_layer_norm`, `mlp`) + residual."""
  return _residual(layer, layer.mlp(layer.pre_mlp_layer_norm(x), deterministic), x, deterministic)


class EncoderLayer(nn.Module):
  """Pre-norm self-attention + gated MLP block."""

  config: t5_config.T5Config

  def setup(self):
    cfg = self.config
    self.pre_attention_layer_norm, self.attention = _norm(cfg), _attention(cfg)
    self.pre_mlp_layer_norm, self.mlp = _norm(cfg), _mlp(cfg)

  def __call__(self, inputs: Array, bias: Array, deterministic: bool) -> Array:
    x = self.pre_attention_layer_norm(inputs)
    x = _residual(self, self.attention(x, x, bias, deterministic), inputs, deterministic)
    return _mlp_sublayer(self, x, deterministic)


class DecoderLayer(nn.Module):
  """Pre-norm causal self-attention, cross-attention and gated MLP block."""

  config: t5_config.T5Config

  def setup(self):
    cfg = self.config
    self.pre_self_attention_layer_norm, self.self_attention = _norm(cfg), _attention(cfg)
    self.pre_cross_attention_layer_norm = _norm(cfg)
    self.encoder_decoder_attention = _attention(cfg)
    self.pre_mlp_layer_norm, self.mlp = _norm(cfg), _mlp(cfg)

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
    self_num_keys: Array | None = None,
  ):
    """One decoder layer.

    Args:
      inputs: [B, T, d].
      self_bias: [B|1, H, T, K] mask + relative-position bias of the self-attention (K = T without
        a cache, K = cache length with one).
      cross_bias: [B, 1, T|1, S] mask bias of the cross-attention.
      deterministic: no t5_layers.dropout if True.
      encoded: [B, S, d] encoder output (used when `cross_kv` is None).
      cross_kv: precomputed cross-attention (key, value), each [B, H, dh, S].
      self_kv_cache: (key, value) caches, each [B, H, dh, K]; the new keys/values are written at
        `write_positions` and attention runs over the whole cache.
      write_positions: [B, T] int32 cache positions of the T new tokens, or [T] when all rows
        write at the same positions (see `t5_attention.write_rows`).
      self_num_keys: [B] int32 or None: `self_bias` masks the cache from position
        self_num_keys[b] on for every query of row b (`MultiHeadDotProductAttention.attend`).

    Returns:
      ([B, T, d] outputs, updated (key, value) cache or None).
    """
    x = self.pre_self_attention_layer_norm(inputs)
    query, key, value = self.self_attention.project_qkv(x)  # each [B, T, H, dh]
    new_cache = None
    if self_kv_cache is not None:
      key = t5_attention.write_rows(self_kv_cache[0], key, write_positions)  # [B, H, dh, K]
      value = t5_attention.write_rows(self_kv_cache[1], value, write_positions)
      new_cache = (key, value)
    x = self.self_attention.attend(
      query,
      key,
      value,
      self_bias,
      deterministic,
      heads_first=self_kv_cache is not None,
      num_keys=self_num_keys,
    )
    x = _residual(self, x, inputs, deterministic)

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
    y = _residual(self, y, x, deterministic)
    return _mlp_sublayer(self, y, deterministic), new_cache


class _Stack(nn.Module):
  """What the encoder and the decoder share: the shared embedding in front of a stack of layers,
  with one relative-position bias module (`relpos_bias`) for all of them."""

  config: t5_config.T5Config
  shared_embedding: nn.Module

  def _setup_layers(self, layer_type: type[nn.Module], num_layers: int) -> None:
    """Called from `setup`: `relpos_bias` and `layers` (layers_0, layers_1, ...)."""
    cfg = self.config
    self.relpos_bias = t5_attention.RelativePositionBiases(
      num_buckets=cfg.relative_attention_num_buckets,
      max_distance=cfg.relative_attention_max_distance,
      num_heads=cfg.num_heads,
      dtype=jnp.dtype(cfg.dtype),
    )
    self.layers = [layer_type(cfg) for _ in range(num_layers)]

  def _embed(self, tokens: Array, deterministic: bool) -> Array:
    """[B, T] token ids -> [B, T, d] in the compute dtype, after dropout (none if deterministic)."""
    cfg = self.config
    x = self.shared_embedding(tokens.astype(jnp.int32))
    return t5_layers.dropout(self, cfg.dropout_rate, x, deterministic).astype(jnp.dtype(cfg.dtype))


class Encoder(_Stack):
  """Embedding (shared) -> encoder layers -> final RMS norm."""

  def setup(self):
    self._setup_layers(EncoderLayer, self.config.num_encoder_layers)
    self.encoder_norm = _norm(self.config)

  def __call__(self, encoder_tokens: Array, deterministic: bool) -> Array:
    cfg = self.config
    assert encoder_tokens.ndim == 2, encoder_tokens.shape  # [B, S]
    valid = encoder_tokens > 0  # [B, S]
    mask = valid[:, None, :, None] & valid[:, None, None, :]  # [B, 1, S, S]
    positions = jnp.arange(encoder_tokens.shape[1], dtype=jnp.int32)
    relpos = self.relpos_bias(positions, positions, True)[None]  # [1, H, S, S]
    bias = t5_attention.mask_to_bias(mask, jnp.dtype(cfg.dtype)) + relpos  # [B, H, S, S]
    x = self._embed(encoder_tokens, deterministic)  # [B, S, d]
    for layer in self.layers:
      x = layer(x, bias, deterministic)
    x = self.encoder_norm(x)
    return t5_layers.dropout(self, cfg.dropout_rate, x, deterministic, broadcast=False)  # [B, S, d]


class Decoder(_Stack):
  """Embedding (shared) -> decoder layers -> final RMS norm -> float32 logits."""

  def setup(self):
    cfg = self.config
    self._setup_layers(DecoderLayer, cfg.num_decoder_layers)
    # The logits head's dtype (T5Config.logits_dtype); shared by `__call__` and `extend`.
    self.decoder_norm = t5_layers.LayerNorm(dtype=jnp.dtype(cfg.logits_dtype or cfg.dtype))
    if not cfg.logits_via_embedding:
      self.logits_dense = t5_layers.DenseGeneral(
        cfg.vocab_size, ('embed', 'vocab'), t5_layers.mlp_kernel_init, jnp.float32
      )

  def cross_key_values(self, encoded: Array) -> tuple[tuple[Array, Array], ...]:
    """Every layer's cross-attention (key, value), each [B, H, dh, S]."""
    return tuple(layer.cross_key_value(encoded) for layer in self.layers)

  def _logits(self, y: Array, deterministic: bool) -> Array:
    cfg = self.config
    y = self.decoder_norm(y)
    y = t5_layers.dropout(self, cfg.dropout_rate, y, deterministic)
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
    self_bias = t5_attention.mask_to_bias(self_mask, dtype) + relpos  # [B|1, H, T, T]
    cross_mask = query_valid[:, None, :, None] & (encoder_tokens > 0)[:, None, None, :]
    cross_bias = t5_attention.mask_to_bias(cross_mask, dtype)  # [B, 1, T, S]

    y = self._embed(decoder_input_tokens, deterministic)  # [B, T, d]
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
    # one dynamic_update_slice instead of a per-row scatter (`t5_attention.write_rows`).
    query_positions = start[..., None] + jnp.arange(num_new, dtype=jnp.int32)  # [B|-, T]
    key_positions = jnp.arange(cache_length, dtype=jnp.int32)  # [K]
    # A query at position j sees cache positions 0..j of its own row; later entries are stale.
    self_mask = key_positions <= query_positions[..., None]  # [B|-, T, K]
    relpos = self.relpos_bias(query_positions, key_positions, False)  # [B|-, H, T, K]
    self_bias = (
      t5_attention.mask_to_bias(self_mask[..., None, :, :], dtype) + relpos
    )  # [B|-, H, T, K]
    if start.ndim == 0:
      self_bias = self_bias[None]  # [1, H, T, K]
    cross_bias = t5_attention.mask_to_bias(encoder_mask[:, None, None, :], dtype)  # [B, 1, 1, S]
    # Every query of row b is masked from cache position start[b] + T on.
    num_keys = jnp.broadcast_to(start + num_new, tokens.shape[:1]).astype(jnp.int32)  # [B]

    y = self._embed(tokens, True)  # [B, T, d]
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
        self_num_keys=num_keys,
      )
      new_self_kv.append(layer_cache)
    return self._logits(y, True), tuple(new_self_kv)  # [B, T, V] float32


class Transformer(nn.Module):
  """The T5 encoder-decoder (T5X `network.Transformer` parameter tree)."""

  config: t5_config.T5Config

  def setup(self):
    cfg = self.config
    self.token_embedder = t5_layers.Embed(
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
