"""The two decoding modes as callables: one place that binds a model pair and its options.

Every job that compares the modes (`speculative.infer`, the benchmark's methods, the bf16 audit and
the runtime-settings script) builds them here, so the baseline and the speculative decode of a job
always share their options:

  fns = modes.decode_fns(target, target_params, drafter, draft_params, gamma=4,
                         max_new_tokens=64, sampling=sampling, sampling_params=params, eos_id=1)
  result = fns['speculative'](encoder_tokens, rng)  # encoder_tokens [B, S] int32 -> DecodeResult
"""

from __future__ import annotations

from typing import Any
from typing import Callable

import jax

from speculative import drafters
from speculative import sampling as sampling_lib
from speculative.decode import loops as decoding
from speculative.decode import state as decode_state

BASELINE = 'baseline'
SPECULATIVE = 'speculative'
MODES = (BASELINE, SPECULATIVE)

DecodeFn = Callable[[jax.Array, Any], decode_state.DecodeResult]


def decode_fns(
  target: Any,
  target_params: Any,
  drafter: Any = None,
  draft_params: Any = None,
  *,
  gamma: int | None = None,
  max_new_tokens: int,
  sampling: sampling_lib.SamplingConfig,
  sampling_params: sampling_lib.SamplingParams,
  eos_id: int | None,
  lenience: float | None = None,
  adaptive_verify: bool = False,
  check_finite: bool = False,
) -> dict[str, DecodeFn]:
  """{mode: fn(encoder_tokens [B, S] int32, rng) -> DecodeResult} for an encoder-decoder target.

  'baseline' is `decoding.autoregressive_decode` of the target; 'speculative' (only when a
  `drafter` is given, with `gamma`) is `decoding.speculative_decode` with that drafter, `lenience`
  (None: exact) and `adaptive_verify`. `check_finite=False` leaves the NaN check to the caller
  (the result's `metrics.invalid`), so a job can name the examples of a bad batch.
  """
  common = dict(
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    sampling_params=sampling_params,
    eos_id=eos_id,
    check_finite=check_finite,
  )

  def baseline(encoder_tokens: jax.Array, rng: Any = 0) -> decode_state.DecodeResult:
    return decoding.autoregressive_decode(
      target, target_params, None, rng=rng, encoder_tokens=encoder_tokens, **common
    )

  fns = {BASELINE: baseline}
  if drafter is None:
    return fns
  if gamma is None:
    raise ValueError('decode_fns: the speculative mode needs gamma')

  def speculative(encoder_tokens: jax.Array, rng: Any = 0) -> decode_state.DecodeResult:
    return decoding.speculative_decode(
      target,
      target_params,
      drafter,
      draft_params,
      None,
      gamma=gamma,
      rng=rng,
      encoder_tokens=encoder_tokens,
      lenience=lenience,
      adaptive_verify=adaptive_verify,
      **common,
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
  return decode_fns(
    target,
    target_params,
    drafters.ModelDrafter(draft),
    draft_params,
    gamma=gamma,
    max_new_tokens=max_new_tokens,
    sampling=sampling,
    sampling_params=sampling_params,
    eos_id=eos_id,
    check_finite=check_finite,
  )
