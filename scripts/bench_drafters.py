"""Draft sources and knobs on the embedded pair: alpha per drafter (paper Table 3), alpha vs
lenience (Table 5), and walltime of adaptive gamma vs the best fixed gamma (Section 3.5).

Command (repository root; run it when the CPU is quiet -- roughly 30-45 minutes on 2 cores with the
defaults, most of it compiling one decode loop per (drafter, gamma) and the batch-1 walltime
passes; 7 minutes with the options the README gives for docs/drafters/):

  .venv/bin/python scripts/bench_drafters.py --output_dir=docs/drafters

Smoke run (a few sentences, two gammas, one repeat; random weights if a checkpoint is missing):

  .venv/bin/python scripts/bench_drafters.py --quick --allow_random_init \
      --output_dir=/tmp/bench_drafters

What it measures (the first `--num_examples` test sentences of the LibreOffice En-De task, inputs
longer than `--inputs_length` skipped; greedy = temperature 0, sampling = temperature 1, top-k off):
  1. Table 3: for each drafter -- the draft model, unigram and bigram tables estimated on the train
     split's German side (c ~ 0), prompt lookup alone (copying n-grams from the source sentence and
     the generated prefix) and prompt lookup with the draft model as fallback -- alpha (mean of
     sum_x min(p, q) over drafted positions), the empirical acceptance rate, tokens per target call
     and drafted tokens per step, at gamma = `--gamma`, batch `--batch_size`.
  2. Table 5: alpha, acceptance, tokens per call and BLEU of the draft model drafter for lenience
     l in `--lenience` (l < 1 is APPROXIMATE: argmax form under greedy, sampling form at T=1).
  3. Walltime at batch 1, greedy: the baseline, the draft model at each fixed gamma in `--gammas`,
     and adaptive gamma with the static maximum `--max_gamma`: the confidence stop rule
     (ModelDrafter(stop_below=s) for s in `--stop_below`) with the static verify width and with
     `adaptive_verify`, and the acceptance-predicted rule (AdaptiveGammaDrafter with the measured
     c and v(T), measured by speculative/bench/costs.py). Warm runs (compile timed separately),
     block_until_ready, median of `--repeats`.

Prints three markdown tables; writes OUTPUT_DIR/drafters.json (every number, the command, the
machine) and OUTPUT_DIR/drafters.md (the tables, ready to paste into a results page).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
from pathlib import Path
import platform
import statistics
import subprocess
import sys
import time
from typing import Any
from typing import Callable
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from speculative import checkpoints  # pylint: disable=wrong-import-position
from speculative import drafters as drafters_lib  # pylint: disable=wrong-import-position
from speculative import sampling as sampling_lib  # pylint: disable=wrong-import-position
from speculative.bench import costs as costs_lib  # pylint: disable=wrong-import-position
from speculative.checkpoints import files  # pylint: disable=wrong-import-position
from speculative.data import metrics  # pylint: disable=wrong-import-position
from speculative.data import tasks  # pylint: disable=wrong-import-position
from speculative.decode import loops as decoding  # pylint: disable=g-import-not-at-top,wrong-import-position
from speculative.models import t5 as t5_lib  # pylint: disable=wrong-import-position

DRAFTER_NAMES = ('model', 'unigram', 'bigram', 'prompt_lookup', 'prompt_lookup+model')


# ----------------------------------------------------------------------------------------------
# Setup.
# ----------------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument('--target_gin', default='configs/models/embedded_target.gin')
  parser.add_argument('--target_macro', default='EMBEDDED_TARGET')
  parser.add_argument('--target_checkpoint', default='models/embedded/target.msgpack')
  parser.add_argument('--draft_gin', default='configs/models/embedded_draft.gin')
  parser.add_argument('--draft_macro', default='EMBEDDED_DRAFT')
  parser.add_argument('--draft_checkpoint', default='models/embedded/draft.msgpack')
  parser.add_argument(
    '--allow_random_init',
    action='store_true',
    help='use random weights for a missing checkpoint (smoke runs only)',
  )
  parser.add_argument('--split', default='test')
  parser.add_argument('--num_examples', type=int, default=100)
  parser.add_argument('--inputs_length', type=int, default=64)
  parser.add_argument('--max_new_tokens', type=int, default=64)
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
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument(
    '--skip', default='', help='comma list of parts to skip: alpha,lenience,walltime'
  )
  parser.add_argument(
    '--quick',
    action='store_true',
    help='smoke run: 8 sentences, gammas 2,4, max_gamma 4, one threshold, '
    '3 walltime sentences, 1 repeat',
  )
  parser.add_argument('--output_dir', default='outputs/bench_drafters')
  args = parser.parse_args(argv)
  if args.quick:
    args.num_examples, args.batch_size, args.walltime_examples = 8, 4, 3
    args.gammas, args.max_gamma, args.stop_below, args.repeats = '2,4', 4, '0.5', 1
    args.max_new_tokens = min(args.max_new_tokens, 24)
  return args


def _floats(text: str) -> list[float]:
  return [float(x) for x in text.split(',') if x.strip()]


def _ints(text: str) -> list[int]:
  return [int(x) for x in text.split(',') if x.strip()]


def load_t5_config(gin_file: str, macro: str) -> t5_lib.T5Config:
  """The T5Config a model gin file binds to `macro` (e.g. EMBEDDED_TARGET)."""
  from speculative.jobs import gin_utils  # pylint: disable=g-import-not-at-top

  return gin_utils.load_macro(str(REPO / gin_file), macro, t5_lib.T5Config)


def load_model(
  gin_file: str, macro: str, checkpoint: str, allow_random_init: bool, seed: int
) -> tuple[t5_lib.T5, Any, str]:
  config = load_t5_config(gin_file, macro)
  path = REPO / checkpoint
  if path.exists():
    model, params = checkpoints.load_model(config, str(path))
    return model, params, checkpoint
  if not allow_random_init:
    raise FileNotFoundError(f'{path} does not exist (pass --allow_random_init for a smoke run)')
  print(f'WARNING: {checkpoint} missing: RANDOM weights for {macro}', file=sys.stderr)
  model = t5_lib.T5(config)
  return model, model.init_params(jax.random.key(seed)), 'RANDOM INIT'


def num_params(params: Any) -> int:
  return int(sum(np.size(x) for x in jax.tree_util.tree_leaves(params)))


def load_examples(
  split: str, num_examples: int, inputs_length: int
) -> tuple[list[dict[str, Any]], int]:
  """The first `num_examples` (input tokens, reference) of a split; longer inputs are skipped."""
  import sentencepiece  # pylint: disable=g-import-not-at-top

  processor = sentencepiece.SentencePieceProcessor(model_file=str(tasks.VOCAB_PATH))
  examples, skipped = [], 0
  for index, (source, reference) in enumerate(tasks.load_split(split)):
    ids = processor.encode(tasks.make_inputs(source)) + [tasks.EOS_ID]
    if len(ids) > inputs_length:
      skipped += 1
      continue
    examples.append(dict(index=index, input_tokens=np.asarray(ids, np.int32), reference=reference))
    if len(examples) == num_examples:
      break
  return examples, skipped


def _encoder_batch(
  examples: Sequence[dict[str, Any]], batch_size: int, inputs_length: int
) -> tuple[np.ndarray, np.ndarray]:
  """[B, S] padded inputs (missing rows repeat the first; their results are dropped), [B] ids."""
  batch = np.zeros((batch_size, inputs_length), np.int32)
  row_ids = np.zeros((batch_size,), np.int32)
  for row in range(batch_size):
    example = examples[row] if row < len(examples) else examples[0]
    batch[row, : len(example['input_tokens'])] = example['input_tokens']
    row_ids[row] = example['index']
  return batch, row_ids


def build_drafters(
  names: Sequence[str], draft: Any, draft_params: Any, vocab_size: int, ngram_sizes: tuple[int, ...]
) -> dict[str, tuple[Any, Any]]:
  """name -> (drafter, draft_params), through the drafter registry (speculative.drafters)."""
  sequences = functools.lru_cache(maxsize=1)(lambda: tasks.target_token_sequences('train'))
  return {
    name: drafters_lib.build_drafter(
      name,
      vocab_size=vocab_size,
      draft_model=draft,
      draft_params=draft_params,
      train_sequences=sequences,
      ngram_sizes=ngram_sizes,
    )
    for name in names
  }


# ----------------------------------------------------------------------------------------------
# Alpha (Tables 3 and 5).
# ----------------------------------------------------------------------------------------------


def decode_all(
  target,
  target_params,
  drafter,
  draft_params,
  examples,
  *,
  gamma: int,
  temperature: float,
  batch_size: int,
  inputs_length: int,
  max_new_tokens: int,
  seed: int,
  lenience: float | None = None,
) -> dict[str, Any]:
  """Speculative decoding of all examples in batches; summed metrics and decoded token lists."""
  sampling, sampling_params = sampling_lib.make_sampling(temperature)
  totals = dict(target_calls=0, drafted=0, accepted=0, alpha_sum=0.0, generated=0)
  outputs, compile_s, t_start = [], None, time.perf_counter()
  for lo in range(0, len(examples), batch_size):
    chunk = examples[lo : lo + batch_size]
    encoder_tokens, row_ids = _encoder_batch(chunk, batch_size, inputs_length)
    t0 = time.perf_counter()
    result = decoding.speculative_decode(
      target,
      target_params,
      drafter,
      draft_params,
      None,
      gamma=gamma,
      max_new_tokens=max_new_tokens,
      sampling=sampling,
      sampling_params=sampling_params,
      rng=seed,
      eos_id=tasks.EOS_ID,
      encoder_tokens=jnp.asarray(encoder_tokens),
      row_ids=jnp.asarray(row_ids),
      lenience=lenience,
    )
    jax.block_until_ready(result)
    if compile_s is None:
      compile_s = time.perf_counter() - t0  # first batch: compile + run
    outputs += _add_counts(totals, result, len(chunk))
  drafted = max(totals['drafted'], 1)
  return dict(
    alpha=totals['alpha_sum'] / drafted,
    acceptance=totals['accepted'] / drafted,
    tokens_per_call=totals['generated'] / max(totals['target_calls'], 1),
    drafted_per_step=totals['drafted'] / max(totals['target_calls'], 1),
    first_batch_s=compile_s,
    total_s=time.perf_counter() - t_start,
    **totals,
    outputs=outputs,
  )


def _add_counts(totals: dict[str, Any], result: Any, num_rows: int) -> list[list[int]]:
  """Adds the first `num_rows` rows' counters of a decode result to `totals` (target calls,
  drafted, accepted, alpha sum, generated tokens); returns those rows' generated tokens."""
  metrics = jax.tree.map(np.asarray, result.metrics)
  rows = slice(0, num_rows)
  for key in ('target_calls', 'drafted', 'accepted'):
    totals[key] += int(getattr(metrics, key)[rows].sum())
  if 'alpha_sum' in totals:
    totals['alpha_sum'] += float(metrics.alpha_sum[rows].sum())
  lengths = np.asarray(result.lengths)[rows]
  totals['generated'] += int(lengths.sum())
  tokens = np.asarray(result.tokens)
  return [tokens[row, : lengths[row]].tolist() for row in range(num_rows)]


