"""The packed weight-streaming matmul (matmul.cc): packing at load, the jitted call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from speculative.kernels import library
from speculative.kernels import reference

BLOCK = reference.BLOCK
STORAGE_DTYPES = ('float32', 'bfloat16')


def pack(kernel, storage: str = 'float32', name: str = 'kernel') -> jax.Array:
  """A [K, N] weight as the kernel reads it: [ceil(N/16), K, 16] in `storage` dtype.

  bfloat16 storage is exact only for weights that are bfloat16 values (e.g. loaded from a bfloat16
  checkpoint); any other weight is refused with an error naming it (`name`).
  """
  if storage not in STORAGE_DTYPES:
    raise ValueError(f'{name}: packed storage must be one of {STORAGE_DTYPES}, got {storage!r}')
  kernel = np.asarray(kernel)
  if kernel.ndim != 2:
    raise ValueError(f'{name}: only 2-D [in, out] kernels can be packed, got shape {kernel.shape}')
  kernel = kernel.astype(np.float32)
  if storage == 'bfloat16':
    rounded = kernel.astype(jnp.bfloat16)
    if not np.array_equal(rounded.astype(np.float32), kernel):
      raise ValueError(
        f'{name}: bfloat16 storage would round this weight (it is not bfloat16-valued); '
        "pack it as 'float32'"
      )
    return jnp.asarray(reference.pack(rounded))
  return jnp.asarray(reference.pack(kernel))


def check_packed(packed: jax.Array, in_features: int, out_features: int, name: str) -> None:
  """Raises ValueError naming `name` when a packed weight does not fit an [in, out] kernel."""
  want = (-(-out_features // BLOCK), in_features, BLOCK)
  if tuple(packed.shape) != want:
    raise ValueError(
      f'{name}: packed weight has shape {tuple(packed.shape)}, expected {want} for an '
      f'[{in_features}, {out_features}] kernel'
    )
  if jnp.dtype(packed.dtype).name not in STORAGE_DTYPES:
    raise ValueError(
      f'{name}: packed weight dtype {jnp.dtype(packed.dtype).name} is not one of {STORAGE_DTYPES}'
    )


def matmul(
  x: jax.Array,
  packed: jax.Array,
  out_features: int,
  isa: str = 'auto',
  name: str = 'packed weight',
) -> jax.Array:
  """x [..., K] times the packed [K, N] weight: [..., N] float32 (x is read as float32).

  Every ISA path ('portable', 'avx2', 'avx512'; 'auto' = the best this host runs) gives the same
  bits, and a row's result does not depend on the other rows. A packed weight that does not fit
  is refused with an error naming it (`name`, e.g. the parameter's path).
  """
  library.require()
  check_packed(packed, x.shape[-1], out_features, name)
  out = jax.ShapeDtypeStruct(x.shape[:-1] + (out_features,), jnp.float32)
  call = jax.ffi.ffi_call('speculative_packed_matmul', out, vmap_method='expand_dims')
  return call(
    jnp.asarray(x, jnp.float32),
    packed,
    n=np.int64(out_features),
    isa=np.int64(library.isa_id(isa)),
  )
