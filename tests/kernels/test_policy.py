"""The per-job path (speculative/kernels/policy.py): chosen from the `kernels` setting, the batch
size, whether the kernels' library is available, and the backend the job computes on.

The backend is faked by monkeypatching `policy.backend` (the one place it is detected), so the
GPU and TPU cases run on this CPU host: there 'auto' takes XLA's dot and says why, 'on' is one
ValueError naming the backend and the setting, and packing weights is refused. Only the test of
the kernels' own choice on CPU needs the library built (skipped, with the reason, only where this
host cannot build it: model_utils.kernels_cannot_run_here).
"""

from __future__ import annotations

import jax
import model_utils
import pytest

from speculative.kernels import library
from speculative.kernels import policy
from speculative.models import t5 as t5_lib

OFF_CPU = ('gpu', 'tpu')


@pytest.fixture
def computes_on(monkeypatch):
  """computes_on('gpu'): from here on the job's backend, as `policy.backend` detects it, is 'gpu'."""

  def fake(platform: str) -> None:
    monkeypatch.setattr(policy, 'backend', lambda given=None: platform if given is None else given)

  return fake


def test_the_backend_is_jaxs_default_unless_a_platform_is_given():
  assert policy.backend() == jax.default_backend()
  assert policy.backend('tpu') == 'tpu'
  assert policy.off_cpu('cpu') is None
  assert policy.off_cpu('gpu') == 'this job computes on gpu: the CPU kernels run on cpu only'
  assert policy.choose('auto', 1, platform='gpu').name == policy.XLA


@pytest.mark.parametrize('platform', OFF_CPU)
def test_auto_takes_xla_off_cpu_and_says_why(computes_on, platform):
  computes_on(platform)
  path = policy.choose('auto', 1)
  assert path.name == policy.XLA and not path.kernels
  assert path.line == (
    f'XLA dot (kernels = auto: the job computes on {platform}; the CPU kernels run on cpu only)'
  )


@pytest.mark.parametrize('platform', OFF_CPU)
def test_on_off_cpu_is_one_error_naming_the_backend_and_the_setting(computes_on, platform):
  computes_on(platform)
  with pytest.raises(
    ValueError,
    match=rf"^kernels = on, but this job computes on {platform}: the CPU kernels run on cpu only "
    r"\(KERNELS = 'auto' or 'off'\)$",
  ):
    policy.choose('on', 1)


@pytest.mark.parametrize('platform', OFF_CPU)
def test_off_is_xla_off_cpu(computes_on, platform):
  computes_on(platform)
  assert policy.choose('off', 1) == policy.Path(policy.XLA, 'XLA dot (kernels = off)')


@pytest.mark.parametrize('platform', OFF_CPU)
def test_packing_weights_is_refused_off_cpu(computes_on, platform):
  computes_on(platform)
  with pytest.raises(RuntimeError, match=f'^this job computes on {platform}: the CPU kernels'):
    t5_lib.pack_decode_params(None, {})  # refused before the model or its params are looked at


@model_utils.kernels_run_here_mark()
def test_policy_chooses_per_job_on_cpu(computes_on):
  computes_on('cpu')
  assert policy.choose('off', 1).name == policy.XLA
  assert policy.choose('on', 64).name == policy.KERNELS
  assert policy.choose('auto', 1).name == policy.KERNELS
  assert policy.choose('auto', policy.AUTO_MAX_BATCH).name == policy.KERNELS
  assert policy.choose('auto', policy.AUTO_MAX_BATCH + 1).name == policy.XLA
  with pytest.raises(ValueError, match='kernels must be one of'):
    policy.choose('yes', 1)


def test_unavailable_kernels_refuse_on_and_fall_back_on_auto(computes_on, monkeypatch):
  computes_on('cpu')
  monkeypatch.setattr(
    library, '_load', lambda: (None, 'kernels off (SPECULATIVE_KERNELS=0); XLA path')
  )
  with pytest.raises(ValueError, match=r'kernels = on, but kernels off \(SPECULATIVE_KERNELS=0\)'):
    policy.choose('on', 1)
  path = policy.choose('auto', 1)
  assert path.name == policy.XLA and 'SPECULATIVE_KERNELS=0' in path.line
