"""SpecTr decoding (Sun et al., NeurIPS 2023): K i.i.d. draft sequences per step, one target call.

`spectr_decode` is `decode/loops.py`'s `speculative_decode` with K drafts instead of one: every step drafts K
sequences of length L (= gamma) for each row, verifies all K x (L+1) positions in one batched target
`extend`, and picks the emitted block with the sequence-level selection of the paper's Algorithm 3
(`spectr/sequence.py`'s `spectr_sequence_select`, k-Seq with the optimal rho* at every depth). The output is
distributed exactly as the target's (identical to it under argmax), and K = 1 is Leviathan's
algorithm: the same tokens as `speculative_decode` for the same rng (tested).

Layout: the K drafts of row b live in rows b*K .. b*K+K-1 of "expanded" caches ([K*B, ...]; both
the target's and the drafter's state are repeated K times along axis 0 after the prefill, for
encoder-decoder models too, so the encoder runs once per row). The token buffer, lengths, done
flags and metrics stay per original row ([B, ...]). A step is decode/step.py's, the one of
`speculative_decode`, with K drafts:
  1. draft: drafter.propose on all K*B rows in one batched call (the committed tokens repeated K
     times); copy j of row b gets its own PRNG key, so the K drafts are i.i.d.;
  2. verify: one target `extend` over [K*B, L+1] = [last committed token, draft j] at start =
     length-1;
  3. accept: `spectr_sequence_select` per original row (vectorized): n accepted tokens, the next
     token and the branch (a draft whose first n tokens were emitted);
  4. commit: the block exactly as `speculative_decode` commits it (EOS, max_new_tokens), and all K
     copies of row b adopt the chosen branch's caches: its cache rows are gathered into all K
     slots. The chosen branch's caches hold exactly the committed stream on the positions the
     invariants of `decode/state.py` / `ModelDrafter` need (the other branches differ only there);
     entries beyond the committed length are stale and never read, so copying whole rows is
     correct. Cache leaves that the target's `extend` passes through unchanged (e.g. a T5's encoder
     output and cross-attention keys/values) are identical in all K copies and are not copied.

Keys (row b, step s; `decode/step.py`'s `row_keys` = fold_in(fold_in(fold_in(rng, row_id), s), use)):
  * draft copy 0 uses use=0, the key speculative_decode's drafter gets; copy j >= 1 uses
    fold_in(use=2 key, j);
  * use=1 is split as in `speculative_accept`: fold_in(., 0) gives the acceptance uniforms, shape
    [L, K] (for K = 1 the same numbers as speculative_accept's [gamma]), fold_in(., 1) the one
    residual / bonus sample (Gumbel-max, as speculative_accept).
So with K = 1 every random number is consumed for the same purpose as in speculative_decode.

Metrics (decode/state.py's `SpecTrMetrics`, per original row, steps in which the row was not yet done):
  target_calls counts steps (one batched call over the K drafts is one call: on a TPU the K*(L+1)
  positions cost about what L+1 do; on this CPU they do not, which the walltime shows); `drafted`
  counts per step the most tokens any of the K drafts proposed (L for a drafter that always drafts
  L: the draft model produces K*L tokens, batched); block efficiency = generated tokens /
  target_calls, as everywhere (docs/design.md section 7). The token-level acceptance probability
  with the surviving drafts is `alpha_sum / selections` (compare `single_alpha_sum / selections`:
  one draft at the same conditionals, Leviathan's alpha).
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from speculative import sampling as sampling_lib
from speculative.decode import inputs as decode_inputs
from speculative.decode import options as decode_options
from speculative.decode import state as decode_state
from speculative.decode import step as decode_step
from speculative.drafters import base as drafter_base
from speculative.models import interface
from speculative.spectr import kseq


@functools.partial(
  jax.jit,
  static_argnames=('target', 'drafter', 'options', 'num_drafts', 'num_iters'),
)
def _spectr_jit(
  target_params,
  draft_params,
  inputs: decode_inputs.DecodeInputs,
  *,
  target: interface.CachedLM,
  drafter: drafter_base.Drafter,
  options: decode_options.DecodeOptions,
  num_drafts: int,
  num_iters: int,
):
  decode_state.TRACE_COUNTS['spectr_decode'] += 1
  return decode_step.run(
    decode_step.LoopSpec(
      target,
      target_params,
      options,
      inputs,
      drafter,
      draft_params,
      num_drafts=num_drafts,
      num_iters=num_iters,
    )
  )


def spectr_decode(
  target: interface.CachedLM,
  target_params: Any,
  drafter: drafter_base.Drafter,
  draft_params: Any,
  prompt_tokens: jax.Array | None,
  prompt_lengths: jax.Array | None = None,
  *,
  num_drafts: int,
  draft_length: int | None = None,
  options: decode_options.DecodeOptions | None = None,
  sampling_params: sampling_lib.SamplingParams | None = None,
  rng: Any = 0,
  encoder_tokens: jax.Array | None = None,
  draft_encoder_tokens: jax.Array | None = None,
  row_ids: jax.Array | None = None,
  num_iters: int = kseq.DEFAULT_BISECTION_ITERS,
  check_finite: bool = True,
  max_steps: int | None = None,
  **option_fields: Any,
) -> decode_state.DecodeResult:
  """SpecTr decoding: K i.i.d. drafts of length L, one target call over K x (L+1) positions a step.

  Arguments as in `decode/loops.py`'s `speculative_decode` (gamma is `draft_length`), plus:
    num_drafts: K, drafts per row and step (static, >= 1). K = 1 is `speculative_decode`.
    draft_length: L, tokens per draft (static, >= 1): the options' gamma.
    num_iters: bisection steps for rho* (static).
    max_steps: stop after this many steps even if rows are not done (a run-time value, as in
      `speculative_decode`; default: no limit).
  The drafter must sample its copies independently given different keys (`ModelDrafter` does; a
  deterministic drafter gives K identical drafts, which is exact but gains nothing), and its state
  must have the batch on axis 0 of every leaf.

  Returns:
    decode_state.DecodeResult whose `metrics` is a SpecTrMetrics (per original row).
  """
  decode_options.check_positive_int('num_drafts', num_drafts)
  if draft_length is not None:
    decode_options.check_positive_int('draft_length', draft_length)
    option_fields['gamma'] = draft_length
  decode_options.check_positive_int('num_iters', num_iters)
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
  result = _spectr_jit(
    target_params,
    draft_params,
    inputs,
    target=target,
    drafter=drafter,
    options=options,
    num_drafts=int(num_drafts),
    num_iters=int(num_iters),
  )
  decode_inputs.raise_if_invalid(result, check_finite)
  return result