def bleu(outputs: Sequence[Sequence[int]], examples: Sequence[dict[str, Any]]) -> float:
  import sentencepiece  # pylint: disable=g-import-not-at-top

  processor = sentencepiece.SentencePieceProcessor(model_file=str(tasks.VOCAB_PATH))
  predictions = [processor.decode([t for t in out if t != tasks.EOS_ID]) for out in outputs]
  return metrics.bleu([e['reference'] for e in examples], predictions)['bleu']


# ----------------------------------------------------------------------------------------------
# Costs (c, v(T)) and walltime.
# ----------------------------------------------------------------------------------------------


COST_POSITION = 16  # decoder position at which c and v(T) are measured (mid-sentence)


def measure_costs(
  target,
  target_params,
  draft,
  draft_params,
  encoder_tokens,
  max_gamma: int,
  repeats: int,
  min_seconds: float = 0.1,
) -> dict[str, Any]:
  """c and v(T), T = 1..max_gamma+1, at batch 1: the benchmark's cost model (interleaved rounds,
  per-round ratios), with the estimates it refuses as too noisy in 'too_noisy'."""
  cm = costs_lib.measure_extend_costs(
    target,
    target_params,
    encoder_tokens[:1],
    max_length=COST_POSITION + max_gamma + 2,
    position=COST_POSITION,
    verify_lengths=range(2, max_gamma + 2),
    drafts={'model': (draft, draft_params)},
    repeats=repeats,
    min_seconds=min_seconds,
  )
  model = cm['drafters']['model']
  return dict(
    target_step_s=cm['target_step_s'],
    draft_step_s=model['draft_step_s'],
    c=model['c'],
    v={int(t): v for t, v in cm['v'].items()},
    too_noisy=cm['noise']['refused'],
  )


