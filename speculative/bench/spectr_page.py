"""SpecTr (K drafts) vs speculative decoding (K = 1) vs the baseline, embedded pair, temperature 1.

  python -m speculative.bench.spectr_page --num_examples 12 --repeats 2 --output_dir docs/spectr

(repository root, on a quiet machine: about 20-30 minutes on the 2-core CPU with the defaults, 5.5
minutes with the options above, which made docs/spectr/). Smoke run (4 inputs, 16 new tokens, K in
{1, 2}, L = 4, one repeat; random-init weights when a checkpoint is missing; timings mean nothing):

  python -m speculative.bench.spectr_page --quick

Models and inputs: the options of bench/pages.py (the embedded target and draft, the first
--num_examples sentences of the test split whose tokenized input fits --inputs_length, batch 1 as
in the papers), exact sampling at temperature 1 (no top-k), --max_new_tokens 64.

Methods, all on the same inputs and per-input seeds: `baseline`, `speculative L` (gamma = L) and
`spectr K L` (decode.spectr_loop.spectr_decode, K in --ks, L in --ls). With the same seed, spectr K=1
emits exactly speculative L's tokens (checked and reported). Timing as the benchmark's sweep
(bench/pages.time_rows): each method compiled on the first input, then every input decoded
--repeats times by every method, interleaved; a method's walltime = sum over inputs of the median
over repeats. Samples differ between methods, so the comparison is per generated token.

Cost model (where the wider target call eats the gain; bench/costs.py): t(R, T) = one target
`extend` over R rows of T tokens, d(R) = one draft step over R rows. A SpecTr step costs about
L d(K) + t(K, L+1), so the predicted speedup is BE x t(1, 1) / (L d(K) + t(K, L+1)).

Writes results.json and results.md (bench/spectr_tables.py) to --output_dir; the results page
includes the latter. SpecTr's Table 4 (LM1B, 97M target, 6M draft, temperature 1) is printed next to
ours where the paper reports it (K = 1 and K = 8).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from typing import Sequence

import numpy as np

from speculative import sampling as sampling_lib
from speculative import timing
from speculative.bench import costs as bench_noise
from speculative.bench import costs as costs_lib
from speculative.bench import machine as machine_lib
from speculative.bench import methods as methods_lib
from speculative.bench import pages
from speculative.bench import spectr_tables
from speculative.bench import sweep
from speculative.data import tasks
from speculative.decode import batching
from speculative.decode import spectr_loop as spectr_decoding

MODULE = 'speculative.bench.spectr_page'
SPECTR = 'spectr'
# SpecTr (Sun et al. 2023) Table 4, LM1B, block efficiency at temperature 1: only K = 1 and K = 8
# are quoted there; the other cells are left empty rather than guessed.
SPECTR_TABLE4 = {(1, 4): 2.21, (8, 4): 2.99, (1, 8): 2.33, (8, 8): 3.27}
COST_POSITION = 16  # decoder position of the timed calls (mid-sentence)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  quick = (
    'smoke run: 4 inputs, 16 new tokens, K 1 2, L 4, random init if a checkpoint is missing, '
    'output in outputs/bench_spectr_quick'
  )
  pages.add_pair_args(parser, num_examples=20, output_dir='outputs/bench_spectr', quick=quick)
  parser.add_argument('--ks', type=int, nargs='+', default=[1, 2, 4, 8])
  parser.add_argument('--ls', type=int, nargs='+', default=[4, 8])
  parser.add_argument('--cost_repeats', type=int, default=5)
  args = parser.parse_args(argv)
  if args.quick:
    args.num_examples, args.max_new_tokens, args.ks, args.ls = 4, 16, [1, 2], [4]
    args.repeats, args.cost_repeats, args.allow_random_init = 1, bench_noise.MIN_ROUNDS, True
    if args.output_dir == parser.get_default('output_dir'):
      args.output_dir = 'outputs/bench_spectr_quick'
  if 1 not in args.ks:
    parser.error('--ks must include 1 (the K=1 reference)')
  return args


# ----------------------------------------------------------------------------------------------
# Cost model: t(R, T) and d(R).
# ----------------------------------------------------------------------------------------------


def measure_costs(pair: pages.Pair, encoder_row: np.ndarray, args, max_length: int) -> dict:
  """t(K, L+1), d(K) and t(1, 1) with the benchmark's cost model: per K, the K-row calls
  interleaved with the 1-row target step t(1, 1) in timing rounds, so the ratios
  c_K = d(K) / t(1, 1) and v = t(K, L+1) / t(1, 1) are medians of per-round ratios; those too
  noisy to predict from are listed in 'too_noisy'."""
  costs = {'target_ms': {}, 'draft_ms': {}, 'c': {}, 'v': {}, 'too_noisy': {}}
  t11 = []
  for k in args.ks:
    encoder = np.repeat(encoder_row[None], k, axis=0)  # [K, S]
    reference = timing.extend_timer(
      pair.target,
      pair.target_params,
      encoder[:1],
      num_tokens=1,
      max_length=max_length,
      position=COST_POSITION,
    )
    cm = costs_lib.measure_extend_costs(
      pair.target,
      pair.target_params,
      encoder,
      max_length=max_length,
      position=COST_POSITION,
      verify_lengths=[length + 1 for length in args.ls],
      drafts={'draft': (pair.draft, pair.draft_params)},
      repeats=args.cost_repeats,
      min_seconds=0.1,
      extra_timers={'target_1x1': reference},
      marginal_extra=['target_1x1'],
    )
    t11.append(_add_costs_at_k(costs, cm, k, args.ls))
  costs['target_1x1_ms'] = 1e3 * float(np.median(t11))
  return costs


def _add_costs_at_k(costs: dict[str, Any], cm: dict[str, Any], k: int, ls) -> float:
  """d(K), c_K and every v(K x L+1) of one K's cost model `cm` into `costs` (with the refused
  estimates); returns that K's t(1, 1) in seconds."""
  rounds, noise = cm['rounds'], bench_noise.NoiseLog(cm['noise'])
  costs['draft_ms'][str(k)] = 1e3 * cm['drafters']['draft']['draft_step_s']
  t11_k = cm['seconds']['target_1x1']
  costs['c'][str(k)] = noise.add(
    f'c(K={k})',
    bench_noise.ratio_samples(rounds['draft[draft]_1'], rounds['target_1x1']),
    fallback=cm['drafters']['draft']['draft_step_s'] / t11_k,
  )
  for length in ls:
    key = f'{k}x{length + 1}'
    costs['target_ms'][key] = 1e3 * cm['target_extend_s'][str(length + 1)]
    costs['v'][key] = noise.add(
      f'v({key})',
      bench_noise.ratio_samples(rounds[f'target_{length + 1}'], rounds['target_1x1']),
      minimum=1.0,
      fallback=cm['target_extend_s'][str(length + 1)] / t11_k,
    )
  refused = noise.data['refused'].items()
  costs['too_noisy'].update(
    {name: reason for name, reason in refused if name.startswith(('c(K=', f'v({k}x'))}
  )
  return t11_k


