"""The T5 decoder step on the CPU kernels against XLA's dot: t(1) and v(T) at batch 1.

  .venv/bin/python -m speculative.bench.decode_step [--shape shipped|random140m] [--rows 1,2,4,8]

`T5.extend` over T tokens, 10 chained steps per call, on XLA's dot (float32) and the kernels
(float32 and bfloat16 weights; off CPU skipped), in interleaved rounds, as `kernels.bench`'s table.
Shapes: the shipped target, or a random-init 139.7M one several times the last-level cache.
"""

from __future__ import annotations

import argparse
import dataclasses

from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints
from speculative import kernels
from speculative.jobs import gin_utils
from speculative.jobs import runtime
from speculative.kernels import bench as kernel_bench
from speculative.models import t5 as t5_lib


def timed_paths(model, params) -> dict:
  """{path: params}: XLA's dot, and on CPU only the kernels (float32, bfloat16 weights)."""
  variants = {'xla_f32': params}
  reason = kernels.policy.off_cpu()
  if reason is not None:
    print(f'kernels_f32, kernels_bf16: skipped ({reason})')
    return variants
  variants['kernels_f32'] = t5_lib.pack_decode_params(model, params, 'float32')
  variants['kernels_bf16'] = t5_lib.pack_decode_params(model, params, 'bfloat16')
  return variants


def run_model(shape: str, rows, rounds: int, peak_gflops: float, steps: int = 10):
  """t(1) and v(T) of the T5 decoder step per path (XLA f32, kernels with f32 / bf16 weights)."""
  config = gin_utils.load_macro(
    'configs/models/embedded_target.gin', 'EMBEDDED_TARGET', t5_lib.T5Config
  )
  if shape == 'shipped':
    model, params = checkpoints.load_model(config, 'models/embedded/target.msgpack')
  else:  # wider (d 768, 12 heads, mlp 3072) and deeper than the shipped target
    config = dataclasses.replace(
      config, emb_dim=768, num_heads=12, mlp_dim=3072, num_encoder_layers=6, num_decoder_layers=6
    )
    model = t5_lib.T5(config)
    # bfloat16-valued weights, so that the bf16-stored packing is exact (timing does not depend
    # on the values).
    params = jax.tree_util.tree_map(
      lambda x: x.astype(jnp.bfloat16).astype(jnp.float32), model.init_params(jax.random.PRNGKey(0))
    )
  flat = traverse_util.flatten_dict(params['decoder'], sep='/')
  step_params = sum(int(np.prod(v.shape)) for k, v in flat.items() if k.endswith('kernel'))
  variants = timed_paths(model, params)
  rng = np.random.default_rng(0)
  encoder = jnp.asarray(rng.integers(2, 8000, (1, 40)), jnp.int32)
  tokens = jnp.asarray(rng.integers(2, 8000, (1, max(rows))), jnp.int32)
  fns, args = {}, {}
  for name, p in variants.items():
    cache = model.init_cache(p, 1, 128, encoder)
    for t in rows:

      def chained(p, cache, t=t):
        def body(i, carry):
          cache, acc = carry
          logits, cache = model.extend(p, cache, tokens[:, :t], jnp.asarray([0], jnp.int32) + i * t)
          return cache, acc + logits[0, -1, :8]  # the logits are used: nothing is dead code

        _, acc = jax.lax.fori_loop(0, steps, body, (cache, jnp.zeros(8)))
        return acc

      fns[(name, t)] = jax.jit(chained)
      args[(name, t)] = (p, cache)
  before = kernel_bench.load_average()
  med = {k: v / steps for k, v in kernel_bench.time_interleaved(fns, args, rows, rounds).items()}
  print(
    f'model: {shape}, {step_params / 1e6:.1f}M decode-step weights '
    f'({step_params * 4 / 1e6:.0f} MB f32); batch 1, {steps} chained steps per call, {rounds} '
    f'interleaved rounds, median; load average {before} -> {kernel_bench.load_average()}; '
    f'{kernels.status()}; {runtime.cpu_line(runtime.machine())}'
  )
  bytes_ = {name: step_params * (2 if name.endswith('bf16') else 4) for name in variants}
  kernel_bench.print_table(med, list(variants), rows, bytes_, step_params, peak_gflops)
  if 'kernels_f32' in variants:
    ratio = med[('kernels_f32', 1)] / med[('xla_f32', 1)]
    ratio_bf16 = med[('kernels_bf16', 1)] / med[('xla_f32', 1)]
    print(f't(1) kernels_f32 / xla_f32 = {ratio:.3f}; kernels_bf16 / xla_f32 = {ratio_bf16:.3f}')
  return med


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--shape', choices=('shipped', 'random140m'), default='shipped')
  kernel_bench.add_timing_args(parser)
  args = parser.parse_args()
  # Off CPU only XLA's dot is timed, so the kernels' library is not needed there.
  rows = kernel_bench.timing_rows(args, kernels_needed=kernels.policy.off_cpu() is None)
  run_model(args.shape, rows, args.rounds, args.peak_gflops)


if __name__ == '__main__':
  main()
