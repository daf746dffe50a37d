"""The decoding modes as callables: one place that binds a model pair and its options.

Both places that compare the modes (`speculative.infer` and the benchmark's methods) build them
here, so the baseline, the speculative decode and SpecTr of a job always share their options:

  options = DecodeOptions(max_new_tokens=64, sampling=sampling, eos_id=1, gamma=4)
  fns = modes.decode_fns(target, target_params, drafter, draft_params, options=options,
                         sampling_params=params, num_drafts=4)
  result = fns['speculative'](encoder_tokens, rng)  # encoder_tokens [B, S] int32 -> DecodeResult
  result = fns['spectr'](encoder_tokens, rng)  # K = 4 drafts of L = gamma tokens a step
"""

from __future__ import annotations

from typing import Any
from typing import Callable

import jax

from speculative import sampling as sampling_lib
from speculative.decode import loops as decoding
from speculative.decode import options as decode_options
from speculative.decode import spectr_loop
from speculative.decode import state as decode_state

BASELINE = 'baseline'
SPECULATIVE = 'speculative'
SPECTR = 'spectr'
MODES = (BASELINE, SPECULATIVE, SPECTR)

DecodeFn = Callable[..., decode_state.DecodeResult]  # fn(encoder_tokens, rng, max_steps=None)


def decode_fns(
  target: Any,
  target_params: Any,
  drafter: Any = None,
  draft_params: Any = None,
  *,
  options: decode_options.DecodeOptions | None = None,
  sampling_params: sampling_lib.SamplingParams | None = None,
  lenience: float | None = None,
  num_drafts: int | None = None,
  check_finite: bool = False,
  **option_fields: Any,
) -> dict[str, DecodeFn]:
  """{mode: fn(encoder_tokens [B, S] int32, rng, max_steps=None) -> DecodeResult} for an
  encoder-decoder target (`max_steps`: see `decoding.autoregressive_decode`).

  `options` (DecodeOptions, or its fields as keywords: `gamma=4, max_new_tokens=64, ...`) are the
  static options of every mode. 'baseline' is `loops.autoregressive_decode` of the target;
  'speculative' (only when a `drafter` is given; the options need gamma) is
  `loops.speculative_decode` with that drafter and `lenience` (None: exact); 'spectr' (only
  with a drafter and `num_drafts` K >= 1) is `spectr_loop.spectr_decode` with K drafts of
  L = gamma tokens a step (exact; no lenience, a fixed verify width: the options'
  `adaptive_verify` is not used), whose K = 1 emits 'speculative''s tokens for the same rng.
  `check_finite=False` leaves the NaN check to the caller (the result's `metrics.invalid`), so a
  job can name the examples of a bad batch.
  """
  options = decode_options.DecodeOptions.create(options, **option_fields)
  runtime = dict(sampling_params=sampling_params, check_finite=check_finite)

  def baseline(
    encoder_tokens: jax.Array, rng: Any = 0, max_steps: int | None = None
  ) -> decode_state.DecodeResult:
    return decoding.autoregressive_decode(
      target,
      target_params,
      None,
      options=options,
      rng=rng,
      encoder_tokens=encoder_tokens,
      max_steps=max_steps,
      **runtime,
    )

  fns = {BASELINE: baseline}
  if drafter is None:
    return fns
  options = options.speculative()

  def speculative(
    encoder_tokens: jax.Array, rng: Any = 0, max_steps: int | None = None
  ) -> decode_state.DecodeResult:
    return decoding.speculative_decode(
      target,
      target_params,
      drafter,
      draft_params,
      None,
      options=options,
      rng=rng,
      encoder_tokens=encoder_tokens,
      lenience=lenience,
      max_steps=max_steps,
      **runtime,
    )

  fns[SPECULATIVE] = speculative
  if num_drafts is None:
    return fns
  if lenience is not None:
    raise ValueError('spectr_decode is exact: it takes no lenience')

  def spectr(
    encoder_tokens: jax.Array, rng: Any = 0, max_steps: int | None = None
  ) -> decode_state.DecodeResult:
    return spectr_loop.spectr_decode(
      target,
      target_params,
      drafter,
      draft_params,
      None,
      num_drafts=num_drafts,
      options=options,
      rng=rng,
      encoder_tokens=encoder_tokens,
      max_steps=max_steps,
      **runtime,
    )

  fns[SPECTR] = spectr
  return fns
