"""What every job (inference, training, the benchmark) runs on.

checks     checks of a job's knobs and paths, before any compute
lock       one writer per output directory (an OS lock) and the manifest a resume must match
runtime    the CPU runtime defaults (XLA flags) and the settings in force; the machine a measurement
           ran on (CPU, its features and L3, cores, devices, load)
gin_utils  the runners' command line: gin files, bindings, registration and user errors
resources  XLA compile counts and peak resident memory of a job or a benchmark group
"""

from speculative.jobs.checks import check_choice
from speculative.jobs.checks import check_float
from speculative.jobs.checks import check_int
from speculative.jobs.checks import check_readable
from speculative.jobs.checks import probe_writable
from speculative.jobs.lock import LOCK_FILE
from speculative.jobs.lock import MANIFEST_FILE
from speculative.jobs.lock import OutputLock
from speculative.jobs.lock import check_manifest
from speculative.jobs.lock import manifest_differences
from speculative.jobs.lock import read_manifest

__all__ = [
  'LOCK_FILE',
  'MANIFEST_FILE',
  'OutputLock',
  'check_choice',
  'check_float',
  'check_int',
  'check_manifest',
  'check_readable',
  'manifest_differences',
  'probe_writable',
  'read_manifest',
]
