"""The measured step costs: the cache file (per key, a corrupt file measured afresh with one warning,
an unwritable one refused) and a real measurement on a tiny model."""

import json
import logging
import os

import jax
import model_utils
import pytest

from speculative.autogamma import costs as costs_lib
from speculative.models.t5 import T5

COSTS = costs_lib.Costs((1e-3, 1.2e-3, 1.5e-3), 2e-4)


def _fields(batch=1):
  return {'device': 'test', 'batch_size': batch}


def test_costs_round_trip_through_json():
  assert costs_lib.Costs.from_json(json.loads(json.dumps(COSTS.to_json()))) == COSTS
  with pytest.raises(ValueError, match='costs need'):
    costs_lib.Costs((1e-3,), 0.0)


def test_the_cache_measures_once_per_key(tmp_path):
  path = str(tmp_path / 'sub' / 'calibration.json')
  calls = []

  def measure():
    calls.append(1)
    return COSTS

  costs_lib.check_cache_file(path)  # creates the directory
  first = costs_lib.load_or_measure(path, _fields(), measure)
  assert (first.source, first.costs, len(calls)) == ('measured', COSTS, 1)
  again = costs_lib.load_or_measure(path, _fields(), measure)
  assert (again.source, again.costs, again.seconds, len(calls)) == ('cache', COSTS, 0.0, 1)
  other = costs_lib.load_or_measure(path, _fields(batch=8), measure)  # another key: measured
  assert other.source == 'measured' and len(calls) == 2
  assert len(json.loads(open(path).read())['entries']) == 2
  # The manifest's record gives the same costs back.
  recorded = costs_lib.Calibration.from_json(first.to_json(), 'manifest')
  assert (recorded.costs, recorded.key, recorded.source) == (COSTS, first.key, 'manifest')


@pytest.mark.parametrize('content', ['{not json', '{"version": 1, "entries": {"k": {}}}', '[]'])
def test_a_corrupt_cache_is_measured_afresh_with_one_warning(tmp_path, caplog, content):
  path = tmp_path / 'calibration.json'
  path.write_text(content)
  with caplog.at_level(logging.WARNING):
    calibration = costs_lib.load_or_measure(str(path), _fields(), lambda: COSTS)
  assert calibration.source == 'measured'
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and 'unreadable' in warnings[0].getMessage()
  assert str(path) in warnings[0].getMessage()
  # Rewritten as a cache: the next job reads it.
  assert costs_lib.load_or_measure(str(path), _fields(), lambda: 1 / 0).source == 'cache'


def test_an_unwritable_cache_is_refused(tmp_path):
  with pytest.raises(PermissionError, match='is a directory'):
    costs_lib.check_cache_file(str(tmp_path))
  blocker = tmp_path / 'file'
  blocker.write_text('')
  with pytest.raises(PermissionError, match='file is a file, not a directory'):
    costs_lib.check_cache_file(str(blocker / 'calibration.json'))
  if os.geteuid() != 0:  # root writes anywhere
    locked = tmp_path / 'locked'
    locked.mkdir(mode=0o500)
    with pytest.raises(PermissionError, match='not writable'):
      costs_lib.check_cache_file(str(locked / 'calibration.json'))


def test_default_cache_file_follows_xdg(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert costs_lib.default_cache_file() == str(tmp_path / 'speculative' / 'calibration.json')


def test_measure_times_every_width_and_the_draft_on_a_tiny_pair():
  target = T5(model_utils.tiny_t5_config(2))
  draft = T5(model_utils.tiny_t5_config(1))
  params = model_utils.random_params(target, 0)
  draft_params = model_utils.random_params(draft, 1)
  costs = costs_lib.measure(
    target, params, draft, draft_params, batch=2, encoder_length=8, max_length=32, gamma_max=3
  )
  assert costs.gamma_max == 3 and len(costs.verify) == 4
  assert all(v > 0 for v in costs.verify) and costs.draft_step > 0
  no_draft = costs_lib.measure(
    target, params, None, None, batch=2, encoder_length=8, max_length=32, gamma_max=1
  )
  assert no_draft.draft_step == 0.0 and len(no_draft.verify) == 2
  jax.clear_caches()


def test_loop_step_seconds_is_a_whole_decode_less_its_stepless_call():
  """The plain loop of a tiny T5 decoded whole and stopped before its first step (`max_steps` 0):
  a positive time per step; a loop of one step cannot be resolved (None)."""
  import jax.numpy as jnp
  import numpy as np

  from speculative.decode import modes

  target = T5(model_utils.tiny_t5_config(2))
  params = model_utils.random_params(target, 0)
  encoder_tokens = jnp.asarray(np.arange(2, 10, dtype=np.int32).reshape(2, 4))
  long = modes.decode_fns(target, params, max_new_tokens=24, eos_id=None)['baseline']
  short = modes.decode_fns(target, params, max_new_tokens=1, eos_id=None)['baseline']
  assert int(np.max(np.asarray(long(encoder_tokens, 0, max_steps=0).lengths))) == 0
  seconds = costs_lib.loop_step_seconds({'long': long, 'short': short}, encoder_tokens, 0)
  assert seconds['long'] is not None and 0 < seconds['long'] < 1
  assert seconds['short'] is None
  jax.clear_caches()


def test_the_step_model_goes_through_every_measured_loop():
  """Model calls C(g) = v(g+1) + g d(1) = 1 + g ms (d = 0.5, v grows 0.5 a token); measured loops:
  plain 2 ms, gamma 1 4 ms, gamma 3 7 ms. Between them step(g) is on the line through (C(1), 4)
  and (C(3), 7); beyond gamma 3 it is c(3) plus the calls' difference (slope 1)."""
  costs = costs_lib.Costs(
    tuple((1 + 0.5 * t) * 1e-3 for t in range(5)),
    0.5e-3,
    plain_loop_step=2e-3,
    ref_gamma=3,
    ref_loop_step=7e-3,
    one_loop_step=4e-3,
  )
  assert [round(costs.step(g) * 1e3, 9) for g in range(5)] == [2.0, 4.0, 5.5, 7.0, 8.0]
  one_anchor = costs_lib.Costs(
    costs.verify, 0.5e-3, plain_loop_step=2e-3, ref_gamma=3, ref_loop_step=7e-3
  )
  assert [round(one_anchor.step(g) * 1e3, 9) for g in range(5)] == [2.0, 5.0, 6.0, 7.0, 8.0]
  assert costs_lib.Costs.from_json(costs.to_json()) == costs
