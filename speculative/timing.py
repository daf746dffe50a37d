"""Timing a model's jitted calls: chained `extend` calls in one compiled loop, on a realistic cache.

The one way this package times a model call: the jobs' gamma calibration (speculative/autogamma/)
and the benchmark (speculative/bench/timing.py adds interleaved rounds and noise estimates on top)
both time `extend` through `repeat_extend`, so a figure in a job's report and one on a benchmark page
are measured the same way.
"""

from __future__ import annotations

import functools
import time
from typing import Any
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib

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
