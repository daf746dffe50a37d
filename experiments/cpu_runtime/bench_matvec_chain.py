"""Why a decode step cannot stream its weights at the bare-matvec bandwidth on XLA:CPU: a chain of
dependent 1 MB matvecs (what a decoder does, layer after layer) against one matvec over the same
bytes, each in a jitted loop, interleaved in one process.

  python experiments/cpu_runtime/bench_matvec_chain.py [--matrices 64] [--dim 512] [--rounds 7]

Prints ms per loop step and GB/s of weights streamed for both, e.g. (2026-11-23, 2-core x86_64,
load 2.6): chain 4.27 ms/step 15.7 GB/s, one 2.19 ms/step 30.6 GB/s. Findings: docs/cpu_runtime.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--matrices', type=int, default=64)
  parser.add_argument('--dim', type=int, default=512)
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument('--steps', type=int, default=20)
  args = parser.parse_args()
  n, d = args.matrices, args.dim
  weights = jax.random.normal(jax.random.PRNGKey(0), (n, d, d)) * (1.0 / d**0.5)  # [n, d, d]
  wide = weights.transpose(1, 0, 2).reshape(d, n * d)  # [d, n*d]: the same bytes, one matvec

  def chain(_, x):  # x [1, d]: n dependent matvecs
    for k in range(n):
      x = jnp.tanh(x @ weights[k])
    return x

  def one(_, x):  # one matvec over all n*d*d weights
    return jnp.tanh((x @ wide).reshape(1, n, d).max(1))

  fns = {
    'chain': jax.jit(lambda x, s: jax.lax.fori_loop(0, s, chain, x)),
    'one': jax.jit(lambda x, s: jax.lax.fori_loop(0, s, one, x)),
  }
  x = jnp.ones((1, d))
  for fn in fns.values():
    fn(x, 2).block_until_ready()  # compile
  times = {name: [] for name in fns}
  for r in range(args.rounds):
    for name in sorted(fns, reverse=r % 2 == 1):
      start = time.perf_counter()
      fns[name](x, args.steps).block_until_ready()
      times[name].append((time.perf_counter() - start) / args.steps)
  megabytes = n * d * d * 4 / 1e6
  for name, ts in times.items():
    t = statistics.median(ts)
    print(f'{name}: {1e3 * t:.2f} ms/step, {megabytes / 1e3 / t:.1f} GB/s ({megabytes:.0f} MB)')
  print('load average', os.getloadavg())


if __name__ == '__main__':
  main()
