"""The loops' step costs: the step model between measured gammas, a batch's timing from its
records, and the cache file (per key, a corrupt file measured afresh with one warning, an
unwritable one refused)."""

import dataclasses
import json
import logging
import os

import pytest

from speculative.autogamma import costs as costs_lib
from speculative.jobs import runtime

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


FIXED = costs_lib.Costs(((0, 4e-3), (1, 5e-3), (3, 6e-3)), 7, ((0, 1e-3), (1, 2e-3), (3, 3e-3)))


def test_the_fixed_share_of_an_unmeasured_gamma_is_its_nearest_speculative_neighbours():
  assert [FIXED.fixed_per_token(g) for g in (0, 1, 2, 3, 4, 7)] == [
    1e-3,
    2e-3,
    2e-3,  # between 1 and 3: the nearer, ties the smaller
    3e-3,
    3e-3,
    3e-3,
  ]
  # Only the plain loop measured: its own share; nothing timed: 0.
  plain = costs_lib.Costs(((0, 4e-3),), 7, ((0, 1e-3),))
  assert (plain.fixed_per_token(3), COSTS.fixed_per_token(3)) == (1e-3, 0.0)


def test_costs_round_trip_through_json_and_need_the_plain_step():
  evidence = dataclasses.replace(FIXED, evidence=((0, 64), (1, 32), (3, 0)))
  assert (evidence.measured_steps(1), evidence.measured_steps(2), FIXED.measured_steps(1)) == (
    32,
    0,
    None,
  )
  for costs in (COSTS, FIXED, evidence):
    assert costs_lib.Costs.from_json(json.loads(json.dumps(costs.to_json()))) == costs
  for bad in [((1, 1e-3),), ((0, 1e-3), (9, 1e-3)), ((0, 0.0),), ()]:
    with pytest.raises(ValueError, match='costs need'):
      costs_lib.Costs(bad, 7)
  for bad_fixed in [((0, 1e-3),), ((0, 1e-3), (1, -1e-3))]:  # other gammas; a negative share
    with pytest.raises(ValueError, match='costs need'):
      costs_lib.Costs(((0, 4e-3), (1, 5e-3)), 7, bad_fixed)


def test_a_batch_is_timed_from_its_records():
  rows = [
    {'decode_s': 0.25, 'stepless_s': 0.05, 'target_calls': 7, 'num_tokens': 20},
    {'decode_s': 0.25, 'stepless_s': 0.05, 'target_calls': 9, 'num_tokens': 25},
  ]
  timing = costs_lib.batch_timing(rows)
  assert timing == costs_lib.BatchTiming(0.5, steps=9, stepless=0.1, tokens=25, stepless_tokens=25)
  assert (timing.step(timing.fixed()), timing.fixed()) == pytest.approx((0.4 / 9, 0.1 / 25))
  # Not timed stepless (a batch after the measuring): no fixed share of its own; its steps are its
  # walltime less the fixed share per token it is given, times its tokens.
  untimed = costs_lib.batch_timing(
    [{k: v for k, v in r.items() if k != 'stepless_s'} for r in rows]
  )
  assert (untimed.stepless_tokens, untimed.fixed()) == (0, None)
  assert untimed.step(1e-3) == pytest.approx((0.5 - 25e-3) / 9)
  # A noisy stepless time at or above the whole call's never makes the steps free.
  assert costs_lib.BatchTiming(0.1, 10, 0.2, 20, 20).step(0.01) == pytest.approx(0.01 * 0.1 / 10)


def _timing(step, n, fixed=0.0, tokens=None, timed=True):
  """A batch of n loop steps of `step` seconds and `fixed` seconds once, of `tokens` tokens; its
  stepless call timed (`timed`) or not."""
  tokens = tokens or n
  return costs_lib.BatchTiming(
    step * n + fixed, n, fixed if timed else 0.0, tokens, tokens if timed else 0
  )


