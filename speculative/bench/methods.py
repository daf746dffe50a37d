"""What the benchmark compares: its models on each batch size's decode path (packed once for our
CPU kernels where `kernels.policy` picks them), the drafters and the decoding methods of a group."""

from __future__ import annotations

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
from speculative.data import tasks
from speculative.decode import modes
from speculative.decode import options as decode_options
from speculative.jobs import checks
from speculative.models import memory
from speculative.models import t5 as t5_lib
from speculative.t5x_adapter import stock as t5x_stock

BASELINE = "baseline"
STOCK_EQUIVALENT = "stock_equivalent"
STOCK_T5X = "stock_t5x"
SPECULATIVE = "speculative"


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
) -> tuple[t5_lib.T5, Any, t5_lib.T5 | None, Any, dict[str, str]]:
  """(target, its params, draft, its params, descriptions); ValueError if vocabularies differ."""
  target_model, target_params, target_desc = build_model(
    *target, allow_random_init=allow_random_init, seed=seed, what="target"
  )
  descriptions = {"target": target_desc}
  if draft is None or draft[0] is None:
    return target_model, target_params, None, None, descriptions
  draft_model, draft_params, descriptions["draft"] = build_model(
    *draft, allow_random_init=allow_random_init, seed=seed + 1, what="draft"
  )
  if draft_model.vocab_size != target_model.vocab_size:
    raise ValueError(
      f"draft and target vocabularies differ: {draft_model.vocab_size} != {target_model.vocab_size}"
    )
  return target_model, target_params, draft_model, draft_params, descriptions


def bench_models(
  target, target_params, draft, draft_params, names, kernels_setting, batch_sizes, warnings
):
  """Models and drafters; 'packed': their weights packed where some batch size uses our kernels."""
  pair = dict(target=target, target_params=target_params, draft=draft, draft_params=draft_params)
  drafters = build_drafters(names, warnings=warnings, **pair)
  models = {
    "target": target,
    "target_params": target_params,
    # T5X's decoding structure on XLA's dot, whatever our own path: the stock reference stays stock.
    "stock_target": t5_lib.T5(target.config, cache_cross_kv=False, use_kernels=False),
    "drafters": drafters,
  }
  if not any(kernels.policy.choose(kernels_setting, int(b)).kernels for b in batch_sizes):
    return models
  # The packed target, and the draft model's tree wherever it sits inside a drafter's params (a
  # model drafter's, or a composite's).
  packed_draft = None if draft is None else t5_lib.pack_decode_params(draft, draft_params)

  def swap(params):
    is_draft = lambda x: draft_params is not None and x is draft_params  # noqa: E731
    return jax.tree_util.tree_map(
      lambda x: packed_draft if is_draft(x) else x, params, is_leaf=is_draft
    )

  models["packed"] = {
    "target_params": t5_lib.pack_decode_params(target, target_params),
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
  names: Sequence[str],
  *,
  target: Any,
  target_params: Any,
  draft: Any,
  draft_params: Any,
  warnings: list[str],
  **options: Any,
) -> dict[str, tuple[Any, Any]]:
  """{name: (drafter, params)}; only the first must build (others: a line in `warnings`)."""
  built = {}
  for name in names:
    try:
      drafter, params = drafters_lib.build_drafter(
        name,
        vocab_size=target.vocab_size,
        draft_model=draft,
        draft_params=draft_params,
        train_sequences=train_sequences,
        target_model=target,
        target_params=target_params,
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


def decode_fn(target, target_params, drafter=None, draft_params=None, **options) -> Callable:
  """The baseline's decode fn without a drafter, else speculative (SpecTr given num_drafts)."""
  fns = modes.decode_fns(target, target_params, drafter, draft_params, **options)
  if drafter is None:
    return fns[modes.BASELINE]
  return fns[modes.SPECULATIVE if options.get("num_drafts") is None else modes.SPECTR]


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
