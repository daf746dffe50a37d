"""What a T5 shape needs in memory, and whether it fits jax's first device: its parameters, the
bytes of its weights, decode caches and largest activations (`estimate`), refused in one line where
they are above the device's memory (`check_fits`). The paper-shape benchmark
(speculative/bench/paper_shape.py) and a job that grows its target (`infer.grow_target_to`) check
their shapes with it before anything loads."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp

from speculative.jobs import runtime
from speculative.models import t5 as t5_lib

MARGIN = 1.10  # XLA workspace, fragmentation, compiled programs: 10% over the estimate
GB = 1e9


@dataclasses.dataclass(frozen=True)
class Need:
  """Bytes a run needs, by part."""

  weights: int
  caches: int
  activations: int

  @property
  def total(self) -> int:
    return int(MARGIN * (self.weights + self.caches + self.activations))

  def line(self) -> str:
    return (
      f"~{self.total / GB:.1f} GB (weights {self.weights / GB:.1f} GB, KV caches "
      f"{self.caches / GB:.2f} GB, activations {self.activations / GB:.2f} GB, "
      f"+{round(100 * (MARGIN - 1))}% margin)"
    )


@functools.cache
def _sizes(config: t5_lib.T5Config) -> tuple[int, ...]:
  """Elements of each parameter of a T5 config (shapes only, no compute; traced once per config)."""
  return tuple(math.prod(s) for s in t5_lib.T5(config).param_shapes().values())


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
) -> Need:
  """The bytes of `models` (the first: the target), `caches` target caches and activations."""
  itemsize = jnp.dtype(storage_dtype).itemsize
  target = models[0]
  return Need(
    weights=int(itemsize * sum(num_params(c) for c in models)),
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
