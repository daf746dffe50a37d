"""The draft-source contract: the `Drafter` protocol, `DraftProposal`, and shared row helpers.

This is the only drafter module the decode loops import (decode/state.py,
decode/step.py, decode/loops.py, decode/spectr_loop.py).

A drafter is a small frozen (hashable) dataclass: a jit static argument holding only configuration.
Its arrays (model weights, n-gram tables) are its `params`, passed to the decode loop as
`draft_params` (never stored in the dataclass, so big tables are not constant-folded into the HLO),
and its mutable part (a model cache, an acceptance estimate, ...) is a pytree "draft state" that the
decode loop threads through its `lax.while_loop` state. Every drafter implements `Drafter`:

  vocab_size: int
  supports_guided_draft: bool (class attribute; see `GuidedDrafter`)
  init(params, prompt_tokens[B, P], prompt_lengths[B], max_length, encoder_tokens=None) -> state
      Called once per decode, before the loop; may prefill with the (padded) prompt.
  propose(params, state, tokens[B, L_max], lengths[B], gamma, keys[B], sampling, sampling_params)
      -> (DraftProposal, state)
      `tokens` is the decode loop's committed token buffer (row b is valid on [0, lengths[b])),
      `gamma` is static, `keys` holds one PRNG key per row (already specific to this row and step).
      The proposal's `probs` must be the distribution each token was drawn from, standardized with
      the same `sampling` transform as the target, so the acceptance rule stays exact. A drafter
      that has nothing to propose for a row sets `num_drafted[b] < gamma` (filler tokens beyond it
      are ignored); deterministic drafters (prompt lookup) use one-hot probs.

The drafters in this package subclass `DrafterBase` / `GuidedDrafterBase`, which spell these methods
out once and hand their bundled arguments (`DraftPrompt`, `DraftCall`, `DraftHooks`) to the
drafter's named steps (`start`, `step` / `guided_step`).

Exactness never depends on the drafter: any proposal whose tokens were drawn from the `probs` it
reports -- including a row that proposes fewer than gamma tokens, or stops drafting based on its own
(draft-side) confidence or on past acceptance -- yields exactly the target's distribution. A bad
drafter only lowers alpha.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import ClassVar
from typing import Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib

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
  """The draft-source interface (see the module docstring).

  Attributes:
    vocab_size: V, must equal the target's.
    supports_guided_draft: True iff the drafter is a `GuidedDrafter` (has `draft` with the
      `max_drafted` / `forced_tokens` / `forced` hooks). Wrappers read this flag instead of probing.
  """

  supports_guided_draft: ClassVar[bool]

  @property
  def vocab_size(self) -> int: ...

  def init(
    self,
    params: Any,
    prompt_tokens: jax.Array,
    prompt_lengths: jax.Array,
    max_length: int,
    encoder_tokens: jax.Array | None = None,
  ) -> DraftState: ...

  def propose(
    self,
    params: Any,
    state: DraftState,
    tokens: jax.Array,
    lengths: jax.Array,
    gamma: int,
    keys: jax.Array,
    sampling: sampling_lib.SamplingConfig,
    sampling_params: sampling_lib.SamplingParams,
  ) -> tuple[DraftProposal, DraftState]: ...


class GuidedDrafter(Drafter, Protocol):
  """A drafter whose proposal a wrapper can limit and steer (`supports_guided_draft = True`).

  `draft` is `propose` (same positional arguments) with three hooks:
    max_drafted: [B] int32, row b drafts at most clip(max_drafted[b], 1, gamma) tokens (default
      gamma), so a stateful drafter really stops after that many draft calls.
    forced_tokens: [B, gamma] int32 and forced: [B] bool. A forced row is fed forced_tokens instead
      of its own samples, so the drafter's state holds what the wrapper proposes (and stays valid
      when those tokens are accepted); its returned proposal for that row is meaningless (the
      wrapper replaces it).
  Used by `AdaptiveGammaDrafter` (max_drafted) and `PromptLookupDrafter` (forced copies).
  """

  def draft(
    self,
    *propose_args: Any,
    max_drafted: jax.Array | None = None,
    forced_tokens: jax.Array | None = None,
    forced: jax.Array | None = None,
  ) -> tuple[DraftProposal, DraftState]: ...


# --------------------------------------------------------------------------------------------------
# The call convention, spelled out once: drafters implement named steps on bundled arguments.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class DraftPrompt:
  """The arguments of one `Drafter.init` call (see the module docstring)."""

  params: Any
  prompt_tokens: jax.Array
  prompt_lengths: jax.Array
  max_length: int
  encoder_tokens: jax.Array | None = None

  def init(self, drafter: Drafter) -> DraftState:
    """`drafter.init` with these arguments (a wrapper starting its inner drafter)."""
    return drafter.init(
      self.params, self.prompt_tokens, self.prompt_lengths, self.max_length, self.encoder_tokens
    )


@dataclasses.dataclass(frozen=True, eq=False)
class DraftHooks:
  """The hooks of one `GuidedDrafter.draft` call (None: not used; see `GuidedDrafter`)."""

  max_drafted: jax.Array | None = None
  forced_tokens: jax.Array | None = None
  forced: jax.Array | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class DraftCall:
  """The arguments of one `propose` / `draft` call but the draft state (B rows).

  Attributes:
    params: the drafter's params.
    tokens: [B, L_max] int32, the committed stream (row b valid on [0, lengths[b])).
    lengths: [B] int32, committed lengths.
    gamma: static int, the most tokens a row drafts.
    keys: [B] PRNG keys of this step (folded with the draft position per sample).
    sampling: static SamplingConfig; sampling_params: its run-time values.
  """

  params: Any
  tokens: jax.Array
  lengths: jax.Array
  gamma: int
  keys: jax.Array
  sampling: sampling_lib.SamplingConfig
  sampling_params: sampling_lib.SamplingParams

  def ask(
    self, drafter: Drafter, state: DraftState, hooks: DraftHooks | None = None
  ) -> tuple[DraftProposal, DraftState]:
    """`drafter.propose` with these arguments, or `drafter.draft` with `hooks` too (a wrapper
    asking its inner drafter)."""
    args = (self.params, state, self.tokens, self.lengths, self.gamma, self.keys, self.sampling)
    if hooks is None:
      return drafter.propose(*args, self.sampling_params)
    return drafter.draft(
      *args,
      self.sampling_params,
      max_drafted=hooks.max_drafted,
      forced_tokens=hooks.forced_tokens,
      forced=hooks.forced,
    )


class DrafterBase:
  """Implements the `Drafter` methods once on bundled arguments.

  A subclass defines `start(prompt: DraftPrompt) -> state` and
  `step(call: DraftCall, state) -> (DraftProposal, state)`.
  """

  supports_guided_draft: ClassVar[bool] = False

  def init(self, params, prompt_tokens, prompt_lengths, max_length, encoder_tokens=None):
    return self.start(
      DraftPrompt(params, prompt_tokens, prompt_lengths, max_length, encoder_tokens)
    )

  def propose(self, params, state, tokens, lengths, gamma, keys, sampling, sampling_params):
    call = DraftCall(params, tokens, lengths, gamma, keys, sampling, sampling_params)
    return self.step(call, state)


class GuidedDrafterBase(DrafterBase):
  """Implements the `GuidedDrafter` methods once: a subclass defines `start` (see `DrafterBase`)
  and `guided_step(call: DraftCall, state, hooks: DraftHooks) -> (DraftProposal, state)`;
  `propose` is `draft` without the hooks."""

  supports_guided_draft: ClassVar[bool] = True

  def draft(
    self,
    params,
    state,
    tokens,
    lengths,
    gamma,
    keys,
    sampling,
    sampling_params,
    *,
    max_drafted=None,
    forced_tokens=None,
    forced=None,
  ):
    call = DraftCall(params, tokens, lengths, gamma, keys, sampling, sampling_params)
    return self.guided_step(call, state, DraftHooks(max_drafted, forced_tokens, forced))

  def step(self, call: DraftCall, state: DraftState) -> tuple[DraftProposal, DraftState]:
    return self.guided_step(call, state, DraftHooks())


# --------------------------------------------------------------------------------------------------
# Row helpers shared by the drafters and the decode loops.
# --------------------------------------------------------------------------------------------------


def gather_rows(tokens: jax.Array, positions: jax.Array) -> jax.Array:
  """tokens [B, L], positions [B, T] -> tokens[b, positions[b, t]] as [B, T]."""
  return jnp.take_along_axis(tokens, positions, axis=1)


def write_rows(tokens: jax.Array, block: jax.Array, start: jax.Array) -> jax.Array:
  """tokens [B, L] <- block [B, T] at per-row offsets start [B]."""
  return jax.vmap(lambda row, blk, s: jax.lax.dynamic_update_slice(row, blk, (s,)))(
    tokens, block, start
  )


def fold_keys(keys: jax.Array, index: int | jax.Array) -> jax.Array:
  """[B] keys -> [B] keys fold_in(keys[b], index): one fresh key per use."""
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, index)


def one_hot_proposal(tokens: jax.Array, num_drafted: jax.Array, vocab: int) -> DraftProposal:
  """A deterministic proposal: one-hot q at each token; filler past num_drafted becomes 0."""
  gamma = tokens.shape[1]
  tokens = jnp.where(jnp.arange(gamma)[None, :] < num_drafted[:, None], tokens, 0)
  return DraftProposal(
    tokens=tokens.astype(jnp.int32),
    probs=jax.nn.one_hot(tokens, vocab, dtype=jnp.float32),
    num_drafted=num_drafted.astype(jnp.int32),
  )


def check_gamma(gamma: Any) -> None:
  """ValueError unless gamma is a static int >= 1."""
  if not isinstance(gamma, (int, np.integer)) or gamma < 1:
    raise ValueError(f'gamma must be a static int >= 1, got {gamma!r}')
