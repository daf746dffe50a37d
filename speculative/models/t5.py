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

The parts, one module each: `t5_config` (T5Config), `t5_layers` (dense, RMS norm, embedding, gated
MLP, dropout), `t5_attention` (relative position buckets, attention, the cache write) and
`t5_network` (the Flax encoder-decoder); this module is the `CachedLM` wrapper and its cache.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any
from typing import Sequence

import flax
from flax import linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from speculative import kernels

# T5Config (gin: `t5.T5Config`) and the parts are re-exported from here.
from speculative.models import interface
from speculative.models import t5_layers
from speculative.models.t5_attention import relative_position_bucket  # noqa: F401
from speculative.models.t5_config import T5Config
from speculative.models.t5_network import Transformer

Array = jax.Array
Params = Any

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


@flax.struct.dataclass
class DecodeParams:
  """A T5's parameters with its decoder's weights packed for `kernels.matmul` (a pytree).

  Made once per job by `pack_decode_params`; `T5.init_cache`/`extend`/`encode` accept it wherever
  they accept the plain tree, and then every decoder linear map (1-token steps and multi-token
  verifies alike) runs in the kernel, while the encoder stays on XLA.

  Fields:
    params: the T5X parameter tree, unchanged (float32 leaves).
    packed: the decoder's kernels, same paths as in `params` ('decoder/layers_0/mlp/wo/kernel',
      ..., 'decoder/logits_dense/kernel'), each [ceil(N / 16), K, 16] float32 or bfloat16, except
      that self-attention's query, key and value are packed side by side as one kernel
      ('.../self_attention/qkv', [d, 3 H dh]) and so are the MLP's input maps ('.../mlp/wi_fused',
      [d, n f], n = len(mlp_activations): 2 in T5 1.1); and its RMS norm scales
      ('decoder/layers_0/pre_mlp_layer_norm/scale', ...), each [d] float32: the decoder's norms and
      its attention over the cache then run in the kernels too.
  """

  params: Params
  packed: Params


def packed_storage(model: 'T5', params: Params) -> str:
  """'bfloat16' when every decoder kernel is bfloat16-valued (bf16 storage then changes nothing the
  model computes and halves the bytes a step reads), else 'float32'."""
  flat = traverse_util.flatten_dict(params['decoder'], sep='/')
  for path, value in flat.items():
    if path.endswith('kernel'):  # in NumPy (ml_dtypes' bfloat16): no XLA compile per weight shape
      value = np.asarray(value, np.float32)
      if not np.array_equal(value.astype(jnp.bfloat16).astype(np.float32), value):
        return 'float32'
  return 'bfloat16'


def pack_decode_params(model: 'T5', params: Params, storage: str = 'auto') -> DecodeParams:
  """Packs every decoder linear map's kernel for the CPU kernel (see `DecodeParams`).

  storage: 'float32', 'bfloat16' (refused, naming the parameter, for a weight that is not
  bfloat16-valued) or 'auto' (`packed_storage`). With bfloat16 activations (config dtype) the XLA
  path rounds every kernel to bfloat16 before its dot, so the layers other than the float32 logits
  head are packed from those rounded values: the same model on either path. Refused (one line)
  where the kernels are unavailable or the job does not compute on CPU (`kernels.policy.off_cpu`):
  their FFI handlers exist for the cpu platform only.
  """
  if (reason := kernels.policy.off_cpu()) is not None:
    raise RuntimeError(reason)
  if not kernels.available():
    raise RuntimeError(kernels.status())
  if isinstance(params, DecodeParams):
    raise ValueError('params are already packed')
  if storage == 'auto':
    storage = packed_storage(model, params)
  activation_dtype = jnp.dtype(model.config.dtype)

  def pack(path: str, kernel: Array) -> Array:  # path below 'decoder/'; NumPy, as packed_storage
    kernel = np.asarray(kernel, np.float32)
    layer_storage = storage
    if not path.startswith('logits_dense') and activation_dtype == jnp.bfloat16:
      kernel = kernel.astype(jnp.bfloat16).astype(np.float32)
      layer_storage = 'bfloat16'
    return kernels.pack(kernel, layer_storage, f'decoder/{path}')

  decoder = params['decoder']
  packed = {}
  for path, value in traverse_util.flatten_dict(decoder, sep='/').items():
    parts = tuple(path.split('/'))
    fused = len(parts) == 4 and (
      parts[1:3]
      in (('self_attention', 'query'), ('self_attention', 'key'), ('self_attention', 'value'))
      or (parts[1] == 'mlp' and parts[2].startswith('wi'))
    )
    if path.endswith('layer_norm/scale') or path == 'decoder_norm/scale':
      packed[parts] = jnp.asarray(value, jnp.float32)  # [d]
    elif path.endswith('/kernel') and not fused:
      packed[parts] = pack(path, value)
  # Self-attention's query, key and value side by side ('qkv'), and the MLP's input maps ('wi_fused'):
  # one kernel call each instead of three and two.
  for i in range(model.config.num_decoder_layers):
    layer = decoder[f'layers_{i}']
    qkv = [layer['self_attention'][n]['kernel'] for n in ('query', 'key', 'value')]
    packed[(f'layers_{i}', 'self_attention', 'qkv')] = pack(
      f'layers_{i}/self_attention/qkv', np.concatenate([np.asarray(k) for k in qkv], axis=1)
    )  # [d, 3 H dh]
    wi_names = (
      ['wi']
      if 'wi' in layer['mlp']
      else [f'wi_{j}' for j in range(len(model.config.mlp_activations))]
    )
    packed[(f'layers_{i}', 'mlp', 'wi_fused')] = pack(
      f'layers_{i}/mlp/wi_fused',
      np.concatenate([np.asarray(layer['mlp'][n]['kernel']) for n in wi_names], axis=1),
    )  # [d, n f]
  packed = {('decoder', *k): v for k, v in packed.items()}
  return DecodeParams(params=params, packed=traverse_util.unflatten_dict(packed))


