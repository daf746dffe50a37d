"""Jit-compiled decode loops: `autoregressive_decode` (baseline) and `speculative_decode`.

Both are one jitted pure function around a single `lax.while_loop`; models, the drafter, the
sampling strategy, gamma, max_new_tokens and eos_id are static, everything else (params, prompts,
sampling values, rng) is an array, so new prompts of the same shapes, a new temperature / top-k /
top-p value or a new seed never recompile (`TRACE_COUNTS` counts traces, for tests).

The loop state, the stream conventions (buffer, lengths, EOS, per-row RNG) and the in-loop steps
shared with decode/spectr_loop.py live in decode/state.py; the eager input checks in
decode/inputs.py.

Exactness: the speculative loop's output is distributed exactly as the baseline's (and equal to it
token for token under argmax, up to float rounding of a T=gamma+1 call vs T=1 calls) -- unless a
`lenience` l < 1 is passed, which deliberately changes the output (sampling.py, Appendix A.5).

Adaptive gamma: gamma is the static maximum. Drafters may propose fewer tokens per row and step
(`num_drafted`, e.g. `ModelDrafter(stop_below=...)`, `AdaptiveGammaDrafter`), which saves draft
calls; the target's verify call keeps the static width gamma+1 unless `adaptive_verify=True`, which
branches (`lax.switch`) over widths 1..gamma+1 and feeds only 1 + max_b num_drafted[b] tokens.
"""

from __future__ import annotations

import functools
from typing import Any
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib
from speculative.decode import inputs as decode_inputs
from speculative.decode import options as decode_options
from speculative.decode import state as decode_state
from speculative.drafters import base as drafter_base
from speculative.models import interface

__all__ = [
  'autoregressive_decode',
  'speculative_decode',
]


# --------------------------------------------------------------------------------------------------
# Baseline.
# --------------------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames=('target', 'options', 'lockstep'))
def _autoregressive_jit(
  target_params,
  inputs: decode_inputs.DecodeInputs,
  *,
  target: interface.CachedLM,
  options: decode_options.DecodeOptions,
  lockstep: bool = False,
):
  decode_state.TRACE_COUNTS['autoregressive_decode'] += 1
  max_new_tokens, sampling = options.max_new_tokens, options.sampling
  prompt_lengths, sampling_params = inputs.prompt_lengths, inputs.sampling_params
  batch = prompt_lengths.shape[0]
  state = decode_state.start(target, target_params, inputs, options, decode_state.DecodeMetrics)

  def body(state: decode_state.DecodeState) -> decode_state.DecodeState:
    last = decode_state.last_tokens(state.tokens, state.lengths)  # [B]
    # lockstep (equal prompt lengths, target.lockstep_extend): rows not done all sit at the
    # longest length, so one scalar start serves the batch (done rows' writes are discarded).
    start = jnp.max(state.lengths) - 1 if lockstep else state.lengths - 1
    logits, cache = target.extend(
      target_params, state.target_cache, last[:, None], start
    )  # [B, 1, V]
    probs = sampling_lib.probs_from_logits(logits[:, 0], sampling, sampling_params)  # [B, V]
    token = sampling_lib.sample_rows(
      decode_state.row_keys(inputs.rng, inputs.row_ids, state.step, 0), probs, sampling.greedy
    )  # [B]
    tokens, lengths, done, active = decode_state.commit_tokens(
      state,
      token[:, None],
      jnp.ones((batch,), jnp.int32),
      prompt_lengths,
      max_new_tokens,
      options.eos_id,
    )
    metrics = state.metrics.replace(
      target_calls=state.metrics.target_calls + active,
      invalid=state.metrics.invalid | (active & decode_state.has_nan(probs)),
    )
    return state.advance(tokens, lengths, done, cache, None, metrics)

  return decode_state.run_loop(body, state, prompt_lengths, max_new_tokens, inputs.max_steps)


# --------------------------------------------------------------------------------------------------
# Speculative.
# --------------------------------------------------------------------------------------------------


