"""SpecTr (K drafts) vs speculative decoding (K = 1) vs the baseline, embedded pair, temperature 1.

  python -m speculative.bench.spectr_page --num_examples 12 --repeats 2 --output_dir docs/spectr

(5.5 minutes on 2 quiet cores, which made docs/spectr/; `--quick` is a smoke run.) At batch 1 on
the same inputs and seeds, `baseline`, `speculative L` and `spectr K L` (K = 1 must emit speculative
L's tokens: checked), compared per generated token; a SpecTr step costs about L d(K) + t(K, L+1)
(bench/costs.py), hence the predicted speedup. SpecTr's Table 4 (LM1B) is beside ours.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from typing import Sequence

import numpy as np

from speculative import timing
from speculative.bench import costs as bench_noise
from speculative.bench import markdown
from speculative.bench import methods as methods_lib
from speculative.bench import sweep
from speculative.decode import batching

MODULE = 'speculative.bench.spectr_page'
SPECTR = 'spectr'
# SpecTr (Sun et al. 2023) Table 4, LM1B, block efficiency at temperature 1: only K = 1 and K = 8
# are quoted there; the other cells are left empty rather than guessed.
SPECTR_TABLE4 = {(1, 4): 2.21, (8, 4): 2.99, (1, 8): 2.33, (8, 8): 3.27}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(prog=f'python -m {MODULE}', description=__doc__.split('\n')[0])
  quick = 'smoke run: 4 inputs, 16 new tokens, K 1 2, L 4, random init if a checkpoint is missing, '
  quick += 'output in outputs/bench_spectr_quick'
  methods_lib.add_pair_args(parser, num_examples=20, output_dir='outputs/bench_spectr', quick=quick)
  parser.add_argument('--ks', type=int, nargs='+', default=[1, 2, 4, 8])
  parser.add_argument('--ls', type=int, nargs='+', default=[4, 8])
  parser.add_argument('--cost_repeats', type=int, default=5)
  presets = dict(num_examples=4, max_new_tokens=16, ks=[1, 2], ls=[4], repeats=1)
  presets.update(cost_repeats=bench_noise.MIN_ROUNDS, allow_random_init=True)
  quick = dict(presets, output_dir='outputs/bench_spectr_quick')
  args = methods_lib.parse_page_args(parser, argv, quick, positive=('ks', 'ls', 'cost_repeats'))
  if 1 not in args.ks:
    parser.error('--ks must include 1 (the K=1 reference)')
  return args


def measure_costs(pair: methods_lib.Pair, example, args) -> dict:
  """d(K), t(K, L+1) and t(1, 1) on `example`'s cache, c_K and v as per-round ratios."""
  encoder_row = batching.pad_batch([example], 1, args.inputs_length)[0]  # [S]
  max_length = args.inputs_length + args.max_new_tokens + max(args.ls) + 1
  costs = {'target_ms': {}, 'draft_ms': {}, 'c': {}, 'v': {}, 'too_noisy': {}}
  t11, at = [], dict(max_length=max_length, position=methods_lib.COST_POSITION)
  for k in args.ks:
    encoder = np.repeat(encoder_row[None], k, axis=0)  # [K, S]
    reference = timing.extend_timer(
      pair.target, pair.target_params, encoder[:1], num_tokens=1, **at
    )
    cm = methods_lib.extend_costs(
      pair,
      encoder,
      max_length=max_length,
      verify_lengths=[length + 1 for length in args.ls],
      repeats=args.cost_repeats,
      extra_timers={'target_1x1': reference},
      marginal_extra=['target_1x1'],
    )
    noise, seconds = bench_noise.NoiseLog(cm['noise']), cm['seconds']
    t11.append(seconds['target_1x1'])
    ratio = lambda name, timer, **kw: noise.ratio(
      name, cm['rounds'], seconds, timer, 'target_1x1', **kw
    )
    costs['draft_ms'][str(k)] = 1e3 * seconds['draft[model]_1']
    costs['c'][str(k)] = ratio(f'c(K={k})', 'draft[model]_1')
    for length in args.ls:
      key = f'{k}x{length + 1}'
      costs['target_ms'][key] = 1e3 * seconds[f'target_{length + 1}']
      costs['v'][key] = ratio(f'v({key})', f'target_{length + 1}', minimum=1.0)
    refused = noise.data['refused'].items()
    costs['too_noisy'].update(
      {name: reason for name, reason in refused if name.startswith(('c(K=', f'v({k}x'))}
    )
  costs['target_1x1_ms'] = 1e3 * float(np.median(t11))
  return costs


