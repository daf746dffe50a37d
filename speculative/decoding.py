"""Jit-compiled decode loops: `autoregressive_decode` (baseline) and `speculative_decode`.

Both are one jitted pure function around a single `lax.while_loop`; models, the drafter, the
sampling strategy, gamma, max_new_tokens and eos_id are static, everything else (params, prompts,
sampling values, rng) is an array, so new prompts of the same shapes, a new temperature / top-k /
top-p value or a new seed never recompile (`TRACE_COUNTS` counts traces, for tests).

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

Exactness: the speculative loop's output is distributed exactly as the baseline's (and equal to it
token for token under argmax, up to float rounding of a T=gamma+1 call vs T=1 calls) -- unless a
`lenience` l < 1 is passed, which deliberately changes the output (sampling.py, Appendix A.5).

Adaptive gamma: gamma is the static maximum. Drafters may propose fewer tokens per row and step
(`num_drafted`, e.g. `ModelDrafter(stop_below=...)`, `AdaptiveGammaDrafter`), which saves draft
calls; the target's verify call keeps the static width gamma+1 unless `adaptive_verify=True`, which
branches (`lax.switch`) over widths 1..gamma+1 and feeds only 1 + max_b num_drafted[b] tokens.
"""

from __future__ import annotations

import collections
import functools
from typing import Any
import warnings

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib
from speculative.drafters import base as drafter_base
from speculative.models.interface import CachedLM

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
  """Loop state of the decode loops (both here and `spectr_decoding.spectr_decode`).

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


# --------------------------------------------------------------------------------------------------
# Loop building blocks, shared with spectr_decoding.py (same stream conventions, per-row RNG
# and commit rule).
# --------------------------------------------------------------------------------------------------


def row_keys(rng: jax.Array, row_ids: jax.Array, step: jax.Array, use: int) -> jax.Array:
  """[B] keys: fold_in(fold_in(fold_in(rng, row), step), use); `use` separates consumers."""

  def one(row):
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(rng, row), step), use)

  return jax.vmap(one)(row_ids)


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


# --------------------------------------------------------------------------------------------------
# Baseline.
# --------------------------------------------------------------------------------------------------


@functools.partial(
  jax.jit, static_argnames=('target', 'sampling', 'max_new_tokens', 'eos_id', 'lockstep')
)
def _autoregressive_jit(
  target_params,
  prompt_tokens,
  prompt_lengths,
  encoder_tokens,
  sampling_params,
  rng,
  row_ids,
  *,
  target,
  sampling,
  max_new_tokens,
  eos_id,
  lockstep=False,
):
  TRACE_COUNTS['autoregressive_decode'] += 1
  batch, prompt_len = prompt_tokens.shape
  # +1: a row that is done still gets (and discards) one token written at its length per step.
  max_length = prompt_len + max_new_tokens + 1
  cache = target.init_cache(target_params, batch, max_length, encoder_tokens)
  # Prefill: positions [0, lengths-1) must be correct before the first step; entries past a row's
  # length are stale and overwritten before anything attends to them.
  _, cache = target.extend(target_params, cache, prompt_tokens, jnp.zeros((batch,), jnp.int32))
  state = DecodeState(
    step=jnp.zeros((), jnp.int32),
    tokens=init_buffer(prompt_tokens, max_length),
    lengths=prompt_lengths,
    done=jnp.zeros((batch,), bool),
    target_cache=cache,
    draft_state=None,
    metrics=DecodeMetrics.zeros(batch),
  )

  def body(state: DecodeState) -> DecodeState:
    last = last_tokens(state.tokens, state.lengths)  # [B]
    # lockstep (equal prompt lengths, target.lockstep_extend): rows not done all sit at the
    # longest length, so one scalar start serves the batch (done rows' writes are discarded).
    start = jnp.max(state.lengths) - 1 if lockstep else state.lengths - 1
    logits, cache = target.extend(
      target_params, state.target_cache, last[:, None], start
    )  # [B, 1, V]
    probs = sampling_lib.probs_from_logits(logits[:, 0], sampling, sampling_params)  # [B, V]
    token = sampling_lib.sample_rows(row_keys(rng, row_ids, state.step, 0), probs)  # [B]
    tokens, lengths, done, active = commit_tokens(
      state, token[:, None], jnp.ones((batch,), jnp.int32), prompt_lengths, max_new_tokens, eos_id
    )
    metrics = state.metrics.replace(
      target_calls=state.metrics.target_calls + active,
      invalid=state.metrics.invalid | (active & has_nan(probs)),
    )
    return DecodeState(
      step=state.step + 1,
      tokens=tokens,
      lengths=lengths,
      done=done,
      target_cache=cache,
      draft_state=None,
      metrics=metrics,
    )

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return make_result(state, prompt_lengths, max_new_tokens)


# --------------------------------------------------------------------------------------------------
# Speculative.
# --------------------------------------------------------------------------------------------------


def _verify(
  target: CachedLM,
  target_params: Any,
  cache: Any,
  verify_tokens: jax.Array,
  start: jax.Array,
  width: jax.Array | None,
) -> tuple[jax.Array, Any]:
  """The target's verify call over verify_tokens [B, gamma+1] at per-row offsets `start`.

  width None: one call of the static width gamma+1. Otherwise `width` ([] int32 in [1, gamma+1])
  picks one of gamma+1 compiled calls (lax.switch) that feeds only verify_tokens[:, :width]; the
  logits past `width` are zeros (a uniform p that is never used: the caller guarantees width >
  num_drafted for every active row) and the cache is written only on the fed positions. Measured
  with the embedded target (random weights, CPU): the switch costs ~1.5 ms per call (the cache is
  copied into and out of the conditional), width 2 ~12 ms vs width 9 ~20 ms.
  """
  full = verify_tokens.shape[1]
  if width is None:
    return target.extend(target_params, cache, verify_tokens, start)

  def branch(w):
    def call(cache):
      logits, cache = target.extend(target_params, cache, verify_tokens[:, :w], start)  # [B, w, V]
      logits = jnp.pad(logits.astype(jnp.float32), ((0, 0), (0, full - w), (0, 0)))
      return logits, cache

    return call

  return jax.lax.switch(width - 1, [branch(w) for w in range(1, full + 1)], cache)


@functools.partial(
  jax.jit,
  static_argnames=(
    'target',
    'drafter',
    'sampling',
    'gamma',
    'max_new_tokens',
    'eos_id',
    'adaptive_verify',
  ),
)
def _speculative_jit(
  target_params,
  draft_params,
  prompt_tokens,
  prompt_lengths,
  encoder_tokens,
  draft_encoder_tokens,
  sampling_params,
  rng,
  row_ids,
  lenience=None,
  *,
  target,
  drafter,
  sampling,
  gamma,
  max_new_tokens,
  eos_id,
  adaptive_verify=False,
):
  TRACE_COUNTS['speculative_decode'] += 1
  batch, prompt_len = prompt_tokens.shape
  max_length = prompt_len + max_new_tokens + gamma + 1
  cache = target.init_cache(target_params, batch, max_length, encoder_tokens)
  _, cache = target.extend(target_params, cache, prompt_tokens, jnp.zeros((batch,), jnp.int32))
  draft_state = drafter.init(
    draft_params, prompt_tokens, prompt_lengths, max_length, draft_encoder_tokens
  )
  state = DecodeState(
    step=jnp.zeros((), jnp.int32),
    tokens=init_buffer(prompt_tokens, max_length),
    lengths=prompt_lengths,
    done=jnp.zeros((batch,), bool),
    target_cache=cache,
    draft_state=draft_state,
    metrics=DecodeMetrics.zeros(batch),
  )

  def body(state: DecodeState) -> DecodeState:
    proposal, draft_state = drafter.propose(
      draft_params,
      state.draft_state,
      state.tokens,
      state.lengths,
      gamma,
      row_keys(rng, row_ids, state.step, 0),
      sampling,
      sampling_params,
    )
    assert proposal.tokens.shape == (batch, gamma), proposal.tokens.shape
    assert proposal.probs.shape == (batch, gamma, target.vocab_size), proposal.probs.shape
    drafted = jnp.arange(gamma)[None, :] < proposal.num_drafted[:, None]  # [B, gamma]
    # Filler past num_drafted becomes token 0: any id is fine for exactness (p at a position only
    # conditions on earlier tokens), but an out-of-range id could make NaN keys/values in the cache.
    draft_tokens = jnp.where(drafted, proposal.tokens, 0)  # [B, gamma]
    # One verify call over [last committed token, x_1..x_gamma] at start = lengths-1.
    last = last_tokens(state.tokens, state.lengths)  # [B]
    verify_tokens = jnp.concatenate([last[:, None], draft_tokens], axis=1)  # [B, gamma+1]
    width = None
    if adaptive_verify:  # only as wide as the longest proposal of a row that is not done
      width = 1 + jnp.max(jnp.where(state.done, 0, proposal.num_drafted))
    logits, cache = _verify(
      target, target_params, state.target_cache, verify_tokens, state.lengths - 1, width
    )  # [B, gamma+1, V]
    target_probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)
    accept_keys = row_keys(rng, row_ids, state.step, 1)
    if lenience is None:
      result = sampling_lib.speculative_accept(
        draft_tokens, proposal.probs, target_probs, accept_keys, proposal.num_drafted
      )
    else:
      # APPROXIMATE for l < 1 (bit-identical to the exact rule at l = 1). Under argmax decoding the
      # standardized p is one-hot, so the argmax form (p(x) >= l max p, on the raw logits) applies.
      argmax_mode = jnp.asarray(True) if sampling.greedy else sampling_params.temperature == 0
      lenient_accepts = (
        sampling_lib.lenient_argmax_accept(logits[:, :gamma], draft_tokens, lenience) & argmax_mode
      )
      result = sampling_lib.speculative_accept(
        draft_tokens,
        proposal.probs,
        target_probs,
        accept_keys,
        proposal.num_drafted,
        lenience=lenience,
        lenient_accepts=lenient_accepts,
      )
    tokens, lengths, done, active = commit_tokens(
      state, result.tokens, result.num_accepted + 1, prompt_lengths, max_new_tokens, eos_id
    )
    # Only the distributions that can matter: q at drafted positions, p at positions <= num_drafted.
    verified = jnp.arange(gamma + 1)[None, :] <= proposal.num_drafted[:, None]  # [B, gamma+1]
    invalid = has_nan(jnp.where(verified[..., None], target_probs, 0.0)) | has_nan(
      jnp.where(drafted[..., None], proposal.probs, 0.0)
    )
    metrics = DecodeMetrics(
      target_calls=state.metrics.target_calls + active,
      drafted=state.metrics.drafted + jnp.where(active, proposal.num_drafted, 0),
      accepted=state.metrics.accepted + jnp.where(active, result.num_accepted, 0),
      alpha_sum=state.metrics.alpha_sum + jnp.where(active, result.min_mass.sum(axis=1), 0.0),
      invalid=state.metrics.invalid | (active & invalid),
    )
    return DecodeState(
      step=state.step + 1,
      tokens=tokens,
      lengths=lengths,
      done=done,
      target_cache=cache,
      draft_state=draft_state,
      metrics=metrics,
    )

  state = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, state)
  return make_result(state, prompt_lengths, max_new_tokens)


# --------------------------------------------------------------------------------------------------
# Public entry points: validate eagerly, call the jitted loop, check for invalid distributions.
# --------------------------------------------------------------------------------------------------


def _as_key(rng: Any) -> jax.Array:
  if isinstance(rng, (int, np.integer)):
    return jax.random.key(int(rng))
  rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return rng
  return jax.random.wrap_key_data(rng.astype(jnp.uint32))


def check_positive_int(name: str, value: Any) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ValueError(f'{name} must be an int >= 1, got {value!r}')


def prepare_inputs(
  target: CachedLM,
  prompt_tokens,
  prompt_lengths,
  encoder_tokens,
  max_new_tokens,
  eos_id,
  sampling,
  sampling_params,
  rng,
  row_ids,
):
  """Validates and normalizes the inputs shared by both decoders."""
  check_positive_int('max_new_tokens', max_new_tokens)
  if not isinstance(sampling, sampling_lib.SamplingConfig):
    raise ValueError(f'sampling must be a SamplingConfig, got {type(sampling).__name__}')
  if sampling_params is None:
    sampling_params = sampling_lib.SamplingParams.create()
  sampling_params = sampling_lib.SamplingParams(
    temperature=jnp.asarray(sampling_params.temperature, jnp.float32),
    top_k=jnp.asarray(sampling_params.top_k, jnp.int32),
    top_p=jnp.asarray(sampling_params.top_p, jnp.float32),
  )
  sampling_params.validate()
  if prompt_tokens is None:
    if encoder_tokens is None:
      raise ValueError(
        'empty input: pass prompt_tokens (decoder-only) or encoder_tokens (encoder-decoder)'
      )
    # Encoder-decoder: the decoder stream starts with the decoder start token (0 for T5).
    batch = np.shape(encoder_tokens)[0]
    prompt_tokens = jnp.zeros((batch, 1), jnp.int32)
    if prompt_lengths is None:
      prompt_lengths = jnp.ones((batch,), jnp.int32)
  prompt_tokens = jnp.asarray(prompt_tokens)
  if prompt_tokens.ndim != 2 or prompt_tokens.shape[0] < 1:
    raise ValueError(
      f'prompt_tokens must be [batch >= 1, prompt_len], got shape {prompt_tokens.shape}'
    )
  if prompt_tokens.shape[1] < 1:
    raise ValueError(
      'empty prompt: prompt_tokens has length 0 (a decoder stream needs at least '
      'one token; use the decoder start token for encoder-decoder models)'
    )
  if not jnp.issubdtype(prompt_tokens.dtype, jnp.integer):
    raise ValueError(f'prompt_tokens must be integer token ids, got {prompt_tokens.dtype}')
  prompt_tokens = prompt_tokens.astype(jnp.int32)
  batch, prompt_len = prompt_tokens.shape
  if prompt_lengths is None:
    prompt_lengths = jnp.full((batch,), prompt_len, jnp.int32)
  prompt_lengths = jnp.asarray(prompt_lengths).astype(jnp.int32)
  if prompt_lengths.shape != (batch,):
    raise ValueError(f'prompt_lengths must have shape [{batch}], got {prompt_lengths.shape}')
  if not isinstance(prompt_lengths, jax.core.Tracer):
    lengths_np = np.asarray(prompt_lengths)
    if (lengths_np < 1).any():
      raise ValueError(
        f'empty prompt in rows {np.flatnonzero(lengths_np < 1)[:10].tolist()}: '
        'every row needs prompt length >= 1'
      )
    if (lengths_np > prompt_len).any():
      raise ValueError(
        f'prompt_lengths {lengths_np.max()} longer than the prompt buffer '
        f'({prompt_len} columns) in rows '
        f'{np.flatnonzero(lengths_np > prompt_len)[:10].tolist()}'
      )
  vocab = target.vocab_size
  if not isinstance(prompt_tokens, jax.core.Tracer):
    tokens_np = np.asarray(prompt_tokens)
    if tokens_np.min() < 0 or tokens_np.max() >= vocab:
      raise ValueError(
        f'prompt token ids must be in [0, {vocab}), got range '
        f'[{tokens_np.min()}, {tokens_np.max()}]'
      )
  if eos_id is not None and (not isinstance(eos_id, (int, np.integer)) or not 0 <= eos_id < vocab):
    raise ValueError(f'eos_id must be None or an int in [0, {vocab}), got {eos_id!r}')
  if row_ids is None:
    row_ids = jnp.arange(batch, dtype=jnp.int32)
  row_ids = jnp.asarray(row_ids).astype(jnp.int32)
  if row_ids.shape != (batch,):
    raise ValueError(f'row_ids must have shape [{batch}], got {row_ids.shape}')
  if encoder_tokens is not None:
    encoder_tokens = jnp.asarray(encoder_tokens).astype(jnp.int32)
    if encoder_tokens.ndim != 2 or encoder_tokens.shape[0] != batch:
      raise ValueError(f'encoder_tokens must be [{batch}, S], got {encoder_tokens.shape}')
    if encoder_tokens.shape[1] < 1:
      raise ValueError('empty input: encoder_tokens has length 0')
  eos_id = None if eos_id is None else int(eos_id)
  return (
    prompt_tokens,
    prompt_lengths,
    encoder_tokens,
    eos_id,
    sampling_params,
    _as_key(rng),
    row_ids,
  )


def raise_if_invalid(result: DecodeResult, check_finite: bool) -> None:
  if check_finite and not isinstance(result.metrics.invalid, jax.core.Tracer):
    invalid = np.asarray(result.metrics.invalid)
    if invalid.any():
      raise ValueError(
        f'NaN/+inf or all -inf logits (no valid distribution) in rows '
        f'{np.flatnonzero(invalid)[:10].tolist()}; check the model parameters'
      )


def autoregressive_decode(
  target: CachedLM,
  target_params: Any,
  prompt_tokens: jax.Array | None,
  prompt_lengths: jax.Array | None = None,
  *,
  max_new_tokens: int,
  sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
  sampling_params: sampling_lib.SamplingParams | None = None,
  rng: Any = 0,
  eos_id: int | None = None,
  encoder_tokens: jax.Array | None = None,
  row_ids: jax.Array | None = None,
  check_finite: bool = True,
) -> DecodeResult:
  """Baseline: one target `extend` call with T=1 per generated token.

  Args:
    target: the CachedLM (static).
    target_params: its parameters.
    prompt_tokens: [B, P] int32 decoder prompts, left-aligned and right-padded; None for an
      encoder-decoder model (then the decoder start token 0 with length 1).
    prompt_lengths: [B] int32 in [1, P] (default P).
    max_new_tokens: tokens to generate per row (static).
    sampling: static SamplingConfig; sampling_params: run-time values (default temperature 1).
    rng: int seed or PRNG key.
    eos_id: stop token (static) or None.
    encoder_tokens: [B, S] int32 for encoder-decoder targets.
    row_ids: [B] int32 RNG row identities (default arange(B)).
    check_finite: raise ValueError after decoding if any distribution was NaN (syncs with the host).

  Returns:
    DecodeResult with tokens [B, max_new_tokens], lengths [B] and metrics (target_calls).
  """
  (prompt_tokens, prompt_lengths, encoder_tokens, eos_id, sampling_params, rng, row_ids) = (
    prepare_inputs(
      target,
      prompt_tokens,
      prompt_lengths,
      encoder_tokens,
      max_new_tokens,
      eos_id,
      sampling,
      sampling_params,
      rng,
      row_ids,
    )
  )
  lockstep = (
    getattr(target, 'lockstep_extend', False)
    and not isinstance(prompt_lengths, jax.core.Tracer)
    and bool(np.all(np.asarray(prompt_lengths) == np.asarray(prompt_lengths)[0]))
  )
  result = _autoregressive_jit(
    target_params,
    prompt_tokens,
    prompt_lengths,
    encoder_tokens,
    sampling_params,
    rng,
    row_ids,
    target=target,
    sampling=sampling,
    max_new_tokens=int(max_new_tokens),
    eos_id=eos_id,
    lockstep=lockstep,
  )
  raise_if_invalid(result, check_finite)
  return result


def speculative_decode(
  target: CachedLM,
  target_params: Any,
  drafter: drafter_base.Drafter,
  draft_params: Any,
  prompt_tokens: jax.Array | None,
  prompt_lengths: jax.Array | None = None,
  *,
  gamma: int,
  max_new_tokens: int,
  sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig(),
  sampling_params: sampling_lib.SamplingParams | None = None,
  rng: Any = 0,
  eos_id: int | None = None,
  encoder_tokens: jax.Array | None = None,
  draft_encoder_tokens: jax.Array | None = None,
  row_ids: jax.Array | None = None,
  check_finite: bool = True,
  lenience: float | jax.Array | None = None,
  adaptive_verify: bool = False,
) -> DecodeResult:
  """Speculative decoding: gamma draft tokens, one target call over gamma+1 positions per step.

  Arguments as in `autoregressive_decode`, plus:
    drafter: a Drafter (static), e.g. `ModelDrafter(draft_model)`; draft_params: its parameters.
    gamma: draft tokens per step (static, >= 1); the maximum when the drafter adapts it.
    draft_encoder_tokens: [B, S'] encoder input of an encoder-decoder draft (default
      encoder_tokens).
    lenience: None (default: exact) or a run-time l in (0, 1] (an array: a new value does not
      recompile; l = 1.0 is exact and gives the same tokens as None). l < 1 CHANGES THE OUTPUT: it
      is no longer distributed as the target's (paper Appendix A.5): sampling accepts x iff
      r * l * q(x) <= p(x) (no token emitted with probability above p(x)/l); argmax accepts the
      draft token iff p(x) >= l * max p under the target's temperature-1 softmax. Metrics'
      alpha_sum then holds the lenient acceptance probabilities.
    adaptive_verify: static; True feeds the target only 1 + max_b num_drafted[b] tokens per step
      (gamma+1 compiled widths in a lax.switch: longer compile), for drafters whose num_drafted
      varies (adaptive gamma, prompt lookup). False: always gamma+1.

  Returns:
    DecodeResult; metrics hold target_calls, drafted, accepted, alpha_sum per row.
  """
  check_positive_int('gamma', gamma)
  if drafter.vocab_size != target.vocab_size:
    raise ValueError(
      f'draft and target vocabularies differ: draft vocab_size '
      f'{drafter.vocab_size} != target vocab_size {target.vocab_size}'
    )
  (prompt_tokens, prompt_lengths, encoder_tokens, eos_id, sampling_params, rng, row_ids) = (
    prepare_inputs(
      target,
      prompt_tokens,
      prompt_lengths,
      encoder_tokens,
      max_new_tokens,
      eos_id,
      sampling,
      sampling_params,
      rng,
      row_ids,
    )
  )
  if draft_encoder_tokens is None:
    draft_encoder_tokens = encoder_tokens
  elif encoder_tokens is None:
    raise ValueError('draft_encoder_tokens given without encoder_tokens for the target')
  else:
    draft_encoder_tokens = jnp.asarray(draft_encoder_tokens).astype(jnp.int32)
  if lenience is not None:
    sampling_lib.check_lenience(lenience)
    if not isinstance(lenience, jax.core.Tracer) and float(lenience) < 1.0:
      warnings.warn(
        f'speculative_decode with lenience {float(lenience)} < 1: APPROXIMATE '
        'decoding, the output is not distributed as the target model\'s',
        stacklevel=2,
      )
    lenience = jnp.asarray(lenience, jnp.float32)
  result = _speculative_jit(
    target_params,
    draft_params,
    prompt_tokens,
    prompt_lengths,
    encoder_tokens,
    draft_encoder_tokens,
    sampling_params,
    rng,
    row_ids,
    lenience,
    target=target,
    drafter=drafter,
    sampling=sampling,
    gamma=int(gamma),
    max_new_tokens=int(max_new_tokens),
    eos_id=eos_id,
    adaptive_verify=bool(adaptive_verify),
  )
  raise_if_invalid(result, check_finite)
  return result
