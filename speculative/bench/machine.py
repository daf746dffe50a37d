"""The machine a benchmark ran on (reported with every results page)."""

from __future__ import annotations

import os
import platform
from typing import Any

import jax

from speculative.jobs import runtime


def _proc_field(path: str, key: str) -> str | None:
  """The value of the first `key: value` line of a /proc file; None where unreadable."""
  try:
    with open(path, encoding="utf-8") as f:
      for line in f:
        if line.startswith(key):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return None


def machine_info() -> dict[str, Any]:
  """CPU, cores, memory, software versions, devices and the load average now."""
  cpu = _proc_field("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()
  mem_total = _proc_field("/proc/meminfo", "MemTotal")
  memory_gib = int(mem_total.split()[0]) / 2**20 if mem_total else None
  try:
    usable = len(os.sched_getaffinity(0))
  except AttributeError:  # pragma: no cover
    usable = os.cpu_count()
  return {
    "cpu": cpu,
    "cpu_count": os.cpu_count(),
    "usable_cores": usable,
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
  machine["load_average_end"] = list(os.getloadavg())
  if (
    max(machine["load_average_start"][0], machine["load_average_end"][0]) > machine["usable_cores"]
  ):
    return (
      f"The machine was busy (load average above {machine['usable_cores']} cores): "
      "timings are noisy; regenerate on a quiet machine."
    )
  return None
