"""`python -m speculative.bench.auto_gamma`'s rounds, table and measuring cost, on fake jobs (the
jobs themselves are `speculative.infer`'s, tested there): a rotating order, medians and spreads
per setting, 'auto' against the best fixed gamma, and what measuring cost."""

import pytest

from speculative.bench import auto_gamma as bench


def _metrics(setting, speedup):
  auto = setting in (bench.AUTO, bench.UNCACHED)
  metrics = {
    'speedup': speedup,
    'identical_outputs': 10,
    'examples': 10,
    'baseline': {'decode_s': 2.0},
    'speculative': {'decode_s': 2.0 / speedup, 'compile_s': 3.0 if auto else 1.0},
  }
  if auto:
    metrics['gamma_policy'] = {
      'per_gamma': {'0': {'batches': 2}, '2': {'batches': 8}},
      'calibration': {
        'source': 'measured' if setting == bench.UNCACHED else 'cache',
        'measuring_batches': 3 if setting == bench.UNCACHED else 0,
        'calibration_s': 0.04 if setting == bench.UNCACHED else 0.0,
      },
      'predicted_speedup': 1.3,
    }
  return metrics


def test_rounds_rotate_and_the_table_compares_auto_with_the_best_fixed_gamma(monkeypatch):
  # Medians 1.2 and 1.35 where the means are 1.167 and 1.367, and 'auto' above both: the best fixed
  # gamma is the largest median of the fixed gammas only.
  speedups = {1: [1.0, 1.3, 1.2], 2: [1.3, 1.45, 1.35], bench.AUTO: [1.4] * 3}
  speedups[bench.UNCACHED] = [1.0, 1.0, 1.0]
  order = []

  def run_job(gin_files, bindings, gamma, gamma_max, out, cache):
    assert gamma_max == 2 and bindings == ['BATCH_SIZE = 8']
    if out.endswith('fill'):  # the unreported job that fills the cache
      return _metrics(gamma, 1.0)
    order.append(gamma)
    rounds_done = sum(1 for g in order if g == gamma) - 1
    return _metrics(gamma, speedups[gamma][rounds_done])

  monkeypatch.setattr(bench, 'run_job', run_job)
  jobs = bench.measure(['run.gin'], ['BATCH_SIZE = 8'], [1, 2], rounds=3, log=lambda *_: None)
  settings = [1, 2, bench.AUTO, bench.UNCACHED]
  assert order == settings + settings[1:] + settings[:1] + settings[2:] + settings[:2]
  rows = {row['gamma']: row for row in bench.table(jobs)}
  assert (rows['1']['median'], rows['1']['min'], rows['1']['max']) == (1.2, 1.0, 1.3)
  assert rows[bench.AUTO]['vs_best_fixed'] == pytest.approx(1.4 / 1.35)  # best fixed: gamma 2
  assert rows[bench.UNCACHED]['vs_best_fixed'] == pytest.approx(1.0 / 1.35)
  assert rows[bench.AUTO]['chosen'] == {'0': 6, '2': 24}
  cost = bench.measuring_cost(jobs)
  assert cost['decode_ratio_median'] == pytest.approx(1.4)  # (2 / 1.0) / (2 / 1.4)
  assert cost['calibration_of_decode'] == pytest.approx([0.02] * 3)
  text = bench.format_table(bench.table(jobs), cost)
  assert 'auto uncached: 1.000x of plain decoding, 0.741 x the best fixed gamma' in text
  assert 'calibration (stepless calls and measurements, not decode time) 2.0%, 2.0%, 2.0%' in text


def test_gamma_max_reaches_every_job_and_is_refused_below_the_fixed_gammas(monkeypatch, capsys):
  seen = []

  def run_job(gin_files, bindings, gamma, gamma_max, out, cache):
    seen.append((gamma, gamma_max))
    return _metrics(gamma, 1.0)

  monkeypatch.setattr(bench, 'run_job', run_job)
  bench.measure(['run.gin'], [], [1], rounds=1, gamma_max=7, log=lambda *_: None)
  # The fill job, fixed gamma 1 (run_job binds GAMMA_MAX for 'auto' only) and both 'auto' jobs.
  assert seen == [(bench.AUTO, 7), (1, 7), (bench.AUTO, 7), (bench.UNCACHED, 7)]
  with pytest.raises(SystemExit) as exit_info:
    bench.main(['--gin_file=configs/local/run.gin', '--gammas=1,2', '--gamma_max=1'])
  assert exit_info.value.code == 2
  assert '--gamma_max must be in [2, 32]' in capsys.readouterr().err
  # 0 is refused too (not taken for "unset"), and a JSON file that cannot be written is refused
  # before any job runs, not after all of them.
  monkeypatch.setattr(bench, 'measure', lambda *a, **k: pytest.fail('jobs ran'))
  for argv, message in [
    (['--gamma_max=0'], '--gamma_max must be in [2, 32] (the largest of --gammas), got 0'),
    (['--json_out=/'], '--json_out / cannot be written'),
  ]:
    with pytest.raises(SystemExit):
      bench.main(['--gin_file=configs/local/run.gin', '--gammas=1,2', *argv])
    assert message in capsys.readouterr().err
