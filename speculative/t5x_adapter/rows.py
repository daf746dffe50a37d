"""T5X batch rows for the speculative adapter, without t5x: each example repeated `num_decodes`
times, the decode arguments they share, and the decodes, scores and metrics laid out as T5X's
`predict_batch_with_aux` returns them (used by `models.SpeculativeEncoderDecoderModel`)."""

from __future__ import annotations

from typing import Any
from typing import Mapping

import flax.struct
import jax
import jax.numpy as jnp

from speculative.decode import state as decode_state
from speculative.t5x_adapter import options as options_lib

Array = jax.Array


@flax.struct.dataclass
class ExpandedRows:
  """A T5X batch with each example repeated num_decodes times in place ([e0, e0, e1, e1, ...],
  like T5X's flat_batch_beam_expand); R = B * num_decodes rows.

  Attributes:
    encoder_tokens: [R, S] int32.
    decoder_input_tokens: [B, L] int32, the batch's (not expanded; L is the decode length).
    prompt_tokens: [R, L] int32 decoder prompts [0 (BOS), prompt, 0...] (EOS stripped), or None
      without prompt_with_targets (then the decoder starts from BOS alone).
    stream_lengths: [R] int32, prompt length + 1 (BOS), or None.
    prompt_len: [R] int32, prompt tokens per row, BOS not counted (0 without prompts).
  """

  encoder_tokens: Array
  decoder_input_tokens: Array
  prompt_tokens: Array | None
  stream_lengths: Array | None
  prompt_len: Array


def expand_rows(
  batch: Mapping[str, Array], num_decodes: int, eos_id: int, prompt_with_targets: bool
) -> ExpandedRows:
  """Checks the batch's shapes and repeats each example num_decodes times (`ExpandedRows`)."""
  encoder_tokens = jnp.asarray(batch['encoder_input_tokens']).astype(jnp.int32)  # [B, S]
  decoder_input_tokens = jnp.asarray(batch['decoder_input_tokens']).astype(jnp.int32)  # [B, L]
  if encoder_tokens.ndim != 2 or decoder_input_tokens.ndim != 2:
    raise ValueError(
      f'encoder_input_tokens and decoder_input_tokens must be [batch, length], '
      f'got {encoder_tokens.shape} and {decoder_input_tokens.shape}'
    )
  rows = decoder_input_tokens.shape[0] * num_decodes
  encoder_tokens = jnp.repeat(encoder_tokens, num_decodes, axis=0)  # [R, S]
  if not prompt_with_targets:
    return ExpandedRows(
      encoder_tokens=encoder_tokens,
      decoder_input_tokens=decoder_input_tokens,
      prompt_tokens=None,
      stream_lengths=None,
      prompt_len=jnp.zeros((rows,), jnp.int32),
    )
  prompt = decoder_input_tokens * (decoder_input_tokens != eos_id)  # EOS stripped
  prompt = jnp.repeat(prompt, num_decodes, axis=0)  # [R, L]: [0 (BOS), prompt, 0...]
  prompt_len = jnp.sum(prompt != 0, axis=1).astype(jnp.int32)  # [R], BOS not counted
  return ExpandedRows(
    encoder_tokens=encoder_tokens,
    decoder_input_tokens=decoder_input_tokens,
    prompt_tokens=prompt,
    stream_lengths=prompt_len + 1,
    prompt_len=prompt_len,
  )


def decode_args(
  rows: ExpandedRows, opts: options_lib.DecodeOptions, decode_len: int
) -> dict[str, Any]:
  """The arguments that the speculative decode and the baseline (check_exactness) share."""
  max_new = decode_len if opts.max_decode_steps is None else min(decode_len, opts.max_decode_steps)
  return dict(
    prompt_tokens=rows.prompt_tokens,
    prompt_lengths=rows.stream_lengths,
    max_new_tokens=max_new,
    sampling=opts.sampling,
    sampling_params=opts.sampling_params,
    rng=opts.decode_rng,
    eos_id=opts.eos_id,
    encoder_tokens=rows.encoder_tokens,
    row_ids=jnp.arange(rows.encoder_tokens.shape[0], dtype=jnp.int32),
    check_finite=False,
  )


