"""What the benchmark and its own pages compare: the pair (loaded, or random-init for smoke runs),
its inputs, its models on each batch size's decode path (packed once for our CPU kernels where
`kernels.policy` picks them), the drafters and the decoding methods of a group; and what the pages
(drafters_page, spectr_page) share besides: their options and command line, batch-1 costs."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
from typing import Any
from typing import Callable
from typing import Sequence

import jax
import numpy as np

from speculative import checkpoints
from speculative import drafters as drafters_lib
from speculative import kernels
from speculative import sampling as sampling_lib
from speculative.bench import costs as costs_lib
from speculative.data import tasks
from speculative.decode import modes
from speculative.decode import options as decode_options
from speculative.infer import inputs as infer_inputs
from speculative.jobs import checks
from speculative.jobs import gin_utils
from speculative.models import memory
from speculative.models import t5 as t5_lib
from speculative.t5x_adapter import stock as t5x_stock

BASELINE = "baseline"
STOCK_EQUIVALENT = "stock_equivalent"
STOCK_T5X = "stock_t5x"
SPECULATIVE = "speculative"
COST_POSITION = 16  # decoder position of the pages' timed cost-model calls (mid-sentence)
ROLES = ("target", "draft")


@dataclasses.dataclass(frozen=True)
class Pair:
  """The models and params (no draft model: None); `descriptions`: where the weights came from;
  `names`: the pages' tables' names."""

  target: t5_lib.T5
  target_params: Any
  draft: t5_lib.T5 | None = None
  draft_params: Any = None
  descriptions: dict[str, str] = dataclasses.field(default_factory=dict)
  names: dict[str, str] = dataclasses.field(default_factory=dict)


def check_checkpoint(
  config: t5_lib.T5Config, checkpoint: str | None, *, allow_random_init: bool, what: str
) -> bool:
  """True: `checkpoint` loads (checked); False: random weights stand in (allow_random_init)."""
  if checkpoint and os.path.exists(checkpoint):
    checkpoints.check_weights(f"{what}_checkpoint", checkpoint, config)
    return True
  if not allow_random_init:
    raise FileNotFoundError(
      f"{what} checkpoint does not exist: {checkpoint!r} (set "
      "allow_random_init=True, e.g. --quick, to time random weights)"
    )
  return False


def build_model(
  config: t5_lib.T5Config, checkpoint: str | None, *, allow_random_init: bool, seed: int, what: str
) -> tuple[t5_lib.T5, Any, str]:
  """(model, f32 params, description) of `checkpoint`, or random-init (`check_checkpoint`)."""
  if check_checkpoint(config, checkpoint, allow_random_init=allow_random_init, what=what):
    with checks.user_errors(checkpoints.LOAD_ERRORS):
      model, params = checkpoints.load_model(config, checkpoint)
    source = checkpoint
  else:
    if checkpoint:
      logging.warning(
        "%s checkpoint %s does not exist: using RANDOM-INIT weights", what, checkpoint
      )
    model = t5_lib.T5(config)
    params = jax.jit(model.init_params)(jax.random.PRNGKey(seed))
    source = f"random init (seed {seed})"
  return model, params, f"{source}, {memory.num_params(config) / 1e6:.1f}M params"


def build_pair(
  target: tuple[t5_lib.T5Config, str | None],
  draft: tuple[t5_lib.T5Config, str | None] | None,
  *,
  allow_random_init: bool,
  seed: int,
) -> Pair:
  """The pair of (config, checkpoint)s, with descriptions; ValueError if vocabularies differ."""
  target_model, target_params, target_desc = build_model(
    *target, allow_random_init=allow_random_init, seed=seed, what="target"
  )
  descriptions = {"target": target_desc}
  if draft is None or draft[0] is None:
    return Pair(target_model, target_params, descriptions=descriptions)
  draft_model, draft_params, descriptions["draft"] = build_model(
    *draft, allow_random_init=allow_random_init, seed=seed + 1, what="draft"
  )
  if draft_model.vocab_size != target_model.vocab_size:
    raise ValueError(
      f"draft and target vocabularies differ: {draft_model.vocab_size} != {target_model.vocab_size}"
    )
  return Pair(target_model, target_params, draft_model, draft_params, descriptions)


def load_pair(args: argparse.Namespace) -> Pair:
  """The pair a page's options name (a missing checkpoint is an error unless --allow_random_init)."""
  option = lambda role, name: getattr(args, f"{role}_{name}")
  # Relative weights paths missing here are the repository's, as the runners' are.
  target, draft = (
    (
      gin_utils.load_macro(option(role, "gin"), option(role, "macro"), t5_lib.T5Config),
      checks.resolve_input_path(option(role, "checkpoint")),
    )
    for role in ROLES
  )
  pair = build_pair(target, draft, allow_random_init=args.allow_random_init, seed=args.seed)
  names = {
    role: f"{option(role, 'macro').lower()} ({memory.num_params(model.config) / 1e6:.1f}M)"
    for role, model in zip(ROLES, (pair.target, pair.draft))
  }
  return dataclasses.replace(pair, names=names)


