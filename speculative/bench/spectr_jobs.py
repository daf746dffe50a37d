"""The SpecTr jobs table: `speculative.infer` jobs run with METHOD = 'spectr', one row per job.

  python -m speculative.bench.spectr_jobs outputs/numbers/* [--log LOG] [--c 0.061]

From each job's metrics, manifest and predictions: block efficiency of SpecTr and of one draft
with 95% intervals and their paired difference, acceptance, ms per token, and the speedup on a
device where a K-row step costs a one-row one: BE / (1 + L c) (--c: docs/spectr/results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any
from typing import Sequence

from speculative.bench import markdown


def read_job(output_dir: str) -> dict[str, Any]:
  """A job's metrics, manifest and (tokens, target calls) per example of both speculative modes."""

  def read(name: str) -> Any:  # a JSON file, or a JSONL file's lines
    with open(os.path.join(output_dir, name), encoding='utf-8') as f:
      return [json.loads(line) for line in f] if name.endswith('.jsonl') else json.load(f)

  job = dict(name=os.path.basename(output_dir.rstrip('/')), records={})
  job.update(metrics=read('metrics.json'), manifest=read('manifest.json'))
  for mode in ('speculative', 'spectr'):
    rows = read(f'predictions-{mode}.jsonl')
    job['records'][mode] = {r['index']: (r['num_tokens'], r['target_calls']) for r in rows}
  return job


def paired_difference(spectr: dict[int, tuple], one: dict[int, tuple]) -> tuple[float, float]:
  """(BE_spectr - BE_one, its standard error): delta method, paired on the same inputs."""
  indices = sorted(spectr)
  n = len(indices)

  def linearized(records):
    tokens = [records[i][0] for i in indices]
    calls = [records[i][1] for i in indices]
    ratio, mean_calls = sum(tokens) / sum(calls), sum(calls) / n
    return ratio, [(t - ratio * c) / mean_calls for t, c in zip(tokens, calls)]

  ratio_s, terms_s = linearized(spectr)
  ratio_1, terms_1 = linearized(one)
  diffs = [a - b for a, b in zip(terms_s, terms_1)]
  mean = sum(diffs) / n
  if n < 2:  # one example: no spread to estimate
    return ratio_s - ratio_1, float('nan')
  variance = sum((d - mean) ** 2 for d in diffs) / (n - 1) / n
  return ratio_s - ratio_1, variance**0.5


def read_loads(log_path: str | None) -> dict[str, str]:
  """{job name: 'start -> end'} 1-minute load averages from scripts/spectr_jobs.sh's log."""
  if not log_path:
    return {}
  loads, job = {}, None
  with open(log_path, encoding='utf-8') as f:
    for line in f:
      load = re.search(r'load average: ([\d.]+)', line)
      if load and (begun := re.match(r'=== (\S+) ', line)):
        job, start = begun.group(1), load.group(1)
      elif load and line.startswith('rc=') and job is not None:
        loads[job] = f'{start} -> {load.group(1)}'
  return loads


def table(jobs: Sequence[dict[str, Any]], c: float, loads: dict[str, str]) -> str:
  header = ['job', 'task', 'B', 'K', 'L', 'examples', 'BE SpecTr [95%]', 'BE one draft [95%]']
  header += ['diff (z)', 'accept. K / 1 draft', 'ms/token base / one / SpecTr']
  header += ['SpecTr vs baseline', 'vs one draft', f'device prediction (c = {c:.3f})']
  header += ['identical to one draft', 'decode path', 'load']
  ms = lambda mode: 1e3 / mode['tokens_per_s']
  ci = lambda mode: '{:.3f} [{:.3f}, {:.3f}]'.format(
    mode['block_efficiency'], *mode['block_efficiency_ci95']
  )
  rows = []
  for job in jobs:
    m, inputs = job['metrics'], job['manifest']['inputs']
    s, one, base = m['spectr'], m['speculative'], m['baseline']
    diff, se = paired_difference(job['records']['spectr'], job['records']['speculative'])
    task = (inputs.get('task') if isinstance(inputs, dict) else None) or inputs
    rows.append(
      [job['name'], task, m['batch_size'], m['num_drafts'], m['gamma'], m['examples']]
      + [ci(s), ci(one), f'{diff:+.3f} ({diff / se if se else 0:+.1f})']
      + [f"{s['alpha']:.3f} / {s['alpha_one_draft']:.3f}"]
      + [f'{ms(base):.1f} / {ms(one):.1f} / {ms(s):.1f}']
      + [f'{s[f"speedup_per_token_vs_{vs}"]:.2f}x' for vs in ('baseline', 'speculative')]
      + [
        f"{s['block_efficiency'] / (1 + m['gamma'] * c):.2f}x vs baseline, "
        f"{s['block_efficiency'] / one['block_efficiency']:.2f}x vs one draft"
      ]
      + [f"{s['identical_to_speculative']} / {m['examples']}", m['decode_path']]
      + [loads.get(job['name'], '-')]
    )
  return markdown.table(header, rows) + '\n'


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(
    prog='python -m speculative.bench.spectr_jobs', description=__doc__.splitlines()[0]
  )
  parser.add_argument('output_dirs', nargs='+')
  parser.add_argument('--log', default=None, help="scripts/spectr_jobs.sh's log (load averages)")
  parser.add_argument('--c', type=float, default=0.061, help='draft step / target step')
  args = parser.parse_args(argv)
  jobs = []
  for output_dir in args.output_dirs:
    try:
      jobs.append(read_job(output_dir))  # predictions-spectr.jsonl: a SpecTr job's own file
    except (OSError, ValueError, KeyError, TypeError) as e:
      parser.error(f"{output_dir} is not a finished METHOD = 'spectr' job's output ({e!r})")
  try:
    loads = read_loads(args.log)
  except OSError as e:
    parser.error(f'--log {args.log}: {e.strerror}')
  sys.stdout.write(table(jobs, args.c, loads))


if __name__ == '__main__':
  main()
