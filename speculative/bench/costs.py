"""The cost model, measured: t(T), c and v(T), with a noise verdict (one home for every benchmark).

  t(T) = seconds of one target `extend` call over T new tokens (batch rows as given);
  c    = draft single-token step / target single-token step;
  v(T) = t(T) / t(1).

Every time is the marginal per-call time of a jitted loop of calls ((time of 2n calls - time of n
calls) / n: no dispatch, no work hoisted out of the loop), on a realistic cache (the encoder run on
real inputs, the decoder cache prefilled to a mid-sentence position).

The noise verdict of every estimate is bench/noise.py; the timers and timing rounds bench/timing.py
(both re-exported here, the one home every benchmark imports).
"""

from __future__ import annotations

import functools
import logging
import re
from typing import Any
from typing import Mapping
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from speculative.bench import noise as bench_noise
from speculative.bench import timing

__all__ = [
  'decode_step_matmuls',
  'draft_prefix',
  'loop_body_matmuls',
  'measure_costs',
  'measure_extend_costs',
  'measure_propose',
  'shared_drafts',
]


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
  extra_timers: Mapping[str, timing.Timer] | None = None,
  marginal_extra: Sequence[str] = (),
  max_calls: Mapping[str, int] | None = None,
  keep_timers: dict[str, timing.Timer] | None = None,
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
  lengths = sorted(set([1] + [int(t) for t in verify_lengths]))
  timers, draft_keys = _extend_timers(
    target,
    target_params,
    drafts,
    lengths,
    encoder_tokens=encoder_tokens,
    max_length=max_length,
    position=position,
  )
  extra = dict(extra_timers or {})
  timers.update(extra)
  if keep_timers is not None:
    keep_timers.update(timers)
  marginal = [k for k in timers if k not in extra or k in marginal_extra]
  rounds, whole = timing.time_rounds(
    timers, repeats, min_seconds, max_calls=max_calls, marginal=marginal
  )
  seconds = {name: timing.per_call_seconds(rounds, whole, name) for name in timers}
  model = _extend_cost_model(rounds, seconds, lengths, draft_keys)
  noise = model.pop("noise")
  return {
    "batch_size": int(encoder_tokens.shape[0]),
    "position": position,
    "max_length": max_length,
    **model,
    "seconds": {name: seconds[name] for name in extra},
    "rounds": rounds,
    "noise": noise,
  }


def _extend_timers(
  target, target_params, drafts, lengths: Sequence[int], **timer_args
) -> tuple[dict[str, timing.Timer], dict[str, str]]:
  """({timer name: Timer}, {drafter: its timer name}): target extend(T) for T in `lengths`, and one
  T=1 timer per distinct draft model (drafters sharing a params object share it)."""
  timers: dict[str, timing.Timer] = {
    f"target_{t}": timing.extend_timer(target, target_params, num_tokens=t, **timer_args)
    for t in lengths
  }
  draft_keys = {name: f"{draft_prefix(owner)}_1" for name, owner in shared_drafts(drafts).items()}
  for name, key in draft_keys.items():
    if key not in timers:
      draft, draft_params = drafts[name]
      timers[key] = timing.extend_timer(draft, draft_params, num_tokens=1, **timer_args)
  return timers, draft_keys


def _extend_cost_model(
  rounds: Mapping[str, Sequence[float]],
  seconds: Mapping[str, float],
  lengths: Sequence[int],
  draft_keys: Mapping[str, str],
) -> dict[str, Any]:
  """t(1), t(T), v(T) and each draft's step and c from the timing rounds, with the noise record."""
  noise = bench_noise.NoiseLog()
  noise.add(bench_noise.TARGET_STEP, rounds["target_1"])
  step = seconds["target_1"]
  costs: dict[str, Any] = {
    "target_step_s": step,
    "target_extend_s": {str(t): seconds[f"target_{t}"] for t in lengths},
    "v": {"1": 1.0},
    "drafters": {},
  }
  for t in lengths[1:]:
    costs["v"][str(t)] = noise.add(
      bench_noise.v_key(t),
      bench_noise.ratio_samples(rounds[f"target_{t}"], rounds["target_1"]),
      minimum=1.0,
      fallback=seconds[f"target_{t}"] / step,
    )
  for name, key in draft_keys.items():
    costs["drafters"][name] = {
      "kind": "model",
      "draft_step_s": seconds[key],
      "c": noise.add(
        bench_noise.c_key(name),
        bench_noise.ratio_samples(rounds[key], rounds["target_1"]),
        fallback=seconds[key] / step,
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
  cache = timing.cache_at_position(
    model, params, encoder_tokens, max_length=max_length, position=position
  )
  try:
    hlo = (
      timing.repeat_extend.lower(
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
  keep_timers: dict[str, timing.Timer] | None = None,
) -> dict[str, Any]:
  """The benchmark's cost model for one batch size: `measure_extend_costs` plus the prefill times,
  the stock-equivalent step, each draft model's 2-token (catch-up) call and, if `check_hoisting`,
  the matmuls per compiled decode step of ours and the stock-equivalent loop."""
  owners = shared_drafts(draft_models)
  extra = _prefill_and_stock_timers(
    target, target_params, stock_target, draft_models, owners, encoder_tokens, max_length, position
  )
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
  bench_noise.NoiseLog(costs["noise"]).add(bench_noise.STOCK_STEP, costs["rounds"]["stock_1"])
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


def _prefill_and_stock_timers(
  target,
  target_params,
  stock_target,
  draft_models: Mapping[str, Any],
  owners: Mapping[str, str],
  encoder_tokens: np.ndarray,
  max_length: int,
  position: int,
) -> dict[str, timing.Timer]:
  """The timers `measure_costs` adds: the prefills, the stock-equivalent step and each draft
  model's 2-token (catch-up) call."""
  timer_args = dict(encoder_tokens=encoder_tokens, max_length=max_length)
  extra = {
    "target_prefill": timing.prefill_timer(target, target_params, **timer_args),
    "stock_1": timing.extend_timer(
      stock_target, target_params, num_tokens=1, position=position, **timer_args
    ),
    "stock_prefill": timing.prefill_timer(stock_target, target_params, **timer_args),
  }
  for owner in set(owners.values()):
    draft, draft_params = draft_models[owner]
    prefix = draft_prefix(owner)
    extra[f"{prefix}_2"] = timing.extend_timer(
      draft, draft_params, num_tokens=2, position=position, **timer_args
    )
    extra[f"{prefix}_prefill"] = timing.prefill_timer(draft, draft_params, **timer_args)
  return extra


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
  target_step: timing.Timer,
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
  timer = timing.propose_timer(
    drafter, draft_params, state, tokens, lengths, sampling_params, gamma=gamma, sampling=sampling
  )
  rounds, whole = timing.time_rounds(
    {"propose": timer, "target_1": target_step},
    repeats,
    min_seconds,
    marginal=["propose", "target_1"],
  )
  propose_s = timing.per_call_seconds(rounds, whole, "propose")
  return (
    propose_s,
    bench_noise.ratio_samples(rounds["propose"], rounds["target_1"], scale=1.0 / gamma),
    propose_s / gamma / timing.per_call_seconds(rounds, whole, "target_1"),
  )
