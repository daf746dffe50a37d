"""The two decoding modes as callables: one place that binds a model pair and its options.

Every job that compares the modes (`speculative.infer`, the benchmark's methods, the bf16 audit and
the runtime-settings script) builds them here, so the baseline and the speculative decode of a job
always share their options:

  options = DecodeOptions(max_new_tokens=64, sampling=sampling, eos_id=1, gamma=4)
  fns = modes.decode_fns(target, target_params, drafter, draft_params, options=options,
                         sampling_params=params)
  result = fns['speculative'](encoder_tokens, rng)  # encoder_tokens [B, S] int32 -> DecodeResult
"""

from __future__ import annotations

from typing import Any
from typing import Callable

import jax

from speculative import drafters
from speculative import sampling as sampling_lib
from speculative.decode import loops as decoding
from speculative.decode import options as decode_options
from speculative.decode import state as decode_state

BASELINE = 'baseline'
SPECULATIVE = 'speculative'
MODES = (BASELINE, SPECULATIVE)

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
  check_finite: bool = False,
  **option_fields: Any,
) -> dict[str, DecodeFn]:
  """{mode: fn(encoder_tokens [B, S] int32, rng, max_steps=None) -> DecodeResult} for an
  encoder-decoder target (`max_steps`: see `decoding.autoregressive_decode`).

  `options` (DecodeOptions, or its fields as keywords: `gamma=4, max_new_tokens=64, ...`) are the
  static options of both modes. 'baseline' is `loops.autoregressive_decode` of the target;
  'speculative' (only when a `drafter` is given; the options need gamma) is
  `loops.speculative_decode` with that drafter and `lenience` (None: exact).
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
  return fns


def greedy_model_pair(
  target: Any,
  target_params: Any,
  draft: Any,
  draft_params: Any,
  *,
  gamma: int,
  max_new_tokens: int,
  eos_id: int | None,
  check_finite: bool = True,
) -> dict[str, DecodeFn]:
  """`decode_fns` of a target and a draft model (`ModelDrafter`) under greedy decoding, the setting
  of the exactness audits and runtime measurements."""
  sampling, sampling_params = sampling_lib.make_sampling(0.0)
  options = decode_options.DecodeOptions(
    max_new_tokens=max_new_tokens, sampling=sampling, eos_id=eos_id, gamma=gamma
  )
  return decode_fns(
    target,
    target_params,
    drafters.ModelDrafter(draft),
    draft_params,
    options=options,
    sampling_params=sampling_params,
    check_finite=check_finite,
  )
