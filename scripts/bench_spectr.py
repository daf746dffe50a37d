"""SpecTr (K drafts) vs speculative decoding (K = 1) vs the baseline, embedded pair, temperature 1.

Command (from the repository root, on a quiet machine; about 20-30 minutes on the 2-core CPU with
the defaults, 5.5 minutes with --num_examples 12 --repeats 2 as for docs/spectr/):
  .venv/bin/python scripts/bench_spectr.py [--num_examples 20] [--repeats 3] \
      [--output_dir outputs/bench_spectr]
Smoke run (4 inputs, 16 new tokens, K in {1, 2}, L = 4, one repeat; random-init weights when a
checkpoint is missing; timings mean nothing):
  .venv/bin/python scripts/bench_spectr.py --quick

Models: target configs/models/embedded_target.gin + models/embedded/target.msgpack, draft
configs/models/embedded_draft.gin + models/embedded/draft.msgpack (`--target_checkpoint` /
`--draft_checkpoint` also take T5X checkpoint dirs, e.g. ../runs/embedded_target/checkpoint_N).
Inputs: the first --num_examples sentences of the LibreOffice En-De test split whose tokenized
input ("translate English to German: " + en, EOS-terminated) fits --inputs_length (64), padded to
it, batch 1 (as the papers), exact sampling at temperature 1 (no top-k), --max_new_tokens 64.

Methods, all on the same inputs and per-input seeds: `baseline` (decoding.autoregressive_decode),
`speculative L` (decoding.speculative_decode, gamma = L) and `spectr K L` (spectr_decoding, K in
{1, 2, 4, 8}, L in {4, 8}). With the same seed, spectr K=1 emits exactly speculative L's tokens
(checked and reported). Timing: each method is compiled on the first input (compile time
reported), then every input is decoded --repeats times by every method, interleaved (the method
order rotates per repeat), `block_until_ready`; a method's walltime = sum over inputs of the median
over repeats. Samples differ between methods (temperature 1), so outputs have different lengths:
the comparison is per generated token (ms/token; speedup = baseline ms/token / method ms/token).

Cost model (where the wider target call eats the gain): t(R, T) = one target `extend` over R rows
of T tokens, d(R) = one draft T=1 step over R rows (speculative/bench/costs.py: jitted loops of
calls on a prefilled cache, interleaved rounds with t(1, 1), ratios per round, a noise verdict).
A SpecTr step costs about L d(K) + t(K, L+1) (+ selection and the cache copy), so the predicted
speedup is BE x t(1, 1) / (L d(K) + t(K, L+1)); on a TPU t(K, L+1) ~ t(1, L+1) ~ t(1, 1), on
this CPU t grows with K (L+1) (docs/design.md section 8).

Prints progress lines and finally the Markdown report; writes results.json and results.md to
--output_dir. SpecTr's Table 4 (LM1B, 97M target, 6M draft, temperature 1) is printed next to ours
where the paper reports it (K = 1 and K = 8).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
from pathlib import Path
import platform
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from speculative import drafters  # pylint: disable=wrong-import-position
from speculative import sampling as sampling_lib  # pylint: disable=wrong-import-position
from speculative.bench import costs as costs_lib  # pylint: disable=wrong-import-position
from speculative.bench import inputs as inputs_lib  # pylint: disable=wrong-import-position
from speculative.bench import noise as bench_noise
from speculative.bench import timing
from speculative.checkpoints import files  # pylint: disable=wrong-import-position
from speculative.data import tasks  # pylint: disable=wrong-import-position
from speculative.decode import loops as decoding  # pylint: disable=g-import-not-at-top,wrong-import-position
from speculative.jobs import gin_utils  # pylint: disable=wrong-import-position
from speculative.models import t5 as t5_lib  # pylint: disable=wrong-import-position
from speculative.spectr import decoding as spectr_decoding  # pylint: disable=wrong-import-position

# SpecTr (Sun et al. 2023) Table 4, LM1B, block efficiency at temperature 1 (the cells we compare with)
# (only K = 1 and K = 8 are quoted there; the other cells are left empty rather than guessed).
SPECTR_TABLE4 = {(1, 4): 2.21, (8, 4): 2.99, (1, 8): 2.33, (8, 8): 3.27}


def load_configs() -> tuple[t5_lib.T5Config, t5_lib.T5Config]:
  return tuple(
    gin_utils.load_macro(
      str(REPO / f'configs/models/embedded_{name}.gin'), f'EMBEDDED_{name.upper()}', t5_lib.T5Config
    )
    for name in ('target', 'draft')
  )


def build(
  config: t5_lib.T5Config, checkpoint: str, allow_random: bool, seed: int, what: str
) -> tuple[t5_lib.T5, Any, str]:
  """(model, f32 params, description): the benchmark's loader (random init only if allowed)."""
  return inputs_lib.build_model(
    config, checkpoint, allow_random_init=allow_random, seed=seed, what=what
  )


