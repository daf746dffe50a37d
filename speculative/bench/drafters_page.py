"""Draft sources and knobs on the embedded pair: alpha per drafter (paper Table 3), alpha vs
lenience (Table 5), and walltime of adaptive gamma vs the best fixed gamma (Section 3.5).

  python -m speculative.bench.drafters_page --output_dir=docs/drafters

(repository root, quiet CPU: 30-45 minutes on 2 cores with the defaults, mostly compiling one
decode loop per (drafter, gamma); docs/benchmark.md gives docs/drafters/'s options). Smoke run (one
repeat; random weights for a missing checkpoint); `--skip alpha,lenience` times the walltime only:

  python -m speculative.bench.drafters_page --quick --allow_random_init \\
      --output_dir=/tmp/bench_drafters

On the first --num_examples sentences that fit (greedy = temperature 0, sampling = 1, top-k off):
  1. alpha (mean of sum_x min(p, q) over drafted positions), acceptance rate, tokens per target
     call and drafted tokens per step of each registry drafter in --drafters, at --gamma and
     --batch_size.
  2. The same and BLEU of the draft model per lenience l in --lenience (l < 1 is APPROXIMATE).
  3. Walltime at batch 1 (sweep.time_rows): the baseline, the draft model at each gamma in
     --gammas, and adaptive gamma up to --max_gamma: the confidence stop rule (each --stop_below)
     with the static and the adaptive verify width, and the acceptance-predicted rule
     (AdaptiveGammaDrafter, c and v(T) measured on the first sentence).

Writes OUTPUT_DIR/drafters.json (every number, the command, the machine) and drafters.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from typing import Sequence

import jax
import jax.numpy as jnp

from speculative import drafters as drafters_lib
from speculative.bench import markdown as markdown_lib
from speculative.bench import methods
from speculative.bench import sweep
from speculative.data import metrics as metrics_lib
from speculative.data import tasks
from speculative.data import vocabulary as vocabulary_lib
from speculative.decode import batching

DRAFTER_NAMES = ('model', 'unigram', 'bigram', 'prompt_lookup', 'prompt_lookup+model')
PARTS = ('alpha', 'lenience', 'walltime')
MODULE = 'speculative.bench.drafters_page'
# The options recorded as they are in the report's setup (the tables name them).
SETUP_OPTIONS = 'split inputs_length max_new_tokens gamma batch_size repeats seed'.split()


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  raw = argparse.RawDescriptionHelpFormatter
  parser = argparse.ArgumentParser(
    prog=f'python -m {MODULE}', description=__doc__.split('\n\n')[0], formatter_class=raw
  )
  quick = 'smoke run: 8 sentences, gammas 2,4, max_gamma 4, one threshold, 3 walltime sentences'
  methods.add_pair_args(parser, num_examples=100, output_dir='outputs/bench_drafters', quick=quick)
  parser.add_argument('--gamma', type=int, default=4, help='gamma of the alpha tables')
  parser.add_argument('--batch_size', type=int, default=10, help='batch of the alpha tables')
  parser.add_argument('--drafters', default=','.join(DRAFTER_NAMES))
  parser.add_argument('--ngram_sizes', default='3,2,1', help='prompt lookup n-gram sizes')
  parser.add_argument('--lenience', default='1,0.5,0.3,0.1')
  parser.add_argument('--walltime_examples', type=int, default=20)
  parser.add_argument('--gammas', default='1,2,3,4,5,6,7,8', help='fixed gammas (walltime)')
  parser.add_argument('--max_gamma', type=int, default=8, help='static maximum of adaptive gamma')
  stop_help = 'confidence thresholds of the adaptive stop rule'
  parser.add_argument('--stop_below', default='0.5,0.7,0.9', help=stop_help)
  parser.add_argument('--walltime_temperature', type=float, default=0.0)
  parser.add_argument('--skip', default='', help=f'comma list of parts to skip: {",".join(PARTS)}')
  presets = dict(num_examples=8, batch_size=4, walltime_examples=3, gammas='2,4', max_gamma=4)
  args = methods.parse_page_args(
    parser,
    argv,
    dict(presets, stop_below='0.5', repeats=1, max_new_tokens=24),
    positive=('gamma', 'batch_size', 'walltime_examples', 'max_gamma'),
    lists=dict(gammas=int, lenience=float, stop_below=float, ngram_sizes=int),
  )
  if min(methods.values(args.gammas, int), default=0) < 1:
    parser.error(f'--gammas must be integers >= 1, got {args.gammas!r}')
  if not all(0 < v <= 1 for v in methods.values(args.lenience, float)):
    parser.error(f'--lenience values must be in (0, 1], got {args.lenience!r}')
  unknown = set(methods.values(args.skip, str)) - set(PARTS)
  if unknown:
    parser.error(f'--skip: unknown parts {sorted(unknown)} (known: {", ".join(PARTS)})')
  return args


def sampling_name(temperature: float) -> str:
  return 'argmax' if temperature == 0 else f'T={temperature:g}'


def decode_all(
  pair: methods.Pair, drafter: Any, params: Any, examples, args, temperature: float, lenience=None
) -> dict[str, Any]:
  """Summed counters, alpha, acceptance (and BLEU with a lenience) at --gamma, --batch_size."""
  options = dict(draft_params=params, lenience=lenience, gamma=args.gamma)
  decode = methods.pair_decode_fn(pair, args.max_new_tokens, temperature, drafter, **options)
  method = methods.Method('alpha', methods.SPECULATIVE, decode)
  batches = batching.batches(examples, args.batch_size, args.inputs_length)
  for index, (_, encoder_tokens) in enumerate(batches):
    rng = jax.random.fold_in(jax.random.PRNGKey(args.seed), index)
    result = decode(jnp.asarray(encoder_tokens), rng)
    method.outputs.append(methods.decode_outputs(method.kind, result))
  keys = ('target_calls', 'drafted', 'accepted', 'alpha_sum', 'lengths')
  totals = {key: sweep.sum_rows(method, batches, key) for key in keys}
  drafted, calls = max(totals['drafted'], 1), max(totals['target_calls'], 1)
  row = dict(alpha=totals['alpha_sum'] / drafted, acceptance=totals['accepted'] / drafted)
  row.update(tokens_per_call=totals['lengths'] / calls, drafted_per_step=totals['drafted'] / calls)
  row.update(generated=int(totals.pop('lengths')), **totals)
  if lenience is not None:
    vocabulary = vocabulary_lib.load()
    predictions = [
      vocabulary.decode(
        [t for t in out['tokens'][r, : int(out['lengths'][r])].tolist() if t != tasks.EOS_ID]
      )
      for (chunk, _), out in zip(batches, method.outputs)
      for r in range(len(chunk))
    ]
    row['bleu'] = metrics_lib.bleu([e.reference for e in examples], predictions)['bleu']
  return row


def alpha_part(pair: methods.Pair, examples, args) -> list[dict[str, Any]]:
  """Table 3: alpha, acceptance and tokens per call of every drafter, greedy and sampled."""
  print('== alpha per drafter', flush=True)
  labels = dict(model=pair.names['draft'], unigram='unigram (train split)')
  labels.update(bigram='bigram (train split)', prompt_lookup='prompt lookup')
  labels['prompt_lookup+model'] = f'prompt lookup + {pair.names["draft"]}'
  ngram_sizes = tuple(methods.values(args.ngram_sizes, int))
  names = methods.values(args.drafters, str)
  built = methods.build_drafters(names, pair, [], ngram_sizes=ngram_sizes)
  rows = []
  for name, (drafter, params) in built.items():
    for temperature in (0.0, 1.0):
      row = decode_all(pair, drafter, params, examples, args, temperature)
      label = labels.get(name, name)
      rows.append(dict(drafter=name, drafter_label=label, temperature=temperature, **row))
      print(
        f'  {name} {sampling_name(temperature)}: alpha {row["alpha"]:.3f}, acceptance '
        f'{row["acceptance"]:.3f}, {row["tokens_per_call"]:.2f} tokens/call',
        flush=True,
      )
  return rows


def lenience_part(pair: methods.Pair, examples, args) -> dict[str, list[dict[str, Any]]]:
  """Table 5: the draft model drafter at every lenience, greedy and sampled, with BLEU."""
  print('== alpha vs lenience', flush=True)
  out, drafter = {}, drafters_lib.ModelDrafter(pair.draft)
  for temperature in (0.0, 1.0):
    out[str(temperature)] = []
    for lenience in methods.values(args.lenience, float):
      row = decode_all(pair, drafter, pair.draft_params, examples, args, temperature, lenience)
      out[str(temperature)].append(dict(lenience=lenience, **row))
      print(
        f'  {sampling_name(temperature)} l={lenience:g}: alpha {row["alpha"]:.3f}, '
        f'{row["tokens_per_call"]:.2f} tokens/call, BLEU {row["bleu"]:.1f}',
        flush=True,
      )
  return out


def walltime_methods(pair: methods.Pair, costs: dict[str, Any], args) -> list[methods.Method]:
  """The timed methods (`drafter_obj` holds each one's description)."""

  def method(name, info, drafter=None, gamma=None, adaptive_verify=False):
    options = dict(gamma=gamma, adaptive_verify=adaptive_verify)
    decode = methods.pair_decode_fn(
      pair, args.max_new_tokens, args.walltime_temperature, drafter, **options
    )
    kind = methods.BASELINE if drafter is None else methods.SPECULATIVE
    return methods.Method(name, kind, decode, gamma=gamma, drafter_obj=info)

  out = [method('baseline', dict(kind='baseline'))]
  for gamma in methods.values(args.gammas, int):
    out.append(
      method(f'fixed gamma={gamma}', dict(kind='fixed'), methods.model_drafter(pair), gamma)
    )
  max_gamma = args.max_gamma
  for threshold in methods.values(args.stop_below, float):
    for adaptive in (False, True):
      info = dict(kind='confidence', stop_below=threshold, adaptive_verify=adaptive)
      name = f'stop_below={threshold}, max gamma={max_gamma}'
      name += ', adaptive verify' if adaptive else ''
      drafter = methods.model_drafter(pair, stop_below=threshold)
      out.append(method(name, info, drafter, max_gamma, adaptive))
  rule = drafters_lib.AdaptiveGammaDrafter(
    methods.model_drafter(pair),
    draft_cost=round(costs['c'], 4),
    verify_costs=tuple(round(costs['v'][t], 3) for t in range(1, max_gamma + 2)),
  )
  info = dict(kind='acceptance_rule', adaptive_verify=True, draft_cost=rule.draft_cost)
  info['verify_costs'] = rule.verify_costs
  name = f'acceptance rule, max gamma={max_gamma}, adaptive verify'
  return out + [method(name, info, rule, max_gamma, True)]


def walltime_part(pair: methods.Pair, examples, args) -> tuple[dict[str, Any], dict[str, Any]]:
  """(costs at batch 1, every method's batch-1 walltime and speedups)."""
  print('== costs', flush=True)
  cm = methods.extend_costs(
    pair,
    batching.pad_batch(examples[:1], 1, args.inputs_length),  # [1, S]
    max_length=methods.COST_POSITION + args.max_gamma + 2,
    verify_lengths=range(2, args.max_gamma + 2),
    repeats=max(3, args.repeats),
  )
  draft = cm['drafters']['model']
  costs = dict(target_step_s=cm['target_step_s'], draft_step_s=draft['draft_step_s'], c=draft['c'])
  costs.update(v={int(t): v for t, v in cm['v'].items()}, too_noisy=cm['noise']['refused'])
  print(
    f'  c = {costs["c"]:.3f}, v = { ({k: round(v, 2) for k, v in costs["v"].items()}) }', flush=True
  )
  print('== walltime (batch 1)', flush=True)
  examples = examples[: args.walltime_examples]
  timed = walltime_methods(pair, costs, args)
  _, measured = sweep.time_rows(timed, examples, args, args.walltime_temperature)
  rows = []
  for m in timed:
    r = measured[m.name]
    calls = max(r['target_calls'], 1)
    row = dict(method=m.name, gamma=m.gamma, **m.drafter_obj, decode_s=r['walltime_s'])
    row.update(compile_s=r['compile_s'], ms_per_token=r['ms_per_token'])
    row.update(tokens_per_call=r['generated_tokens'] / calls)
    row['drafted_per_step'] = r.get('drafted_tokens', 0) / calls
    rows.append(dict(row, generated=r['generated_tokens'], target_calls=r['target_calls']))
    print(
      f'  {m.name}: {r["ms_per_token"]:.2f} ms/token, {row["tokens_per_call"]:.2f} '
      f'tokens/call, compile {r["compile_s"]:.1f} s',
      flush=True,
    )
  fixed = [r for r in rows if r['kind'] == 'fixed']
  best = min(fixed, key=lambda r: r['decode_s']) if fixed else None
  for row in rows:
    row['speedup'] = rows[0]['decode_s'] / row['decode_s']
    row['vs_best_fixed'] = best['decode_s'] / row['decode_s'] if best else None
  walltime = dict(temperature=args.walltime_temperature, examples=len(examples), rows=rows)
  return costs, dict(walltime, best_fixed=best['method'] if best else None)


def _alpha_markdown(report: dict[str, Any]) -> list[str]:
  """Alpha per drafter (paper Table 3 layout)."""
  setup, column = report['setup'], markdown_lib.column
  columns = [
    column('M_p', lambda r: setup['target_name']),
    column('M_q', 'drafter_label'),
    column('Sampling', lambda r: sampling_name(r['temperature'])),
    column('alpha', 'alpha', 3),
    column('acceptance rate', 'acceptance', 3),
    column('tokens / target call', 'tokens_per_call'),
    column('drafted / step', 'drafted_per_step'),
  ]
  return markdown_lib.section(
    f'Alpha per drafter (paper Table 3 layout; gamma={setup["gamma"]}, '
    f'{setup["num_examples"]} {setup["split"]} sentences)',
    markdown_lib.columns_table(columns, report['alpha']),
    'alpha = mean over drafted positions of sum_x min(p(x), q(x)); deterministic '
    'drafters (prompt lookup) have one-hot q, so there alpha = P(accept). Prompt lookup '
    'proposes only where an n-gram matches (drafted / step < gamma).',
    level=3,
  )


def _lenience_markdown(report: dict[str, Any]) -> list[str]:
  """Alpha, tokens per call and BLEU vs lenience (paper Table 5 layout)."""
  setup, fmt = report['setup'], markdown_lib.fmt
  target_name, draft_name = setup['target_name'], setup['draft_name']
  header = [f'l={v:g}' for v in setup['lenience']]
  alpha_rows, metric_rows = [], []
  for temperature, rows in report['lenience'].items():
    name = sampling_name(float(temperature))
    alpha_rows.append([target_name, draft_name, name] + [fmt(r['alpha'], 3) for r in rows])
    for metric, digits in (('tokens_per_call', 2), ('bleu', 1)):
      metric_rows.append([name, metric] + [fmt(r[metric], digits) for r in rows])
  return markdown_lib.section(
    f'Alpha vs lenience (paper Table 5 layout; M_q = {draft_name}, gamma={setup["gamma"]})',
    markdown_lib.table(['M_p', 'M_q', 'Sampling'] + header, alpha_rows),
    'Tokens per target call and BLEU (l < 1 is APPROXIMATE: the output is no longer '
    "the target's):",
    markdown_lib.table(['Sampling', 'metric'] + header, metric_rows),
    'Greedy lenience accepts a draft token x iff p(x) >= l max p (target softmax at '
    'temperature 1); sampling lenience accepts iff r l q(x) <= p(x), so no token is '
    'emitted with probability above p(x)/l.',
    level=3,
  )


def _walltime_markdown(report: dict[str, Any]) -> list[str]:
  """Walltime of adaptive vs fixed gamma, with the measured costs."""
  setup, wall, costs = report['setup'], report['walltime'], report['costs']
  column, v_values = markdown_lib.column, sorted(costs['v'].items(), key=lambda kv: int(kv[0]))
  columns = [
    column('method', 'method'),
    column('ms / token', 'ms_per_token'),
    column('speedup vs baseline', 'speedup', 2, 'x'),
    column('vs best fixed gamma', 'vs_best_fixed', 2, 'x'),
    column('tokens / call', 'tokens_per_call'),
    column('drafted / step', 'drafted_per_step'),
    column('compile s', 'compile_s', 1),
  ]
  return markdown_lib.section(
    f'Walltime: adaptive vs fixed gamma (batch 1, {sampling_name(wall["temperature"])}'
    f', {wall["examples"]} sentences, median of {setup["repeats"]})',
    f'Measured: target step {1000 * costs["target_step_s"]:.2f} ms, draft step '
    f'{1000 * costs["draft_step_s"]:.2f} ms (c = {costs["c"]:.3f}), v(T) = '
    + ', '.join(f'{v:.2f}' for _, v in v_values)
    + f' for T = 1..{len(v_values)}'
    + ''.join(
      f'. **Too noisy** (the acceptance rule below uses it anyway): {reason}'
      for reason in costs.get('too_noisy', {}).values()
    ),
    markdown_lib.columns_table(columns, wall['rows']),
    f'Best fixed gamma: {wall["best_fixed"]}. Adaptive gamma is exact (same tokens as '
    'the baseline under argmax). With the static verify width it only saves draft calls; '
    '"adaptive verify" also shrinks the target call to 1 + drafted tokens (lax.switch '
    'over gamma+1 compiled widths).',
    level=3,
  )


def markdown(report: dict[str, Any]) -> str:
  """The page (docs/drafters/drafters.md): the tables of the parts that ran, then the command."""
  writers = dict(alpha=_alpha_markdown, lenience=_lenience_markdown, walltime=_walltime_markdown)
  lines = [line for part, write in writers.items() if part in report for line in write(report)]
  setup = report['setup']
  lines.append(
    f'Command: `{setup["command"]}` ({setup["generated_at"]}); machine: '
    f'{markdown_lib.machine_line(setup["machine"])}; target weights: '
    f'{setup["target_checkpoint"]}; draft weights: {setup["draft_checkpoint"]}.'
  )
  lines += [f'**Warning:** {w}' for w in setup.get('warnings', [])]
  return '\n'.join(lines) + '\n'


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the parts not in --skip; writes drafters.json and drafters.md; returns the report."""
  args = parse_args(argv)
  skip = set(methods.values(args.skip, str))
  pair, examples, skipped = methods.load_pair_and_examples(args)
  setup = dict(markdown_lib.record(MODULE, argv), target_name=pair.names['target'])
  setup.update(draft_name=pair.names['draft'], target_checkpoint=pair.descriptions['target'])
  setup.update(draft_checkpoint=pair.descriptions['draft'], num_examples=len(examples))
  setup.update(skipped_long_inputs=skipped, lenience=methods.values(args.lenience, float))
  report: dict[str, Any] = dict(setup={**setup, **{k: getattr(args, k) for k in SETUP_OPTIONS}})
  if 'alpha' not in skip:
    report['alpha'] = alpha_part(pair, examples, args)
  if 'lenience' not in skip:
    report['lenience'] = lenience_part(pair, examples, args)
  if 'walltime' not in skip:
    report['costs'], report['walltime'] = walltime_part(pair, examples, args)
  report['setup']['warnings'] = markdown_lib.busy_warnings(report['setup']['machine'])
  text = markdown(report)
  markdown_lib.write_page(args.output_dir, {'drafters.json': report, 'drafters.md': text})
  print()
  print(text)
  return report


if __name__ == '__main__':
  methods.command_line(main, sys.argv[1:])
