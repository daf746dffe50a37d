"""What the benchmark's own pages (drafters_page, spectr_page) share: the pair's options and
loading, their inputs (and the benchmark's), decode functions, batch-1 costs and timing, the command
line; their Markdown is bench/markdown.py's."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Any
from typing import Callable
from typing import Sequence

from speculative import sampling as sampling_lib
from speculative.bench import costs as costs_lib
from speculative.bench import methods as methods_lib
from speculative.bench import sweep
from speculative.data import tasks
from speculative.decode import batching
from speculative.infer import inputs as infer_inputs
from speculative.jobs import checks
from speculative.jobs import gin_utils
from speculative.models import memory
from speculative.models import t5 as t5_lib

COST_POSITION = 16  # decoder position of the timed cost-model calls (mid-sentence)
ROLES = ('target', 'draft')


def add_pair_args(
  parser: argparse.ArgumentParser, *, num_examples: int, output_dir: str, quick: str
) -> None:
  """Every page's options: the models, inputs, decode length, repeats, seed, output, --quick."""
  for role in ROLES:
    parser.add_argument(f'--{role}_gin', default=f'configs/models/embedded_{role}.gin')
    parser.add_argument(f'--{role}_macro', default=f'EMBEDDED_{role.upper()}')
    parser.add_argument(f'--{role}_checkpoint', default=f'models/embedded/{role}.msgpack')
  random_init = 'use random weights for a missing checkpoint (smoke runs only)'
  parser.add_argument('--allow_random_init', action='store_true', help=random_init)
  for name, default in (('split', 'test'), ('num_examples', num_examples), ('inputs_length', 64)):
    parser.add_argument(f'--{name}', type=type(default), default=default)
  for name, default in (('max_new_tokens', 64), ('repeats', 3), ('seed', 0)):
    parser.add_argument(f'--{name}', type=int, default=default)
  parser.add_argument('--output_dir', default=output_dir)
  parser.add_argument('--quick', action='store_true', help=f'{quick}; 1 repeat (given options win)')
  gin_utils.add_debug_flag(parser)


def parse_args(
  parser: argparse.ArgumentParser,
  argv: Sequence[str] | None,
  quick: dict[str, Any],
  positive: Sequence[str] = (),
  lists: dict[str, type] | None = None,
) -> argparse.Namespace:
  """The options; under --quick, `quick`'s values for those not given (a given option wins). The
  shared counts and the page's `positive` ones (ints, or lists of them) must be >= 1, and each
  of `lists` ({option: kind}) a comma-separated list of `kind`: else one error line, before any
  model loads."""
  if parser.parse_known_args(argv)[0].quick:
    parser.set_defaults(**quick)
  args = parser.parse_args(argv)
  for name in ('num_examples', 'inputs_length', 'max_new_tokens', 'repeats', *positive):
    given = getattr(args, name)
    if min(given if isinstance(given, list) else [given], default=0) < 1:
      parser.error(f'--{name} must be >= 1, got {given}')
  for name, kind in (lists or {}).items():
    try:
      values(getattr(args, name), kind)
    except ValueError:
      parser.error(
        f'--{name} must be a comma-separated list of {kind.__name__}, got {getattr(args, name)!r}'
      )
  return args


def values(text: str, kind: type) -> list[Any]:
  """The comma-separated values of an option, as `kind`."""
  return [kind(x.strip()) for x in text.split(',') if x.strip()]


@dataclasses.dataclass(frozen=True)
class Pair:
  """The models and params; `descriptions`: where the weights came from; `names`: the tables'."""

  target: t5_lib.T5
  target_params: Any
  draft: t5_lib.T5
  draft_params: Any
  descriptions: dict[str, str]
  names: dict[str, str]


def load_pair(args: argparse.Namespace) -> Pair:
  """The pair the options name (a missing checkpoint is an error unless --allow_random_init)."""
  option = lambda role, name: getattr(args, f'{role}_{name}')
  # Relative weights paths missing here are the repository's, as the runners' are.
  target, draft = (
    (
      gin_utils.load_macro(option(role, 'gin'), option(role, 'macro'), t5_lib.T5Config),
      checks.resolve_input_path(option(role, 'checkpoint')),
    )
    for role in ROLES
  )
  *models, descriptions = methods_lib.build_pair(
    target, draft, allow_random_init=args.allow_random_init, seed=args.seed
  )
  names = {
    role: f'{option(role, "macro").lower()} ({memory.num_params(model.config) / 1e6:.1f}M)'
    for role, model in zip(ROLES, models[0::2])
  }
  return Pair(*models, descriptions, names)


def load_pair_and_examples(
  args: argparse.Namespace,
) -> tuple[Pair, list[infer_inputs.Example], int]:
  """(pair, the split's first sentences that fit, how many skipped); bad options: user errors."""
  with checks.user_errors():
    pair = load_pair(args)
    examples, skipped = split_examples(args.split, args.inputs_length, args.num_examples)
  return pair, examples, skipped


