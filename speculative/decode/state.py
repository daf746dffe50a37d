"""The decode loops' shared state and in-loop steps (`decode/loops.py`, `decode/spectr_loop.py`).

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
  * RNG: row b's key at step s is fold_in(fold_in(rng, row_ids[b]), s), so a row's output does not
    depend on the rest of the batch (pass the same `row_ids` to reproduce a row decoded alone).
"""

from __future__ import annotations

import collections
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculative import sampling as sampling_lib
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
  """Loop state of the decode loops (`decode/loops.py` and `decode/spectr_loop.py`'s `spectr_decode`).

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

  def advance(self, tokens, lengths, done, target_cache, draft_state, metrics) -> 'DecodeState':
    """The state after one step: the step counter + 1 and every other field as given."""
    return DecodeState(self.step + 1, tokens, lengths, done, target_cache, draft_state, metrics)


def row_keys(rng: jax.Array, row_ids: jax.Array, step: jax.Array, use: int) -> jax.Array:
  """[B] keys: fold_in(fold_in(fold_in(rng, row), step), use); `use` separates consumers."""

  def one(row):
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(rng, row), step), use)

  return jax.vmap(one)(row_ids)


def buffer_length(prompt_len: int, max_new_tokens: int, gamma: int = 0) -> int:
  """L_max, the positions of a decode's token buffer and caches (see `start`): the prompt,
  max_new_tokens, one for the token a done row still writes, and gamma more for a speculative
  decode (0 for the baseline). The benchmarks size their caches with it."""
  return prompt_len + max_new_tokens + 1 + gamma


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
  cache = target.init_cache(target_params, batch, max_length, inputs.encoder_tokens)
  cache = interface.prefill(target, target_params, cache, prompt_tokens)
  draft_state = None
  if drafter is not None:
    draft_state = drafter.init(
      draft_params, prompt_tokens, prompt_lengths, max_length, inputs.draft_encoder_tokens
    )
  return DecodeState(
    step=jnp.zeros((), jnp.int32),
    tokens=init_buffer(prompt_tokens, max_length),
    lengths=prompt_lengths,
    done=jnp.zeros((batch,), bool),
    target_cache=cache,
    draft_state=draft_state,
    metrics=metrics_type.zeros(batch),
  )


@flax.struct.dataclass
class Drafts:
  """One step's drafts over R rows (B; K*B in spectr_decode), as the verify call takes them.

  Attributes:
    proposal: the drafter's DraftProposal (tokens [R, gamma], probs [R, gamma, V], num_drafted).
    draft_state: the drafter's state after proposing.
    drafted: [R, gamma] bool, the positions below num_drafted.
    tokens: [R, gamma] int32, the proposal's tokens with the filler past num_drafted set to 0: any
      id is fine for exactness (p at a position only conditions on earlier tokens), but an
      out-of-range id could make NaN keys/values in the cache.
    verify_tokens: [R, gamma+1] int32, [last committed token, x_1..x_gamma], for one verify call
      at start = lengths-1.
  """

  proposal: drafter_base.DraftProposal
  draft_state: Any
  drafted: jax.Array
  tokens: jax.Array
  verify_tokens: jax.Array

  def masked_probs(self) -> jax.Array:
    """[R, gamma, V]: q at the drafted positions, 0 past them."""
    return jnp.where(self.drafted[..., None], self.proposal.probs, 0.0)

  def invalid(self, target_probs: jax.Array) -> jax.Array:
    """[R] bool: NaN in a distribution that can matter, q at drafted positions or p (the verify
    call's, [R, gamma+1, V]) at positions <= num_drafted."""
    gamma = self.tokens.shape[1]
    verified = jnp.arange(gamma + 1)[None, :] <= self.proposal.num_drafted[:, None]  # [R, gamma+1]
    return has_nan(jnp.where(verified[..., None], target_probs, 0.0)) | has_nan(self.masked_probs())


def propose(
  drafter: drafter_base.Drafter,
  draft_params: Any,
  options: decode_options.DecodeOptions,
  sampling_params: sampling_lib.SamplingParams,
  draft_state: Any,
  tokens: jax.Array,
  lengths: jax.Array,
  keys: jax.Array,
) -> Drafts:
  """One `drafter.propose` of options.gamma tokens (under options.sampling) after the committed rows
  `tokens` [R, L_max] / `lengths` [R] with `keys` [R], and the verify call's tokens."""
  gamma = options.gamma
  proposal, draft_state = drafter.propose(
    draft_params, draft_state, tokens, lengths, gamma, keys, options.sampling, sampling_params
  )
  rows = tokens.shape[0]
  assert proposal.tokens.shape == (rows, gamma), proposal.tokens.shape
  assert proposal.probs.shape == (rows, gamma, drafter.vocab_size), proposal.probs.shape
  drafted = jnp.arange(gamma)[None, :] < proposal.num_drafted[:, None]  # [R, gamma]
  draft_tokens = jnp.where(drafted, proposal.tokens, 0)  # [R, gamma]
  last = last_tokens(tokens, lengths)  # [R]
  verify_tokens = jnp.concatenate([last[:, None], draft_tokens], axis=1)  # [R, gamma+1]
  return Drafts(proposal, draft_state, drafted, draft_tokens, verify_tokens)


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


def commit_tokens(
  state: DecodeState,
  block: jax.Array,
  num_emitted: jax.Array,
  prompt_lengths: jax.Array,
  max_new_tokens: int,
  eos_id: int | None,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """Writes an emitted block [B, T] (first num_emitted[b] valid) and applies EOS / max length.

  Returns (tokens, lengths, done, active) where `active` marks rows that were not done before.
  """
  active = ~state.done
  width = block.shape[1]
  if eos_id is not None:
    is_eos = (block == eos_id) & (jnp.arange(width)[None, :] < num_emitted[:, None])  # [B, T]
    hit_eos = jnp.any(is_eos, axis=1)
    num_emitted = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, num_emitted)
  else:
    hit_eos = jnp.zeros_like(state.done)
  generated = state.lengths - prompt_lengths
  num_emitted = jnp.minimum(num_emitted, max_new_tokens - generated)  # truncate the overshoot
  # Filler past the new length is stale.
  tokens = drafter_base.write_rows(state.tokens, block, state.lengths)
  lengths = jnp.where(active, state.lengths + num_emitted, state.lengths)
  done = state.done | (active & hit_eos) | (lengths - prompt_lengths >= max_new_tokens)
  return tokens, lengths, done, active


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


def last_tokens(tokens: jax.Array, lengths: jax.Array) -> jax.Array:
  """[B]: the last committed token of each row."""
  return jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]


def has_nan(probs: jax.Array) -> jax.Array:
  """[B, ..., V] -> [B] bool."""
  return jnp.any(jnp.isnan(probs.reshape(probs.shape[0], -1)), axis=1)