def _verify(
  target: interface.CachedLM,
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
  num_drafted for every active row) and the cache is written only on the fed positions. What the
  switch costs: docs/design.md, section 2.
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
  static_argnames=('target', 'drafter', 'options'),
)
def _speculative_jit(
  target_params,
  draft_params,
  inputs: decode_inputs.DecodeInputs,
  lenience=None,
  *,
  target: interface.CachedLM,
  drafter: drafter_base.Drafter,
  options: decode_options.DecodeOptions,
):
  decode_state.TRACE_COUNTS['speculative_decode'] += 1
  max_new_tokens, sampling = options.max_new_tokens, options.sampling
  prompt_lengths, sampling_params = inputs.prompt_lengths, inputs.sampling_params
  rng, row_ids = inputs.rng, inputs.row_ids
  state = decode_state.start(
    target, target_params, inputs, options, decode_state.DecodeMetrics, drafter, draft_params
  )

  def body(state: decode_state.DecodeState) -> decode_state.DecodeState:
    drafts = decode_state.propose(
      drafter,
      draft_params,
      options,
      sampling_params,
      state.draft_state,
      state.tokens,
      state.lengths,
      decode_state.row_keys(rng, row_ids, state.step, 0),
    )
    proposal = drafts.proposal
    width = None
    if options.adaptive_verify:  # only as wide as the longest proposal of a row that is not done
      width = 1 + jnp.max(jnp.where(state.done, 0, proposal.num_drafted))
    logits, cache = _verify(
      target, target_params, state.target_cache, drafts.verify_tokens, state.lengths - 1, width
    )  # [B, gamma+1, V]
    target_probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)
    result = _accept(
      logits,
      drafts.tokens,
      proposal,
      target_probs,
      decode_state.row_keys(rng, row_ids, state.step, 1),
      lenience,
      sampling,
      sampling_params,
    )
    tokens, lengths, done, active = decode_state.commit_tokens(
      state, result.tokens, result.num_accepted + 1, prompt_lengths, max_new_tokens, options.eos_id
    )
    metrics = decode_state.DecodeMetrics(
      target_calls=state.metrics.target_calls + active,
      drafted=state.metrics.drafted + jnp.where(active, proposal.num_drafted, 0),
      accepted=state.metrics.accepted + jnp.where(active, result.num_accepted, 0),
      alpha_sum=state.metrics.alpha_sum + jnp.where(active, result.min_mass.sum(axis=1), 0.0),
      invalid=state.metrics.invalid | (active & drafts.invalid(target_probs)),
    )
    return state.advance(tokens, lengths, done, cache, drafts.draft_state, metrics)

  return decode_state.run_loop(body, state, prompt_lengths, max_new_tokens, inputs.max_steps)


def _accept(
  logits: jax.Array,
  draft_tokens: jax.Array,
  proposal: drafter_base.DraftProposal,
  target_probs: jax.Array,
  accept_keys: jax.Array,
  lenience: jax.Array | None,
  sampling: sampling_lib.SamplingConfig,
  sampling_params: sampling_lib.SamplingParams,
) -> sampling_lib.AcceptResult:
  """The acceptance rule over one step's drafts: exact (lenience None) or lenient.

  logits: [B, gamma+1, V] of the verify call; draft_tokens: [B, gamma]; target_probs: [B, gamma+1,
  V]; accept_keys: [B].
  """
  if lenience is None:
    return sampling_lib.speculative_accept(
      draft_tokens,
      proposal.probs,
      target_probs,
      accept_keys,
      proposal.num_drafted,
      greedy=sampling.greedy,
    )
  # APPROXIMATE for l < 1 (bit-identical to the exact rule at l = 1). Under argmax decoding the
  # standardized p is one-hot, so the argmax form (p(x) >= l max p, on the raw logits) applies.
  gamma = draft_tokens.shape[1]
  argmax_mode = jnp.asarray(True) if sampling.greedy else sampling_params.temperature == 0
  lenient_accepts = (
    sampling_lib.lenient_argmax_accept(logits[:, :gamma], draft_tokens, lenience) & argmax_mode
  )
  return sampling_lib.speculative_accept(
    draft_tokens,
    proposal.probs,
    target_probs,
    accept_keys,
    proposal.num_drafted,
    lenience=lenience,
    lenient_accepts=lenient_accepts,
    greedy=sampling.greedy,
  )


# --------------------------------------------------------------------------------------------------
# Public entry points: validate eagerly, call the jitted loop, check for invalid distributions.
# --------------------------------------------------------------------------------------------------


def autoregressive_decode(
  target: interface.CachedLM,
  target_params: Any,
  prompt_tokens: jax.Array | None,
  prompt_lengths: jax.Array | None = None,
  *,
  options: decode_options.DecodeOptions | None = None,
  sampling_params: sampling_lib.SamplingParams | None = None,
  rng: Any = 0,
  encoder_tokens: jax.Array | None = None,
  row_ids: jax.Array | None = None,
  check_finite: bool = True,
  max_steps: int | None = None,
  **option_fields: Any,
) -> decode_state.DecodeResult:
  """Baseline: one target `extend` call with T=1 per generated token.

  Args:
    target: the CachedLM (static).
    target_params: its parameters.
    prompt_tokens: [B, P] int32 decoder prompts, left-aligned and right-padded; None for an
      encoder-decoder model (then the decoder start token 0 with length 1).
    prompt_lengths: [B] int32 in [1, P] (default P).
    options: the static DecodeOptions (max_new_tokens, sampling, eos_id), or their fields as
      keywords (`max_new_tokens=64, sampling=..., eos_id=1`), which replace the given options'.
    sampling_params: run-time sampling values (default temperature 1).
    rng: int seed or PRNG key.
    encoder_tokens: [B, S] int32 for encoder-decoder targets.
    row_ids: [B] int32 RNG row identities (default arange(B)).
    check_finite: raise ValueError after decoding if any distribution was NaN (syncs with the host).
    max_steps: stop after this many loop steps even if rows are not done (a run-time value: no
      recompile; default None: no limit). For timing a few steps of the compiled loop.

  Returns:
    DecodeResult with tokens [B, max_new_tokens], lengths [B] and metrics (target_calls).
  """
  options = decode_options.DecodeOptions.create(options, **option_fields)
  inputs = decode_inputs.prepare_inputs(
    target,
    options,
    prompt_tokens,
    prompt_lengths,
    encoder_tokens,
    sampling_params,
    rng,
    row_ids,
    max_steps,
  )
  result = _autoregressive_jit(
    target_params,
    inputs,
    target=target,
    options=options,
    lockstep=_lockstep(target, inputs.prompt_lengths),
  )
  decode_inputs.raise_if_invalid(result, check_finite)
  return result