def bench_models(pair: Pair, names, kernels_setting, batch_sizes, warnings):
  """Models and drafters; 'packed': their weights packed where some batch size uses our kernels."""
  drafters = build_drafters(names, pair, warnings)
  models = {
    "target": pair.target,
    "target_params": pair.target_params,
    # T5X's decoding structure on XLA's dot, whatever our own path: the stock reference stays stock.
    "stock_target": t5_lib.T5(pair.target.config, cache_cross_kv=False, use_kernels=False),
    "drafters": drafters,
  }
  if not any(kernels.policy.choose(kernels_setting, int(b)).kernels for b in batch_sizes):
    return models
  # The packed target, and the draft model's tree wherever it sits inside a drafter's params (a
  # model drafter's, or a composite's).
  draft, draft_params = pair.draft, pair.draft_params
  packed_draft = None if draft is None else t5_lib.pack_decode_params(draft, draft_params)

  def swap(params):
    is_draft = lambda x: draft_params is not None and x is draft_params  # noqa: E731
    return jax.tree_util.tree_map(
      lambda x: packed_draft if is_draft(x) else x, params, is_leaf=is_draft
    )

  models["packed"] = {
    "target_params": t5_lib.pack_decode_params(pair.target, pair.target_params),
    "drafters": {name: (d, swap(p)) for name, (d, p) in drafters.items()},
  }
  return models


def for_batch(models: dict[str, Any], batch_size: int, setting: str) -> dict[str, Any]:
  """`models` on the path `kernels.policy` picks for this batch size ('decode_path')."""
  path = kernels.policy.choose(setting, batch_size)
  view = dict(models, decode_path={"name": path.name, "line": path.line})
  if path.kernels:
    view.update(models["packed"])
  return view


@functools.lru_cache(maxsize=1)
def train_sequences() -> list[np.ndarray]:
  """The LibreOffice training targets as decoder streams (the embedded pair's training data)."""
  return tasks.target_token_sequences("train")


def build_drafters(
  names: Sequence[str], pair: Pair, warnings: list[str], **options: Any
) -> dict[str, tuple[Any, Any]]:
  """{name: (drafter, params)} on the pair; only the first must build (others: a line in
  `warnings`)."""
  built = {}
  target = pair.target
  for name in names:
    try:
      drafter, params = drafters_lib.build_drafter(
        name,
        vocab_size=target.vocab_size,
        draft_model=pair.draft,
        draft_params=pair.draft_params,
        train_sequences=train_sequences,
        target_model=target,
        target_params=pair.target_params,
        **options,
      )
    except Exception as e:  # pylint: disable=broad-except
      if name == names[0]:
        raise
      # A secondary drafter that cannot be built must not cost the whole run; the page says so.
      warnings.append(f"drafter {name!r} skipped: {type(e).__name__}: {e}")
      logging.warning("drafter %r skipped: %s", name, e)
      continue
    if drafter.vocab_size != target.vocab_size:
      raise ValueError(
        f"drafter {name!r} vocab_size {drafter.vocab_size} != target {target.vocab_size}"
      )
    built[name] = (drafter, params)
  return built


def model_drafter(pair: Pair, **options: Any) -> Any:
  """The registry's 'model' drafter on the pair."""
  return build_drafters(["model"], pair, [], **options)["model"][0]


