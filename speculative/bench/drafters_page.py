"""Draft sources and knobs on the embedded pair: alpha per drafter (paper Table 3), alpha vs
lenience (Table 5), and walltime of adaptive gamma vs the best fixed gamma (Section 3.5).

  python -m speculative.bench.drafters_page --output_dir=docs/drafters

(repository root, on a quiet CPU: roughly 30-45 minutes on 2 cores with the defaults, most of it
compiling one decode loop per (drafter, gamma) and the batch-1 walltime passes; the README gives the
options of docs/drafters/). Smoke run (a few sentences, two gammas, one repeat; random weights if a
checkpoint is missing):

  python -m speculative.bench.drafters_page --quick --allow_random_init \\
      --output_dir=/tmp/bench_drafters

What it measures (the first `--num_examples` sentences of a LibreOffice En-De split, inputs longer
than `--inputs_length` skipped; greedy = temperature 0, sampling = temperature 1, top-k off):
  1. Table 3: for each drafter of the drafter registry named in `--drafters` -- the draft model,
     unigram and bigram tables estimated on the train split's German side (c ~ 0), prompt lookup
     alone (copying n-grams from the source sentence and the generated prefix) and prompt lookup
     with the draft model as fallback -- alpha (mean of sum_x min(p, q) over drafted positions),
     the empirical acceptance rate, tokens per target call and drafted tokens per step, at gamma =
     `--gamma`, batch `--batch_size`.
  2. Table 5: alpha, acceptance, tokens per call and BLEU of the draft model drafter for lenience
     l in `--lenience` (l < 1 is APPROXIMATE: argmax form under greedy, sampling form at T=1).
  3. Walltime at batch 1 (bench/drafters_walltime.py): the baseline, the draft model at each fixed
     gamma in `--gammas`, and adaptive gamma with the static maximum `--max_gamma`.

Prints three markdown tables; writes OUTPUT_DIR/drafters.json (every number, the command, the
machine) and OUTPUT_DIR/drafters.md (the tables, bench/drafters_tables.py), which the results page
includes.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from typing import Sequence

import jax
import jax.numpy as jnp

from speculative import drafters as drafters_lib
from speculative import sampling as sampling_lib
from speculative.bench import drafters_tables
from speculative.bench import drafters_walltime
from speculative.bench import machine as machine_lib
from speculative.bench import methods as methods_lib
from speculative.bench import pages
from speculative.bench import sweep
from speculative.data import metrics as metrics_lib
from speculative.data import tasks
from speculative.data import vocabulary as vocabulary_lib
from speculative.decode import batching
from speculative.decode import modes

DRAFTER_NAMES = ('model', 'unigram', 'bigram', 'prompt_lookup', 'prompt_lookup+model')
PARTS = ('alpha', 'lenience', 'walltime')
MODULE = 'speculative.bench.drafters_page'
# The options recorded as they are in the report's setup (the tables name them).
SETUP_OPTIONS = (
  'split',
  'inputs_length',
  'max_new_tokens',
  'gamma',
  'batch_size',
  'repeats',
  'seed',
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  quick = 'smoke run: 8 sentences, gammas 2,4, max_gamma 4, one threshold, 3 walltime sentences'
  pages.add_pair_args(parser, num_examples=100, output_dir='outputs/bench_drafters', quick=quick)
  parser.add_argument('--gamma', type=int, default=4, help='gamma of the alpha tables')
  parser.add_argument('--batch_size', type=int, default=10, help='batch of the alpha tables')
  parser.add_argument('--drafters', default=','.join(DRAFTER_NAMES))
  parser.add_argument('--ngram_sizes', default='3,2,1', help='prompt lookup n-gram sizes')
  parser.add_argument('--lenience', default='1,0.5,0.3,0.1')
  parser.add_argument('--walltime_examples', type=int, default=20)
  parser.add_argument('--gammas', default='1,2,3,4,5,6,7,8', help='fixed gammas (walltime)')
  parser.add_argument('--max_gamma', type=int, default=8, help='static maximum of adaptive gamma')
  parser.add_argument(
    '--stop_below', default='0.5,0.7,0.9', help='confidence thresholds of the adaptive stop rule'
  )
  parser.add_argument('--walltime_temperature', type=float, default=0.0)
  parser.add_argument('--skip', default='', help=f'comma list of parts to skip: {",".join(PARTS)}')
  args = parser.parse_args(argv)
  if args.quick:
    args.num_examples, args.batch_size, args.walltime_examples = 8, 4, 3
    args.gammas, args.max_gamma, args.stop_below, args.repeats = '2,4', 4, '0.5', 1
    args.max_new_tokens = min(args.max_new_tokens, 24)
  unknown = set(pages.values(args.skip, str)) - set(PARTS)
  if unknown:
    parser.error(f'--skip: unknown parts {sorted(unknown)} (known: {", ".join(PARTS)})')
  return args


# ----------------------------------------------------------------------------------------------
# Alpha (Tables 3 and 5).
# ----------------------------------------------------------------------------------------------


def decode_all(
  pair: pages.Pair,
  drafter: Any,
  draft_params: Any,
  examples,
  args: argparse.Namespace,
  *,
  temperature: float,
  lenience: float | None = None,
) -> tuple[dict[str, Any], list[list[int]]]:
  """Speculative decoding of every example in batches of --batch_size at gamma --gamma; returns
  (summed counters with alpha, acceptance, tokens per call, drafted per step; each example's
  generated tokens)."""
  sampling, sampling_params = sampling_lib.make_sampling(temperature)
  decode = modes.decode_fns(
    pair.target,
    pair.target_params,
    drafter,
    draft_params,
    sampling_params=sampling_params,
    lenience=lenience,
    max_new_tokens=args.max_new_tokens,
    sampling=sampling,
    eos_id=tasks.EOS_ID,
    gamma=args.gamma,
  )[modes.SPECULATIVE]
  method = methods_lib.Method('alpha', methods_lib.SPECULATIVE, decode)
  batches = batching.batches(examples, args.batch_size, args.inputs_length)
  for index, (_, encoder_tokens) in enumerate(batches):
    rng = jax.random.fold_in(jax.random.PRNGKey(args.seed), index)
    method.outputs.append(
      methods_lib.decode_outputs(method.kind, decode(jnp.asarray(encoder_tokens), rng))
    )
  totals = {
    key: sweep.sum_rows(method, batches, key)
    for key in ('target_calls', 'drafted', 'accepted', 'alpha_sum', 'lengths')
  }
  drafted, calls = max(totals['drafted'], 1), max(totals['target_calls'], 1)
  row = dict(
    alpha=totals['alpha_sum'] / drafted,
    acceptance=totals['accepted'] / drafted,
    tokens_per_call=totals['lengths'] / calls,
    drafted_per_step=totals['drafted'] / calls,
    generated=int(totals['lengths']),
    **{key: totals[key] for key in ('target_calls', 'drafted', 'accepted', 'alpha_sum')},
  )
  outputs = [
    out['tokens'][r, : int(out['lengths'][r])].tolist()
    for (chunk, _), out in zip(batches, method.outputs)
    for r in range(len(chunk))
  ]
  return row, outputs


def bleu(outputs: Sequence[Sequence[int]], examples) -> float:
  """Corpus BLEU of the decoded `outputs` against the examples' references."""
  vocabulary = vocabulary_lib.load()
  predictions = [vocabulary.decode([t for t in out if t != tasks.EOS_ID]) for out in outputs]
  return metrics_lib.bleu([e.reference for e in examples], predictions)['bleu']


