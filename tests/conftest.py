"""Shared fixtures of the test suite, and its tiers.

`make test` runs every test (what CI runs); `make test-fast` leaves out the tests marked `slow`
(end-to-end kill -9 soaks, full `train.train()` runs, decodes of the shipped pair), for iteration.
The markers are registered in pyproject.toml.

Compiled programs are released after every test module (`_release_compiled_programs`): each
program XLA compiles for the CPU keeps its own memory mappings (code and data of the JIT) for as
long as JAX's caches hold it, some 270 per test on average in tests/decode, and Linux refuses a
process more than `vm.max_map_count` (65,530 by default) mappings. A worker that ran some 330
tests without releasing them reached that limit; from there every mmap fails, and XLA failed in
its next compile: "LLVM compilation error: Cannot allocate memory" (CI, 2026-11-28), SIGABRT
where a thread could not start, SIGSEGV where an allocation came back empty (docs/testing.md has
the measurements). `_mappings_guard` fails a test, naming the count, if one test module alone
comes near the limit.

The suite is compile-bound (two thirds of its time is XLA compiling, docs/testing.md), so a session
shares JAX's persistent compilation cache between its workers and the jobs its tests start, in a
fresh folder that `pytest_unconfigure` removes.
"""

import gc
import os
from pathlib import Path
import shutil
import tempfile

import pytest

REPO = Path(__file__).resolve().parents[1]


# JAX's persistent compilation cache, one fresh folder per test session, shared by the xdist
# workers and by every job a test starts in a subprocess (they inherit the environment). Many
# tests compile the same programs (each module's compiled programs are released below; each job
# subprocess starts cold), and a program loaded from the cache costs a file read instead of an XLA
# compile. The folder starts empty, so a run measures what a fresh clone measures.
# Every program is cached, however quick its compile or small its entry.
_CACHE_THRESHOLDS = {
  'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': '0',
  'JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES': '0',
}


def pytest_configure(config):
  if hasattr(config, 'workerinput'):
    return  # an xdist worker: it inherited the controller's folders
  # The user's cache directory stays untouched: jobs with GAMMA = 'auto' (the run files' default)
  # cache their measured costs under $XDG_CACHE_HOME, here a fresh folder per session.
  user_cache = tempfile.mkdtemp(prefix='speculative-tests-xdg-cache-')
  config._speculative_folders = [user_cache]  # pylint: disable=protected-access
  os.environ['XDG_CACHE_HOME'] = user_cache
  if os.environ.get('JAX_COMPILATION_CACHE_DIR'):
    return  # a compilation cache folder chosen outside
  folder = tempfile.mkdtemp(prefix='speculative-tests-jax-cache-')
  config._speculative_folders.append(folder)  # pylint: disable=protected-access
  os.environ.update(_CACHE_THRESHOLDS, JAX_COMPILATION_CACHE_DIR=folder)


def pytest_unconfigure(config):
  for folder in getattr(config, '_speculative_folders', []):
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope='session')
def repo() -> Path:
  """The repository root (configs/, data/, models/ are looked up from it)."""
  return REPO


@pytest.fixture(scope='module')
def kill_soak():
  """tests/kill_soak.py: SIGKILL a job at random moments, resume, compare with a clean run."""
  import kill_soak as module  # pylint: disable=g-import-not-at-top  (test support beside this file)

  return module


def memory_mappings() -> int | None:
  """This process's memory mappings (lines of /proc/self/maps); None where there is no /proc."""
  try:
    with open('/proc/self/maps', 'rb') as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def max_memory_mappings() -> int | None:
  try:
    with open('/proc/sys/vm/max_map_count') as f:
      return int(f.read())
  except (OSError, ValueError):
    return None


def _release() -> None:
  """Drops every program JAX compiled, and with them the memory mappings each one holds."""
  import jax  # pylint: disable=g-import-not-at-top

  jax.clear_caches()
  gc.collect()


@pytest.fixture(autouse=True, scope='module')
def _release_compiled_programs():
  """After each test module, releases its compiled programs; the next module compiles what it
  needs again."""
  yield
  _release()


@pytest.fixture(autouse=True)
def _mappings_guard():
  """Fails the test, with the count, once this process holds half of `vm.max_map_count`
  mappings even after releasing its compiled programs: a module that compiles this much must
  release its programs itself, well before mmap starts failing inside XLA."""
  yield
  limit, count = max_memory_mappings(), memory_mappings()
  if limit is None or count is None or count < limit // 2:
    return
  _release()
  count = memory_mappings()
  if count >= limit // 2:
    pytest.fail(
      f'this process holds {count} memory mappings after releasing its compiled programs, half '
      f'of vm.max_map_count ({limit}); past the limit every mmap fails inside XLA',
      pytrace=False,
    )