# ----------------------------------------------------------------------------------------------
# Decoding methods and their rows.
# ----------------------------------------------------------------------------------------------


def make_methods(pair: pages.Pair, args) -> list[methods_lib.Method]:
  """baseline, speculative L per L, spectr K L per (K, L); `drafter_obj` holds (K, L)."""
  sampling, sampling_params = sampling_lib.make_sampling(temperature=1.0)
  drafter = pages.model_drafter(pair)
  common = dict(max_new_tokens=args.max_new_tokens, sampling=sampling, eos_id=tasks.EOS_ID)
  baseline = pages.decode_fn(pair, sampling_params=sampling_params, **common)
  methods = [methods_lib.Method('baseline', methods_lib.BASELINE, baseline)]

  def spectr(k, length):
    return lambda encoder_tokens, rng: spectr_decoding.spectr_decode(
      pair.target,
      pair.target_params,
      drafter,
      pair.draft_params,
      None,
      num_drafts=k,
      draft_length=length,
      encoder_tokens=encoder_tokens,
      rng=rng,
      sampling_params=sampling_params,
      **common,
    )

  for length in args.ls:
    speculative = pages.decode_fn(
      pair, drafter, sampling_params=sampling_params, gamma=length, **common
    )
    name = f'speculative L={length}'
    methods.append(methods_lib.Method(name, methods_lib.SPECULATIVE, speculative, gamma=length))
    for k in args.ks:
      methods.append(
        methods_lib.Method(f'spectr K={k} L={length}', SPECTR, spectr(k, length), gamma=length)
      )
      methods[-1].drafter_obj = (k, length)
  return methods