def alpha_part(pair: pages.Pair, examples, args) -> list[dict[str, Any]]:
  """Table 3: alpha, acceptance and tokens per call of every drafter, greedy and sampled."""
  print('== alpha per drafter', flush=True)
  draft_name = pair.names['draft']
  labels = {
    'model': draft_name,
    'unigram': 'unigram (train split)',
    'bigram': 'bigram (train split)',
    'prompt_lookup': 'prompt lookup',
    'prompt_lookup+model': f'prompt lookup + {draft_name}',
  }
  built = methods_lib.build_drafters(
    pages.values(args.drafters, str),
    target=pair.target,
    target_params=pair.target_params,
    draft=pair.draft,
    draft_params=pair.draft_params,
    warnings=[],
    ngram_sizes=tuple(pages.values(args.ngram_sizes, int)),
  )
  rows = []
  for name, (drafter, params) in built.items():
    for temperature in (0.0, 1.0):
      row, _ = decode_all(pair, drafter, params, examples, args, temperature=temperature)
      label = labels.get(name, name)
      rows.append(dict(drafter=name, drafter_label=label, temperature=temperature, **row))
      print(
        f'  {name} {drafters_tables.sampling_name(temperature)}: alpha {row["alpha"]:.3f}, acceptance '
        f'{row["acceptance"]:.3f}, {row["tokens_per_call"]:.2f} tokens/call',
        flush=True,
      )
  return rows


