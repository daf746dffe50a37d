"""The cost model, measured: t(T) (one target `extend` call over T new tokens), c = draft step /
t(1), v(T) = t(T) / t(1), and the noise verdict of each estimate (docs/benchmark.md); the bytes a
decode step reads and the device's read rate (the paper-shape benchmark's bandwidth share).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any
from typing import Mapping
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import drafters as drafters_lib
from speculative import timing
from speculative.decode import batching
from speculative.decode import state as decode_state

MAX_SPREAD = 0.25
MIN_ROUNDS = 3
TARGET_STEP = "t(1)"
STOCK_STEP = "stock t(1)"
CACHED_PER_INPUT = ("encoder_decoder_attention/key/", "encoder_decoder_attention/value/")
TOO_NOISY = "too noisy to predict"  # the cell text where the noise verdict refused a prediction


@dataclasses.dataclass(frozen=True)
class Estimate:
  """The median and spread (interquartile range / median) of the resolved (finite, positive) of
  `rounds` per-round values (nan and inf if none); `unresolved`: the others."""

  value: float
  spread: float
  rounds: int
  unresolved: int


def estimate(samples: Sequence[float]) -> Estimate:
  if not len(samples):  # pylint: disable=g-explicit-length-test
    raise ValueError("no samples to estimate from")
  x = np.asarray(samples, np.float64)
  ok = x[np.isfinite(x) & (x > 0)]
  if not ok.size:
    return Estimate(math.nan, math.inf, len(x), len(x))
  median = float(np.median(ok))
  q25, q75 = np.percentile(ok, [25, 75])
  return Estimate(median, float((q75 - q25) / median), len(x), int(len(x) - ok.size))


def ratio_samples(
  numerator: Sequence[float], denominator: Sequence[float], scale: float = 1.0
) -> list[float]:
  """scale * numerator[r] / denominator[r] per round (nan where the denominator is not positive)."""
  if len(numerator) != len(denominator):
    raise ValueError(f"rounds differ: {len(numerator)} vs {len(denominator)}")
  return [scale * a / b if b > 0 else math.nan for a, b in zip(numerator, denominator)]


def judge(
  est: Estimate, what: str, *, minimum: float | None = None, max_spread: float = MAX_SPREAD
) -> str | None:
  """None if `est` is usable, else why not: fewer than MIN_ROUNDS rounds, a round not resolved
  above timer jitter, a spread above `max_spread`, or a value below `minimum` (v(T) < 1)."""
  if est.rounds < MIN_ROUNDS:
    return f"{what}: {est.rounds} timing rounds, too few to measure the noise (need {MIN_ROUNDS})"
  if est.unresolved:
    return f"{what}: not resolved above timer jitter in {est.unresolved} of {est.rounds} rounds"
  if not est.spread <= max_spread:
    return (
      f"{what} = {est.value:.3g}: spread (interquartile range / median over rounds) "
      f"{est.spread:.2f} > {max_spread:.2f}"
    )
  if minimum is not None and est.value < minimum:
    return f"{what} = {est.value:.3g} < {minimum:g}, physically impossible"
  return None


class NoiseLog:
  """Estimates by name and why the refused ones were, in `data` (the JSON-ready costs['noise'])."""

  def __init__(self, data: dict[str, Any] | None = None):
    empty = dict(max_spread=MAX_SPREAD, min_rounds=MIN_ROUNDS, estimates={}, refused={})
    self.data = empty if data is None else data

  def add(
    self, name: str, samples: Sequence[float], minimum: float | None = None, fallback=math.nan
  ) -> float:
    """Records (and judges) the estimate of `samples`; its value, or `fallback` if unresolved."""
    est = estimate(samples)
    self.data["estimates"][name] = dataclasses.asdict(est)
    reason = judge(est, name, minimum=minimum, max_spread=self.data["max_spread"])
    if reason:
      self.data["refused"][name] = reason
    return est.value if math.isfinite(est.value) else fallback

  def ratio(self, name, rounds, seconds, num: str, den: str, minimum=None, scale=1.0) -> float:
    """`add` of the per-round ratios of timers `num` / `den` (fallback: their `seconds`' ratio)."""
    samples = ratio_samples(rounds[num], rounds[den], scale)
    return self.add(name, samples, minimum, fallback=scale * seconds[num] / seconds[den])


def time_rounds(s, timers: Mapping[str, timing.Timer], **kwargs: Any):
  """timing.time_rounds with the timing settings `s` (every timer marginal unless `marginal` says)."""
  kwargs.setdefault("marginal", list(timers))
  return timing.time_rounds(timers, s.cost_repeats, s.cost_min_seconds, **kwargs)


def refusal(noise: Mapping[str, Any] | None, names: Sequence[str]) -> str | None:
  """Why any of the estimates `names` of a costs['noise'] is refused (None: all usable, or no
  noise record: measured before it existed)."""
  if not noise:
    return None
  return "; ".join(noise["refused"][n] for n in names if n in noise["refused"]) or None


def speedup_cell(speedup: float | None, suffix: str) -> str:
  """A predicted speedup's cell: TOO_NOISY where the noise verdict refused the prediction."""
  return TOO_NOISY if speedup is None else f"{speedup:.2f}{suffix}"


def v_key(num_tokens: int) -> str:
  return f"v({num_tokens})"


def c_key(drafter: str, detail: str = "") -> str:
  return f"c[{drafter}{', ' + detail if detail else ''}]"


def timer_owners(drafts: Mapping[str, tuple[Any, Any]]) -> dict[str, str]:
  """{drafter: the first drafter of `drafts` ({name: (model, params)}) with the same params}:
  drafters sharing a model share its timers."""
  owners: dict[str, str] = {}
  for name, (_, params) in drafts.items():
    owners[name] = next((o for o in owners if drafts[o][1] is params), name)
  return owners


def measure_extend_costs(
  target,
  target_params,
  encoder_tokens: np.ndarray,
  *,
  max_length: int,
  position: int,
  verify_lengths: Sequence[int],
  drafts: Mapping[str, tuple[Any, Any]],
  repeats: int,
  min_seconds: float,
  extra_timers: Mapping[str, timing.Timer] | None = None,
  marginal_extra: Sequence[str] = (),
  max_calls: Mapping[str, int] | None = None,
  keep_timers: dict[str, timing.Timer] | None = None,
) -> dict[str, Any]:
  """t(T) for T in {1} + verify_lengths and each draft model's step and c ({name: (model, params)}:
  one timer per params object), interleaved with `extra_timers` (jitted loops if in
  `marginal_extra`), on the cache of `encoder_tokens` [B, S] at `position`; `keep_timers` receives
  every timer. JSON-ready: target_step_s, target_extend_s, v, drafters, seconds, rounds, noise."""
  lengths = sorted(set([1] + [int(t) for t in verify_lengths]))
  args = dict(encoder_tokens=encoder_tokens, max_length=max_length, position=position)
  timers = {
    f"target_{t}": timing.extend_timer(target, target_params, num_tokens=t, **args) for t in lengths
  }
  draft_keys = {name: f"draft[{owner}]_1" for name, owner in timer_owners(drafts).items()}
  for name, (draft, params) in drafts.items():
    if draft_keys[name] == f"draft[{name}]_1":
      timers[draft_keys[name]] = timing.extend_timer(draft, params, num_tokens=1, **args)
  extra = dict(extra_timers or {})
  timers.update(extra)
  if keep_timers is not None:
    keep_timers.update(timers)
  marginal = [k for k in timers if k not in extra or k in marginal_extra]
  rounds, seconds = timing.time_rounds(
    timers, repeats, min_seconds, max_calls=max_calls, marginal=marginal
  )
  noise = NoiseLog()
  noise.add(TARGET_STEP, rounds["target_1"])
  costs: dict[str, Any] = {
    "batch_size": int(encoder_tokens.shape[0]),
    "position": position,
    "max_length": max_length,
    "target_step_s": seconds["target_1"],
    "target_extend_s": {str(t): seconds[f"target_{t}"] for t in lengths},
    "v": {"1": 1.0},
    "drafters": {},
  }
  for t in lengths[1:]:
    costs["v"][str(t)] = noise.ratio(v_key(t), rounds, seconds, f"target_{t}", "target_1", 1.0)
  for name, key in draft_keys.items():
    c = noise.ratio(c_key(name), rounds, seconds, key, "target_1")
    costs["drafters"][name] = {"kind": "model", "draft_step_s": seconds[key], "c": c}
  costs.update(seconds=seconds, rounds=rounds, noise=noise.data)
  return costs


def measure_costs(
  s, view, examples, batch_size: int, max_gamma: int, timers: dict, *, max_length: int | None = None
) -> dict[str, Any]:
  """The cost model of `view` (`methods.for_batch`) on the first input batch with the timing
  settings `s`: `measure_extend_costs` up to T = max_gamma + 1, the prefills, the stock-equivalent
  step and each draft model's 2-token (catch-up) call. Fills `timers`."""
  target, target_params, stock_target = view["target"], view["target_params"], view["stock_target"]
  draft_models = {
    name: (d.model, p)
    for name, (d, p) in view["drafters"].items()
    if isinstance(d, drafters_lib.ModelDrafter)
  }
  args = dict(
    encoder_tokens=batching.batches(examples, batch_size, s.inputs_length)[0][1],
    max_length=max_length or decode_state.buffer_length(1, s.max_new_tokens, max_gamma),
  )
  extend = functools.partial(timing.extend_timer, position=s.cost_position, **args)
  prefill = functools.partial(timing.prefill_timer, **args)
  extra = {
    "target_prefill": prefill(target, target_params),
    "stock_1": extend(stock_target, target_params, num_tokens=1),
    "stock_prefill": prefill(stock_target, target_params),
  }
  owners = timer_owners(draft_models)
  for name, (draft, draft_params) in draft_models.items():
    if owners[name] == name:
      extra[f"draft[{name}]_2"] = extend(draft, draft_params, num_tokens=2)
      extra[f"draft[{name}]_prefill"] = prefill(draft, draft_params)
  costs = measure_extend_costs(
    target,
    target_params,
    position=s.cost_position,
    verify_lengths=range(2, max_gamma + 2),
    drafts=draft_models,
    repeats=s.cost_repeats,
    min_seconds=s.cost_min_seconds,
    extra_timers=extra,
    marginal_extra=[k for k in extra if not k.endswith("prefill")],
    max_calls={k: 64 for k in extra if k.endswith("prefill")},
    keep_timers=timers,
    **args,
  )
  seconds = costs.pop("seconds")
  NoiseLog(costs["noise"]).add(STOCK_STEP, costs["rounds"]["stock_1"])
  costs["target_prefill_s"] = seconds["target_prefill"]
  costs["stock_equivalent_step_s"] = seconds["stock_1"]
  costs["stock_equivalent_prefill_s"] = seconds["stock_prefill"]
  for name, owner in owners.items():
    costs["drafters"][name].update(
      draft_catch_up_s=seconds[f"draft[{owner}]_2"],
      draft_prefill_s=seconds[f"draft[{owner}]_prefill"],
    )
  return costs


@functools.partial(jax.jit, static_argnames=("drafter", "gamma", "sampling"))
def repeat_propose(
  draft_params, state, tokens, lengths, rng, sampling_params, num_calls, *, drafter, gamma, sampling
):
  """`num_calls` chained `drafter.propose` calls at the same lengths (one fresh key per call) on
  `tokens` [B, L], valid on [0, lengths)."""
  batch = tokens.shape[0]

  def body(i, carry):
    state, tokens, acc = carry
    keys = jax.vmap(lambda row: jax.random.fold_in(jax.random.fold_in(rng, i), row))(
      jnp.arange(batch)
    )  # [B] typed keys, as the decode loop passes them
    proposal, state = drafter.propose(
      draft_params, state, tokens, lengths, gamma, keys, sampling, sampling_params
    )
    # Write a draft token just past the committed length (never read: rows are valid on
    # [0, lengths)), so the buffer is loop-variant and XLA cannot hoist a stateless propose.
    tokens = jax.vmap(lambda row, t, n: row.at[n].set(t))(tokens, proposal.tokens[:, 0], lengths)
    # The acceptance step reads the whole q (residual max(0, p - q)); so does this sum.
    return state, tokens, acc + jnp.sum(proposal.probs)

  state, _, acc = jax.lax.fori_loop(0, num_calls, body, (state, tokens, jnp.zeros((), jnp.float32)))
  return acc, state


def measure_propose(
  drafter,
  draft_params,
  gamma: int,
  noise: NoiseLog,
  name: str,
  *,
  s,
  encoder_tokens: np.ndarray,
  max_length: int,
  sampling,
  sampling_params,
  target_step: timing.Timer,
) -> tuple[float, float]:
  """(seconds per `drafter.propose(gamma)` call of any Drafter at s.cost_position, c = that /
  gamma / target step, recorded in `noise` as `name`), interleaved with `target_step`."""
  batch, position = encoder_tokens.shape[0], s.cost_position
  tokens = np.ones((batch, max_length), np.int32)
  tokens[:, : min(position, encoder_tokens.shape[1])] = encoder_tokens[:, :position]
  tokens[:, 0] = 0
  tokens = jnp.asarray(tokens)
  lengths = jnp.full((batch,), position, jnp.int32)
  state = drafter.init(
    draft_params, tokens[:, :position], lengths, max_length, jnp.asarray(encoder_tokens)
  )
  propose = functools.partial(repeat_propose, drafter=drafter, gamma=gamma, sampling=sampling)
  rng = jax.random.key(0)  # typed keys, as the decode loop passes them
  timers = {
    "propose": lambda n: propose(
      draft_params, state, tokens, lengths, rng, sampling_params, jnp.asarray(n, jnp.int32)
    ),
    "target_1": target_step,
  }
  rounds, seconds = time_rounds(s, timers)
  c = noise.ratio(name, rounds, seconds, "propose", "target_1", scale=1.0 / gamma)
  return seconds["propose"], c


def decode_step_kernels(
  param_shapes: Mapping[str, tuple[int, ...]], *, logits_via_embedding: bool
) -> dict[str, tuple[int, ...]]:
  """{name: shape} of the weights one decode step reads from a flat T5 `param_shapes()`."""
  return {
    name: tuple(shape)
    for name, shape in param_shapes.items()
    if (name.startswith("decoder/") and not any(part in name for part in CACHED_PER_INPUT))
    or (logits_via_embedding and name.startswith("token_embedder/"))
  }


def weight_bytes(shapes: Mapping[str, tuple[int, ...]], itemsize: int = 4) -> int:
  return int(sum(math.prod(shape) for shape in shapes.values()) * itemsize)


@jax.jit
def read_loop(array, num_calls):
  """`num_calls` full reads of `array`, summed into a float32 scalar; each read is scaled by the
  sum so far, so no read is hoisted out of the loop or skipped."""

  def body(_, acc):
    scale = (1.0 + 1e-9 * acc).astype(array.dtype)
    return acc + jnp.sum(array * scale, dtype=jnp.float32) * 1e-12

  return jax.lax.fori_loop(0, num_calls, body, jnp.zeros((), jnp.float32))


def measure_read_rate(s) -> dict[str, Any]:
  """Bytes / the marginal time of one full read of an array of s.read_rate_bytes in
  s.storage_dtype on the device (the paper-shape benchmark's; JSON-ready)."""
  dtype, itemsize = s.storage_dtype, jnp.dtype(s.storage_dtype).itemsize
  array = jnp.ones((max(1, s.read_rate_bytes // itemsize // 1024), 1024), dtype)
  rounds, seconds = time_rounds(s, {"read": lambda n: read_loop(array, jnp.asarray(n, jnp.int32))})
  noise = NoiseLog()
  noise.add("read rate", rounds["read"])
  size = int(array.size * itemsize)
  return {
    "bytes": size,
    "dtype": jnp.dtype(dtype).name,
    "read_s": seconds["read"],
    "read_rate_gb_s": size / seconds["read"] / 1e9,
    "noise": noise.data,
  }
