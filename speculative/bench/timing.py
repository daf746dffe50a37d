"""Timing jitted model calls: per-call seconds of chained calls in a jitted loop, measured in
interleaved rounds (every timer once per round, the order rotating), on a realistic cache."""

from __future__ import annotations

import functools
import logging
from typing import Mapping
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import timing as model_timing
from speculative.bench import noise
from speculative.models import interface

# The chained-call timers live in speculative/timing.py (the jobs' calibration shares them).
Timer = model_timing.Timer
timed = model_timing.timed
repeat_extend = model_timing.repeat_extend
cache_at_position = model_timing.cache_at_position
extend_timer = model_timing.extend_timer


@functools.partial(jax.jit, static_argnames=("model", "max_length"))
def prefill(params, encoder_tokens, *, model, max_length):
  """What every decode pays once: encoder and cache allocation, then the decode loops' own
  `interface.prefill` of the start token (no decoder call: the first step feeds it)."""
  batch = encoder_tokens.shape[0]
  cache = model.init_cache(params, batch, max_length, encoder_tokens)
  return interface.prefill(model, params, cache, jnp.zeros((batch, 1), jnp.int32))


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
  value = noise.estimate(rounds[name]).value
  if not value > 0:
    logging.warning(
      "timer %s: marginal time per call not resolved above noise; using the "
      "whole-invocation time per call, %.3g s",
      name,
      whole[name],
    )
    value = whole[name]
  return float(value)


def retime(timer: Timer, repeats: int, min_seconds: float) -> float:
  """Seconds per call of one jitted-loop timer, again (e.g. t(1) after the sweep: load drift)."""
  rounds, whole = time_rounds({"t": timer}, repeats, min_seconds, marginal=["t"])
  return per_call_seconds(rounds, whole, "t")


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


def propose_timer(
  drafter, draft_params, state, tokens, lengths, sampling_params, *, gamma: int, sampling
) -> Timer:
  """fn(n): n chained `drafter.propose(gamma)` calls from the drafter's `state` at `lengths`
  (repeat_propose, its static arguments bound once)."""
  propose = functools.partial(repeat_propose, drafter=drafter, gamma=gamma, sampling=sampling)
  rng = jax.random.key(0)  # typed keys, as the decode loop passes them
  return lambda n: propose(
    draft_params, state, tokens, lengths, rng, sampling_params, jnp.asarray(n, jnp.int32)
  )
