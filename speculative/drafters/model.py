"""`ModelDrafter`: a small CachedLM drafts autoregressively with its own KV cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculative import sampling as sampling_lib
from speculative.drafters import base
from speculative.models import interface


def draft_confidence(logits: jax.Array) -> jax.Array:
  """[..., V] logits -> [...] max_x softmax(logits)(x), the model's own (temperature-1) confidence.

  Used by the adaptive-gamma stop rule. It is taken before the sampling transform on purpose: under
  argmax decoding the standardized q is one-hot (confidence always 1).
  """
  logits = logits.astype(jnp.float32)
  shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
  return 1.0 / jnp.sum(jnp.exp(shifted), axis=-1)  # = exp(max) / sum(exp)


@flax.struct.dataclass
class Guidance:
  """What a wrapper asks of one `ModelDrafter.draft` call (see `base.GuidedDrafter`).

  Attributes:
    max_drafted: [B] int32 in [1, gamma], the most tokens row b may draft.
    forced_tokens: [B, gamma] int32, what a forced row is fed instead of its own samples.
    forced: [B] bool, the row is forced (it then ignores `stop_below`).
    guided: static; False when no row can be forced (forced tokens are then never read).
  """

  max_drafted: jax.Array
  forced_tokens: jax.Array
  forced: jax.Array
  guided: bool = flax.struct.field(pytree_node=False)

  @classmethod
  def from_hooks(cls, hooks: base.DraftHooks, batch: int, gamma: int) -> Guidance:
    """The hooks of a `draft` call, with their defaults filled in (B = batch rows)."""
    max_drafted = hooks.max_drafted
    if max_drafted is None:
      max_drafted = jnp.full((batch,), gamma, jnp.int32)
    max_drafted = jnp.clip(max_drafted.astype(jnp.int32), 1, gamma)  # [B]
    if hooks.forced is None:
      return cls(
        max_drafted=max_drafted,
        forced_tokens=jnp.zeros((batch, gamma), jnp.int32),
        forced=jnp.zeros((batch,), bool),
        guided=False,
      )
    forced_tokens = hooks.forced_tokens
    assert forced_tokens is not None and forced_tokens.shape == (batch, gamma), (
      None if forced_tokens is None else forced_tokens.shape
    )
    return cls(
      max_drafted=max_drafted,
      forced_tokens=forced_tokens.astype(jnp.int32),
      forced=hooks.forced.astype(bool),
      guided=True,
    )


@flax.struct.dataclass
class DraftLoopState:
  """Loop state of `ModelDrafter`'s draft-call `lax.while_loop`.

  Attributes:
    position: [] int32, j: the number of draft tokens sampled so far (1 after the catch-up call).
    cache: the draft model's cache pytree (CachedLM.init_cache, max_length positions).
    fed: [B] int32, the token the next call feeds at lengths-1+j (x_j, or a forced token).
    tokens: [B, gamma] int32, the sampled x_1..x_j (zeros beyond).
    probs: [B, gamma, V] float32, the standardized q_1..q_j they were drawn from (zeros beyond).
    count: [B] int32, tokens row b proposes (x_1..x_count); stops growing once the row stops.
    active: [B] bool, row b may draft another token.
  """

  position: jax.Array
  cache: Any
  fed: jax.Array
  tokens: jax.Array
  probs: jax.Array
  count: jax.Array
  active: jax.Array


@dataclasses.dataclass(frozen=True)
class ModelDrafter(base.GuidedDrafterBase):
  """Drafts up to gamma tokens autoregressively with a small CachedLM and its own KV cache.

  Attributes:
    model: the draft CachedLM (same vocabulary as the target).
    stop_below: adaptive gamma (static; 0 = always draft gamma tokens). A row stops drafting after
      a token x_i whose draft confidence `draft_confidence(logits_i)` (max of the draft's
      temperature-1 softmax) is below `stop_below`; x_i itself is still proposed (it is already
      sampled, and the verify call has a static width anyway). At least one token is drafted. The
      loop over draft calls ends as soon as every row has stopped, so at batch 1 a low-confidence
      step saves draft calls; the target's verify call keeps its static width gamma+1 unless the
      decode loop runs with `adaptive_verify=True` (see decode/loops.py). Exact for any threshold: the
      stop decision depends only on the draft's own computations.

  Draft state: the draft model's cache (max_length positions).

  Who has seen which token: the draft cache must be correct on positions [0, length-2) at the start
  of `propose` (the prefill establishes it; see below for why it persists). The first draft call
  feeds the last two committed tokens at start = length-2 (a T=2 call; at length 1, the first
  token and a filler at start 0): this catches up on x_gamma and the bonus token after an
  all-accepted step, or re-writes one identical entry plus the correction after a rejection, with
  one code path and no ragged shapes. Then up to gamma-1 T=1 calls feed x_1..x_{k-1} (x_k, the last
  drafted token, is only sampled). After the step the committed length is L' = L+n+1 with n <= k,
  and the cache is correct through position L+min(n, k-1)-1 >= L'-3, so the invariant holds again;
  entries beyond are stale and get overwritten before anything attends to them.
  """

  model: interface.CachedLM
  stop_below: float = 0.0

  def __post_init__(self):
    if not 0.0 <= float(self.stop_below) <= 1.0:
      raise ValueError(
        f'ModelDrafter.stop_below must be in [0, 1] (0 = fixed gamma), got {self.stop_below!r}'
      )

  @property
  def vocab_size(self) -> int:
    return self.model.vocab_size

  def start(self, prompt: base.DraftPrompt) -> base.DraftState:
    """The draft cache, prefilled with the (padded) prompt."""
    prompt_tokens, params = prompt.prompt_tokens, prompt.params
    assert prompt_tokens.ndim == 2, prompt_tokens.shape
    batch = prompt_tokens.shape[0]
    cache = self.model.init_cache(params, batch, prompt.max_length, prompt.encoder_tokens)
    # The padded prompt but its last position, at 0 (correct on [0, length-1), more than the
    # [0, length-2) `propose` needs); nothing for a one-token prompt.
    return interface.prefill(self.model, params, cache, prompt_tokens)

  def guided_step(
    self, call: base.DraftCall, state: base.DraftState, hooks: base.DraftHooks
  ) -> tuple[base.DraftProposal, base.DraftState]:
    """`propose` with the `base.GuidedDrafter` hooks.

    A forced row ignores `stop_below`. When every row is forced, the draft loop is skipped: one
    call of width gamma+1 feeds the catch-up tokens and forced_tokens[:, :gamma-1] instead (1 draft
    call instead of gamma). Otherwise the draft-call loop ends when no row has more to draft.
    """
    tokens, lengths = call.tokens, call.lengths
    assert tokens.ndim == 2 and lengths.shape == tokens.shape[:1], (tokens.shape, lengths.shape)
    base.check_gamma(call.gamma)
    guidance = Guidance.from_hooks(hooks, tokens.shape[0], call.gamma)
    if not guidance.guided:
      return self._sample_loop(call, guidance, state)
    return jax.lax.cond(
      jnp.all(guidance.forced),
      lambda cache: self._forced_call(call, guidance, cache),
      lambda cache: self._sample_loop(call, guidance, cache),
      state,
    )

  # -- named steps of `draft` ----------------------------------------------------------------------

  def _keep_going(self, count: jax.Array, logits: jax.Array, guidance: Guidance) -> jax.Array:
    """[B] bool: may a row draft another token after `count` tokens (logits [B, V]: the last)?"""
    more = count < guidance.max_drafted
    if float(self.stop_below) > 0.0:
      more = more & (guidance.forced | (draft_confidence(logits) >= self.stop_below))
    return more

  def _fed_token(self, sampled: jax.Array, guidance: Guidance, index: jax.Array | int) -> jax.Array:
    """[B]: what the next call feeds: the row's own sample, or forced_tokens[:, index] if forced."""
    if not guidance.guided:
      return sampled
    gamma = guidance.forced_tokens.shape[1]
    forced_token = jax.lax.dynamic_index_in_dim(
      guidance.forced_tokens, jnp.minimum(index, gamma - 1), axis=1, keepdims=False
    )  # [B]
    return jnp.where(guidance.forced, forced_token, sampled)

  def _sample(
    self, call: base.DraftCall, logits: jax.Array, key_index
  ) -> tuple[jax.Array, jax.Array]:
    """(token [B], q [B, V]): the standardized draft distribution of logits [B, V], sampled with
    the rows' keys folded with `key_index`."""
    probs = sampling_lib.probs_from_logits(logits, call.sampling, call.sampling_params)  # [B, V]
    keys = base.fold_keys(call.keys, key_index)
    return sampling_lib.sample_rows(keys, probs, call.sampling.greedy), probs

  def _catch_up(self, call: base.DraftCall, guidance: Guidance, cache: Any) -> DraftLoopState:
    """First draft call: the last two committed tokens (T=2) at max(length-2, 0); samples x_1."""
    tokens, lengths, gamma = call.tokens, call.lengths, call.gamma
    batch = tokens.shape[0]
    start = jnp.maximum(lengths - 2, 0)  # [B]
    catch_up = base.gather_rows(tokens, start[:, None] + jnp.arange(2)[None, :])  # [B, 2]
    logits, cache = self.model.extend(call.params, cache, catch_up, start)  # [B, 2, V]
    last_index = (lengths - 1 - start)[:, None, None]  # 1, or 0 when length == 1
    logits = jnp.take_along_axis(logits, last_index, axis=1)[:, 0]  # [B, V]
    token, probs = self._sample(call, logits, 0)  # [B], [B, V]
    count = jnp.ones((batch,), jnp.int32)
    return DraftLoopState(
      position=jnp.ones((), jnp.int32),
      cache=cache,
      fed=self._fed_token(token, guidance, 0),
      tokens=jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(token),  # [B, gamma]
      probs=jnp.zeros((batch, gamma, self.vocab_size), jnp.float32).at[:, 0].set(probs),
      count=count,
      active=self._keep_going(count, logits, guidance),
    )

  def _next_token(
    self, call: base.DraftCall, guidance: Guidance, loop: DraftLoopState
  ) -> DraftLoopState:
    """One T=1 call: feeds x_j (j = position) at length-1+j and samples x_{j+1} with key j."""
    position = loop.position
    logits, cache = self.model.extend(
      call.params, loop.cache, loop.fed[:, None], call.lengths - 1 + position
    )  # [B, 1, V]
    logits = logits[:, 0]  # [B, V]
    token, probs = self._sample(call, logits, position)  # [B], [B, V]
    count = loop.count + loop.active.astype(jnp.int32)
    return DraftLoopState(
      position=position + 1,
      cache=cache,
      fed=self._fed_token(token, guidance, position),
      tokens=jax.lax.dynamic_update_slice(loop.tokens, token[:, None], (0, position)),
      probs=jax.lax.dynamic_update_slice(loop.probs, probs[:, None], (0, position, 0)),
      count=count,
      active=loop.active & self._keep_going(count, logits, guidance),
    )

  def _sample_loop(
    self, call: base.DraftCall, guidance: Guidance, cache: Any
  ) -> tuple[base.DraftProposal, Any]:
    """Catch-up call, then T=1 calls while some row is active (at most gamma-1 of them)."""
    loop = jax.lax.while_loop(
      lambda s: (s.position < call.gamma) & jnp.any(s.active),
      lambda s: self._next_token(call, guidance, s),
      self._catch_up(call, guidance, cache),
    )
    return base.DraftProposal(
      tokens=loop.tokens, probs=loop.probs, num_drafted=loop.count
    ), loop.cache

  def _forced_call(
    self, call: base.DraftCall, guidance: Guidance, cache: Any
  ) -> tuple[base.DraftProposal, Any]:
    """Every row copies: one call over the window [length-2, length-2+gamma] (at length 1:
    [0, gamma]) of the stream with the forced tokens written after it; the cache then holds exactly
    what the invariant needs if the forced tokens are accepted."""
    lengths, gamma = call.lengths, call.gamma
    stream = base.write_rows(call.tokens, guidance.forced_tokens, lengths)  # [B, L_max]
    start = jnp.maximum(lengths - 2, 0)  # [B]
    window = base.gather_rows(stream, start[:, None] + jnp.arange(gamma + 1)[None, :])  # [B, g+1]
    _, cache = self.model.extend(call.params, cache, window, start)
    return base.one_hot_proposal(
      guidance.forced_tokens, guidance.max_drafted, self.vocab_size
    ), cache
