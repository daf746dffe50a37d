"""Draft sources for speculative decoding.

A drafter is a small frozen (hashable) dataclass: a jit static argument holding only configuration.
Its mutable part (a model cache, a table position, ...) is a pytree "draft state" that the decode
loop threads through its `lax.while_loop` state. Every drafter implements:

  vocab_size: int
  init(params, prompt_tokens[B, P], prompt_lengths[B], max_length, encoder_tokens=None) -> state
      Called once per decode, before the loop; may prefill with the (padded) prompt.
  propose(params, state, tokens[B, L_max], lengths[B], gamma, keys[B], sampling, sampling_params)
      -> (DraftProposal, state)
      `tokens` is the decode loop's committed token buffer (row b is valid on [0, lengths[b])),
      `gamma` is static, `keys` holds one PRNG key per row (already specific to this row and step).
      The proposal's `probs` must be the distribution each token was drawn from, standardized with
      the same `sampling` transform as the target, so the acceptance rule stays exact. A drafter that
      has nothing to propose for a row sets `num_drafted[b] < gamma` (filler tokens beyond it are
      ignored); deterministic drafters (n-gram, prompt lookup) use one-hot probs.

`ModelDrafter(model)` drafts with a smaller `CachedLM`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import flax.struct
import jax
import jax.numpy as jnp

from speculative import sampling as sampling_lib
from speculative.models.interface import CachedLM

DraftState = Any


@flax.struct.dataclass
class DraftProposal:
  """Draft tokens for one speculative step.

  Attributes:
    tokens: [B, gamma] int32, x_1..x_gamma (beyond num_drafted: any filler; the loop replaces it).
    probs: [B, gamma, V] float32, q_i: the standardized distribution x_i was drawn from.
    num_drafted: [B] int32 in [0, gamma], how many tokens each row actually proposed.
  """
  tokens: jax.Array
  probs: jax.Array
  num_drafted: jax.Array


class Drafter(Protocol):
  """The draft-source interface (see the module docstring)."""

  @property
  def vocab_size(self) -> int:
    ...

  def init(self, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
           max_length: int, encoder_tokens: jax.Array | None = None) -> DraftState:
    ...

  def propose(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
              gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
              sampling_params: sampling_lib.SamplingParams) -> tuple[DraftProposal, DraftState]:
    ...


def _gather_rows(tokens: jax.Array, positions: jax.Array) -> jax.Array:
  """tokens [B, L], positions [B, T] -> tokens[b, positions[b, t]] as [B, T]."""
  return jnp.take_along_axis(tokens, positions, axis=1)


@dataclasses.dataclass(frozen=True)
class ModelDrafter:
  """Drafts gamma tokens autoregressively with a small CachedLM and its own KV cache.

  Draft state: the draft model's cache (max_length positions).

  Who has seen which token: the draft cache must be correct on positions [0, length-2) at the start
  of `propose` (the prefill establishes it; see below for why it persists). The first draft call
  feeds the last two committed tokens at start = length-2 (a T=2 call; at length 1, the first
  token and a filler at start 0): this catches up on x_gamma and the bonus token after an
  all-accepted step, or re-writes one identical entry plus the correction after a rejection, with
  one code path and no ragged shapes. Then gamma-1 T=1 calls feed x_1..x_{gamma-1} (x_gamma is only
  sampled). After the step the committed length is L' = L+n+1 and the cache is correct through
  position L+min(n, gamma-1)-1 >= L'-3, so the invariant holds again; entries beyond are stale and
  get overwritten before anything attends to them.
  """
  model: CachedLM

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def init(self, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
           max_length: int, encoder_tokens: jax.Array | None = None) -> DraftState:
    assert prompt_tokens.ndim == 2, prompt_tokens.shape
    batch = prompt_tokens.shape[0]
    cache = self.model.init_cache(params, batch, max_length, encoder_tokens)
    # Prefill the padded prompt at 0; entries past a row's length are stale and later overwritten.
    _, cache = self.model.extend(params, cache, prompt_tokens,
                                 jnp.zeros((batch,), jnp.int32))
    return cache

  def propose(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
              gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
              sampling_params: sampling_lib.SamplingParams) -> tuple[DraftProposal, DraftState]:
    assert tokens.ndim == 2 and lengths.shape == tokens.shape[:1], (tokens.shape, lengths.shape)
    batch = tokens.shape[0]
    cache = state
    # Draft token j (0-based) of row b uses fold_in(keys[b], j): one fresh key per use.
    step_keys = lambda j: jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, j)  # [B]

    # Catch-up call: the last two committed tokens, T=2, at start = max(length-2, 0).
    start = jnp.maximum(lengths - 2, 0)  # [B]
    catch_up = _gather_rows(tokens, start[:, None] + jnp.arange(2)[None, :])  # [B, 2]
    logits, cache = self.model.extend(params, cache, catch_up, start)  # [B, 2, V]
    last_index = (lengths - 1 - start)[:, None, None]  # 1, or 0 when length == 1
    logits = jnp.take_along_axis(logits, last_index, axis=1)[:, 0]  # [B, V]
    probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)  # [B, V]
    token = sampling_lib.sample_rows(step_keys(0), probs)  # [B]

    def draft_step(carry, inputs):
      cache, prev_token, prev_probs = carry
      position = inputs  # [] int32, 1-based index of the token being fed
      logits, cache = self.model.extend(params, cache, prev_token[:, None],
                                        lengths - 1 + position)  # [B, 1, V]
      probs = sampling_lib.probs_from_logits(logits[:, 0], sampling, sampling_params)  # [B, V]
      token = sampling_lib.sample_rows(step_keys(position), probs)  # [B]
      return (cache, token, probs), (prev_token, prev_probs)

    # Position j (1-based) feeds x_j at length-1+j and samples x_{j+1}; scan emits x_j, q_j.
    (cache, last_token, last_probs), (tokens_out, probs_out) = jax.lax.scan(
        draft_step, (cache, token, probs),
        jnp.arange(1, gamma, dtype=jnp.int32))
    draft_tokens = jnp.concatenate(
        [jnp.swapaxes(tokens_out, 0, 1), last_token[:, None]], axis=1)  # [B, gamma]
    draft_probs = jnp.concatenate(
        [jnp.swapaxes(probs_out, 0, 1), last_probs[:, None]], axis=1)  # [B, gamma, V]
    proposal = DraftProposal(tokens=draft_tokens, probs=draft_probs,
                             num_drafted=jnp.full((batch,), gamma, jnp.int32))
    return proposal, cache
