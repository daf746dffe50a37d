"""The cost model, measured: t(T), c and v(T), with a noise verdict (one home for every benchmark).

  t(T) = seconds of one target `extend` call over T new tokens (batch rows as given);
  c    = draft single-token step / target single-token step;
  v(T) = t(T) / t(1).

Every time is the marginal per-call time of a jitted loop of calls ((time of 2n calls - time of n
calls) / n: no dispatch, no work hoisted out of the loop), on a realistic cache (the encoder run on
real inputs, the decoder cache prefilled to a mid-sentence position).

Noise. The timers are run in interleaved rounds: every timer once per round, the order rotating
from round to round, so a change of background load hits all of them alike. A ratio (c, v(T)) is
computed per round, from the two times of the same round, and summarized by its median over rounds
and its spread = interquartile range / median of the per-round ratios. An estimate is refused
(`judge` returns the reason) when
  * fewer than MIN_ROUNDS rounds were timed (the spread cannot be measured),
  * some round's time was not resolved above timer jitter (a non-positive marginal time),
  * the spread exceeds MAX_SPREAD (0.25: the middle half of the rounds disagree by more than a
    quarter of the value, so a predicted speedup could be off by as much),
  * it is physically impossible (v(T) < 1: a T-token call cannot be cheaper than a 1-token call).
A prediction (EXP) and the loop overheads derived from refused estimates are reported as "too
noisy to predict" instead of a number.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import re
import time
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

MAX_SPREAD = 0.25
MIN_ROUNDS = 3
Timer = Callable[[int], Any]  # fn(num_calls) -> a jax value to block on


# ----------------------------------------------------------------------------------------------
# Estimates and the noise verdict (pure functions of per-round times).
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Median over rounds of a per-round quantity, with its relative spread.

  Attributes:
    value: median of the resolved (finite, positive) per-round values; nan if none.
    spread: (75th - 25th percentile) / median of the resolved values; inf if none.
    rounds: number of rounds.
    unresolved: rounds whose value was not finite and positive (timer jitter above the signal).
  """

  value: float
  spread: float
  rounds: int
  unresolved: int

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def estimate(samples: Sequence[float]) -> Estimate:
  """The Estimate of per-round values `samples`."""
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
  """Per-round ratios scale * numerator[r] / denominator[r] (nan where the denominator is not
  positive), pairing the two times measured in the same round."""
  if len(numerator) != len(denominator):
    raise ValueError(f"rounds differ: {len(numerator)} vs {len(denominator)}")
  return [scale * a / b if b > 0 else math.nan for a, b in zip(numerator, denominator)]


def judge(
  est: Estimate, what: str, *, minimum: float | None = None, max_spread: float = MAX_SPREAD
) -> str | None:
  """None if `est` is usable, else why it is too noisy (see the module docstring)."""
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
  """Estimates by name and the reasons of the refused ones, kept in `data` (the JSON-ready
  `costs['noise']`: max_spread, min_rounds, estimates {name: Estimate}, refused {name: reason})."""

  def __init__(self, data: dict[str, Any] | None = None, max_spread: float = MAX_SPREAD):
    self.data = (
      data
      if data is not None
      else {"max_spread": max_spread, "min_rounds": MIN_ROUNDS, "estimates": {}, "refused": {}}
    )

  def add(
    self,
    name: str,
    samples: Sequence[float],
    minimum: float | None = None,
    fallback: float = math.nan,
  ) -> float:
    """Records the estimate of `samples` under `name`; returns its value, or `fallback` where no
    round resolved it (the estimate is refused either way)."""
    est = estimate(samples)
    self.data["estimates"][name] = est.to_json()
    reason = judge(est, name, minimum=minimum, max_spread=self.data["max_spread"])
    if reason:
      self.data["refused"][name] = reason
    return est.value if math.isfinite(est.value) else fallback


def refusal(noise: Mapping[str, Any] | None, names: Sequence[str]) -> str | None:
  """The reasons (joined) why any of the estimates `names` in a `costs['noise']` dict is refused;
  None if all are usable or the costs carry no noise record (measured before it existed)."""
  if not noise:
    return None
  reasons = [noise["refused"][n] for n in names if n in noise["refused"]]
  return "; ".join(reasons) or None


def v_key(num_tokens: int) -> str:
  return f"v({num_tokens})"


def c_key(drafter: str, detail: str = "") -> str:
  return f"c[{drafter}{', ' + detail if detail else ''}]"


TARGET_STEP = "t(1)"
STOCK_STEP = "stock t(1)"