def load_inputs(num_examples: int, inputs_length: int) -> tuple[np.ndarray, list[str]]:
  """[N, inputs_length] int32 encoder inputs (test split, those that fit), and their sources."""
  vocab = tasks.get_vocabulary()
  rows, sources = [], []
  for english, _ in tasks.load_split('test'):
    ids = list(vocab.encode(tasks.make_inputs(english))) + [tasks.EOS_ID]
    if len(ids) > inputs_length:
      continue
    row = np.zeros(inputs_length, np.int32)
    row[: len(ids)] = ids
    rows.append(row)
    sources.append(english)
    if len(rows) == num_examples:
      break
  if not rows:
    raise ValueError('no test inputs fit --inputs_length')
  return np.stack(rows), sources


# ----------------------------------------------------------------------------------------------
# Cost model: t(R, T) and d(R).
# ----------------------------------------------------------------------------------------------

COST_POSITION = 16  # decoder position of the timed calls (mid-sentence)


def measure_costs(
  target,
  target_params,
  draft,
  draft_params,
  encoder_row: np.ndarray,
  *,
  ks,
  ls,
  max_length: int,
  repeats: int,
  min_seconds: float = 0.1,
) -> dict[str, Any]:
  """t(K, L+1), d(K) and t(1, 1) with the benchmark's cost model (speculative/bench/costs.py):
  per K, the K-row calls interleaved with the 1-row target step t(1, 1) in timing rounds, so the
  ratios c_K = d(K) / t(1, 1) and v = t(K, L+1) / t(1, 1) are medians of per-round ratios; those
  too noisy to predict from are listed in 'too_noisy'."""
  costs = {'target_ms': {}, 'draft_ms': {}, 'c': {}, 'v': {}, 'too_noisy': {}}
  t11 = []
  for k in ks:
    encoder = np.repeat(encoder_row[None], k, axis=0)
    reference = timing.extend_timer(
      target,
      target_params,
      encoder[:1],
      num_tokens=1,
      max_length=max_length,
      position=COST_POSITION,
    )
    cm = costs_lib.measure_extend_costs(
      target,
      target_params,
      encoder,
      max_length=max_length,
      position=COST_POSITION,
      verify_lengths=[length + 1 for length in ls],
      drafts={'draft': (draft, draft_params)},
      repeats=repeats,
      min_seconds=min_seconds,
      extra_timers={'target_1x1': reference},
      marginal_extra=['target_1x1'],
    )
    t11.append(_add_costs_at_k(costs, cm, k, ls))
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
  costs['too_noisy'].update(
    {
      name: reason
      for name, reason in noise.data['refused'].items()
      if name.startswith(('c(K=', f'v({k}x'))
    }
  )
  return t11_k


# ----------------------------------------------------------------------------------------------
# Decoding methods.
# ----------------------------------------------------------------------------------------------


