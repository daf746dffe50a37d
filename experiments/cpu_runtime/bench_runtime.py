"""Which CPU runtime settings make our decoding fastest? Paired, interleaved, tokens checked.

Command (repository root; run it on a quiet machine, it takes ~3 minutes per round):

  .venv/bin/python experiments/cpu_runtime/bench_runtime.py [--rounds 3] [--num_examples 8] [--batch_size 1]

XLA flags are fixed when jax starts, so every (setting, round) is a fresh child process that loads
the embedded pair, decodes the first --num_examples test sentences once untimed (compile), then
times a warm greedy baseline decode and a warm speculative decode (model draft, gamma 4) with
`block_until_ready`, and returns ms per generated token and a hash of the tokens. The parent runs
the settings in turn, in a rotated order each round, so a drifting background load hits them alike,
and reports each setting's per-round ratio to the default (< 1 = faster) with the median and the
spread. A setting whose tokens differ from the default's is reported as NOT EXACT.

Settings (`--settings`, comma-separated names):
  default            no XLA_FLAGS, float32 weights in memory (what the entry points use today)
  eigen_single       --xla_cpu_multi_thread_eigen=false
  onednn             --xla_cpu_use_onednn=true
  xnnpack            --xla_cpu_use_xnnpack=true
  no_ynn_dot         --xla_cpu_experimental_ynn_fusion_type=-individual_dot (multi-token dots on
                     XLA's own kernels instead of YNNPACK fusions)
  bf16_weights       weights kept in bfloat16 in memory, computed in float32 (bf16 -> f32 is exact)

Prints one Markdown table (setting, median ratio baseline / speculative, spread, exact) and the load
average before and after; with --output_json also writes every child's figures.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
import hashlib
import json
import os
from pathlib import Path
import statistics
import subprocess
import sys
import time

REPO = Path(__file__).resolve().parents[2]

SETTINGS = {
  'default': ('', 'float32'),
  'eigen_single': ('--xla_cpu_multi_thread_eigen=false', 'float32'),
  'onednn': ('--xla_cpu_use_onednn=true', 'float32'),
  'xnnpack': ('--xla_cpu_use_xnnpack=true', 'float32'),
  'no_ynn_dot': ('--xla_cpu_experimental_ynn_fusion_type=-individual_dot', 'float32'),
  'bf16_weights': ('', 'bfloat16'),
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(
    description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter
  )
  parser.add_argument('--rounds', type=int, default=3)
  parser.add_argument('--num_examples', type=int, default=8)
  parser.add_argument('--batch_size', type=int, default=1)
  parser.add_argument('--max_new_tokens', type=int, default=64)
  parser.add_argument('--settings', default=','.join(SETTINGS))
  parser.add_argument('--output_json', default=None)
  parser.add_argument('--child', default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  names = args.settings.split(',')
  unknown = [n for n in names if n not in SETTINGS]
  if unknown:
    parser.error(f'unknown settings {unknown}; known: {sorted(SETTINGS)}')
  if names[0] != 'default':
    names = ['default'] + [n for n in names if n != 'default']
  args.settings = names
  for name in ('rounds', 'num_examples', 'batch_size', 'max_new_tokens'):
    if getattr(args, name) < 1:
      parser.error(f'--{name} must be >= 1')
  return args


def _load_pair(param_dtype: str):
  """The embedded target and draft with their params stored in `param_dtype` (computed in the
  models' float32 either way)."""
  import jax

  from speculative.checkpoints import params_files
  from speculative.jobs import gin_utils
  from speculative.models import t5 as t5_lib

  os.chdir(REPO)
  target_config = gin_utils.load_macro(
    'configs/models/embedded_target.gin', 'EMBEDDED_TARGET', t5_lib.T5Config
  )
  draft_config = gin_utils.load_macro(
    'configs/models/embedded_draft.gin', 'EMBEDDED_DRAFT', t5_lib.T5Config
  )
  target, target_params = params_files.load_model(target_config, 'models/embedded/target.msgpack')
  draft, draft_params = params_files.load_model(draft_config, 'models/embedded/draft.msgpack')
  if param_dtype != 'float32':
    cast = lambda tree: jax.tree.map(lambda x: x.astype(param_dtype), tree)  # noqa: E731
    target_params, draft_params = cast(target_params), cast(draft_params)
  return target_config, target, target_params, draft, draft_params


def child(args: argparse.Namespace) -> dict:
  """Runs in the child process: warm ms/token of baseline and speculative under one setting."""
  sys.path.insert(0, str(REPO))
  import jax
  import jax.numpy as jnp
  import numpy as np

  from speculative.decode import batching
  from speculative.decode import modes
  from speculative.decode import state as decode_state
  from speculative.infer import inputs as infer_inputs

  target_config, target, target_params, draft, draft_params = _load_pair(SETTINGS[args.child][1])
  examples = infer_inputs.examples_from_task('libreoffice_ende', 'test', 128, args.num_examples)
  padded = [b for _, b in batching.batches(examples, args.batch_size, 128)]
  fns = modes.greedy_model_pair(
    target,
    target_params,
    draft,
    draft_params,
    gamma=4,
    max_new_tokens=args.max_new_tokens,
    eos_id=target_config.eos_id,
  )

  def decode(mode: str, encoder_tokens) -> decode_state.DecodeResult:
    return fns[mode](encoder_tokens)

  out = {'setting': args.child, 'xla_flags': os.environ.get('XLA_FLAGS', '')}
  for mode in ('baseline', 'speculative'):
    for batch in padded:  # compile every shape once, untimed
      jax.block_until_ready(decode(mode, jnp.asarray(batch)).tokens)
    digest, tokens, start = hashlib.sha256(), 0, time.perf_counter()
    for batch in padded:
      result = decode(mode, jnp.asarray(batch))
      jax.block_until_ready(result.tokens)
      digest.update(np.asarray(result.tokens).tobytes())
      tokens += int(np.asarray(result.lengths).sum())
    out[f'{mode}_ms_per_token'] = 1e3 * (time.perf_counter() - start) / tokens
    out[f'{mode}_tokens_sha256'] = digest.hexdigest()
  return out


def run_child(name: str, args: argparse.Namespace) -> dict:
  flags, _ = SETTINGS[name]
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3')
  env.pop('XLA_FLAGS', None)
  if flags:
    env['XLA_FLAGS'] = flags
  cmd = [
    sys.executable, __file__, '--child', name, '--num_examples', str(args.num_examples),
    '--batch_size', str(args.batch_size), '--max_new_tokens', str(args.max_new_tokens),
  ]  # fmt: skip
  proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f'setting {name} failed:\n{proc.stderr[-3000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def summarize(runs: list[list[dict]], names: list[str]) -> list[dict]:
  """Per setting: median and spread (max - min) of the per-round ratio to the default."""
  rows = []
  for name in names:
    row = {'setting': name, 'xla_flags': SETTINGS[name][0], 'param_dtype': SETTINGS[name][1]}
    for mode in ('baseline', 'speculative'):
      ratios = [
        r[name][f'{mode}_ms_per_token'] / r['default'][f'{mode}_ms_per_token'] for r in runs
      ]
      row[f'{mode}_ratio'] = statistics.median(ratios)
      row[f'{mode}_spread'] = max(ratios) - min(ratios)
      row[f'{mode}_default_ms'] = statistics.median(
        r['default'][f'{mode}_ms_per_token'] for r in runs
      )
      row[f'{mode}_exact'] = all(
        r[name][f'{mode}_tokens_sha256'] == r['default'][f'{mode}_tokens_sha256'] for r in runs
      )
    rows.append(row)
  return rows


def main(argv: Sequence[str] | None = None) -> None:
  args = parse_args(argv)
  if args.child:
    print(json.dumps(child(args)))
    return
  load_before = os.getloadavg()
  runs = []
  for rnd in range(args.rounds):
    order = args.settings[rnd % len(args.settings) :] + args.settings[: rnd % len(args.settings)]
    runs.append({name: run_child(name, args) for name in order})
    print(f'round {rnd + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}', flush=True)
  rows = summarize(runs, args.settings)
  load_after = os.getloadavg()
  print(
    f'\n{args.num_examples} test sentences, batch {args.batch_size}, greedy, {args.rounds} '
    f'rounds; load average before {load_before[0]:.2f}, after {load_after[0]:.2f}; default: '
    f'baseline {rows[0]["baseline_default_ms"]:.2f} ms/token, speculative '
    f'{rows[0]["speculative_default_ms"]:.2f} ms/token (medians)\n'
  )
  print('| setting | baseline time / default | speculative time / default | exact |')
  print('|---|---|---|---|')
  for r in rows:
    exact = 'yes' if r['baseline_exact'] and r['speculative_exact'] else 'NOT EXACT'
    print(
      f'| {r["setting"]} | {r["baseline_ratio"]:.3f} (spread {r["baseline_spread"]:.2f}) '
      f'| {r["speculative_ratio"]:.3f} (spread {r["speculative_spread"]:.2f}) | {exact} |'
    )
  if args.output_json:
    Path(args.output_json).write_text(
      json.dumps({'runs': runs, 'summary': rows, 'load': [load_before, load_after]}, indent=2)
    )


if __name__ == '__main__':
  main()