# ----------------------------------------------------------------------------------------------
# Timing primitives.
# ----------------------------------------------------------------------------------------------


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
  """Seconds for fn() including `block_until_ready` on its output."""
  start = time.perf_counter()
  out = fn()
  jax.block_until_ready(out)
  return time.perf_counter() - start, out


@functools.partial(jax.jit, static_argnames=("model",))
def repeat_extend(params, cache, tokens, start, num_calls, *, model):
  """`num_calls` chained `extend` calls on the same positions (what a decode step does).

  The tokens fed at call i+1 are the argmax of call i's logits, so nothing is loop-invariant (XLA
  cannot hoist work out of the loop) and the full logits are needed, as in greedy decoding.
  tokens: [B, T] int32; start: [B] int32; num_calls: [] int32 (an array: no recompile per count).
  """

  def body(_, carry):
    cache, tokens = carry
    logits, cache = model.extend(params, cache, tokens, start)  # [B, T, V]
    return cache, jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, T]

  cache, tokens = jax.lax.fori_loop(0, num_calls, body, (cache, tokens))
  return tokens, cache


@functools.partial(jax.jit, static_argnames=("model", "max_length"))
def prefill(params, encoder_tokens, *, model, max_length):
  """What every decode pays once: encoder, cache allocation, the start-token prefill call."""
  batch = encoder_tokens.shape[0]
  cache = model.init_cache(params, batch, max_length, encoder_tokens)
  logits, cache = model.extend(
    params, cache, jnp.zeros((batch, 1), jnp.int32), jnp.zeros((batch,), jnp.int32)
  )
  return logits, cache


def cache_at_position(model, params, encoder_tokens: np.ndarray, *, max_length: int, position: int):
  """A decoder cache of `model` on `encoder_tokens` [B, S], prefilled on [0, position)."""
  batch = encoder_tokens.shape[0]
  cache = model.init_cache(params, batch, max_length, jnp.asarray(encoder_tokens))
  prefix = jnp.asarray(
    encoder_tokens[:, :position]
    if encoder_tokens.shape[1] >= position
    else np.ones((batch, position), np.int32)
  )
  _, cache = model.extend(params, cache, prefix, jnp.zeros((batch,), jnp.int32))
  return jax.block_until_ready(cache)


def extend_timer(
  model, params, encoder_tokens: np.ndarray, *, num_tokens: int, max_length: int, position: int
) -> Timer:
  """fn(n): n chained `extend` calls over [B, num_tokens] tokens written at `position`."""
  batch = encoder_tokens.shape[0]
  cache = cache_at_position(model, params, encoder_tokens, max_length=max_length, position=position)
  tokens = jnp.ones((batch, num_tokens), jnp.int32)
  start = jnp.full((batch,), position, jnp.int32)
  return lambda n: repeat_extend(
    params, cache, tokens, start, jnp.asarray(n, jnp.int32), model=model
  )


def prefill_timer(model, params, encoder_tokens: np.ndarray, *, max_length: int) -> Timer:
  enc = jnp.asarray(encoder_tokens)
  return lambda n: [prefill(params, enc, model=model, max_length=max_length) for _ in range(n)]


def calibrate(fn: Timer, min_seconds: float, max_calls: int = 4096) -> int:
  """Compiles and warms fn(num_calls) (a jitted loop), then returns the num_calls at which one
  timing lasts >= min_seconds (so dispatch overhead is negligible)."""
  timed(lambda: fn(1))  # compile + warm
  num_calls = 1
  while num_calls < max_calls:
    seconds, _ = timed(lambda: fn(num_calls))  # pylint: disable=cell-var-from-loop
    if seconds >= min_seconds:
      break
    num_calls = min(
      max_calls, max(num_calls * 2, int(num_calls * min_seconds / max(seconds, 1e-6)) + 1)
    )
  return num_calls


