"""Shared fixtures of the test suite, and its tiers.

`make test` runs every test (what CI runs); `make test-fast` leaves out the tests marked `slow`
(end-to-end kill -9 soaks, full `train.train()` runs, decodes of the shipped pair), for iteration.
The marker is registered in pyproject.toml.
"""

import os
from pathlib import Path
import shutil
import sys
import tempfile

import pytest

REPO = Path(__file__).resolve().parents[1]

# One JAX persistent compilation cache per test run, shared by the xdist workers and by every job
# the tests start as a subprocess (they inherit the environment): many tests compile the same decode
# loops of the same tiny models, and a subprocess job otherwise compiles all of them again. The
# cache is keyed by the program, the jax version and the backend, so a hit runs the same executable
# a compile would build; it starts empty in every run (CI and local), so no result depends on an
# earlier run. An environment that sets JAX_COMPILATION_CACHE_DIR itself keeps its own.
_CACHE_ENV = 'JAX_COMPILATION_CACHE_DIR'
_OWN_CACHE_ENV = 'SPECULATIVE_TEST_COMPILE_CACHE'  # set by the controller that made the directory


def pytest_configure(config: pytest.Config) -> None:
  if _CACHE_ENV not in os.environ:
    cache = tempfile.mkdtemp(prefix='speculative-test-jax-cache-')
    os.environ[_CACHE_ENV] = os.environ[_OWN_CACHE_ENV] = cache
    os.environ.setdefault('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '0.5')
  if 'jax' in sys.modules:  # imported before this hook: set the option too
    import jax  # pylint: disable=g-import-not-at-top

    jax.config.update('jax_compilation_cache_dir', os.environ[_CACHE_ENV])


def pytest_unconfigure(config: pytest.Config) -> None:
  worker = hasattr(config, 'workerinput')  # an xdist worker: the controller removes the cache
  if not worker and os.environ.get(_OWN_CACHE_ENV):
    shutil.rmtree(os.environ.pop(_OWN_CACHE_ENV), ignore_errors=True)


@pytest.fixture(scope='session')
def repo() -> Path:
  """The repository root (configs/, data/, models/ are looked up from it)."""
  return REPO


@pytest.fixture(scope='module')
def kill_soak():
  """tests/kill_soak.py: SIGKILL a job at random moments, resume, compare with a clean run."""
  import kill_soak as module  # pylint: disable=g-import-not-at-top  (test support beside this file)

  return module
