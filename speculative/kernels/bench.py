"""Microbenchmark of the packed matmul against XLA's dot and the memory/compute roofline.

  .venv/bin/python -m speculative.kernels.bench [--d 768 --mlp 3072 --layers 16 --rounds 7]

`layers` MLP blocks ([d, mlp] then [mlp, d], float32) as a decode step streams them, jitted once
per path (XLA f32, kernel with f32 / bf16 storage) and row count T; the rounds interleave the paths
so that machine noise hits all alike. Prints t(1) per path, v(T) = t(T) / t(1), the weight
bandwidth at T=1 and the compute floor (T rows x 2 x params / FMA peak), with the load average
before and after. The whole T5 decoder step on the kernels: `python -m speculative.bench.decode_step`.
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative import kernels


def _stack_fn(path: str, n_layers: int, d: int, mlp: int):
  def step(x, weights):
    for i in range(n_layers):
      w1, w2 = weights[2 * i], weights[2 * i + 1]
      if path == 'xla':
        h = x @ w1
        x = x + 1e-3 * (h @ w2)
      else:
        h = kernels.matmul(x, w1, mlp)
        x = x + 1e-3 * kernels.matmul(h, w2, d)
    return x

  return jax.jit(step)


def time_interleaved(fns: dict, args: dict, rows, rounds: int) -> dict:
  """Median seconds per (path, T) over `rounds` rounds that interleave every (path, T)."""
  for key, fn in fns.items():
    jax.block_until_ready(fn(*args[key]))  # compile + warm
  times = {key: [] for key in fns}
  for _ in range(rounds):
    for t in rows:
      for key in [k for k in fns if k[1] == t]:
        start = time.perf_counter()
        jax.block_until_ready(fns[key](*args[key]))
        times[key].append(time.perf_counter() - start)
  return {key: float(np.median(v)) for key, v in times.items()}


def print_table(med: dict, paths, rows, bytes_per_path: dict, params: int, peak_gflops: float):
  print('| path | t(1) ms | ' + ' | '.join(f'v({t})' for t in rows[1:]) + ' | GB/s at T=1 |')
  print('|---|---|' + '---|' * (len(rows) - 1) + '---|')
  for p in paths:
    t1 = med[(p, 1)]
    cells = ' | '.join(f'{med[(p, t)] / t1:.2f}' for t in rows[1:])
    print(f'| {p} | {t1 * 1e3:.3f} | {cells} | {bytes_per_path[p] / t1 / 1e9:.1f} |')
  ref = med[(paths[-1], 1)]
  for t in rows[1:]:
    floor = t * 2 * params / (peak_gflops * 1e9)
    print(
      f'compute floor at T={t}: {floor * 1e3:.3f} ms = {floor / ref:.2f} x t(1) of {paths[-1]} '
      f'(2 x {params / 1e6:.1f}M params x T / {peak_gflops:.0f} GFLOP/s)'
    )


def load_average() -> str:
  return ' '.join(f'{x:.2f}' for x in os.getloadavg())


def run(d: int, mlp: int, layers: int, rows: tuple[int, ...], rounds: int, peak_gflops: float):
  rng = np.random.default_rng(0)
  dense = []
  for _ in range(layers):
    dense += [rng.standard_normal((d, mlp), np.float32) / np.sqrt(d)]
    dense += [rng.standard_normal((mlp, d), np.float32) / np.sqrt(mlp)]
  params = layers * 2 * d * mlp
  weights = {
    'xla': [jnp.asarray(w) for w in dense],
    'kernel_f32': [kernels.pack(w) for w in dense],
    'kernel_bf16': [
      kernels.pack(np.asarray(w.astype(jnp.bfloat16), np.float32), 'bfloat16') for w in dense
    ],
  }
  fns, args = {}, {}
  for p in weights:
    fn = _stack_fn('xla' if p == 'xla' else 'kernel', layers, d, mlp)
    for t in rows:
      fns[(p, t)] = fn
      args[(p, t)] = (jnp.asarray(rng.standard_normal((1, t, d), np.float32)), weights[p])
  before = load_average()
  med = time_interleaved(fns, args, rows, rounds)
  print(
    f'stack: {layers} x ([{d} x {mlp}] + [{mlp} x {d}]) float32 = {params / 1e6:.1f}M params, '
    f'{params * 4 / 1e6:.0f} MB f32; {rounds} interleaved rounds, median; '
    f'load average {before} -> {load_average()}; {kernels.status()}'
  )
  bytes_ = {'xla': params * 4, 'kernel_f32': params * 4, 'kernel_bf16': params * 2}
  print_table(med, list(weights), rows, bytes_, params, peak_gflops)
  return med


def add_timing_args(parser: argparse.ArgumentParser) -> None:
  """--rows, --rounds and --peak_gflops (this module's and `speculative.bench.decode_step`'s)."""
  parser.add_argument('--rows', type=str, default='1,2,3,4,5,8', help='row counts T, from 1')
  parser.add_argument('--rounds', type=int, default=7)
  parser.add_argument(
    '--peak_gflops', type=float, default=190.0, help='f32 FMA peak of the cores used (2 cores)'
  )


def timing_rows(args: argparse.Namespace, kernels_needed: bool = True) -> tuple[int, ...]:
  """The row counts of --rows; exits with one line where the rows are unusable, or where the
  kernels are needed and unavailable or the job does not compute on CPU (`kernels.policy`)."""
  if kernels_needed and not kernels.available():
    raise SystemExit(f'error: {kernels.status()}')
  if kernels_needed and (reason := kernels.policy.off_cpu()) is not None:
    raise SystemExit(f'error: {reason}')
  try:
    rows = tuple(int(r) for r in args.rows.split(','))
  except ValueError:
    raise SystemExit(
      f'error: --rows must be integers separated by commas, got {args.rows!r}'
    ) from None
  if rows[0] != 1 or min(rows) < 1:
    raise SystemExit('error: --rows must start with 1 (v(T) is relative to t(1)), each >= 1')
  if args.rounds < 1:
    raise SystemExit(f'error: --rounds must be >= 1, got {args.rounds}')
  return rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--d', type=int, default=768)
  parser.add_argument('--mlp', type=int, default=3072)
  parser.add_argument('--layers', type=int, default=16)
  add_timing_args(parser)
  args = parser.parse_args()
  for name in ('d', 'mlp', 'layers'):
    if getattr(args, name) < 1:
      parser.error(f'--{name} must be >= 1, got {getattr(args, name)}')
  rows = timing_rows(args)
  run(args.d, args.mlp, args.layers, rows, args.rounds, args.peak_gflops)


if __name__ == '__main__':
  main()