def make_methods(target, target_params, draft, draft_params, ks, ls, max_new_tokens):
  sampling, values = sampling_lib.make_sampling(temperature=1.0)
  drafter = drafters.ModelDrafter(draft)
  common = dict(
    max_new_tokens=max_new_tokens, sampling=sampling, sampling_params=values, eos_id=tasks.EOS_ID
  )
  methods = {
    'baseline': dict(
      kind='baseline',
      K=None,
      L=None,
      fn=lambda enc, seed: decoding.autoregressive_decode(
        target, target_params, None, encoder_tokens=enc, rng=seed, **common
      ),
    )
  }
  for length in ls:
    methods[f'speculative L={length}'] = dict(
      kind='speculative',
      K=None,
      L=length,
      fn=(
        lambda enc, seed, length=length: decoding.speculative_decode(
          target,
          target_params,
          drafter,
          draft_params,
          None,
          gamma=length,
          encoder_tokens=enc,
          rng=seed,
          **common,
        )
      ),
    )
    for k in ks:
      methods[f'spectr K={k} L={length}'] = dict(
        kind='spectr',
        K=k,
        L=length,
        fn=(
          lambda enc, seed, k=k, length=length: spectr_decoding.spectr_decode(
            target,
            target_params,
            drafter,
            draft_params,
            None,
            num_drafts=k,
            draft_length=length,
            encoder_tokens=enc,
            rng=seed,
            **common,
          )
        ),
      )
  return methods


def time_methods(
  methods: dict[str, dict[str, Any]], encs, repeats: int
) -> tuple[dict[str, list[list[float]]], dict[str, list[Any]]]:
  """Compiles every method on the first input (compile_s recorded), then decodes every input
  `repeats` times by every method, interleaved (the order rotating per repeat); returns
  ({method: [input][repeat] seconds}, {method: [input] host results})."""
  for name, method in methods.items():
    start = time.perf_counter()
    jax.block_until_ready(method['fn'](encs[0], 0).tokens)
    first = time.perf_counter() - start
    warm, _ = timing.timed(lambda: method['fn'](encs[0], 0).tokens)  # noqa: B023
    method['compile_s'] = max(first - warm, 0.0)
    print(f'compiled {name}: {method["compile_s"]:.1f}s', flush=True)
  names = list(methods)
  times = {name: [[] for _ in encs] for name in names}
  outputs: dict[str, list[Any]] = {name: [None] * len(encs) for name in names}
  for repeat in range(repeats):
    order = names[repeat % len(names) :] + names[: repeat % len(names)]
    for i, enc in enumerate(encs):
      for name in order:
        start = time.perf_counter()
        result = methods[name]['fn'](enc, i)
        jax.block_until_ready(result.tokens)
        times[name][i].append(time.perf_counter() - start)
        outputs[name][i] = jax.tree.map(np.asarray, result)
    print(f'repeat {repeat + 1}/{repeats} done', flush=True)
  return times, outputs


def run(args) -> dict[str, Any]:
  target_config, draft_config = load_configs()
  target, target_params, target_source = build(
    target_config, args.target_checkpoint, args.allow_random_init, 0, 'target'
  )
  draft, draft_params, draft_source = build(
    draft_config, args.draft_checkpoint, args.allow_random_init, 1, 'draft'
  )
  inputs, sources = load_inputs(args.num_examples, args.inputs_length)
  print(
    f'target: {target_source}\ndraft: {draft_source}\ninputs: {len(inputs)} test sentences',
    flush=True,
  )
  methods = make_methods(
    target, target_params, draft, draft_params, args.ks, args.ls, args.max_new_tokens
  )
  encs = [jnp.asarray(row[None]) for row in inputs]

  times, outputs = time_methods(methods, encs, args.repeats)
  rows = [_method_row(name, method, times[name], outputs) for name, method in methods.items()]
  _add_relative_speeds(rows)

  # Cost model on a realistic cache: the first input, position 16.
  costs = measure_costs(
    target,
    target_params,
    draft,
    draft_params,
    inputs[0],
    ks=args.ks,
    ls=args.ls,
    repeats=args.cost_repeats,
    max_length=args.inputs_length + args.max_new_tokens + max(args.ls) + 1,
  )
  print('costs measured', flush=True)
  for row in rows:
    if row['kind'] == 'spectr':
      _add_prediction(row, costs)

  return dict(
    date=datetime.datetime.now().isoformat(timespec='seconds'),
    command=' '.join(['.venv/bin/python', 'scripts/bench_spectr.py'] + sys.argv[1:]),
    machine=dict(
      platform=platform.platform(),
      cpus=os.cpu_count(),
      jax=jax.__version__,
      load_average=list(os.getloadavg()),
    ),
    target=target_source,
    draft=draft_source,
    num_inputs=len(inputs),
    inputs_length=args.inputs_length,
    max_new_tokens=args.max_new_tokens,
    temperature=1.0,
    repeats=args.repeats,
    rows=rows,
    costs=costs,
    first_source=sources[0],
  )