def _lockstep(target: interface.CachedLM, prompt_lengths: jax.Array) -> bool:
  """All rows start at one length and the target takes a scalar start (`lockstep_extend`)."""
  return (
    getattr(target, 'lockstep_extend', False)
    and not isinstance(prompt_lengths, jax.core.Tracer)
    and bool(np.all(np.asarray(prompt_lengths) == np.asarray(prompt_lengths)[0]))
  )


def speculative_decode(
  target: interface.CachedLM,
  target_params: Any,
  drafter: drafter_base.Drafter,
  draft_params: Any,
  prompt_tokens: jax.Array | None,
  prompt_lengths: jax.Array | None = None,
  *,
  options: decode_options.DecodeOptions | None = None,
  sampling_params: sampling_lib.SamplingParams | None = None,
  rng: Any = 0,
  encoder_tokens: jax.Array | None = None,
  draft_encoder_tokens: jax.Array | None = None,
  row_ids: jax.Array | None = None,
  check_finite: bool = True,
  lenience: float | jax.Array | None = None,
  max_steps: int | None = None,
  **option_fields: Any,
) -> decode_state.DecodeResult:
  """Speculative decoding: gamma draft tokens, one target call over gamma+1 positions per step.

  Arguments as in `autoregressive_decode` (max_steps included), plus:
    drafter: a Drafter (static), e.g. `ModelDrafter(draft_model)`; draft_params: its parameters.
    options: as there, with `gamma` (draft tokens per step, >= 1; the maximum when the drafter
      adapts it) and `adaptive_verify` (True feeds the target only 1 + max_b num_drafted[b]
      tokens per step: gamma+1 compiled widths in a lax.switch, a longer compile; for drafters
      whose num_drafted varies, such as adaptive gamma and prompt lookup. False: always gamma+1).
    draft_encoder_tokens: [B, S'] encoder input of an encoder-decoder draft (default
      encoder_tokens).
    lenience: None (default: exact) or a run-time l in (0, 1] (an array: a new value does not
      recompile; l = 1.0 is exact and gives the same tokens as None). l < 1 CHANGES THE OUTPUT: it
      is no longer distributed as the target's (paper Appendix A.5): sampling accepts x iff
      r * l * q(x) <= p(x) (no token emitted with probability above p(x)/l); argmax accepts the
      draft token iff p(x) >= l * max p under the target's temperature-1 softmax. Metrics'
      alpha_sum then holds the lenient acceptance probabilities.

  Returns:
    DecodeResult; metrics hold target_calls, drafted, accepted, alpha_sum per row.
  """
  options = decode_options.DecodeOptions.create(options, **option_fields).speculative()
  inputs = decode_inputs.prepare_inputs(
    target,
    options,
    prompt_tokens,
    prompt_lengths,
    encoder_tokens,
    sampling_params,
    rng,
    row_ids,
    max_steps,
  ).with_drafter(target, drafter, draft_encoder_tokens)
  result = _speculative_jit(
    target_params,
    draft_params,
    inputs,
    _lenience_value(lenience),
    target=target,
    drafter=drafter,
    options=options,
  )
  decode_inputs.raise_if_invalid(result, check_finite)
  return result


def _lenience_value(lenience: float | jax.Array | None) -> jax.Array | None:
  """lenience as a [] float32 array (a run-time value), checked; warns when l < 1 (approximate)."""
  if lenience is None:
    return None
  sampling_lib.check_lenience(lenience)
  if not isinstance(lenience, jax.core.Tracer) and float(lenience) < 1.0:
    warnings.warn(
      f'speculative_decode with lenience {float(lenience)} < 1: APPROXIMATE '
      'decoding, the output is not distributed as the target model\'s',
      stacklevel=3,
    )
  return jnp.asarray(lenience, jnp.float32)