def _variables(params: Params, use_kernels: bool = True) -> dict[str, Params]:
  if isinstance(params, DecodeParams):
    if not use_kernels:
      return {'params': params.params}
    return {'params': params.params, t5_layers.PACKED: params.packed}
  return {'params': params}


@dataclasses.dataclass(frozen=True)
class T5(interface.ModuleLM):
  """T5 v1.1 as a `CachedLM` (static config only; hashable, usable as a jit static argument).

  Attributes:
    config: network hyperparameters.
    cache_cross_kv: compute each decoder layer's cross-attention keys/values once in `init_cache`
      (True) or recompute them from the encoder output at every `extend` call, as stock T5X does
      (False). Outputs are identical; only speed differs.
    use_kernels: run the decoder on the CPU kernels when given packed params (`DecodeParams`); False
      ignores the packed weights (XLA's dot), e.g. for the benchmark's stock-equivalent twin, which
      shares our params.
  """

  config: T5Config
  cache_cross_kv: bool = True
  use_kernels: bool = True

  # `extend` accepts a scalar `start` (all rows at one position), used by the baseline loop when
  # its rows advance together (`decode/loops.py`'s `autoregressive_decode`); not a dataclass field.
  lockstep_extend = True
  module_type = Transformer

  # -- parameters -----------------------------------------------------------------------------
  def _init_boxed(self, rng: Array):
    tokens = jnp.ones((1, 1), jnp.int32)
    return self.module.init({'params': rng}, tokens, tokens)['params']

  def init_params(self, rng: Array, dtype: str = 'float32') -> Params:
    """Fresh parameters with T5X's initialisers: a nested dict of arrays, no 'params' key.

    Jit-compiled (once per config), so large models initialise quickly. `dtype` is the storage
    dtype of the leaves (float32 by default; 'bfloat16' halves the bytes): the cast happens inside
    the same compiled program, leaf by leaf, so a bfloat16 tree never needs a float32 copy beside
    it (a 10.9B-parameter model is 22 GB in bfloat16, 44 GB in float32).
    """
    return _init_params_jit(self, rng, jnp.dtype(dtype).name)

  def param_shapes(self) -> dict[str, tuple[int, ...]]:
    """Flat {'encoder/layers_0/attention/query/kernel': shape, ...} of this config (no compute)."""
    shapes = jax.eval_shape(self.init_params, jax.random.PRNGKey(0))
    flat = traverse_util.flatten_dict(shapes, sep='/')
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
    return self.module.apply(
      _variables(params, self.use_kernels), *args, method=method, rngs=rngs, **kwargs
    )

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

  def forward_with_attention(
    self, params: Params, encoder_tokens: Array, decoder_target_tokens: Array
  ) -> tuple[Array, dict[str, Array]]:
    """Deterministic teacher-forced forward that also returns every attention layer's softmax
    weights (diagnostics, e.g. the attention entropy of `train.steps.make_eval_step`).

    decoder_target_tokens: [B, T] int32, 0 = padding (masked as in training); the decoder inputs
    are these shifted right. Returns logits [B, T, V] float32 and {'encoder/layers_0/attention':
    [B, H, S, S], 'decoder/layers_0/self_attention': [B, H, T, T],
    'decoder/layers_0/encoder_decoder_attention': [B, H, T, S], ...}.
    """
    _check_tokens('encoder_tokens', encoder_tokens)
    _check_tokens('decoder_target_tokens', decoder_target_tokens)
    decoder_inputs = shift_right(decoder_target_tokens)  # [B, T]
    logits, state = self.module.apply(
      {'params': params},
      encoder_tokens,
      decoder_inputs,
      decoder_target_tokens,
      True,
      mutable=['intermediates'],
    )
    flat = traverse_util.flatten_dict(flax.core.unfreeze(state['intermediates']), sep='/')
    suffix = '/attention_weights'
    weights = {k[: -len(suffix)]: v[0] for k, v in flat.items() if k.endswith(suffix)}
    return logits, weights

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


@functools.partial(jax.jit, static_argnums=(0, 2))
def _init_params_jit(model: T5, rng: Array, dtype: str) -> Params:
  params = flax.core.unfreeze(_unbox(model._init_boxed(rng)))
  return jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


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


def config_param_shapes(config: T5Config) -> dict[str, tuple[int, ...]]:
  """`T5(config).param_shapes()`, traced once per config in this process (each time for a config
  with an unhashable field, e.g. one gin bound to a list): a job's memory estimate and its weights'
  shape checks (the settings', the manifest's) ask for the same config's shapes."""
  try:
    hash(config)
  except TypeError:
    return T5(config).param_shapes()
  return _cached_param_shapes(config)


@functools.cache
def _cached_param_shapes(config: T5Config) -> dict[str, tuple[int, ...]]:
  return T5(config).param_shapes()