def command_line(main: Callable[[Sequence[str]], Any], argv: Sequence[str]) -> None:
  """Runs a page's `main(argv)`: a user error is one `error:` line unless --debug."""
  gin_utils.quiet_native_logs()
  debug = '--debug' in argv or bool(os.environ.get(gin_utils.DEBUG_ENV))
  gin_utils.call_with_user_errors(lambda: main(argv), 'error: ', debug)


def build_drafters(pair: Pair, names: Sequence[str], **options: Any) -> dict[str, Any]:
  """{name: (drafter, params)} of the registry's drafters `names` on the pair."""
  models = {role: getattr(pair, role) for role in ('target', 'target_params', 'draft')}
  return methods_lib.build_drafters(
    names, **models, draft_params=pair.draft_params, warnings=[], **options
  )


def model_drafter(pair: Pair, **options: Any) -> Any:
  """The registry's 'model' drafter."""
  return build_drafters(pair, ['model'], **options)['model'][0]


def decode_fn(
  pair: Pair, max_new_tokens: int, temperature: float, drafter: Any = None, **options: Any
) -> Callable[..., Any]:
  """methods.decode_fn of the pair: exact sampling at `temperature` (0: argmax) up to EOS."""
  sampling, sampling_params = sampling_lib.make_sampling(temperature)
  options = {'draft_params': pair.draft_params, **options, 'eos_id': tasks.EOS_ID}
  options.update(max_new_tokens=max_new_tokens, sampling=sampling, sampling_params=sampling_params)
  return methods_lib.decode_fn(pair.target, pair.target_params, drafter, **options)


def extend_costs(pair: Pair, encoder_tokens: Any, **kwargs: Any) -> dict[str, Any]:
  """costs.measure_extend_costs of the pair (draft: 'model') at COST_POSITION."""
  drafts = {'model': (pair.draft, pair.draft_params)}
  kwargs.update(position=COST_POSITION, drafts=drafts, min_seconds=0.1)
  return costs_lib.measure_extend_costs(pair.target, pair.target_params, encoder_tokens, **kwargs)


def time_rows(
  methods: Sequence[methods_lib.Method],
  examples: Sequence[infer_inputs.Example],
  args: argparse.Namespace,
  temperature: float,
) -> tuple[list[Any], dict[str, dict[str, Any]]]:
  """Times `methods` at batch 1 as the sweep does: (batches, {name: sweep.method_row})."""
  batches = batching.batches(examples, 1, args.inputs_length)
  sweep.time_methods(methods, batches, repeats=args.repeats, seed=args.seed, log=print)
  group = dict(batch_size=1, temperature=temperature, examples=len(examples))
  return batches, {m.name: sweep.method_row(m, batches, group) for m in methods}


def _load_examples(task, split, path, prefix, inputs_length: int, num_examples: int, skip: bool):
  """(the first inputs of a task's split or of a file, how many too long were skipped)."""
  limit = None if skip else num_examples
  examples = infer_inputs.load_examples(task, split, path, prefix, inputs_length, limit)
  skipped = 0
  if skip:
    kept = [e for e in examples if not e.truncated][:num_examples]
    last = kept[-1].index if kept else -1
    skipped = sum(e.truncated for e in examples if e.index <= last)
    examples = kept
  if len(examples) < num_examples:
    logging.warning('only %d examples available (asked for %d)', len(examples), num_examples)
  if not examples:
    raise ValueError('no benchmark inputs')
  return examples, skipped


def split_examples(
  split: str, inputs_length: int, num_examples: int
) -> tuple[list[infer_inputs.Example], int]:
  """`_load_examples` of a LibreOffice En-De split's TSV file (no TensorFlow), long ones skipped."""
  path, prefix = str(tasks.split_path(split)), tasks.TRANSLATE_EN_DE_PREFIX
  return _load_examples(None, split, path, prefix, inputs_length, num_examples, True)


def benchmark_inputs(
  source: Any, *, num_examples: int, skip_truncated: bool
) -> tuple[list[infer_inputs.Example], str, str]:
  """(examples, their source described, the task label) of a BenchmarkSettings."""
  task, input_file, inputs_length = source.task, source.input_file, source.inputs_length
  if source.examples is None:
    if (task is None) == (input_file is None):
      raise ValueError('give exactly one of task and input_file')
    fields = (task, source.split, input_file, source.input_prefix, inputs_length)
    examples, skipped = _load_examples(*fields, num_examples, skip_truncated)
    described = (
      f'the first {len(examples)} examples of `{task}` / {source.split}'
      if task
      else f'the first {len(examples)} lines of `{input_file}`'
    )
    if skipped:
      described += f' ({skipped} longer than {inputs_length} tokens skipped)'
    task_label = task or os.path.basename(input_file)
  else:
    examples = list(source.examples)[:num_examples]
    described = f'{len(examples)} given examples ({examples[0].inputs.split()[0]}...)'
    task_label = 'given inputs'
  for e in examples:
    if len(e.input_tokens) > inputs_length:
      raise ValueError(
        f'example {e.index} has {len(e.input_tokens)} input tokens > inputs_length={inputs_length}'
      )
  return examples, described, task_label