def make_methods(pair: methods_lib.Pair, args) -> list[methods_lib.Method]:
  """baseline, speculative L per L, spectr K L per (K, L); `drafter_obj` holds (K, L)."""
  drafter = methods_lib.model_drafter(pair)
  decode = lambda *a, **options: methods_lib.pair_decode_fn(
    pair, args.max_new_tokens, 1.0, *a, **options
  )
  methods = [methods_lib.Method('baseline', methods_lib.BASELINE, decode())]
  for length in args.ls:
    speculative = decode(drafter, gamma=length)
    name = f'speculative L={length}'
    methods.append(methods_lib.Method(name, methods_lib.SPECULATIVE, speculative, gamma=length))
    for k in args.ks:
      # check_finite as spectr_decode's own default (the page called it directly before).
      spectr = decode(drafter, gamma=length, num_drafts=k, check_finite=True)
      name = f'spectr K={k} L={length}'
      methods.append(
        methods_lib.Method(name, SPECTR, spectr, gamma=length, drafter_obj=(k, length))
      )
  return methods


def method_rows(methods, batches, measured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
  """Per method: walltime, tokens, block efficiency, acceptance, speedups, K=1 identity."""
  by_name = {m.name: m for m in methods}
  rows = []
  for m in methods:
    r = measured[m.name]
    k = m.drafter_obj[0] if m.kind == SPECTR else None
    total = lambda field: sweep.sum_rows(m, batches, field)
    keys = ('walltime_s', 'generated_tokens', 'target_calls', 'ms_per_token')
    row = dict(method=m.name, kind=m.kind, K=k, L=m.gamma, **{key: r[key] for key in keys})
    row['block_efficiency'] = r['generated_tokens'] / max(r['target_calls'], 1)
    row['compile_s'] = r['compile_s']
    if m.kind != methods_lib.BASELINE:
      row['accepted'] = int(total('accepted'))
    if m.kind == methods_lib.SPECULATIVE:
      row['alpha'] = r['alpha']
    if m.kind == SPECTR:
      selections = max(total('selections'), 1)
      row['alpha_k_drafts'] = total('alpha_sum') / selections
      row['alpha_one_draft'] = total('single_alpha_sum') / selections
      row['spectr_table4'] = SPECTR_TABLE4.get((k, m.gamma))
      if k == 1:
        identical = sweep.identical_rows(m, by_name[f'speculative L={m.gamma}'], batches)
        row['identical_to_speculative'] = identical == r['examples']
    rows.append(row)
  # Speedup per token over the baseline, and (SpecTr) over K=1 at the same L.
  for row in rows:
    row['speedup_vs_baseline'] = rows[0]['ms_per_token'] / row['ms_per_token']
    if row['kind'] == SPECTR:
      k1 = next(r for r in rows if r['kind'] == SPECTR and r['K'] == 1 and r['L'] == row['L'])
      row['speedup_vs_k1'] = k1['ms_per_token'] / row['ms_per_token']
  return rows


def _add_prediction(row: dict[str, Any], costs: dict[str, Any]) -> None:
  """A SpecTr row's modelled and measured step, v and predicted speedup (None when too noisy)."""
  k, length = row['K'], row['L']
  key = f'{k}x{length + 1}'
  row['model_step_ms'] = length * costs['draft_ms'][str(k)] + costs['target_ms'][key]
  row['measured_step_ms'] = row['walltime_s'] * 1e3 / max(row['target_calls'], 1)
  row['v'] = costs['v'][key]
  too_noisy = [costs['too_noisy'][n] for n in (f'c(K={k})', f'v({key})') if n in costs['too_noisy']]
  row['predicted_speedup'] = (
    None if too_noisy else row['block_efficiency'] / (length * costs['c'][str(k)] + costs['v'][key])
  )
  if too_noisy:
    row['too_noisy'] = '; '.join(too_noisy)


# The methods table (docs/spectr/results.md), with SpecTr's Table 4 beside ours.
_COLUMNS = [
  markdown.column('method', 'method'),
  markdown.column('K', 'K'),
  markdown.column('L', 'L'),
  markdown.column('block eff.', 'block_efficiency'),
  markdown.column('SpecTr Tab. 4', 'spectr_table4'),
  markdown.column('accept. K drafts', lambda r: r.get('alpha_k_drafts', r.get('alpha')), 3),
  markdown.column('accept. 1 draft', 'alpha_one_draft', 3),
  markdown.column('ms/token', 'ms_per_token', 1),
  markdown.column('speedup vs baseline', 'speedup_vs_baseline'),
  markdown.column('vs K=1', 'speedup_vs_k1'),
  markdown.column(
    'step ms: measured / model',
    lambda r: (
      f'{r["measured_step_ms"]:.1f} / {r["model_step_ms"]:.1f}' if 'model_step_ms' in r else None
    ),
  ),
  markdown.column('v = t(K, L+1)/t(1,1)', 'v'),
  markdown.column(
    'predicted speedup',
    lambda r: (
      bench_noise.speedup_cell(r['predicted_speedup'], '') if 'predicted_speedup' in r else None
    ),
  ),
]


def format_report(report: dict[str, Any]) -> str:
  """The page's Markdown: the methods table, the costs and step model, K relative to K=1."""
  costs, rows = report['costs'], report['rows']
  lines = markdown.section(
    'SpecTr: K drafts per step (embedded pair, temperature 1, batch 1)',
    f'Command: `{report["command"]}` ({report["generated_at"]}; '
    f'{markdown.machine_line(report["machine"])}).\n'
    f'Target: {report["target"]}. Draft: {report["draft"]}. {report["num_inputs"]} test '
    f'sentences, up to {report["max_new_tokens"]} new tokens, median of {report["repeats"]} '
    'repeats. Block efficiency = generated tokens / target calls; SpecTr Table 4 = LM1B, 97M '
    'target / 6M draft (only the cells compared here).',
    markdown.columns_table(_COLUMNS, rows),
    level=3,
  )
  lines += [f'**Warning:** {w}' for w in report.get('warnings', [])]
  lines += [
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
  for length in sorted({r['L'] for r in rows if r['K']}):
    spectr_rows = sorted((r for r in rows if r['K'] and r['L'] == length), key=lambda r: r['K'])
    k1, best = spectr_rows[0], min(spectr_rows, key=lambda r: r['ms_per_token'])
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
  identical = [
    (r['L'], r['identical_to_speculative']) for r in rows if 'identical_to_speculative' in r
  ]
  if identical:
    yes_no = lambda value: '-' if value is None else ('yes' if value else 'NO')
    lines.append(
      'SpecTr K=1 emits the same tokens as speculative decoding with the same seeds: '
      + ', '.join(f'L={length}: {yes_no(same)}' for length, same in identical)
      + '.'
    )
  return '\n'.join(lines) + '\n'


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Times every method and the costs; writes results.json and results.md; returns the report."""
  args = parse_args(argv)
  report = markdown.record(MODULE, argv)
  pair, examples, _ = methods_lib.load_pair_and_examples(args)
  print(
    f'target: {pair.descriptions["target"]}\ndraft: {pair.descriptions["draft"]}\n'
    f'inputs: {len(examples)} {args.split} sentences',
    flush=True,
  )
  methods = make_methods(pair, args)
  batches, measured = sweep.time_rows(methods, examples, args, temperature=1.0)
  rows = method_rows(methods, batches, measured)
  costs = measure_costs(pair, examples[0], args)  # a realistic cache: the first input
  print('costs measured', flush=True)
  for row in rows:
    if row['kind'] == SPECTR:
      _add_prediction(row, costs)
  report.update(warnings=markdown.busy_warnings(report['machine']))
  report.update(target=pair.descriptions['target'])
  report.update(draft=pair.descriptions['draft'], num_inputs=len(examples))
  report.update({k: getattr(args, k) for k in ('inputs_length', 'max_new_tokens')})
  report.update(temperature=1.0, repeats=args.repeats, rows=rows, costs=costs)
  report['first_source'] = examples[0].inputs
  text = format_report(report)
  markdown.write_page(args.output_dir, {'results.json': report, 'results.md': text})
  print(text)
  return report


if __name__ == '__main__':
  methods_lib.command_line(main, sys.argv[1:])
