"""The decode loops' state: its metrics, the state before the first step, the while-loop and the
result (the step itself is decode/step.py).

Stream conventions (per row b):
  * The decoder stream is the prompt (left-aligned in `prompt_tokens[b]`, right-padded, length
    `prompt_lengths[b] >= 1`) followed by generated tokens. For encoder-decoder models the caller
    passes `encoder_tokens` (consumed by `init_cache`) and the decoder prompt is the decoder start
    token (defaults to id 0 with length 1 when `prompt_tokens` is None).
  * The token buffer and caches hold L_max = P + max_new_tokens + gamma + 1 positions (P = padded
    prompt length), so a verify call of a row that is not done always fits.
  * `lengths[b]` is the committed stream length. Target cache invariant at the start of a step: the
    entries at positions [0, lengths-1) are correct. The verify call feeds [last committed token,
    x_1..x_gamma] at start = lengths-1 (gamma+1 positions) and yields p_1..p_{gamma+1}; rejected
    suffixes are "rolled back" by not advancing lengths (stale entries are overwritten later).
  * A row stops at EOS (tokens after an EOS inside an accepted block are dropped; the EOS is kept)
    or after max_new_tokens (overshoot of the last block is truncated). The loop ends when all rows
    are done. Done rows still ride along in the batch but neither advance nor count metrics.
  * RNG: row b's keys at step s are fold_in(fold_in(fold_in(rng, row_ids[b]), s), use), one per
    consumer (decode/step.py's `row_keys`), so a row's output does not depend on the rest of the
    batch (pass the same `row_ids` to reproduce a row decoded alone).
"""

from __future__ import annotations

import collections
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculative.decode import options as decode_options
from speculative.drafters import base as drafter_base
from speculative.models import interface

# Number of times each decode function was traced (== compiled); tests assert it does not grow.
TRACE_COUNTS: collections.Counter = collections.Counter()


@flax.struct.dataclass
class DecodeMetrics:
  """Per-row counters accumulated over the steps in which the row was not yet done.

  Attributes:
    target_calls: [B] int32, target `extend` calls in the loop (prefill not counted).
    drafted: [B] int32, draft tokens proposed (sum of num_drafted).
    accepted: [B] int32, draft tokens accepted by the rule (before EOS/max-length truncation).
    alpha_sum: [B] float32, sum over drafted positions of sum_x min(p(x), q(x));
      alpha = alpha_sum / drafted (docs/design.md section 7).
    invalid: [B] bool, a target or draft distribution was NaN (NaN/+inf/all -inf logits).
  """

  target_calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  alpha_sum: jax.Array
  invalid: jax.Array

  @classmethod
  def zeros(cls, batch: int) -> 'DecodeMetrics':
    return cls(
      target_calls=jnp.zeros((batch,), jnp.int32),
      drafted=jnp.zeros((batch,), jnp.int32),
      accepted=jnp.zeros((batch,), jnp.int32),
      alpha_sum=jnp.zeros((batch,), jnp.float32),
      invalid=jnp.zeros((batch,), bool),
    )


@flax.struct.dataclass
class SpecTrMetrics:
  """Per-row counters (original rows), accumulated over the steps in which the row was not done.

  Attributes:
    target_calls: [B] int32, steps (one batched target call over the K drafts each).
    drafted: [B] int32, per step the most tokens any of the K drafts proposed (L for a drafter
      that always drafts L).
    accepted: [B] int32, draft tokens accepted by the selection (before EOS/max-length truncation).
    alpha_sum: [B] float32, sum over selections of the k-Seq acceptance probability with the
      surviving drafts, 1 - (1 - beta(rho*))^k.
    single_alpha_sum: [B] float32, sum over the same selections of sum_x min(p(x), q(x)).
    selections: [B] int32, depths at which a selection ran (min(n+1, L) per step).
    invalid: [B] bool, a target or draft distribution was NaN (NaN/+inf/all -inf logits).
  """

  target_calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  alpha_sum: jax.Array
  single_alpha_sum: jax.Array
  selections: jax.Array
  invalid: jax.Array

  @classmethod
  def zeros(cls, batch: int) -> 'SpecTrMetrics':
    ints = jnp.zeros((batch,), jnp.int32)
    floats = jnp.zeros((batch,), jnp.float32)
    return cls(
      target_calls=ints,
      drafted=ints,
      accepted=ints,
      alpha_sum=floats,
      single_alpha_sum=floats,
      selections=ints,
      invalid=jnp.zeros((batch,), bool),
    )


@flax.struct.dataclass
class DecodeResult:
  """What a decode returns.

  Attributes:
    tokens: [B, max_new_tokens] int32, the generated tokens, 0-padded after `lengths[b]`.
    lengths: [B] int32, number of generated tokens per row (an EOS counts and is included).
    metrics: per-row DecodeMetrics (spectr_decode: SpecTrMetrics).
  """

  tokens: jax.Array
  lengths: jax.Array
  metrics: Any


