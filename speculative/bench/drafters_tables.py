"""The drafters page's Markdown (docs/drafters/drafters.md): the tables of the parts that ran, in
the layout of the paper's Tables 3 and 5, and the walltime of adaptive vs fixed gamma.

Written by the drafters page:

  python -m speculative.bench.drafters_page --output_dir=docs/drafters
"""

from __future__ import annotations

from typing import Any

from speculative.bench import cells
from speculative.bench import pages


def sampling_name(temperature: float) -> str:
  return 'argmax' if temperature == 0 else f'T={temperature:g}'


def markdown(report: dict[str, Any]) -> str:
  """The tables of the parts that ran, then the command and machine line."""
  lines = []
  for part, section in (
    ('alpha', _alpha_markdown),
    ('lenience', _lenience_markdown),
    ('walltime', _walltime_markdown),
  ):
    if part in report:
      lines += section(report)
  setup = report['setup']
  lines.append(
    f'Command: `{setup["command"]}` ({setup["generated_at"]}); machine: '
    f'{pages.machine_line(setup["machine"])}; target weights: {setup["target_checkpoint"]}; '
    f'draft weights: {setup["draft_checkpoint"]}.'
  )
  lines += [f'**Warning:** {w}' for w in setup.get('warnings', [])]
  return '\n'.join(lines) + '\n'


def _alpha_markdown(report: dict[str, Any]) -> list[str]:
  """Alpha per drafter (paper Table 3 layout)."""
  setup = report['setup']
  rows = [
    [
      setup['target_name'],
      row['drafter_label'],
      sampling_name(row['temperature']),
      cells.fmt(row['alpha'], 3),
      cells.fmt(row['acceptance'], 3),
      cells.fmt(row['tokens_per_call']),
      cells.fmt(row['drafted_per_step']),
    ]
    for row in report['alpha']
  ]
  header = ['M_p', 'M_q', 'Sampling', 'alpha', 'acceptance rate', 'tokens / target call']
  return [
    f'### Alpha per drafter (paper Table 3 layout; gamma={setup["gamma"]}, '
    f'{setup["num_examples"]} {setup["split"]} sentences)',
    '',
    cells.table(header + ['drafted / step'], rows),
    '',
    'alpha = mean over drafted positions of sum_x min(p(x), q(x)); deterministic '
    'drafters (prompt lookup) have one-hot q, so there alpha = P(accept). Prompt lookup '
    'proposes only where an n-gram matches (drafted / step < gamma).',
    '',
  ]


def _lenience_markdown(report: dict[str, Any]) -> list[str]:
  """Alpha, tokens per call and BLEU vs lenience (paper Table 5 layout)."""
  setup = report['setup']
  target_name, draft_name = setup['target_name'], setup['draft_name']
  header = [f'l={v:g}' for v in setup['lenience']]
  alpha_rows, metric_rows = [], []
  for temperature, rows in report['lenience'].items():
    name = sampling_name(float(temperature))
    alpha_rows.append([target_name, draft_name, name] + [cells.fmt(r['alpha'], 3) for r in rows])
    for metric, digits in (('tokens_per_call', 2), ('bleu', 1)):
      metric_rows.append([name, metric] + [cells.fmt(r[metric], digits) for r in rows])
  return [
    f'### Alpha vs lenience (paper Table 5 layout; M_q = {draft_name}, gamma={setup["gamma"]})',
    '',
    cells.table(['M_p', 'M_q', 'Sampling'] + header, alpha_rows),
    '',
    'Tokens per target call and BLEU (l < 1 is APPROXIMATE: the output is no longer '
    "the target's):",
    '',
    cells.table(['Sampling', 'metric'] + header, metric_rows),
    '',
    'Greedy lenience accepts a draft token x iff p(x) >= l max p (target softmax at '
    'temperature 1); sampling lenience accepts iff r l q(x) <= p(x), so no token is '
    'emitted with probability above p(x)/l.',
    '',
  ]


def _walltime_markdown(report: dict[str, Any]) -> list[str]:
  """Walltime of adaptive vs fixed gamma, with the measured costs."""
  setup, wall, costs = report['setup'], report['walltime'], report['costs']
  v_values = sorted(costs['v'].items(), key=lambda kv: int(kv[0]))
  rows = [
    [
      row['method'],
      cells.fmt(row['ms_per_token']),
      cells.fmt(row['speedup'], 2, 'x'),
      cells.fmt(row['vs_best_fixed'], 2, 'x'),
      cells.fmt(row['tokens_per_call']),
      cells.fmt(row['drafted_per_step']),
      cells.fmt(row['compile_s'], 1),
    ]
    for row in wall['rows']
  ]
  header = ['method', 'ms / token', 'speedup vs baseline', 'vs best fixed gamma']
  return [
    f'### Walltime: adaptive vs fixed gamma (batch 1, {sampling_name(wall["temperature"])}'
    f', {wall["examples"]} sentences, median of {setup["repeats"]})',
    '',
    f'Measured: target step {1000 * costs["target_step_s"]:.2f} ms, draft step '
    f'{1000 * costs["draft_step_s"]:.2f} ms (c = {costs["c"]:.3f}), v(T) = '
    + ', '.join(f'{v:.2f}' for _, v in v_values)
    + f' for T = 1..{len(v_values)}'
    + ''.join(
      f'. **Too noisy** (the acceptance rule below uses it anyway): {reason}'
      for reason in costs.get('too_noisy', {}).values()
    ),
    '',
    cells.table(header + ['tokens / call', 'drafted / step', 'compile s'], rows),
    '',
    f'Best fixed gamma: {wall["best_fixed"]}. Adaptive gamma is exact (same tokens as '
    'the baseline under argmax). With the static verify width it only saves draft calls; '
    '"adaptive verify" also shrinks the target call to 1 + drafted tokens (lax.switch '
    'over gamma+1 compiled widths).',
    '',
  ]