def test_a_gammas_step_is_paired_with_the_baselines_on_the_same_batches():
  """A call pays F once per batch, by the input's length, not per token: 60 ms on a long batch of
  128 tokens, 50 ms on a short one of 64; a plain step costs 2 ms, gamma 1's 3 ms (80 steps, on the
  long batch), gamma 2's 3.5 ms (32 steps, on the short one, as a job measures its larger gammas
  last, on its shortest batches). The steps come out exact: the plain step times the batch's
  tokens plus the two calls' difference, over the gamma's steps; F cancels in the difference,
  where a share per token (110 ms over 192 tokens) would charge the short batch too little of it."""
  times = costs_lib.LoopTimes.empty(3)
  for gamma, f, tokens, steps, step in [(1, 0.06, 128, 80, 3e-3), (2, 0.05, 64, 32, 3.5e-3)]:
    times = times.add_plain(
      gamma, costs_lib.BatchTiming(f + tokens * 2e-3, tokens, f, tokens, tokens)
    )
    times = times.add(gamma, costs_lib.BatchTiming(f + steps * step, steps, f, tokens, tokens))
  costs = times.costs()
  assert dict(costs.loop_steps) == pytest.approx({0: 2e-3, 1: 3e-3, 2: 3.5e-3})
  assert dict(costs.fixed) == pytest.approx({g: 0.11 / 192 for g in range(3)})
  assert costs.evidence == ((0, 192), (1, 80), (2, 32))
  # Without a baseline beside it (the job's own plain batches): each gamma's own.
  n = costs_lib.MIN_STEPS
  alone = costs_lib.LoopTimes.empty(3).add(0, _timing(4e-3, n, 0.01, n))
  alone = alone.add(2, _timing(12e-3, n, 0.06, 2 * n))
  assert dict(alone.costs().loop_steps) == pytest.approx({0: 4e-3, 2: 12e-3})
  assert dict(alone.costs().fixed) == pytest.approx({0: 0.01 / n, 2: 0.03 / n})


def test_the_fixed_share_is_pooled_over_the_speculative_loops():
  """Every gamma >= 1 runs the same encoders: one fixed share, the plain loop's times the pooled
  ratio of the stepless calls to the baseline's on the same batches (1.5 on gamma 1's batch, 2.5
  on gamma 2's: 2), also for a gamma whose batches ran no stepless call (decoded after the
  measuring); each step is its walltime less that share per token."""
  n = costs_lib.MIN_STEPS
  times = costs_lib.LoopTimes.empty(3)
  times = times.add_plain(1, _timing(4e-3, n, 0.01)).add(1, _timing(5e-3, n, 0.015))
  times = times.add_plain(2, _timing(4e-3, n, 0.01)).add(2, _timing(6e-3, n, 0.025))
  times = times.add(3, _timing(7e-3, n, 0.02, timed=False))
  share = 0.01 / n * 2  # the plain loop's 0.02 s over 2 n tokens, times 2
  costs = times.costs()
  assert dict(costs.fixed) == pytest.approx({0: 0.01 / n, 1: share, 2: share, 3: share})
  own = {1: 5e-3 * n + 0.015, 2: 6e-3 * n + 0.025, 3: 7e-3 * n + 0.02}
  assert dict(costs.loop_steps) == pytest.approx(
    {0: 4e-3, **{g: (s - share * n) / n for g, s in own.items()}}
  )
  # No stepless call at any gamma >= 1: the plain loop's share; none at all: 0.
  plain_only = costs_lib.LoopTimes.empty(3).add(0, _timing(4e-3, n, 0.032))
  plain_only = plain_only.add(2, _timing(6e-3, n, 0.032, timed=False))
  assert dict(plain_only.costs().fixed) == pytest.approx({0: 1e-3, 2: 1e-3})
  assert dict(plain_only.costs().loop_steps)[2] == pytest.approx(6e-3)
  untimed = costs_lib.LoopTimes.empty(3).add(0, _timing(4e-3, n, timed=False))
  assert untimed.add(1, _timing(5e-3, n, timed=False)).costs().fixed == ((0, 0.0), (1, 0.0))


