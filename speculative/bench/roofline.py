"""How far the decode loop is from the machine's memory-bandwidth floor (the roofline section).

  * bytes a decode step reads: the decoder's weights (the cached cross-attention K/V projections
    excluded: they run once per input), plus the embedding table when it is also the logits layer;
  * stream bandwidth: those bytes / the marginal time of a bare jitted matvec (matmul at batch B)
    over one matrix of the same size, so the floor of a decode step is bytes / bandwidth;
  * v(T) of a bare jitted stack of the target's decoder matmuls at B x T rows, beside the target's
    measured v(T): what the shapes alone cost, without attention, norms or the cache.
Every timing is timing.time_rounds (interleaved rounds, marginal time per call) and every ratio a
median of per-round ratios with its noise verdict.
"""

from __future__ import annotations

import math
from typing import Any
from typing import Mapping
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative.bench import noise as bench_noise
from speculative.bench import timing

CACHED_PER_INPUT = ("encoder_decoder_attention/key/", "encoder_decoder_attention/value/")


def decode_step_kernels(
  param_shapes: Mapping[str, tuple[int, ...]], *, logits_via_embedding: bool
) -> dict[str, tuple[int, ...]]:
  """{name: shape} of the weights one decode step reads from a flat T5 `param_shapes()`."""
  out = {}
  for name, shape in param_shapes.items():
    if name.startswith("decoder/") and not any(part in name for part in CACHED_PER_INPUT):
      out[name] = tuple(shape)
    elif logits_via_embedding and name.startswith("token_embedder/"):
      out[name] = tuple(shape)
  return out


def weight_bytes(shapes: Mapping[str, tuple[int, ...]], itemsize: int = 4) -> int:
  return int(sum(math.prod(shape) for shape in shapes.values()) * itemsize)


@jax.jit
def matmul_loop(kernels, inputs, num_calls):
  """`num_calls` rounds of inputs[i] @ kernels[i] for every i; the inputs are scaled by a
  loop-carried scalar and each product reduced by max, so nothing is hoisted or simplified away."""

  def body(_, acc):
    scale = 1.0 + 1e-9 * acc
    return acc + sum(jnp.max((scale * x) @ w) for x, w in zip(inputs, kernels)) * 1e-12

  return jax.lax.fori_loop(0, num_calls, body, jnp.zeros((), jnp.float32))


def _stack_timer(kernel_shapes: Sequence[tuple[int, int]], rows: int, seed: int) -> timing.Timer:
  rng = np.random.default_rng(seed)
  kernels = [jnp.asarray(rng.standard_normal(s, np.float32)) for s in kernel_shapes]
  inputs = [jnp.asarray(rng.standard_normal((rows, s[0]), np.float32)) for s in kernel_shapes]
  return lambda n: matmul_loop(kernels, inputs, jnp.asarray(n, jnp.int32))


def measure_roofline(
  param_shapes: Mapping[str, tuple[int, ...]],
  *,
  logits_via_embedding: bool,
  emb_dim: int,
  batch_size: int,
  verify_lengths: Sequence[int],
  repeats: int,
  min_seconds: float,
) -> dict[str, Any]:
  """Bytes per decode step, stream bandwidth, the floor per step and v(T) of the bare decoder
  matmul stack at `batch_size` (JSON-ready; 'noise' as in costs)."""
  kernels = decode_step_kernels(param_shapes, logits_via_embedding=logits_via_embedding)
  num_bytes = weight_bytes(kernels)
  matrices = [s for s in kernels.values() if len(s) == 2]
  lengths = sorted(set([1] + [int(t) for t in verify_lengths]))
  timers = {"matvec": _stack_timer([(emb_dim, max(1, num_bytes // 4 // emb_dim))], batch_size, 0)}
  timers.update({f"stack_{t}": _stack_timer(matrices, batch_size * t, t) for t in lengths})
  rounds, whole = timing.time_rounds(timers, repeats, min_seconds, marginal=list(timers))
  seconds = {name: timing.per_call_seconds(rounds, whole, name) for name in timers}
  noise = bench_noise.NoiseLog()
  noise.add("bare matvec", rounds["matvec"])
  out = {
    "batch_size": batch_size,
    "weight_bytes": num_bytes,
    "matvec_s": seconds["matvec"],
    "bandwidth_gb_s": num_bytes / seconds["matvec"] / 1e9,
    "floor_step_s": seconds["matvec"],
    "bare_v": {"1": 1.0},
  }
  for t in lengths[1:]:
    out["bare_v"][str(t)] = noise.add(
      f"bare v({t})",
      bench_noise.ratio_samples(rounds[f"stack_{t}"], rounds["stack_1"]),
      minimum=1.0,
      fallback=seconds[f"stack_{t}"] / seconds["stack_1"],
    )
  out["noise"] = noise.data
  return out


@jax.jit
def read_loop(array, num_calls):
  """`num_calls` full reads of `array` (a sum scaled by a loop-carried scalar, so no read is hoisted
  out of the loop or skipped)."""

  def body(_, acc):
    return acc + jnp.sum(array * (1.0 + 1e-9 * acc).astype(array.dtype), dtype=jnp.float32) * 1e-12

  return jax.lax.fori_loop(0, num_calls, body, jnp.zeros((), jnp.float32))


def measure_read_rate(
  num_bytes: int, dtype: str, *, repeats: int, min_seconds: float
) -> dict[str, Any]:
  """The device's measured read rate: bytes / the marginal time of one full read of an array of
  `num_bytes` in `dtype` made on the device (JSON-ready: bytes, read_s, read_rate_gb_s, noise)."""
  itemsize = jnp.dtype(dtype).itemsize
  array = jnp.ones((max(1, num_bytes // itemsize // 1024), 1024), dtype)
  timers = {"read": lambda n: read_loop(array, jnp.asarray(n, jnp.int32))}
  rounds, whole = timing.time_rounds(timers, repeats, min_seconds, marginal=["read"])
  seconds = timing.per_call_seconds(rounds, whole, "read")
  noise = bench_noise.NoiseLog()
  noise.add("read rate", rounds["read"])
  size = int(array.size * itemsize)
  return {
    "bytes": size,
    "dtype": jnp.dtype(dtype).name,
    "read_s": seconds,
    "read_rate_gb_s": size / seconds / 1e9,
    "noise": noise.data,
  }
