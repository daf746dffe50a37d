"""SIGINT and SIGTERM as a job's clean end (speculative/jobs/interrupts.py): raised as Interrupted
while the runners' handlers are installed, held back through a write, turned into one line and the
exit status 128 + the signal. No jax: real signals sent to this process."""

import os
import signal

import pytest

from speculative.jobs import interrupts


@pytest.fixture
def handler_of():
  """handler_of(signum, handler): `handler` installed for the test (a test process started in the
  background inherits SIGINT ignored), the original restored after."""
  originals = {}

  def install(signum, handler):
    originals.setdefault(signum, signal.getsignal(signum))
    signal.signal(signum, handler)

  yield install
  for signum, handler in originals.items():
    signal.signal(signum, handler)


@pytest.mark.parametrize('signum', [signal.SIGINT, signal.SIGTERM])
def test_a_signal_raises_interrupted_and_the_handlers_are_restored(signum, handler_of):
  def before(*args):
    raise AssertionError('the previous handler ran inside `installed`')

  handler_of(signum, before)
  with pytest.raises(interrupts.Interrupted) as info:
    with interrupts.installed():
      os.kill(os.getpid(), signum)
      for _ in range(1000):  # the handler runs between bytecodes of the main thread
        pass
  assert info.value.signum == signum and isinstance(info.value, KeyboardInterrupt)
  assert interrupts.exit_line(info.value) == ('interrupted', 128 + signum)
  assert signal.getsignal(signum) is before


def test_a_signal_during_a_deferred_block_is_raised_when_it_ends():
  steps = []
  with pytest.raises(interrupts.Interrupted) as info:
    with interrupts.installed():
      with interrupts.deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
          pass
        steps.append('the write after the signal')  # not cut by it
      steps.append('after the block')  # never: raised as the block ends
  assert steps == ['the write after the signal']
  assert info.value.signum == signal.SIGTERM


def test_the_exit_line_is_the_jobs_message():
  stopped = interrupts.Interrupted(signal.SIGTERM, 'interrupted after 3 of 8 examples; ...')
  assert interrupts.exit_line(stopped) == ('interrupted after 3 of 8 examples; ...', 143)
  assert interrupts.exit_line(KeyboardInterrupt()) == ('interrupted', 130)


def test_a_signal_the_process_ignores_stays_ignored():
  before = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup, or `&` in a script
  try:
    with interrupts.installed():
      assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
      assert signal.getsignal(signal.SIGTERM) is interrupts._raise
  finally:
    signal.signal(signal.SIGINT, before)