def test_the_cache_keeps_each_gammas_times_scaled_to_its_cap():
  n = costs_lib.MIN_STEPS
  times = costs_lib.LoopTimes.empty(3).add_plain(1, _timing(4e-3, 64 * n, 0.3))
  times = times.add(1, _timing(5e-3, 40 * n, 0.5)).add_plain(2, _timing(4e-3, n, 0.01))
  times = times.add(2, _timing(6e-3, n, 0.02))
  capped = times.capped(16 * n)
  assert [t.steps for t in capped.own] == [16 * n, 16 * n, n, 0]  # plain: 65 n, gamma 1: 40 n
  assert capped.paired[1].steps == 64 * n * 16 / 40  # gamma 1's pairs, by its own factor
  before, after = times.costs(), capped.costs()
  # Each gamma's ratios stay; only the pooled fixed share's weights between the gammas move.
  assert dict(after.loop_steps) == pytest.approx(dict(before.loop_steps), rel=1e-3)
  assert dict(after.fixed) == pytest.approx(dict(before.fixed), rel=1e-2)
  assert dict(after.loop_steps) != dict(before.loop_steps)
  assert times.capped(1024 * n) == times
  again = costs_lib.LoopTimes.from_json(json.loads(json.dumps(capped.to_json())))
  assert again == capped
  with pytest.raises(ValueError, match='one sum per gamma'):
    costs_lib.LoopTimes.from_json({'own': [[1, 1, 0, 1, 0]] * 3, 'paired': [[0] * 5] * 2})


def _times(scale=1.0):
  n = costs_lib.MIN_STEPS
  times = costs_lib.LoopTimes.empty(7).add(0, _timing(4e-3 * scale, n, 0.01))
  return times.add(1, _timing(5e-3 * scale, n, 0.02)).add(3, _timing(6e-3 * scale, n, 0.02))


def test_the_cache_holds_one_entry_per_key(tmp_path):
  path = str(tmp_path / 'sub' / 'calibration.json')
  costs_lib.check_cache_file(path)  # creates nothing: the first store does
  assert not (tmp_path / "sub").exists()
  first = costs_lib.load(path, _fields())
  assert (first.source, first.costs, first.times) == ('measured', None, None)
  times = _times()
  measured = costs_lib.Calibration(None, times.costs(), first.key, first.fields, 'measured', 6)
  costs_lib.store(path, times, measured)
  again = costs_lib.load(path, _fields())
  assert (again.source, again.times, again.costs) == ('cache', times, times.costs())
  assert costs_lib.load(path, _fields(batch=8)).costs is None  # another key
  costs_lib.store(
    path, _times(2.0), costs_lib.Calibration(None, None, 'k8', _fields(8), 'measured')
  )
  assert len(json.loads(open(path).read())['entries']) == 2
  # A job's end writes its times back under its key: the next job starts from them.
  costs_lib.store(path, _times(3.0), again)
  assert costs_lib.load(path, _fields()).times == _times(3.0)
  # The manifest's record: a cached start keeps its times; a measured start measures again.
  recorded = costs_lib.Calibration.from_json(again.to_json())
  assert (recorded.times, recorded.costs, recorded.source) == (times, times.costs(), 'manifest')
  assert costs_lib.Calibration.from_json(measured.to_json()).costs is None


def test_find_costs_reads_an_xla_path_entry(tmp_path):
  path = str(tmp_path / 'calibration.json')
  here = {'cpu': runtime.cpu_model(), 'usable_cores': runtime.usable_cores()}
  loop = 'drafter model, greedy, lenience exact'
  fields = {**_fields(batch=8), **here, 'loop': loop, 'decode_path': 'XLA dot (kernels = off)'}
  costs_lib.store(path, _times(), costs_lib.Calibration(None, None, 'x', fields, 'measured'))
  kernels = {**fields, 'decode_path': 'CPU kernels'}
  costs_lib.store(path, _times(2.0), costs_lib.Calibration(None, None, 'k', kernels, 'measured'))
  assert costs_lib.find_costs(path, batch_size=8) == _times().costs()
  assert costs_lib.find_costs(path, batch_size=1) is None
  # Of two matching entries the most recently written one: a re-stored entry counts as new.
  other = {**fields, 'encoder_length': 128}
  costs_lib.store(path, _times(4.0), costs_lib.Calibration(None, None, 'y', other, 'measured'))
  assert costs_lib.find_costs(path, batch_size=8) == _times(4.0).costs()
  costs_lib.store(path, _times(5.0), costs_lib.Calibration(None, None, 'x', fields, 'measured'))
  assert costs_lib.find_costs(path, batch_size=8) == _times(5.0).costs()
  # Newer entries of another machine or another drafter are not this adapter's costs.
  elsewhere = {**fields, 'cpu': 'Intel Xeon', 'usable_cores': 64}
  costs_lib.store(path, _times(6.0), costs_lib.Calibration(None, None, 'e', elsewhere, 'measured'))
  lookup = {**fields, 'loop': 'drafter prompt_lookup, greedy, lenience exact'}
  costs_lib.store(path, _times(7.0), costs_lib.Calibration(None, None, 'l', lookup, 'measured'))
  assert costs_lib.find_costs(path, drafter='model', batch_size=8) == _times(5.0).costs()
  assert costs_lib.find_costs(path, drafter='prompt_lookup', batch_size=8) == _times(7.0).costs()


