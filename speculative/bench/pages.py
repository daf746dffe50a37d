"""What the benchmark's own pages share (`drafters_page`: docs/drafters/, `spectr_page`:
docs/spectr/; the results page includes both): the options naming the target/draft pair and its
inputs, loading them (bench/inputs.py), the record of how a page was made (command, machine:
bench/machine.py), timing decoding methods at batch 1 (bench/sweep.py) and writing a page's files.

Not run by itself; the pages are:

  python -m speculative.bench.drafters_page --quick --allow_random_init
  python -m speculative.bench.spectr_page --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
from typing import Any
from typing import Callable
from typing import Sequence

from speculative.bench import inputs as inputs_lib
from speculative.bench import machine as machine_lib
from speculative.bench import methods as methods_lib
from speculative.bench import sweep
from speculative.checkpoints import files
from speculative.decode import batching
from speculative.decode import modes
from speculative.infer import inputs as infer_inputs
from speculative.jobs import checks
from speculative.jobs import gin_utils
from speculative.models import t5 as t5_lib


def add_pair_args(
  parser: argparse.ArgumentParser, *, num_examples: int, output_dir: str, quick: str
) -> None:
  """The options every page has: the two models (gin file, macro, weights), the inputs (the first
  `--num_examples` sentences of a LibreOffice En-De split that fit `--inputs_length`), the decode
  length, the timing repeats, the seed, the output folder, and `--quick` (its help: `quick`; one
  repeat)."""
  for role in ('target', 'draft'):
    parser.add_argument(f'--{role}_gin', default=f'configs/models/embedded_{role}.gin')
    parser.add_argument(f'--{role}_macro', default=f'EMBEDDED_{role.upper()}')
    parser.add_argument(f'--{role}_checkpoint', default=f'models/embedded/{role}.msgpack')
  parser.add_argument(
    '--allow_random_init',
    action='store_true',
    help='use random weights for a missing checkpoint (smoke runs only)',
  )
  parser.add_argument('--split', default='test')
  parser.add_argument('--num_examples', type=int, default=num_examples)
  parser.add_argument('--inputs_length', type=int, default=64)
  parser.add_argument('--max_new_tokens', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=3)
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--output_dir', default=output_dir)
  parser.add_argument('--quick', action='store_true', help=f'{quick}; 1 repeat')
  gin_utils.add_debug_flag(parser)


def values(text: str, kind: type) -> list[Any]:
  """The comma-separated values of an option, as `kind`."""
  return [kind(x.strip()) for x in text.split(',') if x.strip()]


@dataclasses.dataclass(frozen=True)
class Pair:
  """The target and draft models with their params; `descriptions` say where the weights came
  from, `names` are the tables' model names (macro and size)."""

  target: t5_lib.T5
  target_params: Any
  draft: t5_lib.T5
  draft_params: Any
  descriptions: dict[str, str]
  names: dict[str, str]

  @property
  def random_init(self) -> bool:
    return any('random init' in d for d in self.descriptions.values())


def load_pair(args: argparse.Namespace) -> Pair:
  """The pair the `add_pair_args` options name (inputs.build_pair: a missing checkpoint is an
  error unless --allow_random_init)."""
  configs = {
    role: gin_utils.load_macro(
      getattr(args, f'{role}_gin'), getattr(args, f'{role}_macro'), t5_lib.T5Config
    )
    for role in ('target', 'draft')
  }
  target, target_params, draft, draft_params, descriptions = inputs_lib.build_pair(
    # Relative weights paths missing here are the repository's, as the runners' are.
    (configs['target'], checks.resolve_input_path(args.target_checkpoint)),
    (configs['draft'], checks.resolve_input_path(args.draft_checkpoint)),
    allow_random_init=args.allow_random_init,
    seed=args.seed,
  )
  names = {
    role: f'{getattr(args, f"{role}_macro").lower()} ({inputs_lib.num_params(params) / 1e6:.1f}M)'
    for role, params in (('target', target_params), ('draft', draft_params))
  }
  return Pair(target, target_params, draft, draft_params, descriptions, names)


def model_drafter(pair: Pair, **options: Any) -> Any:
  """The registry's 'model' drafter on the pair's draft model (`options`, e.g. stop_below, go to
  the registry)."""
  built = methods_lib.build_drafters(
    ['model'],
    target=pair.target,
    target_params=pair.target_params,
    draft=pair.draft,
    draft_params=pair.draft_params,
    warnings=[],
    **options,
  )
  return built['model'][0]


