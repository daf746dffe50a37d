"""`PromptLookupDrafter`: copies the continuation of the latest n-gram match (prompt lookup
decoding; paper Sec. 3.6), with an optional fallback drafter for rows without a match."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculative.drafters import base

DEFAULT_NGRAM_SIZES = (3, 2, 1)  # n-gram lengths searched, longest first


def _latest_match(
  haystack: jax.Array,
  haystack_lengths: jax.Array,
  suffix: jax.Array,
  suffix_ok: jax.Array,
  gamma: int,
) -> tuple[jax.Array, jax.Array, jax.Array]:
  """The continuation of the latest occurrence of `suffix` in `haystack`.

  Args:
    haystack: [B, H] int32; row b is valid on [0, haystack_lengths[b]).
    haystack_lengths: [B] int32.
    suffix: [B, n] int32, the n-gram to find; suffix_ok: [B] bool (False: no search for this row).
    gamma: how many continuation tokens to return.

  Returns:
    found [B] bool (an occurrence at j with at least one valid token after it, j + n < length),
    continuation [B, gamma] int32 (haystack[j+n : j+n+gamma], 0 past the valid part), and
    count [B] int32 = min(gamma, length - (j + n)) (0 when not found).
  """
  batch, width = haystack.shape
  n = suffix.shape[1]
  candidates = width - n + 1
  if candidates < 1:
    zeros = jnp.zeros((batch,), jnp.int32)
    return jnp.zeros((batch,), bool), jnp.zeros((batch, gamma), jnp.int32), zeros
  match = jnp.ones((batch, candidates), bool)
  for i in range(n):
    match = match & (haystack[:, i : i + candidates] == suffix[:, i : i + 1])  # [B, J]
  starts = jnp.arange(candidates, dtype=jnp.int32)[None, :]  # [1, J]
  match = match & (starts + n < haystack_lengths[:, None]) & suffix_ok[:, None]
  best = jnp.max(jnp.where(match, starts, -1), axis=1)  # [B], latest occurrence
  found = best >= 0
  first = jnp.maximum(best, 0) + n  # [B], first continuation position
  count = jnp.where(found, jnp.clip(haystack_lengths - first, 0, gamma), 0)
  positions = jnp.minimum(first[:, None] + jnp.arange(gamma)[None, :], width - 1)  # [B, gamma]
  continuation = jnp.where(
    jnp.arange(gamma)[None, :] < count[:, None], base.gather_rows(haystack, positions), 0
  )
  return found, continuation.astype(jnp.int32), count.astype(jnp.int32)


@flax.struct.dataclass
class PromptLookupState:
  """Draft state of `PromptLookupDrafter`.

  Attributes:
    source: [B, S] int32, the encoder input searched for matches ([B, 1] zeros when not searched).
    source_lengths: [B] int32, its non-pad length (0 when not searched).
    fallback: the fallback drafter's state (None without a fallback).
  """

  source: jax.Array
  source_lengths: jax.Array
  fallback: Any


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter(base.DrafterBase):
  """Copies the continuation of the latest n-gram match (prompt lookup decoding).

  For each row, the last n committed tokens (n from `ngram_sizes`, longest first) are searched for
  in the earlier decoder stream (prompt + generated tokens; for a decoder-only model the prompt) and
  with `search_source`, in the encoder input (T5: the source sentence, right-padded with `pad_id`;
  copying helps with names, numbers, UI labels, markup). For the longest n with a match (the stream
  before the source), the row proposes the up to gamma tokens that followed the latest occurrence,
  with one-hot q (num_drafted = how many tokens were available). Rows without a match take the
  `fallback` drafter's proposal (or propose nothing: num_drafted 0, a plain target step).

  Params: the fallback's params (None without a fallback).
  State: a `PromptLookupState`.

  A stateful fallback must be a `base.GuidedDrafter` (`supports_guided_draft`; ModelDrafter and
  AdaptiveGammaDrafter are): rows that copy feed the copied tokens to the
  fallback, so its cache stays in sync, and a step where every row copies costs one draft call
  instead of gamma. Stateless fallbacks (n-gram drafters) are simply called every step.
  """

  vocab_size: int
  ngram_sizes: tuple[int, ...] = DEFAULT_NGRAM_SIZES
  fallback: base.Drafter | None = None
  search_source: bool = True
  pad_id: int = 0

  def __post_init__(self):
    sizes = tuple(int(n) for n in self.ngram_sizes)
    if not sizes or min(sizes) < 1:
      raise ValueError(
        f'ngram_sizes must be a non-empty tuple of ints >= 1, got {self.ngram_sizes!r}'
      )
    object.__setattr__(self, 'ngram_sizes', tuple(sorted(set(sizes), reverse=True)))
    if self.fallback is not None and self.fallback.vocab_size != self.vocab_size:
      raise ValueError(
        f'PromptLookupDrafter vocab_size {self.vocab_size} != fallback vocab_size '
        f'{self.fallback.vocab_size}'
      )

  def start(self, prompt: base.DraftPrompt) -> base.DraftState:
    """The encoder input to search (when `search_source`) and the fallback's state."""
    batch = prompt.prompt_tokens.shape[0]
    if prompt.encoder_tokens is None or not self.search_source:
      source = jnp.zeros((batch, 1), jnp.int32)
      source_lengths = jnp.zeros((batch,), jnp.int32)
    else:
      source = jnp.asarray(prompt.encoder_tokens, jnp.int32)
      source_lengths = jnp.sum(source != self.pad_id, axis=1).astype(jnp.int32)
    fallback_state = None if self.fallback is None else prompt.init(self.fallback)
    return PromptLookupState(source=source, source_lengths=source_lengths, fallback=fallback_state)

  def lookup(
    self, state: base.DraftState, tokens: jax.Array, lengths: jax.Array, gamma: int
  ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(found [B] bool, continuation [B, gamma] int32, count [B] int32) for committed streams."""
    batch = tokens.shape[0]
    found = jnp.zeros((batch,), bool)
    continuation = jnp.zeros((batch, gamma), jnp.int32)
    count = jnp.zeros((batch,), jnp.int32)
    for n in self.ngram_sizes:  # longest first; the first hit per row wins
      suffix_ok = lengths >= n
      positions = jnp.maximum(lengths[:, None] - n + jnp.arange(n)[None, :], 0)  # [B, n]
      suffix = base.gather_rows(tokens, positions)
      haystacks = [(tokens, lengths)]
      if self.search_source:
        haystacks.append((state.source, state.source_lengths))
      for haystack, haystack_lengths in haystacks:
        hit, cont, num = _latest_match(haystack, haystack_lengths, suffix, suffix_ok, gamma)
        take = hit & ~found
        continuation = jnp.where(take[:, None], cont, continuation)
        count = jnp.where(take, num, count)
        found = found | hit
    return found, continuation, count

  def step(
    self, call: base.DraftCall, state: base.DraftState
  ) -> tuple[base.DraftProposal, base.DraftState]:
    """The copied continuation where a row has a match, else the fallback's proposal."""
    found, continuation, count = self.lookup(state, call.tokens, call.lengths, call.gamma)
    copied = base.one_hot_proposal(continuation, count, self.vocab_size)
    if self.fallback is None:
      return copied, state
    hooks = None
    if self.fallback.supports_guided_draft:
      hooks = base.DraftHooks(
        max_drafted=jnp.where(found, count, call.gamma), forced_tokens=continuation, forced=found
      )
    fallback, fallback_state = call.ask(self.fallback, state.fallback, hooks)
    proposal = jax.tree.map(
      lambda a, b: jnp.where(found.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), copied, fallback
    )
    return proposal, state.replace(fallback=fallback_state)
