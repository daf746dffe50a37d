"""The speculative loop's ceiling on a job, measured: what a perfect draft would give.

  .venv/bin/python -m speculative.bench.ceiling --gin_file=configs/local/run.gin \
      [--gammas=3,5,7] [--json_out=FILE] [--gin_bindings=...]

The greedy job of the run file, on its models, decode path and batches, each batch decoded by:
`baseline`; `draft g`, the job's drafter at gamma g; `oracle+draft g`, `OracleDrafter` (the
target's own continuation, all accepted) at the drafter's cost; `oracle g`, the oracle alone (the
ceiling of any draft); `encoder`, the prefill alone. Every output must equal the baseline's.
docs/training.md, "The ceiling, measured", has a run.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any
from typing import Callable
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import drafters
from speculative import timing
from speculative.bench import markdown
from speculative.bench import methods as methods_lib
from speculative.decode import batching
from speculative.decode import state as decode_state
from speculative.infer import inputs as infer_inputs
from speculative.infer import run as infer_run
from speculative.infer import settings as infer_settings
from speculative.jobs import checks
from speculative.jobs import runtime

BASELINE = 'baseline'
ENCODER = 'encoder'
DEFAULT_GAMMAS = (3, 5, 7)


@dataclasses.dataclass
class Tally:
  """One method's totals over the job (warm decode seconds) and each example's generated length."""

  seconds: float = 0.0
  tokens: int = 0
  target_calls: int = 0
  lengths: list = dataclasses.field(default_factory=list)
  compiled_shapes: set = dataclasses.field(default_factory=set)


def parse_gammas(text: str) -> tuple[int, ...]:
  """'3,5,7' -> (3, 5, 7); ValueError naming the value unless each is an int in GAMMA_RANGE."""
  low, high = infer_settings.GAMMA_RANGE
  try:
    gammas = tuple(int(g) for g in text.split(','))
  except ValueError:
    raise ValueError(f'--gammas must be comma-separated ints, got {text!r}') from None
  if not gammas or any(not low <= g <= high for g in gammas):
    raise ValueError(f'--gammas: each must be in [{low}, {high}], got {text!r}')
  return gammas


def parse_gamma_arguments(
  parser: argparse.ArgumentParser, argv: Sequence[str] | None, default: str, json_help: str
) -> tuple[argparse.Namespace, tuple[int, ...]]:
  """Adds and parses the job benchmarks' --gammas and --json_out: (arguments, gammas)."""
  parser.add_argument(
    '--gammas', default=default, help='comma-separated gammas to measure (default %(default)s)'
  )
  parser.add_argument('--json_out', default=None, help=json_help)
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  try:
    return args, parse_gammas(args.gammas)
  except ValueError as e:
    parser.error(str(e))


def method_fns(
  settings: infer_settings.InferSettings, models: infer_run.Models, gammas: Sequence[int]
) -> dict[str, Callable[[jax.Array, Any, jax.Array], Any]]:
  """{name: fn(encoder_tokens [B, S], rng, generated [B, N]) -> DecodeResult}, baseline first."""
  sampling = dict(sampling_params=settings.sampling()[1])
  target, target_params = models.target, models.target_params
  vocab = target.vocab_size

  def bind(drafter, gamma, params_of):
    options = dataclasses.replace(settings.decode_options(), gamma=gamma)
    return lambda encoder_tokens, rng, generated: methods_lib.decode_fn(
      target, target_params, drafter, params_of(generated), options=options, **sampling
    )(encoder_tokens, rng)

  baseline = methods_lib.decode_fn(
    target, target_params, options=settings.decode_options(), **sampling
  )
  fns = {BASELINE: lambda encoder_tokens, rng, generated: baseline(encoder_tokens, rng)}
  for g in gammas:
    fns[f'draft {g}'] = bind(models.drafter, g, lambda generated: models.draft_params)
    fns[f'oracle+draft {g}'] = bind(
      drafters.OracleDrafter(vocab, inner=models.drafter),
      g,
      lambda generated: {'generated': generated, 'inner': models.draft_params},
    )
    fns[f'oracle {g}'] = bind(
      drafters.OracleDrafter(vocab), g, lambda generated: {'generated': generated, 'inner': None}
    )
  return fns


def _check_same(name: str, result, reference, batch_examples) -> None:
  """RuntimeError unless `result`'s rows equal the baseline's (the real rows of the batch)."""
  rows = len(batch_examples)
  same_lengths = np.array_equal(np.asarray(result.lengths)[:rows], reference.lengths[:rows])
  if not same_lengths or not np.array_equal(
    np.asarray(result.tokens)[:rows], reference.tokens[:rows]
  ):
    raise RuntimeError(
      f'{name}: output differs from the baseline on examples {[e.index for e in batch_examples]}'
    )