def _method_row(
  name: str, method: dict[str, Any], times: list[list[float]], outputs: dict[str, list[Any]]
) -> dict[str, Any]:
  """A method's totals over the inputs: walltime (sum of per-input medians), tokens, calls,
  acceptance, and (SpecTr K=1) whether it matches speculative decoding."""
  walltime = sum(statistics.median(t) for t in times)
  results = outputs[name]
  total = lambda field: sum(getattr(r.metrics, field).sum() for r in results)  # noqa: E731
  tokens = int(sum(r.lengths.sum() for r in results))
  calls = int(total('target_calls'))
  row = dict(
    method=name,
    kind=method['kind'],
    K=method['K'],
    L=method['L'],
    walltime_s=walltime,
    generated_tokens=tokens,
    target_calls=calls,
    ms_per_token=1e3 * walltime / max(tokens, 1),
    block_efficiency=tokens / max(calls, 1),
    compile_s=method['compile_s'],
  )
  if method['kind'] != 'baseline':
    row['accepted'] = int(total('accepted'))
  if method['kind'] == 'speculative':
    row['alpha'] = float(total('alpha_sum')) / max(int(total('drafted')), 1)
  if method['kind'] == 'spectr':
    selections = int(total('selections'))
    row['alpha_k_drafts'] = float(total('alpha_sum')) / max(selections, 1)
    row['alpha_one_draft'] = float(total('single_alpha_sum')) / max(selections, 1)
    row['spectr_table4'] = SPECTR_TABLE4.get((method['K'], method['L']))
    if method['K'] == 1:
      reference = outputs[f'speculative L={method["L"]}']
      row['identical_to_speculative'] = all(
        np.array_equal(a.tokens, b.tokens) for a, b in zip(results, reference)
      )
  return row


def _add_relative_speeds(rows: list[dict[str, Any]]) -> None:
  """Speedup per token over the baseline, and (SpecTr) over K=1 at the same L."""
  base = next(r for r in rows if r['kind'] == 'baseline')
  for row in rows:
    row['speedup_vs_baseline'] = base['ms_per_token'] / row['ms_per_token']
    if row['kind'] == 'spectr':
      k1 = next(r for r in rows if r['kind'] == 'spectr' and r['K'] == 1 and r['L'] == row['L'])
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


def _fmt(value, digits=2):
  if value is None:
    return '—'
  if isinstance(value, bool):
    return 'yes' if value else 'NO'
  return f'{value:.{digits}f}'


def format_report(report: dict[str, Any]) -> str:
  lines = [
    '### SpecTr: K drafts per step (embedded pair, temperature 1, batch 1)',
    '',
    f'Command: `{report["command"]}` ({report["date"]}; {report["machine"]["cpus"]} CPUs, '
    f'load average at the end {report["machine"]["load_average"][0]:.1f}).',
    f'Target: {report["target"]}. Draft: {report["draft"]}. {report["num_inputs"]} test '
    f'sentences, up to {report["max_new_tokens"]} new tokens, median of {report["repeats"]} '
    'repeats. Block efficiency = generated tokens / target calls; SpecTr Table 4 = LM1B, 97M '
    'target / 6M draft (only the cells compared here).',
    '',
    '| method | K | L | block eff. | SpecTr Tab. 4 | accept. K drafts | accept. 1 draft | '
    'ms/token | speedup vs baseline | vs K=1 | step ms: measured / model | '
    'v = t(K, L+1)/t(1,1) | predicted speedup |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
  ]
  lines += [_table_row(row) for row in report['rows']]
  lines += _cost_lines(report['costs'])
  lines += _comparison_lines(report['rows'])
  return '\n'.join(lines) + '\n'