def time_method(
  decode: Callable[[jax.Array, jax.Array], Any], examples, inputs_length: int, repeats: int
) -> dict[str, Any]:
  """Batch 1 over the examples: compile (first call) timed apart, then the median total time."""
  batches = [_encoder_batch([e], 1, inputs_length) for e in examples]
  encoder0, ids0 = batches[0]
  t0 = time.perf_counter()
  jax.block_until_ready(decode(jnp.asarray(encoder0), jnp.asarray(ids0)))
  compile_s = time.perf_counter() - t0
  totals, counts = [], None
  for _ in range(repeats):
    seconds = 0.0
    counts = dict(generated=0, target_calls=0, drafted=0, accepted=0)
    for encoder_tokens, row_ids in batches:
      encoder_tokens, row_ids = jnp.asarray(encoder_tokens), jnp.asarray(row_ids)
      t0 = time.perf_counter()
      result = decode(encoder_tokens, row_ids)
      jax.block_until_ready(result)
      seconds += time.perf_counter() - t0
      _add_counts(counts, result, result.lengths.shape[0])
    totals.append(seconds)
  decode_s = statistics.median(totals)
  return dict(
    compile_s=compile_s - decode_s / len(batches),
    decode_s=decode_s,
    decode_s_all=totals,
    ms_per_token=1000 * decode_s / max(counts['generated'], 1),
    tokens_per_call=counts['generated'] / max(counts['target_calls'], 1),
    drafted_per_step=counts['drafted'] / max(counts['target_calls'], 1),
    **counts,
  )


