"""The SpecTr page's Markdown (docs/spectr/results.md): the methods table with SpecTr's Table 4
beside ours, the measured costs and step model, and K relative to K=1.

Written by the SpecTr page:

  python -m speculative.bench.spectr_page --num_examples 12 --repeats 2 --output_dir docs/spectr
"""

from __future__ import annotations

from typing import Any

from speculative.bench import cells
from speculative.bench import pages

HEADER = (
  'method',
  'K',
  'L',
  'block eff.',
  'SpecTr Tab. 4',
  'accept. K drafts',
  'accept. 1 draft',
  'ms/token',
  'speedup vs baseline',
  'vs K=1',
  'step ms: measured / model',
  'v = t(K, L+1)/t(1,1)',
  'predicted speedup',
)


def _yes_no(value: bool | None) -> str:
  return '-' if value is None else ('yes' if value else 'NO')


def format_report(report: dict[str, Any]) -> str:
  lines = [
    '### SpecTr: K drafts per step (embedded pair, temperature 1, batch 1)',
    '',
    f'Command: `{report["command"]}` ({report["generated_at"]}; '
    f'{pages.machine_line(report["machine"])}).',
    f'Target: {report["target"]}. Draft: {report["draft"]}. {report["num_inputs"]} test '
    f'sentences, up to {report["max_new_tokens"]} new tokens, median of {report["repeats"]} '
    'repeats. Block efficiency = generated tokens / target calls; SpecTr Table 4 = LM1B, 97M '
    'target / 6M draft (only the cells compared here).',
    '',
    cells.table(HEADER, [_table_row(row) for row in report['rows']]),
  ]
  lines += [''] + [f'**Warning:** {w}' for w in report.get('warnings', [])]
  lines += _cost_lines(report['costs'])
  lines += _comparison_lines(report['rows'])
  return '\n'.join(lines) + '\n'


def _table_row(row: dict[str, Any]) -> list[str]:
  step = (
    f'{row["measured_step_ms"]:.1f} / {row["model_step_ms"]:.1f}' if 'model_step_ms' in row else '-'
  )
  predicted = (
    'too noisy to predict' if row.get('too_noisy') else cells.fmt(row.get('predicted_speedup'))
  )
  return [
    row['method'],
    cells.fmt(row['K']),
    cells.fmt(row['L']),
    cells.fmt(row['block_efficiency']),
    cells.fmt(row.get('spectr_table4')),
    cells.fmt(row.get('alpha_k_drafts', row.get('alpha')), 3),
    cells.fmt(row.get('alpha_one_draft'), 3),
    cells.fmt(row['ms_per_token'], 1),
    cells.fmt(row['speedup_vs_baseline']),
    cells.fmt(row.get('speedup_vs_k1')),
    step,
    cells.fmt(row.get('v')),
    predicted,
  ]


def _cost_lines(costs: dict[str, Any]) -> list[str]:
  """The measured costs, the step model and the refused estimates."""
  lines = [
    f'Target single step t(1,1) = {costs["target_1x1_ms"]:.2f} ms; draft step d(K) ms: '
    + ', '.join(f'K={k}: {v:.2f}' for k, v in costs['draft_ms'].items())
    + '; target verify t(K, L+1) ms: '
    + ', '.join(f'{k}: {v:.2f}' for k, v in costs['target_ms'].items())
    + '.',
    'Model step = L d(K) + t(K, L+1); measured step = walltime / target calls (it also '
    'holds prefill, selection, the draft catch-up and the K-way cache copy). '
    'Predicted speedup = block eff. / (L c_K + v) with c_K = d(K) / t(1,1) and '
    'v = t(K, L+1) / t(1,1), each the median of per-round ratios (interleaved rounds).',
  ]
  lines += [f'**Too noisy to predict:** {reason}.' for reason in costs['too_noisy'].values()]
  return lines


def _comparison_lines(rows: list[dict[str, Any]]) -> list[str]:
  """Per L, each K relative to K=1; and whether K=1 matched speculative decoding."""
  lines = []
  for length in sorted({r['L'] for r in rows if r['K']}):
    spectr_rows = sorted((r for r in rows if r['K'] and r['L'] == length), key=lambda r: r['K'])
    k1 = spectr_rows[0]
    best = min(spectr_rows, key=lambda r: r['ms_per_token'])
    parts = [
      f'K={r["K"]}: block efficiency x{r["block_efficiency"] / k1["block_efficiency"]:.2f}, '
      f'step cost x{r["model_step_ms"] / k1["model_step_ms"]:.2f}'
      for r in spectr_rows[1:]
    ]
    lines.append(
      f'L={length}, relative to K=1: '
      + '; '.join(parts)
      + f'. Fastest per token: K={best["K"]} ({best["ms_per_token"]:.1f} ms/token).'
    )
  identical = [r for r in rows if 'identical_to_speculative' in r]
  if identical:
    lines.append(
      'SpecTr K=1 emits the same tokens as speculative decoding with the same seeds: '
      + ', '.join(f'L={r["L"]}: {_yes_no(r["identical_to_speculative"])}' for r in identical)
      + '.'
    )
  return lines