def time_rounds(
  timers: Mapping[str, Timer],
  repeats: int,
  min_seconds: float,
  *,
  max_calls: Mapping[str, int] | None = None,
  marginal: Sequence[str] = (),
) -> tuple[dict[str, list[float]], dict[str, float]]:
  """Per-round seconds per call of each timer fn(num_calls), in `repeats` interleaved rounds (every
  timer once per round, the order rotating per round).

  Timers named in `marginal` are jitted loops: their per-round time per call is the marginal one,
  (time of 2n calls - time of n calls) / n, which excludes what a loop pays once per invocation
  (dispatch, and work XLA hoisted out of the loop, exactly as inside a decode loop); it may be
  non-positive when timer jitter exceeds the signal. The others: time of n calls / n.

  Returns (per-round seconds per call {name: [repeats]}, whole-invocation median seconds per call
  {name: s}, a fallback for marginal times that noise left unresolved).
  """
  max_calls = dict(max_calls or {})
  calls = {
    name: calibrate(fn, min_seconds, max_calls.get(name, 4096)) for name, fn in timers.items()
  }
  names = list(timers)
  rounds: dict[str, list[float]] = {name: [] for name in names}
  whole: dict[str, list[float]] = {name: [] for name in names}
  for r in range(repeats):
    shift = r % len(names)
    for name in names[shift:] + names[:shift]:
      fn, n = timers[name], calls[name]
      single = timed(lambda: fn(n))[0]  # pylint: disable=cell-var-from-loop
      whole[name].append(single / n)
      if name in marginal:
        rounds[name].append((timed(lambda: fn(2 * n))[0] - single) / n)  # pylint: disable=cell-var-from-loop
      else:
        rounds[name].append(single / n)
  return rounds, {name: float(np.median(t)) for name, t in whole.items()}


def per_call_seconds(
  rounds: Mapping[str, Sequence[float]], whole: Mapping[str, float], name: str
) -> float:
  """Median per-call seconds of timer `name` over its resolved rounds; the whole-invocation time
  per call (an upper bound) when no round resolved it, with a warning."""
  value = estimate(rounds[name]).value
  if not value > 0:
    logging.warning(
      "timer %s: marginal time per call not resolved above noise; using the "
      "whole-invocation time per call, %.3g s",
      name,
      whole[name],
    )
    value = whole[name]
  return float(value)


# ----------------------------------------------------------------------------------------------
# The cost model of a target and its draft models.
# ----------------------------------------------------------------------------------------------


def shared_drafts(drafts: Mapping[str, tuple[Any, Any]]) -> dict[str, str]:
  """{drafter name: the first drafter name with the same params object} (one timer per model)."""
  owners: dict[str, str] = {}
  for name, (_, params) in drafts.items():
    owners[name] = next((other for other in owners if drafts[other][1] is params), name)
  return owners


def draft_prefix(name: str) -> str:
  return f"draft[{name}]"


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
  extra_timers: Mapping[str, Timer] | None = None,
  marginal_extra: Sequence[str] = (),
  max_calls: Mapping[str, int] | None = None,
  keep_timers: dict[str, Timer] | None = None,
) -> dict[str, Any]:
  """t(T) for T in {1} + verify_lengths, each draft model's step and c, all interleaved.

  Args:
    target, target_params: the target model (T5 API) and its params.
    encoder_tokens: [B, S] int32 real inputs (the batch the costs are for).
    max_length, position: the decoder cache length and the position the new tokens are written at.
    verify_lengths: the T > 1 of v(T).
    drafts: {name: (draft model, params)}; drafters sharing a params object share one timer.
    repeats, min_seconds: timing rounds, and the least duration of one timed loop.
    extra_timers: more timers to interleave (their per-call seconds land in 'seconds'); those in
      `marginal_extra` are jitted loops (marginal time); max_calls caps their calibration.
    keep_timers: if given, receives every timer by name (e.g. to re-time 'target_1' later).

  Returns a JSON-ready dict: target_step_s, target_extend_s {T: s}, v {T: ratio}, drafters
  {name: {kind: 'model', draft_step_s, c}}, seconds {extra timer: s}, rounds {timer: [per-round
  seconds]}, noise (see NoiseLog).
  """
  timer_args = dict(encoder_tokens=encoder_tokens, max_length=max_length, position=position)
  lengths = sorted(set([1] + [int(t) for t in verify_lengths]))
  timers: dict[str, Timer] = {
    f"target_{t}": extend_timer(target, target_params, num_tokens=t, **timer_args) for t in lengths
  }
  draft_keys = {name: f"{draft_prefix(owner)}_1" for name, owner in shared_drafts(drafts).items()}
  for name, key in draft_keys.items():
    if key not in timers:
      draft, draft_params = drafts[name]
      timers[key] = extend_timer(draft, draft_params, num_tokens=1, **timer_args)
  extra = dict(extra_timers or {})
  timers.update(extra)
  if keep_timers is not None:
    keep_timers.update(timers)
  rounds, whole = time_rounds(
    timers,
    repeats,
    min_seconds,
    max_calls=max_calls,
    marginal=[k for k in timers if k not in extra or k in marginal_extra],
  )
  seconds = {name: per_call_seconds(rounds, whole, name) for name in timers}

  noise = NoiseLog()
  noise.add(TARGET_STEP, rounds["target_1"])
  step = seconds["target_1"]
  costs: dict[str, Any] = {
    "batch_size": int(encoder_tokens.shape[0]),
    "position": position,
    "max_length": max_length,
    "target_step_s": step,
    "target_extend_s": {str(t): seconds[f"target_{t}"] for t in lengths},
    "v": {"1": 1.0},
    "drafters": {},
    "seconds": {name: seconds[name] for name in extra},
    "rounds": rounds,
  }
  for t in lengths[1:]:
    costs["v"][str(t)] = noise.add(
      v_key(t),
      ratio_samples(rounds[f"target_{t}"], rounds["target_1"]),
      minimum=1.0,
      fallback=seconds[f"target_{t}"] / step,
    )
  for name, key in draft_keys.items():
    costs["drafters"][name] = {
      "kind": "model",
      "draft_step_s": seconds[key],
      "c": noise.add(
        c_key(name), ratio_samples(rounds[key], rounds["target_1"]), fallback=seconds[key] / step
      ),
    }
  costs["noise"] = noise.data
  return costs


