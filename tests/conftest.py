"""Shared fixtures of the test suite, and its tiers.

`make test` runs every test (what CI runs); `make test-fast` leaves out the tests marked `slow`
(end-to-end kill -9 soaks, full `train.train()` runs, decodes of the shipped pair), for iteration.
The markers are registered in pyproject.toml.

Tests marked `own_process` run in a fresh Python process of their own (`pytest_pyfunc_call`
below): the parent re-runs the one test with `python -m pytest <node id>` and takes the child's
outcome (pass, fail with its output, skip with its reason). Used for the tests that run whole
training jobs in-process: in the 4 full `make test` runs of 2026-11-27/28 that were seen to the
end (CI included), the xdist worker running them died inside XLA's compile of a training
function, SIGSEGV or SIGABRT, after some 330 earlier tests in the same process; replaying that
worker's tests in order in one process crashed the same way, while the same training calls
repeated in dedicated processes never did. Cause not found (memory corruption from earlier state;
docs/testing.md has what was measured).
A job runs in its own process for its users too.
"""

import os
from pathlib import Path
import subprocess
import sys

import pytest

_CHILD = 'SPECULATIVE_TEST_OWN_PROCESS'  # set in the child, which then runs the test itself

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope='session')
def repo() -> Path:
  """The repository root (configs/, data/, models/ are looked up from it)."""
  return REPO


@pytest.fixture(scope='module')
def kill_soak():
  """tests/kill_soak.py: SIGKILL a job at random moments, resume, compare with a clean run."""
  import kill_soak as module  # pylint: disable=g-import-not-at-top  (test support beside this file)

  return module


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
  """Runs a test marked `own_process` in a child `python -m pytest <node id>` (see the docstring
  above); its outcome is the child's. Everything else runs here as usual."""
  if pyfuncitem.get_closest_marker('own_process') is None or os.environ.get(_CHILD):
    return None
  cmd = [sys.executable, '-m', 'pytest', '-q', '-p', 'no:xdist', '-p', 'no:cacheprovider']
  cmd += ['-rs', '-W', 'ignore::DeprecationWarning', pyfuncitem.nodeid]
  done = subprocess.run(
    cmd,
    cwd=pyfuncitem.config.rootpath,
    env={**os.environ, _CHILD: '1'},
    capture_output=True,
    text=True,
  )
  if done.returncode == 5:  # the child collected nothing: a node id this hook built wrongly
    pytest.fail(f'own_process: the child found no test {pyfuncitem.nodeid}', pytrace=False)
  if done.returncode == 0 and ' skipped' in done.stdout and ' passed' not in done.stdout:
    reasons = [line for line in done.stdout.splitlines() if line.startswith('SKIPPED')]
    pytest.skip(f'in its own process: {reasons[0] if reasons else done.stdout.strip()}')
  if done.returncode != 0:
    pytest.fail(
      f'own_process: {pyfuncitem.nodeid} failed in its own process (exit {done.returncode}):\n'
      + (done.stdout + done.stderr)[-6000:],
      pytrace=False,
    )
  return True  # the test ran (and passed) in the child
