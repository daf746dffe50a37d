"""Decode attention over a heads-first cache (attention.cc), T-invariant."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from speculative.kernels import library


def decode_attention(
  query: jax.Array,
  key: jax.Array,
  value: jax.Array,
  bias: jax.Array,
  num_keys: jax.Array | None = None,
  isa: str = 'auto',
) -> jax.Array:
  """softmax(query . key + bias) @ value per (batch, query, head) row, float32.

  Args:
    query: [B, T, H, dh].
    key, value: [B, H, dh, K] (the decoding caches' layout).
    bias: [B|1, H|1, T|1, K] added to the scores (mask and relative positions).
    num_keys: [B] int32 or None (= K): row b attends over its first num_keys[b] keys (clamped to
      [1, K]). The caller's `bias` must mask the later keys for every query of the row (a decode
      step's cache beyond its last new token): their weight is then exactly 0, so skipping them
      gives the bits of attending over all K, and a step costs the keys written so far.
    isa: 'auto' or a pinned ISA path; every path gives the same bits.

  Returns:
    [B, T, H, dh] float32; each row's bits do not depend on T.
  """
  library.require()
  b, t, h, dh = query.shape
  if key.shape[:3] != (b, h, dh) or value.shape != key.shape:
    raise ValueError(f'key/value {key.shape}/{value.shape} do not fit query {query.shape}')
  bias = jnp.asarray(bias, jnp.float32)
  if bias.ndim != 4 or bias.shape[3] != key.shape[3]:
    raise ValueError(f'bias {bias.shape} must be [B|1, H|1, T|1, {key.shape[3]}]')
  if num_keys is None:
    num_keys = jnp.full((b,), key.shape[3], jnp.int32)
  num_keys = jnp.asarray(num_keys, jnp.int32)
  if num_keys.shape != (b,):
    raise ValueError(f'num_keys {num_keys.shape} must be [{b}]')
  out = jax.ShapeDtypeStruct((b, t, h, dh), jnp.float32)
  call = jax.ffi.ffi_call('speculative_decode_attention', out)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  return call(f32(query), f32(key), f32(value), bias, num_keys, isa=np.int64(library.isa_id(isa)))
