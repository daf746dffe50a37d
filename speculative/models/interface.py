"""The one protocol through which decode loops reach a model.

Every model (decoder-only GPT, T5 encoder-decoder, ...) is a *frozen, hashable dataclass* holding only
static configuration, so it can be passed to `jax.jit` as a static argument without recompiling per
call. Parameters and caches are pytrees passed separately.

The decode loops see a model only as a *decoder stream*: a sequence of token ids per row, fed in
chunks through `extend`. For a decoder-only model the prompt is the start of that stream; for an
encoder-decoder model the encoder input is consumed once by `init_cache` (encoder forward and the
cross-attention keys/values go into the cache) and the stream starts with the decoder start token.

Cache contract (all implementations):
  * `extend(params, cache, tokens[B, T], start[B])` writes keys/values of the T new tokens at
    positions `start[b] .. start[b] + T - 1` of row b and returns the logits at those positions.
    Those positions must lie inside the cache (start[b] + T <= max_length): past it, T5 drops the
    write, `DecoderOnlyLM` clamps it onto earlier positions (see its `extend`); the decode loops'
    caches (decode/state.py's `buffer_length`) hold their longest write.
  * A query at position j attends to cache positions 0..j of its own row (causal), plus, for an
    encoder-decoder, the non-padding encoder positions.
  * Entries at positions > j are never read by a query at j. Hence "rolling back" rejected tokens
    needs no cache surgery: the decode loop simply re-feeds from the committed length, overwriting
    the stale entries before anything can attend to them.
  * T=1 is ordinary decoding, T=gamma+1 is the verify call; both go through the same code path, so
    cached chunked decoding equals the full no-cache forward (tested).
"""

from __future__ import annotations

from typing import Any
from typing import ClassVar
from typing import Protocol

import jax
import jax.numpy as jnp

Params = Any
Cache = Any

# The positions of a decode loop's cache (decode/state.py's `buffer_length`) past the ones fed for
# a row whose tokens the loop keeps: such a row feeds at most P + N - 1 + gamma positions (P the
# padded prompt, N max_new_tokens: its last token's verify at P + N - 2, with the gamma drafts
# after it); a finished row still feeds its last position P + N - 1 (its outputs discarded) and
# the token buffer takes the block it still writes after that. A model that embeds a bounded
# number of positions (`DecoderOnlyLM` with learned positions) checks the fed ones against it.
UNFED_POSITIONS = 2


class CachedLM(Protocol):
  """A language model with a chunked, per-row-offset KV cache."""

  @property
  def vocab_size(self) -> int: ...

  def init_cache(
    self, params: Params, batch_size: int, max_length: int, encoder_tokens: jax.Array | None = None
  ) -> Cache:
    """Returns an empty cache for `max_length` decoder positions.

    For encoder-decoder models this runs the encoder once on `encoder_tokens` ([B, S] int32, 0 =
    padding) and stores the cross-attention keys/values in the cache. Decoder-only models require
    `encoder_tokens is None`.
    """
    ...

  def extend(
    self, params: Params, cache: Cache, tokens: jax.Array, start: jax.Array
  ) -> tuple[jax.Array, Cache]:
    """Cached forward over T new tokens per row.

    Args:
      params: the model's parameters.
      cache: from `init_cache` or a previous `extend`.
      tokens: [B, T] int32 token ids.
      start: [B] int32, the position of tokens[:, 0] in each row.

    Returns:
      logits: [B, T, V] float32; logits[b, t] predicts the token at position start[b] + t + 1.
      cache: the updated cache.
    """
    ...


class ModuleLM:
  """Base of the CachedLM wrappers around one flax module built from a `config` (a frozen
  dataclass field of the subclass) that has `vocab_size`; the subclass names the module's class in
  `module_type`."""

  module_type: ClassVar[type]

  @property
  def vocab_size(self) -> int:
    return self.config.vocab_size

  @property
  def module(self) -> Any:
    """The model's flax module (unbound)."""
    return self.module_type(self.config)


def prefill(model: CachedLM, params: Any, cache: Any, prompt_tokens: jax.Array) -> Any:
  """`model`'s cache after feeding prompt_tokens [B, P] but their last position, at 0.

  A decode only needs the entries at [0, lengths-1) <= [0, P-1) before its first step, which feeds
  each row's last committed token at lengths-1 itself; so nothing is fed when P = 1 (an
  encoder-decoder's start token): one decoder call less per decode, and one program less to
  compile. Entries past a row's length are stale and overwritten before anything attends to them.
  """
  batch, prompt_len = prompt_tokens.shape
  if prompt_len == 1:
    return cache
  _, cache = model.extend(
    params, cache, prompt_tokens[:, : prompt_len - 1], jnp.zeros((batch,), jnp.int32)
  )  # [B, P-1, V] logits, unused
  return cache