def t5x_layout(
  result: decode_state.DecodeResult, rows: ExpandedRows, decode_len: int, prompt_with_targets: bool
) -> tuple[Array, Array]:
  """(decodes [R, L] int32 in T5X's layout, num_tokens [R] generated tokens that fit).

  Without prompts the decodes are the generated tokens, 0-padded to L. With prompts each row is
  the prompt (without BOS) followed by the generated tokens, cut at L.
  """
  generated = result.tokens  # [R, max_new], 0 after each row's length
  max_new = generated.shape[1]
  if max_new < decode_len:
    generated = jnp.pad(generated, ((0, 0), (0, decode_len - max_new)))  # [R, L]
  num_tokens = result.lengths  # [R]
  if not prompt_with_targets:
    return generated.astype(jnp.int32), num_tokens
  prompt_len = rows.prompt_len
  positions = jnp.arange(decode_len)[None, :]  # [1, L]
  from_prompt = jnp.take_along_axis(
    rows.prompt_tokens, jnp.minimum(positions + 1, decode_len - 1), axis=1
  )
  from_generated = jnp.take_along_axis(
    generated, jnp.clip(positions - prompt_len[:, None], 0, decode_len - 1), axis=1
  )
  decodes = jnp.where(positions < prompt_len[:, None], from_prompt, from_generated)
  num_tokens = jnp.minimum(num_tokens, decode_len - prompt_len)
  decodes = jnp.where(positions < (prompt_len + num_tokens)[:, None], decodes, 0)
  return decodes.astype(jnp.int32), num_tokens


def metrics_aux(
  result: decode_state.DecodeResult,
  scores: Array,
  num_tokens: Array,
  opts: options_lib.DecodeOptions | None = None,
) -> dict[str, Array]:
  """aux: scores and the per-row speculative metrics (docs/design.md, metric definitions); with
  SpecTr (`opts.method`) also K, L and the acceptance with K drafts (alpha = alpha_sum /
  selections) beside one draft's at the same conditionals (alpha_one_draft)."""
  metrics = result.metrics
  drafted = jnp.maximum(metrics.drafted, 1).astype(jnp.float32)
  aux = {
    'scores': scores,
    'num_tokens': num_tokens.astype(jnp.int32),
    'target_calls': metrics.target_calls,
    'drafted': metrics.drafted,
    'accepted': metrics.accepted,
    'alpha_sum': metrics.alpha_sum,
    'alpha': jnp.where(metrics.drafted > 0, metrics.alpha_sum / drafted, 0.0),
    'acceptance_rate': jnp.where(metrics.drafted > 0, metrics.accepted / drafted, 0.0),
    'block_efficiency': result.lengths / jnp.maximum(metrics.target_calls, 1),
    'invalid': metrics.invalid.astype(jnp.int32),
  }
  if opts is None or opts.method != 'spectr':
    return aux
  selections = jnp.maximum(metrics.selections, 1).astype(jnp.float32)
  rows = num_tokens.shape[0]
  aux.update(
    num_drafts=jnp.full((rows,), opts.num_drafts, jnp.int32),
    draft_length=jnp.full((rows,), opts.gamma, jnp.int32),
    selections=metrics.selections,
    single_alpha_sum=metrics.single_alpha_sum,
    alpha=jnp.where(metrics.selections > 0, metrics.alpha_sum / selections, 0.0),
    alpha_one_draft=jnp.where(metrics.selections > 0, metrics.single_alpha_sum / selections, 0.0),
  )
  return aux


def sort_decodes(
  decodes: Array, aux: Mapping[str, Array], num_decodes: int, return_all_decodes: bool
) -> tuple[Array, Mapping[str, Array]]:
  """[B*N, L] decodes and [B*N] aux -> T5X's outputs: [B, N, L] sorted by ascending score (as
  temperature_sample sorts), or the best [B, L] with [B] aux."""
  decode_len = decodes.shape[1]
  decodes = decodes.reshape(-1, num_decodes, decode_len)  # [B, N, L]
  aux = {k: v.reshape(-1, num_decodes) for k, v in aux.items()}  # each [B, N]
  if num_decodes > 1:
    order = jnp.argsort(aux['scores'], axis=1)
    decodes = jnp.take_along_axis(decodes, order[:, :, None], axis=1)
    aux = {k: jnp.take_along_axis(v, order, axis=1) for k, v in aux.items()}
  if return_all_decodes:
    return decodes, aux
  return decodes[:, -1, :], {k: v[:, -1] for k, v in aux.items()}