def measure(
  settings: infer_settings.InferSettings,
  examples: Sequence[infer_inputs.Example],
  models: infer_run.Models,
  gammas: Sequence[int],
  log: Callable[[str], None] = print,
) -> dict[str, Tally]:
  """Decodes `examples` with every method (see the module docstring); {name: Tally}."""
  fns = method_fns(settings, models, gammas)
  tallies = {name: Tally() for name in [*fns, ENCODER]}
  max_length = decode_state.buffer_length(1, settings.max_new_tokens)  # the baseline's cache

  def encoder(encoder_tokens, rng, generated):
    return timing.prefill(
      models.target_params, encoder_tokens, model=models.target, max_length=max_length
    )

  fns[ENCODER] = encoder
  batches = batching.length_sorted_batches(examples, settings.batch_size)
  for i, batch_examples in enumerate(batches):
    length = batching.padded_length(batch_examples, settings.inputs_length)
    encoder_tokens = jnp.asarray(batching.pad_batch(batch_examples, settings.batch_size, length))
    rng = jax.random.fold_in(jax.random.PRNGKey(settings.seed), batch_examples[0].index)
    reference = generated = None
    for name, fn in fns.items():
      tally = tallies[name]
      if encoder_tokens.shape not in tally.compiled_shapes:  # compile outside the timing
        jax.block_until_ready(fn(encoder_tokens, rng, generated))
        tally.compiled_shapes.add(encoder_tokens.shape)
      seconds, result = timing.timed(lambda: fn(encoder_tokens, rng, generated))
      tally.seconds += seconds
      if name == ENCODER:
        continue
      result = jax.tree.map(np.asarray, result)
      if reference is None:  # the baseline, first
        reference, generated = result, jnp.asarray(result.tokens)
      else:
        _check_same(name, result, reference, batch_examples)
      rows = len(batch_examples)
      tally.lengths += [int(n) for n in result.lengths[:rows]]
      tally.tokens += int(result.lengths[:rows].sum())
      tally.target_calls += int(result.metrics.target_calls[:rows].sum())
    if (i + 1) % 50 == 0 or i + 1 == len(batches):
      log(f'{i + 1} / {len(batches)} batches')
  return tallies


def table(tallies: dict[str, Tally]) -> list[dict[str, Any]]:
  """One row per method: seconds, tokens, target calls, block efficiency, speedup."""
  base = tallies[BASELINE].seconds
  rows = []
  for name, t in tallies.items():
    decodes, calls = name != ENCODER, t.target_calls
    rows.append(
      {
        'method': name,
        'seconds': round(t.seconds, 3),
        'tokens': t.tokens if decodes else None,
        'target_calls': calls if decodes else None,
        'block_efficiency': round(t.tokens / calls, 3) if calls else None,
        'speedup': round(base / t.seconds, 3) if decodes and t.seconds else None,
        'share_of_baseline': round(t.seconds / base, 3) if not decodes and base else None,
      }
    )
  return rows


def format_table(rows: list[dict[str, Any]]) -> str:
  cell = lambda value: '-' if value is None else f'{value}'  # noqa: E731
  header = ['method', 'decode s', 'tokens', 'target calls', 'block efficiency']
  return markdown.table(
    header + ['speedup over baseline'],
    [
      [r['method'], f'{r["seconds"]:.2f}']
      + [cell(r[key]) for key in ('tokens', 'target_calls', 'block_efficiency')]
      + [
        cell(r['speedup']) if r['method'] != ENCODER else f'({r["share_of_baseline"]} of baseline)'
      ]
      for r in rows
    ],
  )


def run(settings: infer_settings.InferSettings, gammas: Sequence[int], json_out: str | None):
  """The measurement on a checked job (see the module docstring)."""
  with checks.user_errors():
    if not settings.sampling()[0].greedy:
      raise ValueError('the ceiling is measured under greedy decoding: TEMPERATURE must be 0')
    if not settings.exact:
      raise ValueError('the ceiling compares exact decodes: LENIENCE must be 1')
    if not settings.speculative:
      raise ValueError(
        "the ceiling needs the job's speculative mode: infer.modes must include 'speculative'"
      )
    if json_out is not None:
      checks.probe_writable(os.path.dirname(os.path.abspath(json_out)))
    inputs = infer_inputs.load_inputs(settings)
  machine = runtime.machine()
  models = infer_run.load_models(settings)
  print(
    f'{len(inputs.examples)} inputs at batch {settings.batch_size}, gammas {list(gammas)}, '
    f'decode path: {settings.decode_path().line}; load average {os.getloadavg()[0]:.2f}'
  )
  tallies = measure(settings, inputs.examples, models, gammas)
  load = markdown.load_line(machine)
  rows = table(tallies)
  print(format_table(rows))
  print(f'{runtime.cpu_line(machine)}, {machine["usable_cores"]} cores; {load}')
  result = {
    'rows': rows,
    'machine': machine,
    'num_examples': len(inputs.examples),
    'batch_size': settings.batch_size,
    'gammas': list(gammas),
  }
  if json_out is not None:
    markdown.write_json(json_out, result)
  return result


def main(argv: Sequence[str] | None = None) -> None:
  from speculative.jobs import gin_utils

  parser = gin_utils.runner_parser('infer', __doc__.splitlines()[0])
  parser.prog = 'python -m speculative.bench.ceiling'
  default, json_help = ','.join(map(str, DEFAULT_GAMMAS)), 'also write the table as JSON here'
  args, gammas = parse_gamma_arguments(parser, argv, default, json_help)

  @checks.settings_entry(infer_settings.InferSettings)
  def ceiling(settings: infer_settings.InferSettings):
    return run(settings, gammas, args.json_out)

  gin_utils.run_parsed(parser, args, ceiling, 'infer', default_gin_files=('configs/local/run.gin',))


if __name__ == '__main__':
  main()