def _table_row(row: dict[str, Any]) -> str:
  return (
    '| '
    + ' | '.join(
      [
        row['method'],
        str(row['K'] or '—'),
        str(row['L'] or '—'),
        _fmt(row['block_efficiency']),
        _fmt(row.get('spectr_table4')),
        _fmt(row.get('alpha_k_drafts', row.get('alpha')), 3),
        _fmt(row.get('alpha_one_draft'), 3),
        _fmt(row['ms_per_token'], 1),
        _fmt(row['speedup_vs_baseline']),
        _fmt(row.get('speedup_vs_k1')),
        (
          f'{row["measured_step_ms"]:.1f} / {row["model_step_ms"]:.1f}'
          if 'model_step_ms' in row
          else '—'
        ),
        _fmt(row.get('v')),
        'too noisy to predict' if row.get('too_noisy') else _fmt(row.get('predicted_speedup')),
      ]
    )
    + ' |'
  )


def _cost_lines(costs: dict[str, Any]) -> list[str]:
  """The measured costs, the step model and the refused estimates."""
  lines = [
    '',
    f'Target single step t(1,1) = {costs["target_1x1_ms"]:.2f} ms; draft step d(K) ms: '
    + ', '.join(f'K={k}: {v:.2f}' for k, v in costs['draft_ms'].items())
    + '; target verify t(K, L+1) ms: '
    + ', '.join(f'{k}: {v:.2f}' for k, v in costs['target_ms'].items())
    + '.',
  ]
  lines.append(
    'Model step = L d(K) + t(K, L+1); measured step = walltime / target calls (it also '
    'holds prefill, selection, the draft catch-up and the K-way cache copy). '
    'Predicted speedup = block eff. / (L c_K + v) with c_K = d(K) / t(1,1) and '
    'v = t(K, L+1) / t(1,1), each the median of per-round ratios (interleaved rounds).'
  )
  for reason in costs.get('too_noisy', {}).values():
    lines.append(f'**Too noisy to predict:** {reason}.')
  return lines


def _comparison_lines(rows: list[dict[str, Any]]) -> list[str]:
  """Per L, each K relative to K=1; and whether K=1 matched speculative decoding."""
  lines = []
  for length in sorted({r['L'] for r in rows if r['kind'] == 'spectr'}):
    spectr_rows = sorted(
      (r for r in rows if r['kind'] == 'spectr' and r['L'] == length),
      key=lambda r: r['K'],
    )
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
      + ', '.join(f'L={r["L"]}: {_fmt(r["identical_to_speculative"])}' for r in identical)
      + '.'
    )
  return lines


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--target_checkpoint', default=str(REPO / 'models/embedded/target.msgpack'))
  parser.add_argument('--draft_checkpoint', default=str(REPO / 'models/embedded/draft.msgpack'))
  parser.add_argument('--num_examples', type=int, default=20)
  parser.add_argument('--inputs_length', type=int, default=64)
  parser.add_argument('--max_new_tokens', type=int, default=64)
  parser.add_argument('--ks', type=int, nargs='+', default=[1, 2, 4, 8])
  parser.add_argument('--ls', type=int, nargs='+', default=[4, 8])
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--cost_repeats', type=int, default=5)
  parser.add_argument('--allow_random_init', action='store_true')
  parser.add_argument('--output_dir', default=str(REPO / 'outputs/bench_spectr'))
  parser.add_argument(
    '--quick',
    action='store_true',
    help='smoke run: 4 inputs, 16 new tokens, K 1 2, L 4, 1 repeat, random init '
    'if a checkpoint is missing, output in outputs/bench_spectr_quick',
  )
  args = parser.parse_args(argv)
  if args.quick:
    args.num_examples, args.max_new_tokens, args.ks, args.ls = 4, 16, [1, 2], [4]
    args.repeats, args.cost_repeats, args.allow_random_init = 1, bench_noise.MIN_ROUNDS, True
    args.output_dir = str(REPO / 'outputs/bench_spectr_quick')
  if 1 not in args.ks:
    raise ValueError('--ks must include 1 (the K=1 reference)')
  report = run(args)
  os.makedirs(args.output_dir, exist_ok=True)
  text = format_report(report)
  files.write_atomic(
    os.path.join(args.output_dir, 'results.json'), json.dumps(report, indent=2) + '\n'
  )
  files.write_atomic(os.path.join(args.output_dir, 'results.md'), text)
  print(text)


if __name__ == '__main__':
  main()
