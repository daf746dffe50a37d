"""CPU runtime settings of the decoding entry points: the measured defaults and what is in force;
and the machine a measurement ran on (`machine`: the jobs' reports and the benchmark's pages).

XLA reads `XLA_FLAGS` once, when jax first starts a backend, so the entry points
(`speculative.infer`, `speculative.train` and `speculative.benchmark`, through
`gin_utils.run_parsed`) call `apply_cpu_defaults()` before any jax computation. A user who set
`XLA_FLAGS` keeps exactly their flags.

`DEFAULT_CPU_XLA_FLAGS` holds the settings that made our decoding faster on the project's CPU
machines in paired, interleaved measurements (docs/cpu_runtime.md: the figures and the settings
that did not help). Every candidate there is exact (token-identical to the float32 default,
checked by tests/jobs/test_runtime.py).
"""

from __future__ import annotations

from collections.abc import MutableMapping
import os
from typing import Any

# Measured in paired child processes (docs/cpu_runtime.md): none of the candidate
# XLA CPU flags was faster beyond the measurement's spread, so the default adds none.
DEFAULT_CPU_XLA_FLAGS: tuple[str, ...] = ()

# Weights stay float32 in memory: keeping them in bfloat16 and converting in the step is exact but
# was measured slower on this CPU (XLA materializes the converted weights every step).
PARAM_DTYPE = 'float32'

_applied: dict[str, str] = {}


def apply_cpu_defaults(environ: MutableMapping[str, str] | None = None) -> str:
  """Sets `XLA_FLAGS` to the measured defaults unless the user set it; returns the flags in force.

  Call before jax starts a backend (the first jax computation); later calls change nothing that XLA
  reads."""
  environ = os.environ if environ is None else environ
  if 'XLA_FLAGS' in environ:
    _applied.setdefault('source', 'user')
  else:
    if DEFAULT_CPU_XLA_FLAGS:
      environ['XLA_FLAGS'] = ' '.join(DEFAULT_CPU_XLA_FLAGS)
    _applied.setdefault('source', 'default')
  return environ.get('XLA_FLAGS', '')


def settings_in_force() -> dict[str, Any]:
  """What the report states: XLA flags (and whether the user or our defaults set them), the
  weights' dtype in memory, the jax backend and its device count."""
  import jax  # pylint: disable=g-import-not-at-top

  return {
    'xla_flags': os.environ.get('XLA_FLAGS', ''),
    'xla_flags_source': _applied.get('source', 'user' if 'XLA_FLAGS' in os.environ else 'none'),
    'param_dtype_in_memory': PARAM_DTYPE,
    'backend': jax.default_backend(),
    'devices': jax.device_count(),
  }


def describe(settings: dict[str, Any] | None = None) -> str:
  """One line for reports, e.g. "XLA_FLAGS: (none) (our measured defaults); weights float32 in
  memory; cpu x1"."""
  s = settings_in_force() if settings is None else settings
  flags = s['xla_flags'] or '(none)'
  source = {
    'user': 'set by the user',
    'default': 'our measured defaults',
    'none': 'not set',
  }[s['xla_flags_source']]
  return (
    f'XLA_FLAGS: {flags} ({source}); weights {s["param_dtype_in_memory"]} in memory; '
    f'{s["backend"]} x{s["devices"]}'
  )


def proc_field(path: str, key: str) -> str | None:
  """The value of the first `key: value` line of a /proc file; None where unreadable."""
  try:
    with open(path, encoding='utf-8') as f:
      for line in f:
        if line.startswith(key):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return None


def cpu_model() -> str | None:
  """The CPU's model name (/proc/cpuinfo); None where unreadable."""
  return proc_field('/proc/cpuinfo', 'model name')


# The CPU features a figure depends on here (our kernels' ISA paths, XLA's vector width), as
# /proc/cpuinfo names them.
CPU_FEATURES = ('avx2', 'fma', 'avx512f', 'avx512bw', 'avx512_bf16', 'amx_tile')


def cpu_features() -> list[str]:
  """The CPU_FEATURES this CPU has (/proc/cpuinfo's flags; empty where unreadable)."""
  flags = set((proc_field('/proc/cpuinfo', 'flags') or '').split())
  return [name for name in CPU_FEATURES if name in flags]


def l3_cache_mib(path: str = '/sys/devices/system/cpu/cpu0/cache/index3/size') -> float | None:
  """The L3 cache of CPU 0 in MiB (sysfs, e.g. '32768K'); None where unreadable."""
  try:
    with open(path, encoding='utf-8') as f:
      size = f.read().strip()
  except OSError:
    return None
  scale = {'K': 1 / 1024, 'M': 1.0, 'G': 1024.0}.get(size[-1:].upper())
  return None if scale is None or not size[:-1].isdigit() else int(size[:-1]) * scale


def machine() -> dict[str, Any]:
  """The machine a measurement ran on: CPU, its features and L3, cores, memory, software,
  devices, the runtime settings in force and the load average now (call after jax's backend may
  start: it lists the devices)."""
  import platform  # pylint: disable=g-import-not-at-top

  import jax  # pylint: disable=g-import-not-at-top

  mem_total = proc_field('/proc/meminfo', 'MemTotal')
  devices = jax.devices()
  return {
    'cpu': cpu_model() or platform.processor() or platform.machine(),
    'arch': platform.machine(),
    'cpu_features': cpu_features(),
    'l3_cache_mib': l3_cache_mib(),
    'cpu_count': os.cpu_count(),
    'usable_cores': usable_cores(),
    'memory_gib': None if mem_total is None else round(int(mem_total.split()[0]) / 2**20, 1),
    'platform': platform.platform(),
    'python': platform.python_version(),
    'jax': jax.__version__,
    'backend': jax.default_backend(),
    'devices': [str(d) for d in devices],
    'accelerator': None
    if devices[0].platform == 'cpu'
    else f'{devices[0].device_kind} x{jax.device_count()}',
    'load_average_start': list(os.getloadavg()),
    'runtime': settings_in_force(),
  }


def cpu_line(m: dict[str, Any]) -> str:
  """The CPU of a `machine()` record in words: model, features, L3 (each where recorded)."""
  l3 = m.get('l3_cache_mib')
  extras = [' '.join(m.get('cpu_features') or []), '' if l3 is None else f'L3 {l3:g} MiB']
  extras = [x for x in extras if x]
  return m['cpu'] + (f' ({", ".join(extras)})' if extras else '')


def usable_cores() -> int | None:
  """The cores this process may run on (its affinity), else the machine's."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # pragma: no cover (not Linux)
    return os.cpu_count()
