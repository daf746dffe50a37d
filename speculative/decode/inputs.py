"""Eager checks of what a decode call is given, before anything is traced: prompts, encoder inputs,
sampling values, seeds and row ids become one `DecodeInputs`; invalid distributions found while
decoding are raised after it (`raise_if_invalid`)."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib
from speculative.decode import options as decode_options
from speculative.models import interface

NO_STEP_LIMIT = np.int32(np.iinfo(np.int32).max)


@flax.struct.dataclass
class DecodeInputs:
  """The validated, normalized inputs of a decode call (a pytree of arrays; the static options,
  eos_id among them, are `DecodeOptions`).

  Attributes:
    prompt_tokens: [B, P] int32 decoder prompts, left-aligned, right-padded.
    prompt_lengths: [B] int32 in [1, P].
    encoder_tokens: [B, S] int32 encoder input of an encoder-decoder target, or None.
    sampling_params: SamplingParams of [] arrays (temperature f32, top_k i32, top_p f32).
    rng: a typed PRNG key.
    row_ids: [B] int32 RNG row identities.
    draft_encoder_tokens: [B, S'] int32 encoder input of an encoder-decoder draft (by default the
      target's `encoder_tokens`), or None (no encoder input, or no drafter).
    max_steps: [] int32, the loop stops after this many steps even if rows are not done (a
      run-time value: the jobs' calibration times the compiled loop without its steps, 0, and
      whole; default: no limit).
  """

  prompt_tokens: jax.Array
  prompt_lengths: jax.Array
  encoder_tokens: jax.Array | None
  sampling_params: sampling_lib.SamplingParams
  rng: jax.Array
  row_ids: jax.Array
  draft_encoder_tokens: jax.Array | None = None
  max_steps: jax.Array = NO_STEP_LIMIT

  def with_drafter(
    self, target: interface.CachedLM, drafter: Any, draft_encoder_tokens=None
  ) -> 'DecodeInputs':
    """These inputs for a drafted decode: checks that `drafter` proposes over the target's
    vocabulary (ValueError if not) and sets the draft's encoder input (`draft_encoder_tokens`,
    default the target's `encoder_tokens`)."""
    if drafter.vocab_size != target.vocab_size:
      raise ValueError(
        f'draft and target vocabularies differ: draft vocab_size '
        f'{drafter.vocab_size} != target vocab_size {target.vocab_size}'
      )
    if draft_encoder_tokens is None:
      draft_encoder_tokens = self.encoder_tokens
    elif self.encoder_tokens is None:
      raise ValueError('draft_encoder_tokens given without encoder_tokens for the target')
    else:
      draft_encoder_tokens = jnp.asarray(draft_encoder_tokens).astype(jnp.int32)
    return self.replace(draft_encoder_tokens=draft_encoder_tokens)


def as_key(rng: Any) -> jax.Array:
  """A typed PRNG key from an int seed, a raw uint32 key or a typed key."""
  if isinstance(rng, (int, np.integer)):
    return jax.random.key(int(rng))
  rng = jnp.asarray(rng) if not isinstance(rng, jax.Array) else rng
  if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return rng
  return jax.random.wrap_key_data(rng.astype(jnp.uint32))


def prepare_inputs(
  target: interface.CachedLM,
  options: decode_options.DecodeOptions,
  prompt_tokens,
  prompt_lengths,
  encoder_tokens,
  sampling_params,
  rng,
  row_ids,
  max_steps: int | None = None,
) -> DecodeInputs:
  """Validates and normalizes the inputs shared by every decoder (ValueError naming the first bad
  one); `options` are checked on construction, here only against the target (eos_id < vocab)."""
  if max_steps is not None and (
    not isinstance(max_steps, (int, np.integer)) or isinstance(max_steps, bool) or max_steps < 0
  ):
    raise ValueError(f'max_steps must be None or an int >= 0, got {max_steps!r}')
  eos_id = options.eos_id
  sampling_params = _sampling_values(options.sampling, sampling_params)
  if prompt_tokens is None:
    prompt_tokens, prompt_lengths = _start_token_prompt(encoder_tokens, prompt_lengths)
  prompt_tokens = _checked_prompt(prompt_tokens)
  batch, prompt_len = prompt_tokens.shape
  if prompt_lengths is None:
    prompt_lengths = jnp.full((batch,), prompt_len, jnp.int32)
  prompt_lengths = _checked_prompt_lengths(prompt_lengths, batch, prompt_len)
  vocab = target.vocab_size
  if not isinstance(prompt_tokens, jax.core.Tracer):
    tokens_np = np.asarray(prompt_tokens)
    if tokens_np.min() < 0 or tokens_np.max() >= vocab:
      raise ValueError(
        f'prompt token ids must be in [0, {vocab}), got range '
        f'[{tokens_np.min()}, {tokens_np.max()}]'
      )
  if eos_id is not None and not 0 <= eos_id < vocab:
    raise ValueError(f'eos_id must be None or an int in [0, {vocab}), got {eos_id!r}')
  if row_ids is None:
    row_ids = jnp.arange(batch, dtype=jnp.int32)
  row_ids = jnp.asarray(row_ids).astype(jnp.int32)
  if row_ids.shape != (batch,):
    raise ValueError(f'row_ids must have shape [{batch}], got {row_ids.shape}')
  return DecodeInputs(
    prompt_tokens=prompt_tokens,
    prompt_lengths=prompt_lengths,
    encoder_tokens=_checked_encoder_tokens(encoder_tokens, batch),
    sampling_params=sampling_params,
    rng=as_key(rng),
    row_ids=row_ids,
    max_steps=jnp.asarray(NO_STEP_LIMIT if max_steps is None else max_steps, jnp.int32),
  )


def _sampling_values(
  sampling: sampling_lib.SamplingConfig, sampling_params
) -> sampling_lib.SamplingParams:
  """The run-time sampling values as [] arrays (default: temperature 1), range-checked."""
  if sampling_params is None:
    sampling_params = sampling_lib.SamplingParams.create()
  sampling_params = sampling_lib.SamplingParams(
    temperature=jnp.asarray(sampling_params.temperature, jnp.float32),
    top_k=jnp.asarray(sampling_params.top_k, jnp.int32),
    top_p=jnp.asarray(sampling_params.top_p, jnp.float32),
  )
  sampling_params.validate()
  return sampling_params


def _start_token_prompt(encoder_tokens, prompt_lengths) -> tuple[jax.Array, Any]:
  """Encoder-decoder: the decoder stream starts with the decoder start token (0 for T5)."""
  if encoder_tokens is None:
    raise ValueError(
      'empty input: pass prompt_tokens (decoder-only) or encoder_tokens (encoder-decoder)'
    )
  batch = np.shape(encoder_tokens)[0]
  if prompt_lengths is None:
    prompt_lengths = jnp.ones((batch,), jnp.int32)
  return jnp.zeros((batch, 1), jnp.int32), prompt_lengths


def _checked_prompt(prompt_tokens) -> jax.Array:
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
  return prompt_tokens.astype(jnp.int32)


def _checked_prompt_lengths(prompt_lengths, batch: int, prompt_len: int) -> jax.Array:
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
  return prompt_lengths


def _checked_encoder_tokens(encoder_tokens, batch: int) -> jax.Array | None:
  if encoder_tokens is None:
    return None
  encoder_tokens = jnp.asarray(encoder_tokens).astype(jnp.int32)
  if encoder_tokens.ndim != 2 or encoder_tokens.shape[0] != batch:
    raise ValueError(f'encoder_tokens must be [{batch}, S], got {encoder_tokens.shape}')
  if encoder_tokens.shape[1] < 1:
    raise ValueError('empty input: encoder_tokens has length 0')
  return encoder_tokens


def raise_if_invalid(result: Any, check_finite: bool) -> None:
  """ValueError naming the rows whose distributions were invalid (NaN/inf logits), if
  `check_finite` and the result is concrete."""
  if check_finite and not isinstance(result.metrics.invalid, jax.core.Tracer):
    invalid = np.asarray(result.metrics.invalid)
    if invalid.any():
      raise ValueError(
        f'NaN/+inf or all -inf logits (no valid distribution) in rows '
        f'{np.flatnonzero(invalid)[:10].tolist()}; check the model parameters'
      )
