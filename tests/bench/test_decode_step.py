"""The decode-step benchmark (speculative/bench/decode_step.py) off CPU: on a GPU or TPU backend
(faked: `kernels.policy.backend`) its kernel columns are skipped with the reason printed, never
packed, and XLA's dot is timed alone."""

from __future__ import annotations

import pytest

from speculative.bench import decode_step
from speculative.kernels import policy


@pytest.mark.parametrize('platform', ['gpu', 'tpu'])
def test_the_kernel_columns_are_skipped_off_cpu_with_the_reason(monkeypatch, capsys, platform):
  monkeypatch.setattr(policy, 'backend', lambda given=None: platform)
  params = {'decoder': {}}
  assert decode_step.timed_paths(None, params) == {'xla_f32': params}
  assert capsys.readouterr().out == (
    f'kernels_f32, kernels_bf16: skipped (this job computes on {platform}: the CPU kernels run '
    'on cpu only)\n'
  )