def loop_body_matmuls(compiled_hlo: str) -> int | None:
  """Number of `dot` ops executed per iteration of the (largest) while loop of an optimized HLO
  module, following called computations; None if no loop is found.

  Used to check whether XLA hoisted loop-invariant work (e.g. the cross-attention K/V projection of
  the fixed encoder output) out of a decode loop."""
  computations: dict[str, list[str]] = {}
  current = None
  for line in compiled_hlo.splitlines():
    match = re.match(r"^(?:ENTRY )?(%?[\w.\-]+) ", line)
    if match and line.rstrip().endswith("{"):
      current = match.group(1)
      computations[current] = []
    elif current is not None:
      computations[current].append(line)

  def count(name: str, seen: set[str]) -> int:
    if name in seen or name not in computations:
      return 0
    seen.add(name)
    total = 0
    for line in computations[name]:
      total += len(re.findall(r"= \S+ dot\(", line))
      for callee in re.findall(
        r"(?:calls|to_apply|body|condition|branch_computations)="
        r"\{?(%?[\w.\-]+)",
        line,
      ):
        total += count(callee, seen)
    return total

  bodies = re.findall(r"body=(%?[\w.\-]+)", compiled_hlo)
  if not bodies:
    return None
  return max(count(body, set()) for body in bodies)


def decode_step_matmuls(
  model, params, encoder_tokens: np.ndarray, *, max_length: int, position: int
) -> int | None:
  """Matmuls per iteration of the compiled single-token `repeat_extend` loop of `model`."""
  batch = encoder_tokens.shape[0]
  cache = cache_at_position(model, params, encoder_tokens, max_length=max_length, position=position)
  try:
    hlo = (
      repeat_extend.lower(
        params,
        cache,
        jnp.ones((batch, 1), jnp.int32),
        jnp.full((batch,), position, jnp.int32),
        jnp.asarray(1, jnp.int32),
        model=model,
      )
      .compile()
      .as_text()
    )
  except Exception as e:  # pylint: disable=broad-except  # a diagnostic only
    logging.warning("could not inspect the compiled decode step: %s", e)
    return None
  return loop_body_matmuls(hlo)