def decode_fn(target, target_params, drafter=None, draft_params=None, **options) -> Callable:
  """The baseline's decode fn without a drafter, else speculative (SpecTr given num_drafts)."""
  fns = modes.decode_fns(target, target_params, drafter, draft_params, **options)
  if drafter is None:
    return fns[modes.BASELINE]
  return fns[modes.SPECULATIVE if options.get("num_drafts") is None else modes.SPECTR]


def pair_decode_fn(
  pair: Pair, max_new_tokens: int, temperature: float, drafter: Any = None, **options: Any
) -> Callable[..., Any]:
  """`decode_fn` of the pair: exact sampling at `temperature` (0: argmax) up to EOS."""
  sampling, sampling_params = sampling_lib.make_sampling(temperature)
  options = {"draft_params": pair.draft_params, **options, "eos_id": tasks.EOS_ID}
  options.update(max_new_tokens=max_new_tokens, sampling=sampling, sampling_params=sampling_params)
  return decode_fn(pair.target, pair.target_params, drafter, **options)


@dataclasses.dataclass
class Method:
  """A decoding method of a group (`decode`: encoder_tokens, rng -> result) and its measurements."""

  name: str
  kind: str
  decode: Callable[[jax.Array, jax.Array], Any]
  drafter: str | None = None
  gamma: int | None = None
  drafter_obj: Any = None
  first_call_s: float | None = None  # compile + one decode of the first input batch
  times: list[list[float]] = dataclasses.field(default_factory=list)  # [input batch][repeat]
  outputs: list[dict[str, np.ndarray]] = dataclasses.field(default_factory=list)


def decode_outputs(kind: str, result: Any) -> dict[str, np.ndarray]:
  """Host copies: tokens [B, N], lengths [B], and the per-row counters of the result's metrics."""
  if kind == STOCK_T5X:
    tokens = np.asarray(result)
    is_eos = tokens == tasks.EOS_ID
    lengths = np.where(is_eos.any(1), is_eos.argmax(1) + 1, tokens.shape[1])
    tokens = np.where(np.arange(tokens.shape[1])[None] < lengths[:, None], tokens, 0)
    zeros = np.zeros(tokens.shape[0])  # no draft: nothing drafted or accepted
    counters = dict.fromkeys(("drafted", "accepted", "alpha_sum"), zeros)
    counters["invalid"] = zeros.astype(bool)
    return dict(counters, tokens=tokens, lengths=lengths, target_calls=lengths)
  # Every counter of the result's metrics (a SpecTr decode adds selections and single_alpha_sum).
  metrics = {
    f.name: np.asarray(getattr(result.metrics, f.name)) for f in dataclasses.fields(result.metrics)
  }
  return {"tokens": np.asarray(result.tokens), "lengths": np.asarray(result.lengths), **metrics}


def stock_t5x_decoder(s: Any, params: Any) -> Callable[..., Any] | None:
  """`t5x_stock.make_stock_t5x_decode` at a temperature=..., or None where `s` does not time it."""
  if not s.use_t5x:
    return None
  return functools.partial(
    t5x_stock.make_stock_t5x_decode, s.target_config, params, max_new_tokens=s.max_new_tokens
  )


def make_methods(b: Any, temperature: float, gammas, sampling, sampling_params) -> list[Method]:
  """A group's methods: baseline, stock ones and speculative per drafter x its `gammas`."""
  target, target_params = b.models["target"], b.models["target_params"]
  options = decode_options.DecodeOptions(
    max_new_tokens=b.settings.max_new_tokens, sampling=sampling, eos_id=tasks.EOS_ID
  )

  def decode(model, drafter=None, draft_params=None, **replaced):
    return decode_fn(
      model,
      target_params,
      drafter,
      draft_params,
      options=dataclasses.replace(options, **replaced),
      sampling_params=sampling_params,
    )

  methods = [
    Method(BASELINE, BASELINE, decode(target)),
    Method(STOCK_EQUIVALENT, STOCK_EQUIVALENT, decode(b.models["stock_target"])),
  ]
  if b.stock_t5x_decode is not None:
    methods.append(Method(STOCK_T5X, STOCK_T5X, b.stock_t5x_decode(temperature=temperature)))
  for name, built in b.models["drafters"].items():
    for gamma in gammas.get(name, ()):
      fn = decode(target, *built, gamma=gamma)
      methods.append(Method(f"{name}/gamma={gamma}", SPECULATIVE, fn, name, gamma, built))
  return methods


