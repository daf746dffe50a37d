"""GAMMA = 'auto' against every fixed gamma, on a job: one process per job, interleaved rounds.

  .venv/bin/python -m speculative.bench.auto_gamma --gin_file=configs/local/run.gin \
      [--gammas=1,2,3,4,5,6,7] [--gamma_max=N] [--rounds=4] [--json_out=FILE] [--gin_bindings=...]

Each round runs the job once per setting in a rotating order, each a fresh process: GAMMA = g per
fixed g; 'auto' on costs cached by an unreported first job; 'auto uncached' (both with GAMMA_MAX =
--gamma_max, by default the largest fixed gamma; 7 is the jobs' own default). Prints each setting's
median speedup, spread and identical outputs, the gammas 'auto' chose and what measuring cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Any
from typing import Sequence

import numpy as np

from speculative.bench import ceiling
from speculative.bench import markdown
from speculative.jobs import runtime

AUTO = 'auto'
UNCACHED = 'auto uncached'


def run_job(
  gin_files: Sequence[str], bindings: Sequence[str], gamma: Any, gamma_max: int, out: str, cache
):
  """One job in its own process; its metrics.json, or an error naming the command."""
  argv = [sys.executable, '-m', 'speculative.infer']
  argv += [f'--gin_file={f}' for f in gin_files]
  own = [
    f'GAMMA = {gamma!r}',
    f'INFER_OUTPUT_DIR = {out!r}',
    'OVERWRITE = True',
    'infer.progress = False',
  ]
  if gamma in (AUTO, UNCACHED):
    own[0] = f'GAMMA = {AUTO!r}'
    own += [f'GAMMA_MAX = {gamma_max}', f'CALIBRATION_FILE = {cache!r}']
  argv += [f'--gin_bindings={b}' for b in [*bindings, *own]]
  proc = subprocess.run(argv, capture_output=True, text=True)
  if proc.returncode != 0:
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    raise RuntimeError(f'job GAMMA = {gamma!r} failed (exit {proc.returncode}): {tail}')
  with open(os.path.join(out, 'metrics.json'), encoding='utf-8') as f:
    return json.load(f)


def measure(
  gin_files, bindings, gammas: Sequence[int], rounds: int, gamma_max=None, log=print
) -> dict[str, Any]:
  """The jobs, `rounds` rounds of every setting in a rotating order (module docstring)."""
  gamma_max = gamma_max or max(gammas)
  settings: list[Any] = [*gammas, AUTO, UNCACHED]
  jobs: dict[str, list[dict[str, Any]]] = {str(s): [] for s in settings}
  with tempfile.TemporaryDirectory(prefix='auto-gamma-bench-') as tmp:
    cache = os.path.join(tmp, 'calibration.json')
    run_job(gin_files, bindings, AUTO, gamma_max, os.path.join(tmp, 'fill'), cache)
    for r in range(rounds):
      shift = r % len(settings)
      for setting in settings[shift:] + settings[:shift]:
        load = os.getloadavg()[0]
        out = os.path.join(tmp, f'job-{setting}'.replace(' ', '-'))
        own_cache = os.path.join(tmp, f'empty-{r}.json') if setting == UNCACHED else cache
        metrics = run_job(gin_files, bindings, setting, gamma_max, out, own_cache)
        jobs[str(setting)].append(_job_row(metrics, load))
        log(
          f'round {r + 1}/{rounds} GAMMA = {setting!r}: {metrics["speedup"]:.3f}x (load {load:.2f})'
        )
  return jobs


def _job_row(metrics: dict[str, Any], load: float) -> dict[str, Any]:
  """A job's speedup, identical outputs, decode and compile times; 'auto''s chosen gammas and costs."""
  spec = metrics['speculative']
  row = {
    'speedup': metrics['speedup'],
    'identical': metrics['identical_outputs'],
    'examples': metrics['examples'],
    'baseline_decode_s': metrics['baseline']['decode_s'],
    'speculative_decode_s': spec['decode_s'],
    'speculative_compile_s': spec['compile_s'],
    'load_average': load,
  }
  if policy := metrics.get('gamma_policy'):
    calibration = policy['calibration']
    row['per_gamma'] = {g: v['batches'] for g, v in policy['per_gamma'].items()}
    row['calibration_source'] = calibration['source']
    row['measuring_batches'] = calibration['measuring_batches']
    row['predicted_speedup'] = policy['predicted_speedup']
    row['calibration_s'] = calibration['calibration_s']
  return row


def table(jobs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
  """One row per setting: the median speedup over the rounds, its spread, identical outputs."""
  medians = {s: float(np.median([j['speedup'] for j in runs])) for s, runs in jobs.items()}
  best_fixed = max((m for s, m in medians.items() if s not in (AUTO, UNCACHED)), default=None)
  rows = [{'gamma': '0 (plain)', 'median': 1.0, 'min': 1.0, 'max': 1.0, 'identical': '-'}]
  for setting, runs in jobs.items():
    speedups = [j['speedup'] for j in runs]
    row = dict(gamma=setting, median=medians[setting], min=min(speedups), max=max(speedups))
    row['identical'] = f'{min(j["identical"] for j in runs)}/{runs[0]["examples"]}'
    if setting in (AUTO, UNCACHED):
      chosen: dict[str, int] = {}
      for j in runs:
        for g, n in j['per_gamma'].items():
          chosen[g] = chosen.get(g, 0) + n
      row['chosen'] = chosen
      row['calibration'] = [(j['calibration_source'], j['measuring_batches']) for j in runs]
      row['vs_best_fixed'] = row['median'] / best_fixed if best_fixed else None
      row['vs_plain'] = row['median']
    rows.append(row)
  return rows


def measuring_cost(jobs: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
  """What measuring cost: uncached over cached decode time, and compile times, per round."""
  if not jobs.get(UNCACHED) or not jobs.get(AUTO):
    return None
  pairs = list(zip(jobs[UNCACHED], jobs[AUTO]))
  ratios = [u['speculative_decode_s'] / c['speculative_decode_s'] for u, c in pairs]
  return {
    'decode_ratio': ratios,
    'decode_ratio_median': float(np.median(ratios)),
    'compile_s_uncached': [u['speculative_compile_s'] for u, _ in pairs],
    'compile_s_cached': [c['speculative_compile_s'] for _, c in pairs],
    # Calibration, outside the decode time: the stepless calls that time what a call pays once,
    # and the measurements of gammas a batch was then not decoded at.
    'calibration_of_decode': [u['calibration_s'] / u['speculative_decode_s'] for u, _ in pairs],
  }


def format_table(rows: list[dict[str, Any]], cost: dict[str, Any] | None = None) -> str:
  def cells(row):
    chosen = ''
    if 'chosen' in row:
      chosen = (
        ', '.join(f'{g}: {n}' for g, n in sorted(row['chosen'].items(), key=lambda x: int(x[0])))
        + '; '
        + ', '.join(f'{s} {t}' for s, t in row['calibration'])
      )
    spread = f'{row["min"]:.3f}..{row["max"]:.3f}'
    return [row['gamma'], f'{row["median"]:.3f}x', spread, row['identical'], chosen]

  header = ['gamma', 'median speedup', 'spread (min..max)', 'identical']
  header.append('auto: batches per gamma, costs (source, batches measuring)')
  lines = [markdown.table(header, [cells(row) for row in rows])]
  for row in rows:
    if row.get('vs_best_fixed'):
      lines.append(
        f'\n{row["gamma"]}: {row["vs_plain"]:.3f}x of plain decoding, {row["vs_best_fixed"]:.3f} '
        'x the best fixed gamma of the same rounds (medians).'
      )
  if cost is not None:
    lines.append(
      f'\nMeasuring the costs: the uncached job\'s speculative decode time '
      f'{cost["decode_ratio_median"]:.3f} x the cached job\'s (median; per round '
      + ', '.join(f'{r:.3f}' for r in cost['decode_ratio'])
      + '); compile s uncached '
      + ', '.join(f'{t:.1f}' for t in cost['compile_s_uncached'])
      + ', cached '
      + ', '.join(f'{t:.1f}' for t in cost['compile_s_cached'])
      + '; the uncached job\'s calibration (stepless calls and measurements, not decode time) '
      + ', '.join(f'{100 * f:.1f}%' for f in cost['calibration_of_decode'])
      + ' of its decode time.'
    )
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
    prog='python -m speculative.bench.auto_gamma', description=__doc__.splitlines()[0]
  )
  parser.add_argument('--gin_file', action='append', required=True, help='the job run file')
  parser.add_argument('--gin_bindings', action='append', default=[], help='for every job')
  parser.add_argument('--rounds', type=int, default=4, help='rounds, >= 1 (%(default)s)')
  parser.add_argument('--gamma_max', type=int, help="'auto''s GAMMA_MAX (the largest of --gammas)")
  json_help = 'also write the jobs and table as JSON'
  args, gammas = ceiling.parse_gamma_arguments(parser, argv, '1,2,3,4,5,6,7', json_help)
  gammas = sorted(set(gammas))
  if args.rounds < 1:
    parser.error(f'--rounds must be >= 1, got {args.rounds}')
  gamma_max = gammas[-1] if args.gamma_max is None else args.gamma_max
  if not gammas[-1] <= gamma_max <= 32:
    parser.error(
      f'--gamma_max must be in [{gammas[-1]}, 32] (the largest of --gammas), got {gamma_max}'
    )
  for path in args.gin_file:
    if not os.path.exists(path):
      parser.error(f'--gin_file {path} does not exist')
  if args.json_out:  # checked before the jobs run, not after them
    out_dir = os.path.dirname(os.path.abspath(args.json_out))
    if (
      os.path.isdir(args.json_out) or not os.path.isdir(out_dir) or not os.access(out_dir, os.W_OK)
    ):
      parser.error(
        f'--json_out {args.json_out} cannot be written (a directory, or no writable one)'
      )
  machine = runtime.machine()
  print(
    f'{runtime.cpu_line(machine)}, {machine["usable_cores"]} cores; load average '
    f'{machine["load_average_start"][0]:.2f}; jobs: {args.gin_file} {args.gin_bindings}; '
    f"'auto' with GAMMA_MAX = {gamma_max}"
  )
  try:
    jobs = measure(args.gin_file, args.gin_bindings, gammas, args.rounds, gamma_max)
  except RuntimeError as e:
    print(f'{parser.prog}: error: {e}', file=sys.stderr)
    sys.exit(1)
  load = markdown.load_line(machine)
  rows = table(jobs)
  cost = measuring_cost(jobs)
  print(format_table(rows, cost))
  print(load)
  if args.json_out:
    table_json = {
      'machine': machine,
      'gamma_max': gamma_max,
      'jobs': jobs,
      'table': rows,
      'measuring_cost': cost,
    }
    markdown.write_json(args.json_out, table_json)


if __name__ == '__main__':
  main()
