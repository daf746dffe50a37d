"""Timing jitted calls: `timed` (one call, blocked on), chained `extend` calls in one compiled loop on
a realistic cache, and interleaved rounds.

The one way this package times: a job times each batch's decode with `timed` (the times a
`GAMMA = 'auto'` job measures its loops' steps from, speculative/autogamma/costs.py);
`repeat_extend` chains a model's `extend` calls in one compiled loop, and `time_rounds` times
several such timers in interleaved rounds (every timer once per round, the order rotating). The
benchmark (speculative/bench/) times its cost model with them and judges their noise in
speculative/bench/costs.py.
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import time
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib
from speculative.models import interface

Timer = Callable[[int], Any]  # fn(num_calls) -> a jax value to block on


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
    return cache, sampling_lib.argmax(logits)  # [B, T], the decode loops' argmax

  cache, tokens = jax.lax.fori_loop(0, num_calls, body, (cache, tokens))
  return tokens, cache


def cache_at_position(model, params, encoder_tokens: np.ndarray, *, max_length: int, position: int):
  """A decoder cache of `model` on `encoder_tokens` [B, S], prefilled on [0, position)."""
  batch = encoder_tokens.shape[0]
  prefix = jnp.asarray(
    encoder_tokens[:, :position]
    if encoder_tokens.shape[1] >= position
    else np.ones((batch, position), np.int32)
  )  # [B, position]
  cache = _prefilled_cache(
    params, jnp.asarray(encoder_tokens), prefix, model=model, max_length=max_length
  )
  return jax.block_until_ready(cache)


@functools.partial(jax.jit, static_argnames=("model", "max_length"))
def _prefilled_cache(params, encoder_tokens, prefix, *, model, max_length):
  """`cache_at_position`'s cache, in one compiled call (op by op, each op of the encoder and the
  prefill would compile on its own)."""
  batch = encoder_tokens.shape[0]
  cache = model.init_cache(params, batch, max_length, encoder_tokens)
  _, cache = model.extend(params, cache, prefix, jnp.zeros((batch,), jnp.int32))
  return cache


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
  """Seconds per call of each timer fn(num_calls), in `repeats` interleaved rounds (every timer
  once per round, the order rotating per round).

  Timers named in `marginal` are jitted loops: their per-round time per call is the marginal one,
  (time of 2n calls - time of n calls) / n, which excludes what a loop pays once per invocation
  (dispatch, and work XLA hoisted out of the loop, exactly as inside a decode loop); it may be
  non-positive when timer jitter exceeds the signal. The others: time of n calls / n.

  Returns (per-round seconds per call {name: [repeats]}, seconds per call {name: s}): the median
  of the resolved (finite, positive) rounds, or where none resolved, the whole-invocation median
  time per call (an upper bound), with a warning.
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
  seconds = {}
  for name in names:
    resolved = [x for x in rounds[name] if math.isfinite(x) and x > 0]
    seconds[name] = float(statistics.median(resolved if resolved else whole[name]))
    if not resolved:
      logging.warning(
        "timer %s: marginal time per call not resolved above noise; using the "
        "whole-invocation time per call, %.3g s",
        name,
        seconds[name],
      )
  return rounds, seconds