def extend_costs(pair: Pair, encoder_tokens: Any, **kwargs: Any) -> dict[str, Any]:
  """costs.measure_extend_costs of the pair (draft: 'model') at COST_POSITION (the pages')."""
  drafts = {"model": (pair.draft, pair.draft_params)}
  kwargs.update(position=COST_POSITION, drafts=drafts, min_seconds=0.1)
  return costs_lib.measure_extend_costs(pair.target, pair.target_params, encoder_tokens, **kwargs)


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
    logging.warning("only %d examples available (asked for %d)", len(examples), num_examples)
  if not examples:
    raise ValueError("no benchmark inputs")
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
      raise ValueError("give exactly one of task and input_file")
    fields = (task, source.split, input_file, source.input_prefix, inputs_length)
    examples, skipped = _load_examples(*fields, num_examples, skip_truncated)
    described = (
      f"the first {len(examples)} examples of `{task}` / {source.split}"
      if task
      else f"the first {len(examples)} lines of `{input_file}`"
    )
    if skipped:
      described += f" ({skipped} longer than {inputs_length} tokens skipped)"
    task_label = task or os.path.basename(input_file)
  else:
    examples = list(source.examples)[:num_examples]
    described = f"{len(examples)} given examples ({examples[0].inputs.split()[0]}...)"
    task_label = "given inputs"
  for e in examples:
    if len(e.input_tokens) > inputs_length:
      raise ValueError(
        f"example {e.index} has {len(e.input_tokens)} input tokens > inputs_length={inputs_length}"
      )
  return examples, described, task_label


def add_pair_args(
  parser: argparse.ArgumentParser, *, num_examples: int, output_dir: str, quick: str
) -> None:
  """Every page's options: the models, inputs, decode length, repeats, seed, output, --quick."""
  for role in ROLES:
    parser.add_argument(f"--{role}_gin", default=f"configs/models/embedded_{role}.gin")
    parser.add_argument(f"--{role}_macro", default=f"EMBEDDED_{role.upper()}")
    parser.add_argument(f"--{role}_checkpoint", default=f"models/embedded/{role}.msgpack")
  random_init = "use random weights for a missing checkpoint (smoke runs only)"
  parser.add_argument("--allow_random_init", action="store_true", help=random_init)
  for name, default in (("split", "test"), ("num_examples", num_examples), ("inputs_length", 64)):
    parser.add_argument(f"--{name}", type=type(default), default=default)
  for name, default in (("max_new_tokens", 64), ("repeats", 3), ("seed", 0)):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--output_dir", default=output_dir)
  parser.add_argument("--quick", action="store_true", help=f"{quick}; 1 repeat (given options win)")
  gin_utils.add_debug_flag(parser)


def parse_page_args(
  parser: argparse.ArgumentParser,
  argv: Sequence[str] | None,
  quick: dict[str, Any],
  positive: Sequence[str] = (),
  lists: dict[str, type] | None = None,
) -> argparse.Namespace:
  """A page's options; under --quick, `quick`'s values for those not given (a given option wins).
  The shared counts and the page's `positive` ones (ints, or lists of them) must be >= 1, and each
  of `lists` ({option: kind}) a comma-separated list of `kind`: else one error line, before any
  model loads."""
  if parser.parse_known_args(argv)[0].quick:
    parser.set_defaults(**quick)
  args = parser.parse_args(argv)
  for name in ("num_examples", "inputs_length", "max_new_tokens", "repeats", *positive):
    given = getattr(args, name)
    if min(given if isinstance(given, list) else [given], default=0) < 1:
      parser.error(f"--{name} must be >= 1, got {given}")
  for name, kind in (lists or {}).items():
    try:
      values(getattr(args, name), kind)
    except ValueError:
      parser.error(
        f"--{name} must be a comma-separated list of {kind.__name__}, got {getattr(args, name)!r}"
      )
  return args


def values(text: str, kind: type) -> list[Any]:
  """The comma-separated values of an option, as `kind`."""
  return [kind(x.strip()) for x in text.split(",") if x.strip()]


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
  debug = "--debug" in argv or bool(os.environ.get(gin_utils.DEBUG_ENV))
  gin_utils.call_with_user_errors(lambda: main(argv), "error: ", debug)