def method_rows(methods, batches, measured: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
  """Per method: walltime, tokens, calls, ms/token, block efficiency, acceptance, the speedups and
  (SpecTr K=1) whether it matches speculative decoding."""
  by_name = {m.name: m for m in methods}
  rows = []
  for m in methods:
    r = measured[m.name]
    k = m.drafter_obj[0] if m.kind == SPECTR else None
    total = lambda field: sweep.sum_rows(m, batches, field)  # noqa: E731
    row = dict(
      method=m.name,
      kind=m.kind,
      K=k,
      L=m.gamma,
      walltime_s=r['walltime_s'],
      generated_tokens=r['generated_tokens'],
      target_calls=r['target_calls'],
      ms_per_token=r['ms_per_token'],
      block_efficiency=r['generated_tokens'] / max(r['target_calls'], 1),
      compile_s=r['compile_s'],
    )
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
        reference = by_name[f'speculative L={m.gamma}']
        identical = sweep.identical_rows(m, reference, batches)
        row['identical_to_speculative'] = identical == r['examples']
    rows.append(row)
  _add_relative_speeds(rows)
  return rows


def _add_relative_speeds(rows: list[dict[str, Any]]) -> None:
  """Speedup per token over the baseline, and (SpecTr) over K=1 at the same L."""
  base = next(r for r in rows if r['kind'] == methods_lib.BASELINE)
  for row in rows:
    row['speedup_vs_baseline'] = base['ms_per_token'] / row['ms_per_token']
    if row['kind'] == SPECTR:
      k1 = next(r for r in rows if r['kind'] == SPECTR and r['K'] == 1 and r['L'] == row['L'])
      row['speedup_vs_k1'] = k1['ms_per_token'] / row['ms_per_token']


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


# ----------------------------------------------------------------------------------------------
# Main.
# ----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Times every method, measures the cost model on the first input; returns the report."""
  started = pages.record(MODULE, argv)
  pair, examples, _ = pages.load_pair_and_examples(args)
  print(
    f'target: {pair.descriptions["target"]}\ndraft: {pair.descriptions["draft"]}\n'
    f'inputs: {len(examples)} {args.split} sentences',
    flush=True,
  )
  methods = make_methods(pair, args)
  batches, measured = pages.time_rows(
    methods,
    examples,
    inputs_length=args.inputs_length,
    temperature=1.0,
    repeats=args.repeats,
    seed=args.seed,
  )
  rows = method_rows(methods, batches, measured)
  # Cost model on a realistic cache: the first input, position 16.
  costs = measure_costs(
    pair,
    batching.pad_batch(examples[:1], 1, args.inputs_length)[0],  # [S]
    args,
    max_length=args.inputs_length + args.max_new_tokens + max(args.ls) + 1,
  )
  print('costs measured', flush=True)
  for row in rows:
    if row['kind'] == SPECTR:
      _add_prediction(row, costs)
  busy = machine_lib.busy_warning(started['machine'])
  return dict(
    **started,
    warnings=[busy] if busy else [],
    target=pair.descriptions['target'],
    draft=pair.descriptions['draft'],
    num_inputs=len(examples),
    inputs_length=args.inputs_length,
    max_new_tokens=args.max_new_tokens,
    temperature=1.0,
    repeats=args.repeats,
    rows=rows,
    costs=costs,
    first_source=examples[0].inputs,
  )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the page; writes results.json and results.md to --output_dir; returns the report."""
  args = parse_args(argv)
  report = run(args, argv)
  text = spectr_tables.format_report(report)
  pages.write_page(args.output_dir, {'results.json': report, 'results.md': text})
  print(text)
  return report


if __name__ == '__main__':
  pages.command_line(main, sys.argv[1:])
