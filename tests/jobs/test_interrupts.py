"""SIGINT and SIGTERM as a job's clean end (speculative/jobs/interrupts.py): raised as Interrupted
while the runners' handlers are installed, held back through a write, turned into one line and the
exit status 128 + the signal. No jax in this process: real signals sent to it; the runners' start-up
(imports and command line, before the job's handlers) in subprocesses that stop at their imports."""

import os
from pathlib import Path
import signal
import subprocess
import sys

import pytest

from speculative.jobs import gin_utils
from speculative.jobs import interrupts

REPO = Path(__file__).resolve().parents[2]


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


class _RaisesWhenDropped:
  def __init__(self, error: BaseException):
    self.error = error

  def __del__(self):  # Python prints what __del__ raises through sys.unraisablehook, and drops it
    raise self.error


def test_a_signal_a_callback_swallowed_is_raised_at_the_next_deferred_block(
  monkeypatch, handler_of
):
  # jax's gc callback prints and drops what it raises ('Exception ignored in ...', a traceback): a
  # Ctrl-C that landed there left the job running to its end. Now it is not printed, and the next
  # write (a deferred block) raises it.
  steps, printed = [], []
  monkeypatch.setattr(sys, 'unraisablehook', lambda u: printed.append(type(u.exc_value).__name__))
  handler_of(signal.SIGINT, signal.default_int_handler)  # (an xdist worker ignores SIGINT)
  with interrupts.installed():
    try:
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(1000):
        pass
    except KeyboardInterrupt:
      steps.append('swallowed')
    _RaisesWhenDropped(interrupts.Interrupted(signal.SIGINT))  # dropped at once: not printed
    _RaisesWhenDropped(ValueError('another error'))  # printed, by the hook before
    assert printed == ['ValueError']
    with pytest.raises(interrupts.Interrupted) as info:
      with interrupts.deferred():
        steps.append('the write')  # not cut: raised as the block ends
    assert info.value.signum == signal.SIGINT
    with interrupts.deferred():  # raised once
      steps.append('the next write')
  assert steps == ['swallowed', 'the write', 'the next write']
  _RaisesWhenDropped(interrupts.Interrupted(signal.SIGINT))
  assert printed == ['ValueError', 'Interrupted']


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


# The runner as its console script (setup.py's generated script) or `python -m` starts it, with
# `signum` sent from inside the first import of `module`: a Ctrl-C at a set point of the start-up
# (jax imports before the command line is parsed; gin after it, before the job's handlers are
# installed), where a timer would race.
_STARTS = {
  'script': 'from speculative.{package} import main\nsys.exit(main())',
  'python -m': "import runpy\nrunpy.run_module('speculative.{package}', run_name='__main__')",
}
_SIGNAL_AT_IMPORT = """import os, signal, sys
class SignalAtImport:
  def find_spec(self, name, path=None, target=None):
    if name == {module!r}:
      sys.meta_path.remove(self)
      os.kill(os.getpid(), {signum})
    return None
# A terminal's job has Python's handler (a test run in the background inherits SIGINT ignored).
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.meta_path.insert(0, SignalAtImport())
sys.argv[1:] = ['--gin_file', 'run.gin']
"""


def _start_interrupted(tmp_path, package, start, module, signum, debug=False):
  code = _SIGNAL_AT_IMPORT.format(module=module, signum=int(signum))
  env = {k: v for k, v in os.environ.items() if k != gin_utils.DEBUG_ENV}
  env['PYTHONPATH'] = os.pathsep.join([str(REPO), os.environ.get('PYTHONPATH', '')])
  if debug:
    env[gin_utils.DEBUG_ENV] = '1'
  work = tmp_path / 'work'
  work.mkdir()
  proc = subprocess.run(
    [sys.executable, '-c', code + _STARTS[start].format(package=package)],
    cwd=work,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
  )
  return proc, sorted(p.name for p in work.iterdir())


@pytest.mark.parametrize(
  'package,start,module,signum',
  [
    ('infer', 'script', 'jax', signal.SIGINT),
    ('infer', 'python -m', 'jax', signal.SIGINT),
    ('train', 'script', 'jax', signal.SIGINT),
    ('train', 'python -m', 'jax', signal.SIGINT),
    ('benchmark', 'script', 'jax', signal.SIGINT),
    ('benchmark', 'python -m', 'jax', signal.SIGINT),
    ('infer', 'script', 'gin', signal.SIGINT),
    ('infer', 'python -m', 'jax', signal.SIGTERM),
  ],
)
def test_a_signal_while_a_runner_starts_is_one_line(tmp_path, package, start, module, signum):
  """Before the job's handlers are in place (its imports, its command line): one line naming the
  command, exit status 128 + the signal, no traceback, nothing written."""
  proc, written = _start_interrupted(tmp_path, package, start, module, signum)
  assert (proc.returncode, proc.stderr) == (128 + signum, f'speculative-{package}: interrupted\n')
  assert written == []


def test_debug_keeps_the_traceback_of_a_signal_while_a_runner_starts(tmp_path):
  proc, _ = _start_interrupted(tmp_path, 'infer', 'script', 'jax', signal.SIGINT, debug=True)
  assert proc.returncode == -signal.SIGINT and 'Traceback' in proc.stderr, proc.stderr[-2000:]


def test_before_job_hands_over_to_installed_and_restores_the_handlers(handler_of):
  def before(*args):
    raise AssertionError('the previous handler ran inside `before_job`')

  handler_of(signal.SIGTERM, before)
  handler_of(signal.SIGINT, signal.SIG_IGN)  # as under nohup: stays ignored
  with interrupts.before_job('speculative-infer', argv=[]):
    leave = signal.getsignal(signal.SIGTERM)
    assert leave not in (before, interrupts._raise)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    with interrupts.installed():  # the job's own handling takes over, then gives back
      assert signal.getsignal(signal.SIGTERM) is interrupts._raise
    assert signal.getsignal(signal.SIGTERM) is leave
  assert signal.getsignal(signal.SIGTERM) is before
  assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