def walltime(target, target_params, draft, draft_params, examples, costs, args) -> dict[str, Any]:
  """Batch-1 walltime of the baseline, each fixed gamma and the adaptive-gamma rules."""
  rows = []
  for name, info, decode in _walltime_methods(
    target, target_params, draft, draft_params, costs, args
  ):
    row = dict(
      method=name, **info, **time_method(decode, examples, args.inputs_length, args.repeats)
    )
    rows.append(row)
    print(
      f'  {name}: {row["ms_per_token"]:.2f} ms/token, {row["tokens_per_call"]:.2f} tokens/call, '
      f'compile {row["compile_s"]:.1f} s',
      flush=True,
    )
  base = rows[0]['decode_s']
  for row in rows:
    row['speedup'] = base / row['decode_s']
  fixed = [r for r in rows if r['kind'] == 'fixed']
  best_fixed = min(fixed, key=lambda r: r['decode_s']) if fixed else None
  for row in rows:
    row['vs_best_fixed'] = best_fixed['decode_s'] / row['decode_s'] if best_fixed else None
  return dict(
    temperature=args.walltime_temperature,
    examples=len(examples),
    rows=rows,
    best_fixed=best_fixed['method'] if best_fixed else None,
  )


def _walltime_methods(
  target, target_params, draft, draft_params, costs, args
) -> list[tuple[str, dict[str, Any], Callable]]:
  """(name, description, decode(encoder_tokens, row_ids)) of every method the walltime times."""
  sampling, sampling_params = sampling_lib.make_sampling(args.walltime_temperature)
  common = dict(
    max_new_tokens=args.max_new_tokens,
    sampling=sampling,
    sampling_params=sampling_params,
    rng=args.seed,
    eos_id=tasks.EOS_ID,
    check_finite=False,
  )

  def baseline(encoder_tokens, row_ids):
    return decoding.autoregressive_decode(
      target, target_params, None, encoder_tokens=encoder_tokens, row_ids=row_ids, **common
    )

  def speculative(drafter, gamma, adaptive_verify=False):
    return lambda encoder_tokens, row_ids: decoding.speculative_decode(
      target,
      target_params,
      drafter,
      draft_params,
      None,
      gamma=gamma,
      encoder_tokens=encoder_tokens,
      row_ids=row_ids,
      adaptive_verify=adaptive_verify,
      **common,
    )

  methods: list[tuple[str, dict[str, Any], Callable]] = [
    ('baseline', dict(kind='baseline'), baseline)
  ]
  for gamma in _ints(args.gammas):
    methods.append(
      (
        f'fixed gamma={gamma}',
        dict(kind='fixed', gamma=gamma),
        speculative(drafters_lib.ModelDrafter(draft), gamma),
      )
    )
  return methods + _adaptive_gamma_methods(draft, costs, args, speculative)


