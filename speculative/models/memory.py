"""What a T5 shape needs in memory, and whether it fits jax's first device: its parameters, the
bytes of its weights, of their copy packed for the CPU kernels where the decode path is the
kernels' (`packed_bytes`), of decode caches and largest activations (`estimate`), refused in one
line where they are above the device's memory (`check_fits`). The paper-shape benchmark
(speculative/bench/paper_shape.py) and a job that grows its target (`infer.grow_target_to`) check
their shapes with it before anything loads."""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import jax
import jax.numpy as jnp

from speculative.jobs import runtime
from speculative.kernels.matmul import BLOCK
from speculative.models import t5 as t5_lib

MARGIN = 1.10  # XLA workspace, fragmentation, compiled programs: 10% over the estimate
GB = 1e9


@dataclasses.dataclass(frozen=True)
class Need:
  """Bytes a run needs, by part."""

  weights: int
  caches: int
  activations: int
  packed: int = 0  # the CPU kernels' packed copy of the decoders' weights (0 off their path)

  @property
  def total(self) -> int:
    return int(MARGIN * (self.weights + self.packed + self.caches + self.activations))

  def line(self) -> str:
    packed = f", packed for the CPU kernels {self.packed / GB:.1f} GB" if self.packed else ""
    return (
      f"~{self.total / GB:.1f} GB (weights {self.weights / GB:.1f} GB{packed}, KV caches "
      f"{self.caches / GB:.2f} GB, activations {self.activations / GB:.2f} GB, "
      f"+{round(100 * (MARGIN - 1))}% margin)"
    )


def _sizes(config: t5_lib.T5Config) -> tuple[int, ...]:
  """Elements of each parameter of a T5 config."""
  return tuple(math.prod(s) for s in t5_lib.config_param_shapes(config).values())


def num_params(config: t5_lib.T5Config) -> int:
  """Parameters of a T5 config."""
  return int(sum(_sizes(config)))


def describe(config: t5_lib.T5Config) -> str:
  """One line of a T5 shape: 'd 4096, 64 heads of 64, 24+24 layers, MLP 10240, vocabulary 8000:
  10.94B params'."""
  n = num_params(config)
  size = f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"
  return (
    f"d {config.emb_dim}, {config.num_heads} heads of {config.head_dim}, "
    f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, MLP {config.mlp_dim}, "
    f"vocabulary {config.vocab_size}: {size} params"
  )


def largest_leaf(config: t5_lib.T5Config) -> int:
  """Elements of the config's largest parameter."""
  return int(max(_sizes(config)))


