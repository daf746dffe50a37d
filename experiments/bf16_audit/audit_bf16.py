"""Greedy exactness in reduced precision: baseline vs speculative on the embedded pair, audited.

For each variant (activation dtype, optionally the float32 logits head `T5Config.logits_dtype` or
float32 attention logits), decodes the first `--num_examples` test sentences of the LibreOffice
En-De task greedily, once with the baseline (1-token steps) and once speculatively with the draft
model (gamma+1-token verify calls), and audits every example whose outputs differ
(`speculative.decode.audit`: first differing position, float32 logits there, top-2 gap, near-tie vs
mismatch). Also reports the baseline's and the speculative decode's per-token cost (warm, the
first batch is decoded once untimed to compile) and the measured per-logit error of the variant's
full forward against float32, in units of the audit's per-logit allowance eps * max(|z|, 1).

Command (repository root; the issue's full runs, when the CPU is quiet):

  .venv/bin/python experiments/bf16_audit/audit_bf16.py --num_examples=500 --batch_size=1
  .venv/bin/python experiments/bf16_audit/audit_bf16.py --num_examples=500 --batch_size=8

Small run (25 minutes for both default variants on a 2-core CPU shared with a training job;
bfloat16 matmuls are slow on CPUs without native bfloat16, ~100 ms/token there):

  .venv/bin/python experiments/bf16_audit/audit_bf16.py --num_examples=30

Cost of a variant per token (issue: what the float32 logits head costs): `--cost_rounds=N` also
times each variant's target call (a 1-token step and a (gamma+1)-token verify call, the calls
decoding makes) in N interleaved rounds and prints its ratio to the first variant, e.g.

  .venv/bin/python experiments/bf16_audit/audit_bf16.py --num_examples=8 --batch_size=8 --cost_rounds=7

Variants (`--variants`, comma-separated): a dtype name, optionally followed by `+f32logits`
(logits_dtype='float32'), `+f32attn` (float32_attention_logits=True) and/or `+kernels` (both
decoders on the CPU kernels, `speculative.kernels`: every verify row then has the bits of the
1-token step), e.g. `bfloat16,bfloat16+kernels,float32`; a `+kernels` variant is `KERNELS = 'on'`
(`speculative.kernels.policy`): refused in one line, before any weights load, where the kernels are
unavailable or jax computes on a GPU or TPU. The draft always runs in the variant's dtype.
Prints Markdown tables; with --output_json, also writes every number there.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import dataclasses
import json
import os
from pathlib import Path
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from speculative.bench import noise  # noqa: E402
from speculative.bench import timing  # noqa: E402
from speculative.checkpoints import params_files
from speculative.data import tasks  # noqa: E402
from speculative.decode import audit  # noqa: E402
from speculative.decode import modes  # noqa: E402
from speculative.jobs import gin_utils  # noqa: E402
from speculative.kernels import policy  # noqa: E402
from speculative.models import t5 as t5_lib  # noqa: E402


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument('--num_examples', type=int, default=30, help='first N test sentences')
  parser.add_argument('--batch_size', type=int, default=1)
  parser.add_argument('--max_new_tokens', type=int, default=64)
  parser.add_argument(
    '--inputs_length',
    type=int,
    default=64,
    help='encoder length; longer inputs are truncated (EOS kept)',
  )
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--variants', default='bfloat16,bfloat16+f32logits')
  parser.add_argument('--bound_factor', type=float, default=audit.DEFAULT_BOUND_FACTOR)
  parser.add_argument('--target_gin', default=str(REPO / 'configs/models/embedded_target.gin'))
  parser.add_argument('--target_checkpoint', default=str(REPO / 'models/embedded/target.msgpack'))
  parser.add_argument('--draft_gin', default=str(REPO / 'configs/models/embedded_draft.gin'))
  parser.add_argument('--draft_checkpoint', default=str(REPO / 'models/embedded/draft.msgpack'))
  parser.add_argument('--output_json', default=None)
  parser.add_argument(
    '--cost_rounds',
    type=int,
    default=0,
    help='also time the target call of every variant (1-token step and (gamma+1)-token verify) '
    'in this many interleaved rounds and report its cost relative to the first variant',
  )
  args = parser.parse_args(argv)
  for name in ('num_examples', 'batch_size', 'max_new_tokens', 'inputs_length', 'gamma'):
    if getattr(args, name) < 1:
      parser.error(f'--{name} must be >= 1')
  if any('+kernels' in spec for spec in args.variants.split(',')):
    try:  # '+kernels' asks for the kernels as KERNELS = 'on' does: checked here, before any load
      policy.choose('on', args.batch_size)
    except ValueError as err:
      parser.error(f'--variants: {err}')
  return args


def parse_variant(spec: str) -> dict:
  """'bfloat16+f32logits+f32attn' -> T5Config overrides."""
  dtype, *flags = spec.strip().split('+')
  overrides = {
    'dtype': jnp.dtype(dtype).name,
    'logits_dtype': None,
    'float32_attention_logits': False,
  }
  for flag in flags:
    if flag == 'f32logits':
      overrides['logits_dtype'] = 'float32'
    elif flag == 'f32attn':
      overrides['float32_attention_logits'] = True
    elif flag != 'kernels':  # not a config override: `_variant_decoder` packs the weights
      raise ValueError(f'unknown variant flag {flag!r} in {spec!r} (f32logits, f32attn, kernels)')
  return overrides


def encoder_batches(num_examples: int, batch_size: int, inputs_length: int) -> list[np.ndarray]:
  """[B, inputs_length] int32 encoder inputs of the first test sentences (last batch may be
  smaller)."""
  vocabulary = tasks.get_vocabulary()
  rows = []
  for source, _ in tasks.load_split('test')[:num_examples]:
    ids = vocabulary.encode(tasks.make_inputs(source))[: inputs_length - 1] + [1]
    rows.append(ids + [0] * (inputs_length - len(ids)))
  rows = np.asarray(rows, np.int32)
  return [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]


def run_variant(spec: str, batches: list[np.ndarray], args: argparse.Namespace) -> dict:
  """Greedy baseline and speculative decodes of `batches` with the variant's models, audited: the
  divergences, their verdicts and table, ms per token, and the target's logit error ratios."""
  overrides = parse_variant(spec)
  target, target_params, decode = _variant_decoder(overrides, args, '+kernels' in spec)
  decode(batches[0])  # compile (untimed)
  sequences = {'baseline': [], 'speculative': []}
  seconds = {'baseline': 0.0, 'speculative': 0.0}
  for encoder in batches:
    for mode, (seqs, secs) in decode(encoder).items():
      sequences[mode] += seqs
      seconds[mode] += secs
  encoder_tokens = np.concatenate(batches)
  divergences = audit.audit_divergences(
    target,
    target_params,
    encoder_tokens,
    sequences['baseline'],
    sequences['speculative'],
    bound_factor=args.bound_factor,
  )
  ratios = _logit_error_ratios(target, target_params, encoder_tokens, sequences['baseline'], args)
  num_tokens = {mode: sum(len(s) for s in seqs) for mode, seqs in sequences.items()}
  return {
    'variant': spec,
    'overrides': overrides,
    'summary': audit.summarize(divergences, len(encoder_tokens)),
    'ms_per_token': {mode: 1e3 * seconds[mode] / max(num_tokens[mode], 1) for mode in seconds},
    'tokens': num_tokens,
    'logit_error_ratio': {
      q: float(np.quantile(ratios, q / 100)) if ratios.size else 0.0 for q in (50, 99, 100)
    },
    'divergences': [dataclasses.asdict(d) for d in divergences],
    'table': audit.format_table(divergences, token_text=_token_text()),
  }