def _adaptive_gamma_methods(
  draft, costs, args, speculative: Callable
) -> list[tuple[str, dict[str, Any], Callable]]:
  """The confidence stop rule (static and adaptive verify width) per threshold, and the
  acceptance-predicted rule with the measured c and v(T), all with the static maximum gamma."""
  max_gamma = args.max_gamma
  methods = []
  for threshold in _floats(args.stop_below):
    for adaptive_verify in (False, True):
      methods.append(
        (
          f'stop_below={threshold}, max gamma={max_gamma}'
          + (', adaptive verify' if adaptive_verify else ''),
          dict(
            kind='confidence',
            gamma=max_gamma,
            stop_below=threshold,
            adaptive_verify=adaptive_verify,
          ),
          speculative(
            drafters_lib.ModelDrafter(draft, stop_below=threshold), max_gamma, adaptive_verify
          ),
        )
      )
  rule = drafters_lib.AdaptiveGammaDrafter(
    drafters_lib.ModelDrafter(draft),
    draft_cost=round(costs['c'], 4),
    verify_costs=tuple(round(costs['v'][t], 3) for t in range(1, max_gamma + 2)),
  )
  methods.append(
    (
      f'acceptance rule, max gamma={max_gamma}, adaptive verify',
      dict(
        kind='acceptance_rule',
        gamma=max_gamma,
        adaptive_verify=True,
        draft_cost=rule.draft_cost,
        verify_costs=rule.verify_costs,
      ),
      speculative(rule, max_gamma, True),
    )
  )
  return methods


# ----------------------------------------------------------------------------------------------
# Markdown.
# ----------------------------------------------------------------------------------------------


def _sampling_name(temperature: float) -> str:
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
    f'Command: `{setup["command"]}`; machine: {setup["machine"]}; target weights: '
    f'{setup["target_checkpoint"]}; draft weights: {setup["draft_checkpoint"]}.'
  )
  return '\n'.join(lines) + '\n'


