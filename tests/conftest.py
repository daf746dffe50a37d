"""Shared fixtures of the test suite, and its tiers.

`make test` runs every test (what CI runs); `make test-fast` leaves out the tests marked `slow`
(end-to-end kill -9 soaks, full `train.train()` runs, decodes of the shipped pair), for iteration.
The marker is registered in pyproject.toml.
"""

from pathlib import Path

import pytest

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