def measure_costs(
  *,
  target,
  target_params,
  stock_target,
  draft_models: Mapping[str, Any],
  encoder_tokens: np.ndarray,
  max_length: int,
  verify_lengths: Sequence[int],
  position: int,
  repeats: int,
  min_seconds: float,
  check_hoisting: bool = True,
  keep_timers: dict[str, Timer] | None = None,
) -> dict[str, Any]:
  """The benchmark's cost model for one batch size: `measure_extend_costs` plus the prefill times,
  the stock-equivalent step, each draft model's 2-token (catch-up) call and, if `check_hoisting`,
  the matmuls per compiled decode step of ours and the stock-equivalent loop."""
  timer_args = dict(encoder_tokens=encoder_tokens, max_length=max_length)
  extra = {
    "target_prefill": prefill_timer(target, target_params, **timer_args),
    "stock_1": extend_timer(
      stock_target, target_params, num_tokens=1, position=position, **timer_args
    ),
    "stock_prefill": prefill_timer(stock_target, target_params, **timer_args),
  }
  owners = shared_drafts(draft_models)
  for owner in set(owners.values()):
    draft, draft_params = draft_models[owner]
    prefix = draft_prefix(owner)
    extra[f"{prefix}_2"] = extend_timer(
      draft, draft_params, num_tokens=2, position=position, **timer_args
    )
    extra[f"{prefix}_prefill"] = prefill_timer(draft, draft_params, **timer_args)
  costs = measure_extend_costs(
    target,
    target_params,
    encoder_tokens,
    max_length=max_length,
    position=position,
    verify_lengths=verify_lengths,
    drafts=draft_models,
    repeats=repeats,
    min_seconds=min_seconds,
    extra_timers=extra,
    marginal_extra=[k for k in extra if not k.endswith("prefill")],
    max_calls={k: 64 for k in extra if k.endswith("prefill")},
    keep_timers=keep_timers,
  )
  seconds = costs.pop("seconds")
  NoiseLog(costs["noise"]).add(STOCK_STEP, costs["rounds"]["stock_1"])
  costs["target_prefill_s"] = seconds["target_prefill"]
  costs["stock_equivalent_step_s"] = seconds["stock_1"]
  costs["stock_equivalent_prefill_s"] = seconds["stock_prefill"]
  if check_hoisting:
    # XLA's loop-invariant code motion may hoist the per-step cross-attention K/V projection of the
    # (loop-invariant) encoder output out of the loop, making the stock-equivalent loop do exactly
    # the per-step work of ours. Record the matmuls per step of both, as evidence.
    matmuls = functools.partial(
      decode_step_matmuls, encoder_tokens=encoder_tokens, max_length=max_length, position=position
    )
    costs["loop_matmuls"] = {
      "baseline": matmuls(target, target_params),
      "stock_equivalent": matmuls(stock_target, target_params),
    }
  for name, owner in owners.items():
    prefix = draft_prefix(owner)
    costs["drafters"][name].update(
      draft_catch_up_s=seconds[f"{prefix}_2"], draft_prefill_s=seconds[f"{prefix}_prefill"]
    )
  return costs


@functools.partial(jax.jit, static_argnames=("drafter", "gamma", "sampling"))
def repeat_propose(
  draft_params, state, tokens, lengths, rng, sampling_params, num_calls, *, drafter, gamma, sampling
):
  """`num_calls` chained `drafter.propose` calls at the same lengths (one fresh key per call).

  tokens: [B, L] int32 stream buffer, valid on [0, lengths); lengths: [B] int32; rng: a typed key.
  """
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
  *,
  encoder_tokens: np.ndarray,
  max_length: int,
  position: int,
  gamma: int,
  sampling,
  sampling_params,
  target_step: Timer,
  repeats: int,
  min_seconds: float,
) -> tuple[float, list[float], float]:
  """Seconds per `drafter.propose(gamma)` call (generic: any Drafter) at a mid-sentence length,
  interleaved with the target step timer `target_step`; returns (seconds, per-round c samples =
  propose / gamma / target step, c from the medians: the fallback where no round resolved c)."""
  batch = encoder_tokens.shape[0]
  tokens = np.ones((batch, max_length), np.int32)
  tokens[:, : min(position, encoder_tokens.shape[1])] = encoder_tokens[:, :position]
  tokens[:, 0] = 0
  tokens = jnp.asarray(tokens)
  lengths = jnp.full((batch,), position, jnp.int32)
  state = drafter.init(
    draft_params, tokens[:, :position], lengths, max_length, jnp.asarray(encoder_tokens)
  )
  rng = jax.random.key(0)  # typed keys, as the decode loop passes them
  timer = lambda n: repeat_propose(  # noqa: E731
    draft_params,
    state,
    tokens,
    lengths,
    rng,
    sampling_params,
    jnp.asarray(n, jnp.int32),
    drafter=drafter,
    gamma=gamma,
    sampling=sampling,
  )
  rounds, whole = time_rounds(
    {"propose": timer, "target_1": target_step},
    repeats,
    min_seconds,
    marginal=["propose", "target_1"],
  )
  propose_s = per_call_seconds(rounds, whole, "propose")
  return (
    propose_s,
    ratio_samples(rounds["propose"], rounds["target_1"], scale=1.0 / gamma),
    propose_s / gamma / per_call_seconds(rounds, whole, "target_1"),
  )


def retime(timer: Timer, repeats: int, min_seconds: float) -> float:
  """Seconds per call of one jitted-loop timer, again (e.g. t(1) after the sweep: load drift)."""
  rounds, whole = time_rounds({"t": timer}, repeats, min_seconds, marginal=["t"])
  return per_call_seconds(rounds, whole, "t")
