"""The machine a benchmark runs on: its description (on every results page), its load, and whether
a model shape fits its memory (`estimate`, `check_fits`)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import platform
from typing import Any
from typing import Sequence

import jax
import jax.numpy as jnp

from speculative.jobs import runtime
from speculative.models import t5 as t5_lib


def machine_info() -> dict[str, Any]:
  """CPU, cores, memory, software versions, devices and the load average now."""
  cpu = runtime.cpu_model() or platform.processor() or platform.machine()
  mem_total = runtime.proc_field("/proc/meminfo", "MemTotal")
  memory_gib = int(mem_total.split()[0]) / 2**20 if mem_total else None
  return {
    "cpu": cpu,
    "cpu_count": os.cpu_count(),
    "usable_cores": runtime.usable_cores(),
    "memory_gib": None if memory_gib is None else round(memory_gib, 1),
    "platform": platform.platform(),
    "python": platform.python_version(),
    "jax": jax.__version__,
    "backend": jax.default_backend(),
    "devices": [str(d) for d in jax.devices()],
    "load_average_start": list(os.getloadavg()),
    "runtime": runtime.settings_in_force(),
  }


def busy_warning(machine: dict[str, Any]) -> str | None:
  """Records the load average at the end; a warning if the machine was busier than its cores."""
  end = machine["load_average_end"] = list(os.getloadavg())
  if max(machine["load_average_start"][0], end[0]) > machine["usable_cores"]:
    return (
      f"The machine was busy (load average above {machine['usable_cores']} cores): "
      "timings are noisy; regenerate on a quiet machine."
    )
  return None


def load_line(machine: dict[str, Any]) -> str:
  """The load average at the start and at the end (now), with `busy_warning`'s warning."""
  warning = busy_warning(machine)
  return (
    f"load average {machine['load_average_start'][0]:.2f} at the start, "
    f"{machine['load_average_end'][0]:.2f} at the end" + (f". {warning}" if warning else "")
  )


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
  """Twice the largest float32 working set of one call, plus a decoder layer's float32 copy."""
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
