"""Tests of speculative/jobs/resources.py (compile counting, peak RSS).

.venv/bin/python -m pytest -q -p no:xdist tests/jobs/test_resources.py
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest

from speculative.jobs import resources


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


_PEAK_RSS_PROBE = """
import numpy as np
from speculative.jobs import resources
with resources.PeakRss() as big:
  block = np.ones(64 * 2**20 // 8)  # 64 MiB, touched
  block[::512] = 2.0
del block
with resources.PeakRss() as small:
  pass
print(big.reset, small.reset, big.mib, small.mib)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
def test_peak_rss_is_reset_per_block():
  # In a fresh interpreter: a long-lived test worker can serve the 64 MiB from memory it already
  # holds (freed by earlier tests but still resident), so its RSS would not move at all.
  import subprocess
  import sys

  out = subprocess.run(
    [sys.executable, "-c", _PEAK_RSS_PROBE], capture_output=True, text=True, check=True
  ).stdout.split()
  big_reset, small_reset, big_mib, small_mib = out[0], out[1], float(out[2]), float(out[3])
  assert big_reset == small_reset == "True"
  assert big_mib - small_mib > 48