def _variant_decoder(overrides: dict, args: argparse.Namespace, use_kernels: bool = False):
  """(target, target_params, decode) of the variant `overrides`: decode(encoder [B, S]) ->
  {mode: (token lists, seconds)}, the greedy baseline and speculative decodes of one batch."""
  target_config = gin_utils.load_macro(args.target_gin, 'EMBEDDED_TARGET', t5_lib.T5Config)
  draft_config = gin_utils.load_macro(args.draft_gin, 'EMBEDDED_DRAFT', t5_lib.T5Config)
  target, target_params = params_files.load_model(
    dataclasses.replace(target_config, **overrides), args.target_checkpoint
  )
  draft, draft_params = params_files.load_model(
    dataclasses.replace(draft_config, **overrides), args.draft_checkpoint
  )
  if use_kernels:
    target_params = t5_lib.pack_decode_params(target, target_params)
    draft_params = t5_lib.pack_decode_params(draft, draft_params)
  fns = modes.greedy_model_pair(
    target,
    target_params,
    draft,
    draft_params,
    gamma=args.gamma,
    max_new_tokens=args.max_new_tokens,
    eos_id=target_config.eos_id,
  )

  def decode(encoder):
    """Token lists and seconds of the baseline and the speculative decode of one batch."""
    out = {}
    for mode, fn in fns.items():
      start = time.perf_counter()
      result = fn(jnp.asarray(encoder))
      tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)
      out[mode] = (
        [tokens[i, : lengths[i]].tolist() for i in range(len(encoder))],
        time.perf_counter() - start,
      )
    return out

  return target, target_params, decode


def _logit_error_ratios(
  target, target_params, encoder_tokens: np.ndarray, baseline: list, args: argparse.Namespace
) -> np.ndarray:
  """`audit.logit_error_ratios` of the baseline's tokens, in chunks of 8 sentences padded to
  max_new_tokens: two compiles at most (the last chunk)."""
  return np.concatenate(
    [
      audit.logit_error_ratios(
        target,
        target_params,
        encoder_tokens[i : i + 8],
        baseline[i : i + 8],
        pad_to=args.max_new_tokens,
      )
      for i in range(0, len(encoder_tokens), 8)
    ]
  )


