"""The machine a benchmark runs on: its description (on every results page) and its load (whether a
model shape fits its memory: speculative/models/memory.py)."""

from __future__ import annotations

import os
import platform
from typing import Any

import jax

from speculative.jobs import runtime


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
