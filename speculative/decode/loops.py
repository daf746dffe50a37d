"""Jit-compiled decode loops: `autoregressive_decode` (baseline) and `speculative_decode`.

Both are one jitted pure function around a single `lax.while_loop`; models, the drafter, the
sampling strategy, gamma, max_new_tokens and eos_id are static, everything else (params, prompts,
sampling values, rng) is an array, so new prompts of the same shapes, a new temperature / top-k /
top-p value or a new seed never recompile (`TRACE_COUNTS` counts traces, for tests).

Both run decode/step.py's loop (a step: draft, verify, accept, commit; the baseline drafts nothing
and samples one token), as does decode/spectr_loop.py's `spectr_decode`; the loop state and the
stream conventions (buffer, lengths, EOS, per-row RNG) are decode/state.py's, the eager input
checks decode/inputs.py's.

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
from speculative.decode import step as decode_step
from speculative.drafters import base as drafter_base
from speculative.models import interface

__all__ = [
  'autoregressive_decode',
  'speculative_decode',
]


# --------------------------------------------------------------------------------------------------
# The jitted loops: decode/step.py's `run` of a baseline or a speculative `LoopSpec`.
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
  return decode_step.run(
    decode_step.LoopSpec(target, target_params, options, inputs, lockstep=lockstep)
  )


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
  return decode_step.run(
    decode_step.LoopSpec(
      target, target_params, options, inputs, drafter, draft_params, lenience=lenience
    )
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
