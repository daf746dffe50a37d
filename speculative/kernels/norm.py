"""T5's RMS layer norm (rms_norm.cc), T-invariant."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from speculative.kernels import library


def rms_norm(x: jax.Array, scale: jax.Array, epsilon: float, isa: str = 'auto') -> jax.Array:
  """(x * 1/sqrt(mean(x^2) + eps)) * scale over the last axis, float32, each row on its own."""
  library.require()
  if scale.shape != x.shape[-1:]:
    raise ValueError(f'scale {scale.shape} does not fit x {x.shape}')
  out = jax.ShapeDtypeStruct(x.shape, jnp.float32)
  call = jax.ffi.ffi_call('speculative_rms_norm', out, vmap_method='expand_dims')
  return call(
    jnp.asarray(x, jnp.float32),
    jnp.asarray(scale, jnp.float32),
    eps=np.float32(epsilon),
    isa=np.int64(library.isa_id(isa)),
  )