def packed_bytes(config: t5_lib.T5Config, storage_dtype: str) -> int:
  """Bytes of `t5.pack_decode_params`' packed copy of a config's decoder (held beside the weights,
  which `DecodeParams` keeps), for weights stored in `storage_dtype`: every decoder kernel as
  [ceil(N / 16), K, 16] (self-attention's query, key and value as one [d, 3 H dh] kernel, the MLP's
  input maps as one [d, n f]) and the RMS norm scales in float32. The packed dtype is the one
  `packed_storage` picks: bfloat16 for bfloat16 weights, else float32 (an upper bound where float32
  weights happen to be bfloat16 values), and bfloat16 for all but the logits head where the config
  computes in bfloat16."""
  stored = 2 if jnp.dtype(storage_dtype) == jnp.bfloat16 else 4
  layers = 2 if jnp.dtype(config.dtype) == jnp.bfloat16 else stored  # all but logits_dense
  kernels = {}  # {path: (K, N)} as packed; (1, d) for a norm's scale
  for path, shape in t5_lib.config_param_shapes(config).items():
    parts = path.split("/")
    if parts[0] != "decoder":
      continue
    if parts[-1] == "scale":  # the layers' norms and the final one: [d] float32
      kernels[path] = (1, shape[0])
    elif parts[-1] == "kernel" and parts[2:4] not in (
      ["self_attention", "query"],
      ["self_attention", "key"],
      ["self_attention", "value"],
    ):
      fused = parts[2] == "mlp" and parts[3].startswith("wi")  # the MLP's input maps: one kernel
      key = "/".join(parts[:3] + ["wi_fused"]) if fused else path
      k, n = kernels.get(key, (shape[0], 0))
      kernels[key] = (k, n + shape[1])
  for i in range(config.num_decoder_layers):  # query, key and value side by side: [d, 3 H dh]
    kernels[f"decoder/layers_{i}/self_attention/qkv"] = (
      config.emb_dim,
      3 * config.num_heads * config.head_dim,
    )
  total = 0
  for path, (k, n) in kernels.items():
    if path.endswith("scale"):
      total += 4 * n
    else:
      itemsize = stored if path.startswith("decoder/logits_dense/") else layers
      total += itemsize * k * -(-n // BLOCK) * BLOCK  # [K, N] -> [ceil(N / 16), K, 16]
  return int(total)


def cache_bytes(config: t5_lib.T5Config, batch: int, max_length: int, inputs_length: int) -> int:
  """One decode cache of `config` (`T5.init_cache`): self K/V, cross K/V, the encoder output."""
  itemsize = jnp.dtype(config.dtype).itemsize
  per_position = 2 * config.num_decoder_layers * config.num_heads * config.head_dim
  return int(
    batch
    * itemsize
    * (per_position * (max_length + inputs_length) + inputs_length * config.emb_dim)
  )


def activation_bytes(
  config: t5_lib.T5Config, batch: int, inputs_length: int, decoder_length: int
) -> int:
  """Twice the largest float32 working set of one call, plus twice a decoder layer's float32
  copy."""
  rows = batch * max(inputs_length, decoder_length)
  widest = max(len(config.mlp_activations) * config.mlp_dim, 3 * config.num_heads * config.head_dim)
  layer = rows * (widest + 4 * config.emb_dim)
  scores = batch * config.num_heads * max(inputs_length, decoder_length) ** 2
  logits = batch * decoder_length * config.vocab_size
  d, hd, f = config.emb_dim, config.num_heads * config.head_dim, config.mlp_dim
  decoder_layer = 8 * d * hd + (len(config.mlp_activations) + 1) * d * f  # self + cross + MLP
  return int(4 * (2 * (layer + scores + logits) + 2 * decoder_layer))


def estimate(
  models: Sequence[t5_lib.T5Config],
  *,
  storage_dtype: str,
  batch: int,
  inputs_length: int,
  max_length: int,
  caches: int,
  extra_bytes: int = 0,
  packed: Sequence[tuple[t5_lib.T5Config, str]] = (),
) -> Need:
  """The bytes of `models` (the first: the target), `caches` target caches and activations;
  `packed`: (config, weights' dtype) of each model whose decoder is packed for the CPU kernels
  (`packed_bytes`), empty where the decode path is XLA's (`kernels.policy`)."""
  itemsize = jnp.dtype(storage_dtype).itemsize
  target = models[0]
  return Need(
    weights=int(itemsize * sum(num_params(c) for c in models)),
    packed=sum(packed_bytes(c, dtype) for c, dtype in packed),
    caches=caches * cache_bytes(target, batch, max_length, inputs_length),
    activations=activation_bytes(target, batch, inputs_length, max_length) + int(extra_bytes),
  )


def device_memory() -> tuple[int | None, str]:
  """(bytes the job may use on jax's first device, where that number comes from)."""
  device = jax.devices()[0]
  try:
    stats = device.memory_stats() or {}
  except Exception:  # pylint: disable=broad-except  # a backend without memory stats
    stats = {}
  if stats.get("bytes_limit"):
    return int(stats["bytes_limit"]), f"{device.platform} memory_stats bytes_limit"
  if device.platform == "cpu":
    available = runtime.proc_field("/proc/meminfo", "MemAvailable:")
    return available and int(available.split()[0]) * 1024, "cpu: MemAvailable in /proc/meminfo"
  return None, f"{device.platform}: no memory_stats"


def check_fits(what: str, need: Need, available: tuple[int | None, str], hint: str) -> None:
  """ValueError (one line) where `need` is above the device's known memory."""
  limit, source = available
  if limit is not None and need.total > limit:
    raise ValueError(
      f"{what} does not fit this device: it needs {need.line()}, the device has "
      f"{limit / GB:.1f} GB ({source}); {hint}"
    )