# Not JSON; an entry without its costs in a cache of this version; not a cache at all.
ENTRY_WITHOUT_COSTS = json.dumps({'version': costs_lib.CACHE_VERSION, 'entries': {'k': {}}})


@pytest.mark.parametrize('content', ['{not json', ENTRY_WITHOUT_COSTS, '[]'])
def test_a_corrupt_cache_is_measured_afresh_with_one_warning(tmp_path, caplog, content):
  path = tmp_path / 'calibration.json'
  path.write_text(content)
  with caplog.at_level(logging.WARNING):  # a job: load, measure, then store its costs
    calibration = costs_lib.load(str(path), _fields())
    assert calibration.source == 'measured' and calibration.costs is None
    # Rewritten as a cache once measured (no second warning): the next job reads it.
    costs_lib.store(str(path), _times(), calibration)
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1 and 'unreadable' in warnings[0].getMessage()
  assert str(path) in warnings[0].getMessage()
  assert costs_lib.load(str(path), _fields()).source == 'cache'


def _damaged(entry):
  """Ways a cache entry of the right layout can still be wrong (each: entry -> None, in place)."""
  fields, own = entry['fields'], entry['times']['own']
  return {
    'gamma_max other than its loop times': lambda: fields.update(gamma_max=2),
    'a NaN time': lambda: own[1].__setitem__(0, float('nan')),
    'a plain loop of 0 steps': lambda: own[0].__setitem__(1, 0),
    'a string for a time': lambda: own[1].__setitem__(0, 'fast'),
  }


@pytest.mark.parametrize('damage', list(_damaged({'fields': {}, 'times': {'own': []}})))
def test_an_entry_whose_times_cannot_give_costs_is_measured_afresh(tmp_path, caplog, damage):
  """Not only the layout: an entry is read only if its loop times give the costs a job decides
  with, under its own GAMMA_MAX (else a job could choose past GAMMA_MAX, or fail mid-job)."""
  path = tmp_path / 'calibration.json'
  calibration = costs_lib.load(str(path), _fields())
  costs_lib.store(str(path), _times(), calibration)
  data = json.loads(path.read_text())
  (entry,) = data['entries'].values()
  _damaged(entry)[damage]()
  path.write_text(json.dumps(data))
  with caplog.at_level(logging.WARNING):
    assert costs_lib.load(str(path), _fields()).source == 'measured'
  assert 'unreadable' in caplog.text and str(path) in caplog.text


def test_an_unwritable_cache_is_refused(tmp_path, monkeypatch):
  with pytest.raises(PermissionError, match='is a directory'):
    costs_lib.check_cache_file(str(tmp_path))
  blocker = tmp_path / 'file'
  blocker.write_text('')
  with pytest.raises(PermissionError, match='file is a file, not a directory'):
    costs_lib.check_cache_file(str(blocker / 'calibration.json'))
  locked = tmp_path / 'locked'
  locked.mkdir(mode=0o500)
  if os.geteuid() == 0:  # root writes anywhere: the directory is made unwritable to the check
    monkeypatch.setattr(os, 'access', lambda p, mode: os.path.abspath(p) != str(locked))
  with pytest.raises(PermissionError, match='calibration.json is not writable'):
    costs_lib.check_cache_file(str(locked / 'calibration.json'))


def test_default_cache_file_follows_xdg(monkeypatch, tmp_path):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path))
  assert costs_lib.default_cache_file() == str(tmp_path / 'speculative' / 'calibration.json')
