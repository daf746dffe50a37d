"""The loops' step costs: the step model between measured gammas, a batch's timing from its
records, and the cache file (per key, a corrupt file measured afresh with one warning, an
unwritable one refused)."""

import json
import logging
import os

import pytest

from speculative.autogamma import costs as costs_lib

COSTS = costs_lib.Costs(((0, 4e-3), (1, 5e-3), (3, 6e-3)), 7)


def _fields(batch=1):
  return {'device': 'test', 'batch_size': batch, 'gamma_max': 7}


def test_the_step_model_interpolates_and_extrapolates_between_measured_gammas():
  assert [COSTS.step(g) for g in (0, 1, 3)] == [4e-3, 5e-3, 6e-3]
  assert COSTS.step(2) == pytest.approx(5.5e-3)  # between 1 and 3: the line
  assert COSTS.step(5) == pytest.approx(7e-3)  # beyond 3: the last two's slope, 0.5 ms a gamma
  # A noisy measured step that falls beyond gamma 1 is not extrapolated downwards.
  dip = costs_lib.Costs(((0, 4e-3), (1, 5e-3), (2, 4.5e-3)), 7)
  assert dip.step(6) == 4.5e-3
  # One measured gamma >= 1: beyond it flat (not the plain step's slope up to it).
  assert costs_lib.Costs(((0, 4e-3), (1, 5e-3)), 7).step(3) == 5e-3
  assert costs_lib.Costs(((0, 4e-3),), 7).step(3) == 4e-3  # the plain step alone: flat
  assert (COSTS.top, costs_lib.Costs(((0, 4e-3),), 7).top) == (3, 0)


def test_costs_round_trip_through_json_and_need_the_plain_step():
  assert costs_lib.Costs.from_json(json.loads(json.dumps(COSTS.to_json()))) == COSTS
  for bad in [((1, 1e-3),), ((0, 1e-3), (9, 1e-3)), ((0, 0.0),), ()]:
    with pytest.raises(ValueError, match='costs need'):
      costs_lib.Costs(bad, 7)


def test_a_batch_is_timed_from_its_records():
  rows = [
    {'decode_s': 0.25, 'target_calls': 7},
    {'decode_s': 0.25, 'target_calls': 9},
  ]
  assert costs_lib.batch_timing(rows) == (0.5, 9)


def test_a_gammas_step_is_paired_with_the_baselines_on_the_same_batches():
  """Gamma 2's batches ran while the machine was twice as slow, the baseline's decodes of them
  too: the pair's ratio (1.5) times the plain step measured over all of the baseline's batches."""
  n = costs_lib.MIN_STEPS
  times = costs_lib.LoopTimes.empty(3).add_plain(1, 4e-3 * n, n).add(1, 5e-3 * n, n)
  times = times.add_plain(2, 8e-3 * n, n).add(2, 12e-3 * n, n)  # loaded: both 2x
  plain = (4e-3 + 8e-3) / 2
  assert dict(times.costs().loop_steps) == pytest.approx(
    {0: plain, 1: plain * 1.25, 2: plain * 1.5}
  )
  # Without a baseline beside it (the job's own plain batches): each gamma's own seconds per step.
  alone = costs_lib.LoopTimes.empty(3).add(0, 4e-3 * n, n).add(2, 12e-3 * n, n)
  assert dict(alone.costs().loop_steps) == pytest.approx({0: 4e-3, 2: 12e-3})


def test_the_cache_holds_one_entry_per_key(tmp_path):
  path = str(tmp_path / 'sub' / 'calibration.json')
  costs_lib.check_cache_file(path)  # creates the directory
  first = costs_lib.load(path, _fields())
  assert (first.source, first.costs) == ('measured', None)
  measured = costs_lib.Calibration(COSTS, first.key, first.fields, 'measured', batches=6)
  costs_lib.store(path, measured)
  again = costs_lib.load(path, _fields())
  assert (again.source, again.costs) == ('cache', COSTS)
  assert costs_lib.load(path, _fields(batch=8)).costs is None  # another key
  costs_lib.store(path, costs_lib.Calibration(COSTS, 'k8', _fields(batch=8), 'measured'))
  assert len(json.loads(open(path).read())['entries']) == 2
  # The manifest's record: a cached start keeps its costs; a measured start measures again.
  recorded = costs_lib.Calibration.from_json(again.to_json())
  assert (recorded.costs, recorded.key, recorded.source) == (COSTS, again.key, 'manifest')
  assert costs_lib.Calibration.from_json(measured.to_json()).costs is None


def test_find_costs_reads_an_xla_path_entry(tmp_path):
  path = str(tmp_path / 'calibration.json')
  fields = {**_fields(batch=8), 'decode_path': 'XLA dot (kernels = off)'}
  costs_lib.store(path, costs_lib.Calibration(COSTS, 'x', fields, 'measured'))
  costs_lib.store(
    path, costs_lib.Calibration(COSTS, 'k', {**fields, 'decode_path': 'CPU kernels'}, 'measured')
  )
  assert costs_lib.find_costs(path, batch_size=8) == COSTS
  assert costs_lib.find_costs(path, batch_size=1) is None


@pytest.mark.parametrize('content', ['{not json', '{"version": 1, "entries": {"k": {}}}', '[]'])
def test_a_corrupt_cache_is_measured_afresh_with_one_warning(tmp_path, caplog, content):
  path = tmp_path / 'calibration.json'
  path.write_text(content)
  with caplog.at_level(logging.WARNING):
    calibration = costs_lib.load(str(path), _fields())
  assert calibration.source == 'measured' and calibration.costs is None
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and 'unreadable' in warnings[0].getMessage()
  assert str(path) in warnings[0].getMessage()
  # Rewritten as a cache once measured: the next job reads it.
  costs_lib.store(
    str(path), calibration.__class__(COSTS, calibration.key, calibration.fields, 'measured')
  )
  assert costs_lib.load(str(path), _fields()).source == 'cache'


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
