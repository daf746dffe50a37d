"""speculative.bench.spectr_jobs: the paired block-efficiency difference, the load log, the table."""

import json

import pytest

from speculative.bench import spectr_jobs


def test_paired_difference_is_the_delta_method_on_the_same_examples():
  # SpecTr: 12 tokens / 6 calls = 2; linearized terms (t - 2c) / mean(c) = 0, 1, -1.
  spectr = {0: (4, 2), 1: (6, 2), 2: (2, 2)}
  one = {0: (3, 3), 1: (3, 3), 2: (3, 3)}  # ratio 1, every term 0
  diff, se = spectr_jobs.paired_difference(spectr, one)
  assert diff == pytest.approx(1.0)
  assert se == pytest.approx((2 / 2 / 3) ** 0.5)  # variance of (0, 1, -1) / n
  assert spectr_jobs.paired_difference(spectr, spectr) == (0.0, 0.0)


def test_loads_and_table(tmp_path):
  log = tmp_path / 'log'
  log.write_text(
    '=== a 02:00:00 uptime:  02:00:00 up 1 min,  load average: 1.50, 1.0, 0.5\n'
    'command: ...\n'
    'rc=0 wall=10s end 02:00:10 uptime:  02:00:10 up 1 min,  load average: 2.25, 1.1, 0.6\n'
  )
  assert spectr_jobs.read_loads(str(log)) == {'a': '1.50 -> 2.25'}
  job = tmp_path / 'a'
  job.mkdir()
  mode = lambda be, tps: dict(
    block_efficiency=be,
    block_efficiency_ci95=[be - 0.1, be + 0.1],  # noqa: E731
    tokens_per_s=tps,
  )
  metrics = dict(
    batch_size=1,
    num_drafts=2,
    gamma=3,
    examples=3,
    decode_path='XLA dot',
    baseline=mode(1.0, 100.0),
    speculative=mode(1.0, 125.0),
    spectr=dict(
      mode(2.0, 80.0),
      alpha=0.7,
      alpha_one_draft=0.6,
      identical_to_speculative=1,
      speedup_per_token_vs_baseline=0.8,
      speedup_per_token_vs_speculative=0.64,
    ),
  )
  (job / 'metrics.json').write_text(json.dumps(metrics))
  (job / 'manifest.json').write_text(json.dumps({'inputs': {'task': 'libreoffice_ende'}}))
  for name, rows in (('spectr', [(4, 2), (6, 2), (2, 2)]), ('speculative', [(3, 3)] * 3)):
    (job / f'predictions-{name}.jsonl').write_text(
      ''.join(
        json.dumps(dict(index=i, num_tokens=t, target_calls=c)) + '\n'
        for i, (t, c) in enumerate(rows)
      )
    )
  text = spectr_jobs.table([spectr_jobs.read_job(str(job))], 0.1, {'a': '1.50 -> 2.25'})
  row = text.splitlines()[2]
  assert row.startswith('| a | libreoffice_ende | 1 | 2 | 3 | 3 | 2.000 [1.900, 2.100] | ')
  assert '+1.000 (+1.7) | 0.700 / 0.600 | 10.0 / 8.0 / 12.5 | 0.80x | 0.64x | ' in row
  # Device: BE / (1 + L c) = 2 / 1.3; vs one draft 2 / 1.
  assert '1.54x vs baseline, 2.00x vs one draft | 1 / 3 | XLA dot | 1.50 -> 2.25 |' in row


def test_what_is_not_a_spectr_job_is_one_line(tmp_path, capsys):
  """A missing directory, a job without SpecTr's mode, a log that starts mid-job, one example."""
  (tmp_path / 'plain').mkdir()
  for output_dir in (tmp_path / 'missing', tmp_path / 'plain'):
    with pytest.raises(SystemExit) as exit_info:
      spectr_jobs.main([str(output_dir)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"{output_dir} is not a finished METHOD = 'spectr' job's output" in err
    assert 'Traceback' not in err
  log = tmp_path / 'log'
  log.write_text('rc=0 wall=10s uptime:  load average: 2.25, 1.1, 0.6\n')  # no job began
  assert spectr_jobs.read_loads(str(log)) == {}
  diff, se = spectr_jobs.paired_difference({0: (4, 2)}, {0: (3, 3)})
  assert diff == pytest.approx(1.0) and se != se  # one example: no standard error (nan)