def _alpha_markdown(report: dict[str, Any]) -> list[str]:
  """Alpha per drafter (paper Table 3 layout)."""
  setup = report['setup']
  target_name = setup['target_name']
  lines = []
  lines += [
    f'### Alpha per drafter (paper Table 3 layout; gamma={setup["gamma"]}, '
    f'{setup["num_examples"]} {setup["split"]} sentences)',
    '',
    '| M_p | M_q | Sampling | alpha | acceptance rate | tokens / target call | drafted / step |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in report['alpha']:
    lines.append(
      f'| {target_name} | {row["drafter_label"]} | {_sampling_name(row["temperature"])} '
      f'| {row["alpha"]:.3f} | {row["acceptance"]:.3f} | '
      f'{row["tokens_per_call"]:.2f} | {row["drafted_per_step"]:.2f} |'
    )
  lines += [
    '',
    'alpha = mean over drafted positions of sum_x min(p(x), q(x)); deterministic '
    'drafters (prompt lookup) have one-hot q, so there alpha = P(accept). Prompt lookup '
    'proposes only where an n-gram matches (drafted / step < gamma).',
    '',
  ]
  return lines


def _lenience_markdown(report: dict[str, Any]) -> list[str]:
  """Alpha, tokens per call and BLEU vs lenience (paper Table 5 layout)."""
  setup = report['setup']
  target_name, draft_name = setup['target_name'], setup['draft_name']
  lines = []
  values = report['setup']['lenience']
  header = ' | '.join(f'l={v:g}' for v in values)
  lines += [
    f'### Alpha vs lenience (paper Table 5 layout; M_q = {draft_name}, gamma={setup["gamma"]})',
    '',
    f'| M_p | M_q | Sampling | {header} |',
    '|---|---|---|' + '---|' * len(values),
  ]
  for temperature, rows in report['lenience'].items():
    cells = ' | '.join(f'{r["alpha"]:.3f}' for r in rows)
    lines.append(
      f'| {target_name} | {draft_name} | {_sampling_name(float(temperature))} | {cells} |'
    )
  lines += [
    '',
    'Tokens per target call and BLEU (l < 1 is APPROXIMATE: the output is no longer '
    "the target's):",
    '',
    f'| Sampling | metric | {header} |',
    '|---|---|' + '---|' * len(values),
  ]
  for temperature, rows in report['lenience'].items():
    for metric, digits in (('tokens_per_call', 2), ('bleu', 1)):
      cells = ' | '.join(f'{r[metric]:.{digits}f}' for r in rows)
      lines.append(f'| {_sampling_name(float(temperature))} | {metric} | {cells} |')
  lines += [
    '',
    'Greedy lenience accepts a draft token x iff p(x) >= l max p (target softmax at '
    'temperature 1); sampling lenience accepts iff r l q(x) <= p(x), so no token is '
    'emitted with probability above p(x)/l.',
    '',
  ]
  return lines


def _walltime_markdown(report: dict[str, Any]) -> list[str]:
  """Walltime of adaptive vs fixed gamma, with the measured costs."""
  setup = report['setup']
  lines = []
  wall = report['walltime']
  costs = report['costs']
  lines += [
    f'### Walltime: adaptive vs fixed gamma (batch 1, {_sampling_name(wall["temperature"])}'
    f', {wall["examples"]} sentences, median of {setup["repeats"]})',
    '',
    f'Measured: target step {1000 * costs["target_step_s"]:.2f} ms, draft step '
    f'{1000 * costs["draft_step_s"]:.2f} ms (c = {costs["c"]:.3f}), v(T) = '
    + ', '.join(f'{v:.2f}' for _, v in sorted(costs['v'].items(), key=lambda kv: int(kv[0])))
    + ' for T = 1..'
    + ''.join(
      f'. **Too noisy** (the acceptance rule below uses it anyway): {reason}'
      for reason in costs.get('too_noisy', {}).values()
    ),
    '',
    '| method | ms / token | speedup vs baseline | vs best fixed gamma | tokens / call | '
    'drafted / step | compile s |',
    '|---|---|---|---|---|---|---|',
  ]
  for row in wall['rows']:
    vs_best = '' if row['vs_best_fixed'] is None else f'{row["vs_best_fixed"]:.2f}x'
    lines.append(
      f'| {row["method"]} | {row["ms_per_token"]:.2f} | {row["speedup"]:.2f}x | '
      f'{vs_best} | {row["tokens_per_call"]:.2f} | {row["drafted_per_step"]:.2f} | '
      f'{row["compile_s"]:.1f} |'
    )
  lines += [
    '',
    f'Best fixed gamma: {wall["best_fixed"]}. Adaptive gamma is exact (same tokens as '
    'the baseline under argmax). With the static verify width it only saves draft calls; '
    '"adaptive verify" also shrinks the target call to 1 + drafted tokens (lax.switch '
    'over gamma+1 compiled widths).',
    '',
  ]
  return lines


# ----------------------------------------------------------------------------------------------
# Main.
# ----------------------------------------------------------------------------------------------


def _machine() -> str:
  return (
    f'{platform.machine()} {platform.processor() or ""} {os.cpu_count()} cores, '
    f'jax {jax.__version__} {jax.default_backend()}'
  ).replace('  ', ' ')


def _git_commit() -> str | None:
  try:
    return subprocess.run(
      ['git', 'rev-parse', 'HEAD'], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return None


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  args = parse_args(argv)
  skip = {s.strip() for s in args.skip.split(',') if s.strip()}
  target, target_params, target_source = load_model(
    args.target_gin, args.target_macro, args.target_checkpoint, args.allow_random_init, args.seed
  )
  draft, draft_params, draft_source = load_model(
    args.draft_gin, args.draft_macro, args.draft_checkpoint, args.allow_random_init, args.seed + 1
  )
  if target.vocab_size != draft.vocab_size:
    raise ValueError(f'target vocab {target.vocab_size} != draft vocab {draft.vocab_size}')
  examples, skipped = load_examples(args.split, args.num_examples, args.inputs_length)
  target_name = f'{args.target_macro.lower()} ({num_params(target_params) / 1e6:.0f}M)'
  draft_name = f'{args.draft_macro.lower()} ({num_params(draft_params) / 1e6:.1f}M)'
  report: dict[str, Any] = dict(
    setup=_setup_record(
      args, argv, (target_name, draft_name, target_source, draft_source), len(examples), skipped
    )
  )
  models = (target, target_params, draft, draft_params)
  if 'alpha' not in skip:
    report['alpha'] = _alpha_part(models, examples, args, draft_name)
  if 'lenience' not in skip:
    report['lenience'] = _lenience_part(models, examples, args, report['setup']['lenience'])
  if 'walltime' not in skip:
    report['costs'], report['walltime'] = _walltime_part(models, examples, args)
  text = markdown(report)
  os.makedirs(args.output_dir, exist_ok=True)
  for name, content in (
    ('drafters.json', json.dumps(report, indent=2) + '\n'),
    ('drafters.md', text),
  ):
    files.write_atomic(os.path.join(args.output_dir, name), content)
  print()
  print(text)
  return report


def _setup_record(args, argv, names, num_examples: int, skipped: int) -> dict[str, Any]:
  """The report's `setup`: the command, machine, commit, the models (`names`: target and draft
  names and weights) and every option that shapes the numbers."""
  target_name, draft_name, target_source, draft_source = names
  return dict(
    command='python '
    + ' '.join(
      [os.path.relpath(__file__, REPO)] + sys.argv[1:]
      if argv is None
      else ['scripts/bench_drafters.py', *argv]
    ),
    machine=_machine(),
    git_commit=_git_commit(),
    time=time.strftime('%Y-%m-%d %H:%M:%S'),
    target_name=target_name,
    draft_name=draft_name,
    target_checkpoint=target_source,
    draft_checkpoint=draft_source,
    split=args.split,
    num_examples=num_examples,
    skipped_long_inputs=skipped,
    inputs_length=args.inputs_length,
    max_new_tokens=args.max_new_tokens,
    gamma=args.gamma,
    batch_size=args.batch_size,
    lenience=_floats(args.lenience),
    repeats=args.repeats,
    seed=args.seed,
  )


def _decode_options(args) -> dict[str, Any]:
  return dict(
    gamma=args.gamma,
    batch_size=args.batch_size,
    inputs_length=args.inputs_length,
    max_new_tokens=args.max_new_tokens,
    seed=args.seed,
  )


def _alpha_part(models, examples, args, draft_name: str) -> list[dict[str, Any]]:
  """Table 3: alpha, acceptance and tokens per call of every drafter, greedy and sampled."""
  target, target_params, draft, draft_params = models
  print('== alpha per drafter', flush=True)
  labels = {
    'model': draft_name,
    'unigram': 'unigram (train split)',
    'bigram': 'bigram (train split)',
    'prompt_lookup': 'prompt lookup',
    'prompt_lookup+model': f'prompt lookup + {draft_name}',
  }
  drafters = build_drafters(
    [d.strip() for d in args.drafters.split(',') if d.strip()],
    draft,
    draft_params,
    target.vocab_size,
    tuple(_ints(args.ngram_sizes)),
  )
  rows = []
  for name, (drafter, params) in drafters.items():
    for temperature in (0.0, 1.0):
      row = decode_all(
        target,
        target_params,
        drafter,
        params,
        examples,
        temperature=temperature,
        **_decode_options(args),
      )
      row.pop('outputs')
      rows.append(dict(drafter=name, drafter_label=labels[name], temperature=temperature, **row))
      print(
        f'  {name} {_sampling_name(temperature)}: alpha {row["alpha"]:.3f}, acceptance '
        f'{row["acceptance"]:.3f}, {row["tokens_per_call"]:.2f} tokens/call',
        flush=True,
      )
  return rows


def _lenience_part(models, examples, args, lenience_values) -> dict[str, list[dict[str, Any]]]:
  """Table 5: the draft model drafter at every lenience, greedy and sampled, with BLEU."""
  target, target_params, draft, draft_params = models
  print('== alpha vs lenience', flush=True)
  out = {}
  model_drafter = drafters_lib.ModelDrafter(draft)
  for temperature in (0.0, 1.0):
    rows = []
    for lenience in lenience_values:
      row = decode_all(
        target,
        target_params,
        model_drafter,
        draft_params,
        examples,
        temperature=temperature,
        lenience=lenience,
        **_decode_options(args),
      )
      row['bleu'] = bleu(row.pop('outputs'), examples)
      rows.append(dict(lenience=lenience, **row))
      print(
        f'  {_sampling_name(temperature)} l={lenience:g}: alpha {row["alpha"]:.3f}, '
        f'{row["tokens_per_call"]:.2f} tokens/call, BLEU {row["bleu"]:.1f}',
        flush=True,
      )
    out[str(temperature)] = rows
  return out


def _walltime_part(models, examples, args) -> tuple[dict[str, Any], dict[str, Any]]:
  """(costs, walltime): c and v(T) at batch 1, then the batch-1 walltime of every method."""
  target, target_params, draft, draft_params = models
  print('== costs', flush=True)
  encoder_tokens, _ = _encoder_batch(examples[:1], 1, args.inputs_length)
  costs = measure_costs(
    target,
    target_params,
    draft,
    draft_params,
    encoder_tokens,
    args.max_gamma,
    repeats=max(3, args.repeats),
  )
  print(
    f'  c = {costs["c"]:.3f}, v = { ({k: round(v, 2) for k, v in costs["v"].items()}) }',
    flush=True,
  )
  print('== walltime (batch 1)', flush=True)
  wall = walltime(
    target, target_params, draft, draft_params, examples[: args.walltime_examples], costs, args
  )
  return costs, wall


if __name__ == '__main__':
  main()
