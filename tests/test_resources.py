"""Tests of speculative/resources.py (compile counting, peak RSS).

.venv/bin/python -m pytest -q -p no:xdist tests/test_resources.py
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import resources


def test_compile_counter_counts_new_programs_only():
  x = jnp.arange(7.0)
  fn = jax.jit(lambda v: jnp.sin(v) * 3.0 + 1.25)
  with resources.CompileCounter() as first:
    fn(x).block_until_ready()
  with resources.CompileCounter() as again:
    fn(x).block_until_ready()
  with resources.CompileCounter() as outer:
    with resources.CompileCounter() as new_shape:
      fn(jnp.arange(9.0)).block_until_ready()
  assert first.count >= 1 and first.seconds > 0
  assert again.count == 0
  assert new_shape.count >= 1 and outer.count == new_shape.count


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_peak_rss_is_reset_per_block():
  with resources.PeakRss() as big:
    block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
    block[::512] = 2.0
  del block
  with resources.PeakRss() as small:
    pass
  assert big.reset and small.reset
  assert big.mib - small.mib > 48