def decode_fn(pair: Pair, drafter: Any = None, **options: Any) -> Callable[..., Any]:
  """fn(encoder_tokens [B, S], rng) -> DecodeResult (modes.decode_fns): the target's baseline
  without a drafter, else speculative decoding with `drafter` on the pair's draft params;
  `options` are DecodeOptions fields, sampling_params and lenience."""
  fns = modes.decode_fns(pair.target, pair.target_params, drafter, pair.draft_params, **options)
  return fns[modes.BASELINE if drafter is None else modes.SPECULATIVE]


def load_pair_and_examples(
  args: argparse.Namespace,
) -> tuple[Pair, list[infer_inputs.Example], int]:
  """(`load_pair`, then `load_examples`): a bad gin file or macro, a missing checkpoint or no
  inputs is the user's to fix (one line at the command line, `command_line`)."""
  with checks.user_errors():
    pair = load_pair(args)
    examples, skipped = load_examples(args)
  return pair, examples, skipped


def command_line(main: Callable[[Sequence[str]], Any], argv: Sequence[str]) -> None:
  """Runs a page's `main(argv)`; a user error (raised inside `checks.user_errors`) prints one
  `error:` line and exits with status 2, unless --debug (or SPECULATIVE_DEBUG) lets its traceback
  through. TensorFlow's and XLA's start-up log lines are silenced as the runners' are."""
  gin_utils.quiet_native_logs()
  debug = '--debug' in argv or bool(os.environ.get(gin_utils.DEBUG_ENV))
  gin_utils.call_with_user_errors(lambda: main(argv), 'error: ', debug)


def load_examples(args: argparse.Namespace) -> tuple[list[infer_inputs.Example], int]:
  """(examples, how many were skipped as longer than --inputs_length): the first --num_examples
  sentences of --split that fit."""
  return inputs_lib.load_examples(
    inputs_lib.split_file(args.split, args.inputs_length),
    num_examples=args.num_examples,
    skip_truncated=True,
  )


def record(module: str, argv: Sequence[str] | None) -> dict[str, Any]:
  """How a page was made: its command (as `python -m module ...`), when, and the machine."""
  arguments = list(sys.argv[1:] if argv is None else argv)
  return dict(
    command=' '.join(['python', '-m', module, *arguments]),
    generated_at=datetime.datetime.now().isoformat(timespec='seconds'),
    machine=machine_lib.machine_info(),
  )


def machine_line(machine: dict[str, Any]) -> str:
  """The machine in one line, with the load average at the start and (if recorded) the end."""
  loads = [machine['load_average_start'][0]] + machine.get('load_average_end', [])[:1]
  return (
    f'{machine["cpu"]}, {machine["usable_cores"]} usable of {machine["cpu_count"]} cores, jax '
    f'{machine["jax"]} ({machine["backend"]}), load average '
    + ' -> '.join(f'{x:.1f}' for x in loads)
  )


def time_rows(
  methods: Sequence[methods_lib.Method],
  examples: Sequence[infer_inputs.Example],
  *,
  inputs_length: int,
  temperature: float,
  repeats: int,
  seed: int,
  log: Callable[[str], None] = print,
) -> tuple[list[Any], dict[str, dict[str, Any]]]:
  """Times `methods` at batch 1 as the benchmark's sweep does (compiled on the first input, then
  every input decoded `repeats` times by every method, interleaved); returns the input batches
  and {method name: sweep.method_row} (walltime = sum over inputs of the median over repeats)."""
  batches = batching.batches(examples, 1, inputs_length)
  sweep.time_methods(methods, batches, repeats=repeats, seed=seed, log=log)
  group = dict(batch_size=1, temperature=temperature, examples=len(examples))
  return batches, {m.name: sweep.method_row(m, batches, group) for m in methods}


def write_page(output_dir: str, outputs: dict[str, str | dict[str, Any]]) -> None:
  """Writes each {file name: text, or a report written as JSON} into output_dir, atomically."""
  os.makedirs(output_dir, exist_ok=True)
  for name, content in outputs.items():
    text = content if isinstance(content, str) else json.dumps(content, indent=2) + '\n'
    files.write_atomic(os.path.join(output_dir, name), text)
