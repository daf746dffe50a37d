"""Loads the kernels' shared library once, registers its FFI targets, and says which path runs."""

from __future__ import annotations

import ctypes
import functools
import os

import jax

ISA_NAMES = {1: 'portable', 2: 'avx2', 3: 'avx512'}
ISA_IDS = {'auto': 0, **{name: isa for isa, name in ISA_NAMES.items()}}
ENV_SWITCH = 'SPECULATIVE_KERNELS'  # '0' / 'off' / 'false' / 'no' turns the kernels off
# FFI target name -> exported handler symbol (matmul.cc, attention.cc, rms_norm.cc).
TARGETS = {
  'speculative_packed_matmul': 'SpeculativePackedMatmul',
  'speculative_decode_attention': 'SpeculativeDecodeAttention',
  'speculative_rms_norm': 'SpeculativeRmsNorm',
}


def switched_off() -> bool:
  return os.environ.get(ENV_SWITCH, '1').strip().lower() in ('0', 'off', 'false', 'no')


@functools.cache
def _load() -> tuple[ctypes.CDLL | None, str]:
  """(library or None, one-line status)."""
  from speculative.kernels import build  # pylint: disable=g-import-not-at-top

  if switched_off():
    return None, f'kernels off ({ENV_SWITCH}={os.environ[ENV_SWITCH]}); XLA path'
  if not os.path.exists(build.LIBRARY):
    return (
      None,
      'kernels not built (run `make install` or `python -m speculative.kernels.build`); XLA path',
    )
  if build.built_sha256() != build.source_sha256():
    return (
      None,
      'kernels stale (their C++ source changed since the build; run `make install`); XLA path',
    )
  try:
    lib = ctypes.CDLL(build.LIBRARY)
    lib.speculative_best_isa.restype = ctypes.c_int64
    isa = int(lib.speculative_best_isa())
    for target, symbol in TARGETS.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)), platform='cpu')
  except (OSError, AttributeError) as err:
    return None, f'kernels not loadable ({err}); XLA path'
  return lib, f'kernels on ({ISA_NAMES[isa]})'


def available() -> bool:
  """True when the library is built from the current sources, loaded and not switched off."""
  return _load()[0] is not None


def status() -> str:
  """One line: 'kernels on (avx512)', or why the XLA path is used."""
  return _load()[1]


def require() -> None:
  if not available():
    raise RuntimeError(status())


def best_isa() -> str:
  """The ISA path this host runs: 'avx512', 'avx2' or 'portable'."""
  require()
  return ISA_NAMES[int(_load()[0].speculative_best_isa())]


def isa_id(isa: str) -> int:
  if isa not in ISA_IDS:
    raise ValueError(f'unknown ISA path {isa!r}; one of {sorted(ISA_IDS)}')
  return ISA_IDS[isa]
