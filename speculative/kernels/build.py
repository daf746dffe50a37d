"""Builds the CPU kernels' shared library next to their source (the Makefile runs this).

  .venv/bin/python -m speculative.kernels.build

Compiles the kernels' sources (`SOURCES`) with g++ against jaxlib's XLA FFI headers
(`jax.ffi.include_dir()`) into one library, `_kernels.so`. No `-march` flag: the ISA paths carry their own target attributes and are chosen at
run time, so the library runs on any x86-64 host. The sources' sha256 is written beside the library
(`_kernels.so.sha256`) and `speculative.kernels` refuses a library built from other sources. When
no compiler or no header is found, or the host is not x86-64, it prints one line and exits 0: the
package then uses XLA's dot (`speculative.kernels.status()` says why).
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = tuple(os.path.join(HERE, f) for f in ('matmul.cc', 'attention.cc', 'rms_norm.cc'))
HEADERS = tuple(
  os.path.join(HERE, f)
  for f in ('vec16.h', 'vec16_ops.inc', 'per_isa.inc', 'attention_impl.inc', 'rms_norm_impl.inc')
)
LIBRARY = os.path.join(HERE, '_kernels.so')
FLAGS = ('-O3', '-std=c++17', '-shared', '-fPIC', '-ffp-contract=off', '-fno-fast-math')


def source_sha256() -> str:
  digest = hashlib.sha256()
  for path in SOURCES + HEADERS:
    with open(path, 'rb') as f:
      digest.update(f.read())
  return digest.hexdigest()


def built_sha256() -> str | None:
  try:
    with open(LIBRARY + '.sha256') as f:
      return f.read().strip()
  except OSError:
    return None


def unbuildable() -> str | None:
  """Why this host cannot build the library (not x86-64, no C++ compiler, no XLA FFI headers), or
  None where it can: there a missing or stale library is an install that was not (re)built."""
  if platform.machine() not in ('x86_64', 'AMD64'):
    return f'host is {platform.machine()}, the kernels are x86-64'
  name = os.environ.get('CXX') or 'g++'
  if not shutil.which(name):
    return f'no C++ compiler: {name} not found'
  if not os.path.exists(os.path.join(_ffi_include_dir(), 'xla', 'ffi', 'api', 'ffi.h')):
    return f'no XLA FFI headers under {_ffi_include_dir()}'
  return None


def _ffi_include_dir() -> str:
  import jax  # the FFI headers ship with jaxlib

  return jax.ffi.include_dir()


def build(force: bool = False) -> str:
  """Builds the library if missing or stale; returns one line saying what happened."""
  digest = source_sha256()
  if not force and os.path.exists(LIBRARY) and built_sha256() == digest:
    os.utime(LIBRARY + '.sha256')  # newer than the sources again: make's stamp
    return f'kernels: {os.path.relpath(LIBRARY)} is up to date'
  why_not = unbuildable()
  if why_not:
    return f'kernels: not built ({why_not}); XLA path'
  compiler = shutil.which(os.environ.get('CXX') or 'g++')
  include = _ffi_include_dir()
  # Build to a temporary name and rename, so an interrupted build leaves no half-written library.
  fd, tmp = tempfile.mkstemp(dir=HERE, prefix='._kernels.', suffix='.so')
  os.close(fd)
  cmd = [compiler, *FLAGS, f'-I{include}', *SOURCES, '-o', tmp]
  try:
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
      lines = result.stderr.strip().splitlines() or ['(no output)']
      first = next((line for line in lines if 'error' in line), lines[0])
      return f'kernels: not built ({os.path.basename(compiler)} failed: {first}); XLA path'
    os.replace(tmp, LIBRARY)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)
  with open(LIBRARY + '.sha256', 'w') as f:
    f.write(digest + '\n')
  return (
    f'kernels: built {os.path.relpath(LIBRARY)} ({os.path.basename(compiler)} {" ".join(FLAGS)})'
  )


def main() -> None:
  print(build(force='--force' in sys.argv[1:]))


if __name__ == '__main__':
  main()