@flax.struct.dataclass
class DecodeState:
  """Loop state of the decode loops (`decode/step.py`'s `run`: every loop of decode/loops.py and
  decode/spectr_loop.py).

  Attributes:
    step: [] int32, loop iteration (the per-row RNG folds it in).
    tokens: [B, L_max] int32, the stream buffer; row b is committed on [0, lengths[b]).
    lengths: [B] int32, committed stream length (prompt + generated).
    done: [B] bool, the row hit EOS or max_new_tokens.
    target_cache: the target's cache pytree (CachedLM.init_cache, L_max positions). In
      spectr_decode it has K*B rows (row b*K+j: draft j of row b); at the start of a step all K
      copies of a row agree on every position that will be read.
    draft_state: the drafter's state pytree (None for the baseline; K*B rows in spectr_decode).
    metrics: per-row counters: DecodeMetrics (spectr_decode: SpecTrMetrics, per original row).
  """

  step: jax.Array
  tokens: jax.Array
  lengths: jax.Array
  done: jax.Array
  target_cache: Any
  draft_state: Any
  metrics: Any


def fed_positions(prompt_len: int, max_new_tokens: int, gamma: int = 0) -> int:
  """The positions a decode feeds a model for a row whose tokens it keeps: the prompt and the new
  tokens but the last, whose verify at prompt_len + max_new_tokens - 2 feeds gamma drafts after it
  (0 for the baseline)."""
  return prompt_len + max_new_tokens - 1 + gamma


def buffer_length(prompt_len: int, max_new_tokens: int, gamma: int = 0) -> int:
  """L_max, the positions of a decode's token buffer and caches (see `start`): `fed_positions`
  and interface.UNFED_POSITIONS more, which only a done row writes (its last position, fed once
  more with the gamma after it, and the block it still writes at its length). The benchmarks
  size their caches with it."""
  return fed_positions(prompt_len, max_new_tokens, gamma) + interface.UNFED_POSITIONS


def start(
  target: interface.CachedLM,
  target_params: Any,
  inputs: Any,
  options: decode_options.DecodeOptions,
  metrics_type: Any,
  drafter: drafter_base.Drafter | None = None,
  draft_params: Any = None,
) -> DecodeState:
  """The loop state before the first step of a decode of `inputs` (a `DecodeInputs`).

  The token buffer holds the prompts in L_max = prompt_len + max_new_tokens + 1 positions, + gamma
  with a drafter (a row that is done still gets, and discards, one token written at its length per
  step; a verify call writes gamma+1), no row done. The target's cache has L_max positions and is
  prefilled on the prompts (`interface.prefill`): correct on [0, lengths-1) of every row. The
  drafter's state (None without a drafter) is `drafter.init` over the same prompts; the metrics
  are `metrics_type.zeros(batch)`.
  """
  prompt_tokens, prompt_lengths = inputs.prompt_tokens, inputs.prompt_lengths
  batch, prompt_len = prompt_tokens.shape
  max_length = buffer_length(
    prompt_len, options.max_new_tokens, 0 if drafter is None else options.gamma
  )
  tokens = init_buffer(prompt_tokens, max_length)  # [B, L_max]
  metrics = metrics_type.zeros(batch)
  cache = target.init_cache(target_params, batch, max_length, inputs.encoder_tokens)
  cache = interface.prefill(target, target_params, cache, prompt_tokens)
  draft_state = None
  if drafter is not None:
    draft_state = drafter.init(
      draft_params, prompt_tokens, prompt_lengths, max_length, inputs.draft_encoder_tokens
    )
  return DecodeState(
    step=jnp.zeros((), jnp.int32),
    tokens=tokens,
    lengths=prompt_lengths,
    done=jnp.zeros((batch,), bool),
    target_cache=cache,
    draft_state=draft_state,
    metrics=metrics,
  )


def run_loop(
  body,
  state: DecodeState,
  prompt_lengths: jax.Array,
  max_new_tokens: int,
  max_steps: jax.Array | None = None,
):
  """`body` until every row is done, or for at most `max_steps` ([] int32) steps (one
  `lax.while_loop`), then the DecodeResult."""

  def more(s: DecodeState) -> jax.Array:
    running = ~jnp.all(s.done)
    return running if max_steps is None else running & (s.step < max_steps)

  state = jax.lax.while_loop(more, body, state)
  return make_result(state, prompt_lengths, max_new_tokens)


def make_result(state: DecodeState, prompt_lengths: jax.Array, max_new_tokens: int) -> DecodeResult:
  generated = state.lengths - prompt_lengths  # [B]
  index = prompt_lengths[:, None] + jnp.arange(max_new_tokens)[None, :]  # [B, max_new]
  index = jnp.minimum(index, state.tokens.shape[1] - 1)
  out = jnp.take_along_axis(state.tokens, index, axis=1)
  out = jnp.where(jnp.arange(max_new_tokens)[None, :] < generated[:, None], out, 0)
  return DecodeResult(
    tokens=out.astype(jnp.int32), lengths=generated.astype(jnp.int32), metrics=state.metrics
  )


def init_buffer(prompt_tokens: jax.Array, max_length: int) -> jax.Array:
  batch, prompt_len = prompt_tokens.shape
  return jnp.zeros((batch, max_length), jnp.int32).at[:, :prompt_len].set(prompt_tokens)