def lenience_part(pair: pages.Pair, examples, args) -> dict[str, list[dict[str, Any]]]:
  """Table 5: the draft model drafter at every lenience, greedy and sampled, with BLEU."""
  print('== alpha vs lenience', flush=True)
  out = {}
  drafter = drafters_lib.ModelDrafter(pair.draft)
  for temperature in (0.0, 1.0):
    rows = []
    for lenience in pages.values(args.lenience, float):
      row, outputs = decode_all(
        pair, drafter, pair.draft_params, examples, args, temperature=temperature, lenience=lenience
      )
      row['bleu'] = bleu(outputs, examples)
      rows.append(dict(lenience=lenience, **row))
      print(
        f'  {drafters_tables.sampling_name(temperature)} l={lenience:g}: alpha {row["alpha"]:.3f}, '
        f'{row["tokens_per_call"]:.2f} tokens/call, BLEU {row["bleu"]:.1f}',
        flush=True,
      )
    out[str(temperature)] = rows
  return out


# ----------------------------------------------------------------------------------------------
# Main.
# ----------------------------------------------------------------------------------------------


def setup_record(args, argv, pair: pages.Pair, num_examples: int, skipped: int) -> dict[str, Any]:
  """The report's `setup`: the command, machine and time (pages.record), the models and every
  option that shapes the numbers."""
  return dict(
    **pages.record(MODULE, argv),
    target_name=pair.names['target'],
    draft_name=pair.names['draft'],
    target_checkpoint=pair.descriptions['target'],
    draft_checkpoint=pair.descriptions['draft'],
    num_examples=num_examples,
    skipped_long_inputs=skipped,
    lenience=pages.values(args.lenience, float),
    **{name: getattr(args, name) for name in SETUP_OPTIONS},
  )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  """Runs the parts not in --skip; writes drafters.json and drafters.md; returns the report."""
  args = parse_args(argv)
  skip = set(pages.values(args.skip, str))
  pair, examples, skipped = pages.load_pair_and_examples(args)
  report: dict[str, Any] = dict(setup=setup_record(args, argv, pair, len(examples), skipped))
  if 'alpha' not in skip:
    report['alpha'] = alpha_part(pair, examples, args)
  if 'lenience' not in skip:
    report['lenience'] = lenience_part(pair, examples, args)
  if 'walltime' not in skip:
    report['costs'], report['walltime'] = drafters_walltime.walltime_part(pair, examples, args)
  busy = machine_lib.busy_warning(report['setup']['machine'])
  report['setup']['warnings'] = [busy] if busy else []
  text = drafters_tables.markdown(report)
  pages.write_page(args.output_dir, {'drafters.json': report, 'drafters.md': text})
  print()
  print(text)
  return report


if __name__ == '__main__':
  pages.command_line(main, sys.argv[1:])