def variant_costs(specs: list[str], encoder: np.ndarray, args: argparse.Namespace) -> list[dict]:
  """Per-call cost of each variant's target: a 1-token step and a (gamma+1)-token verify call at
  position 16 of a cache of `encoder`'s rows, timed in --cost_rounds interleaved rounds
  (bench.timing), relative to the first variant per round, with the spread (bench.noise)."""
  target_config = gin_utils.load_macro(args.target_gin, 'EMBEDDED_TARGET', t5_lib.T5Config)
  timers = {}
  for spec in specs:
    target, params = params_files.load_model(
      dataclasses.replace(target_config, **parse_variant(spec)), args.target_checkpoint
    )
    for tokens in (1, args.gamma + 1):
      timers[(spec, tokens)] = timing.extend_timer(
        target, params, encoder, num_tokens=tokens, max_length=96, position=16
      )
  names = {key: f'{key[0]}/T={key[1]}' for key in timers}
  rounds, _ = timing.time_rounds(
    {names[k]: fn for k, fn in timers.items()}, args.cost_rounds, 0.2, marginal=list(names.values())
  )
  rows = []
  for spec in specs:
    row = {'variant': spec}
    for tokens in (1, args.gamma + 1):
      seconds = rounds[names[(spec, tokens)]]
      ratio = noise.estimate(noise.ratio_samples(seconds, rounds[names[(specs[0], tokens)]]))
      row[f'T={tokens}'] = {
        'ms': 1e3 * noise.estimate(seconds).value,
        'ratio': ratio.value,
        'spread': ratio.spread,
        'verdict': noise.judge(ratio, f'{spec} T={tokens} ratio') or 'ok',
      }
    rows.append(row)
  return rows


def format_costs(rows: list[dict], args: argparse.Namespace) -> str:
  t = args.gamma + 1
  lines = [
    f'Target call cost per variant (batch {args.batch_size}, position 16, {args.cost_rounds} '
    f'interleaved rounds, ratio to {rows[0]["variant"]} per round; load average '
    f'{os.getloadavg()[0]:.2f}):',
    '',
    f'| variant | T=1 ms | T=1 ratio (spread) | T={t} ms | T={t} ratio (spread) |',
    '|---|---:|---|---:|---|',
  ]
  for r in rows:
    a, b = r['T=1'], r[f'T={t}']
    cell = lambda c: (
      f"{c['ratio']:.3f} ({c['spread']:.2f}{'' if c['verdict'] == 'ok' else ', too noisy'})"
    )  # noqa: E731
    lines.append(f"| {r['variant']} | {a['ms']:.2f} | {cell(a)} | {b['ms']:.2f} | {cell(b)} |")
  return '\n'.join(lines)


def _token_text():
  vocabulary = tasks.get_vocabulary()
  return lambda t: vocabulary.decode([t]).replace('|', '\\|')


def format_report(results: list[dict], args: argparse.Namespace) -> str:
  lines = [
    f'Greedy baseline vs speculative (gamma {args.gamma}, batch {args.batch_size}, '
    f'{args.num_examples} sentences, <= {args.max_new_tokens} new tokens, '
    f'bound C = {args.bound_factor}); machine: '
    f'{platform.processor() or platform.machine()}, {jax.devices()[0].platform}.',
    '',
    '| variant | identical | diverged | near-tie | mismatch | baseline ms/token | '
    'speculative ms/token | logit error / (eps max(abs z, 1)): median, p99, max |',
    '|---|---:|---:|---:|---:|---:|---:|---|',
  ]
  for r in results:
    s, ms, e = r['summary'], r['ms_per_token'], r['logit_error_ratio']
    lines.append(
      f"| {r['variant']} | {s['identical']} | {s['diverged']} | {s['near_tie']} | "
      f"{s['mismatch']} | {ms['baseline']:.2f} | {ms['speculative']:.2f} | "
      f"{e[50]:.3f}, {e[99]:.3f}, {e[100]:.3f} |"
    )
  for r in results:
    if r['divergences']:
      lines += ['', f"Divergences, {r['variant']}:", '', r['table']]
  return '\n'.join(lines)


def main(argv: Sequence[str] | None = None) -> None:
  args = parse_args(argv)
  batches = encoder_batches(args.num_examples, args.batch_size, args.inputs_length)
  specs = args.variants.split(',')
  results = [run_variant(spec, batches, args) for spec in specs]
  report = format_report(results, args)
  if args.cost_rounds:
    report += '\n\n' + format_costs(variant_costs(specs, batches[0], args), args)
  print(report)
  if args.output_json:
    Path(args.output_json).write_text(
      json.dumps(
        {'args': vars(args), 'command': ' '.join(sys.argv), 'results': results, 'report': report},
        indent=1,
        default=str,
      )
    )


if __name__ == '__main__':
  main()
