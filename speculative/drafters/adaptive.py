"""`AdaptiveGammaDrafter`: drafts k <= gamma tokens per row, k chosen from an online estimate of
alpha (Theorem 3.8 with the estimate)."""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from speculative.drafters import base


@flax.struct.dataclass
class AdaptiveState:
  """Draft state of `AdaptiveGammaDrafter`.

  Attributes:
    inner: the inner drafter's state.
    prev_lengths: [B] int32, committed lengths at the previous step.
    prev_drafted: [B] int32, tokens drafted at the previous step (0 before the first).
    successes: [B] float32, decayed count of accepted drafts (plus the prior's).
    trials: [B] float32, decayed count of Bernoulli trials (plus the prior's weight).
  """

  inner: Any
  prev_lengths: jax.Array
  prev_drafted: jax.Array
  successes: jax.Array
  trials: jax.Array


@dataclasses.dataclass(frozen=True)
class AdaptiveGammaDrafter(base.GuidedDrafterBase):
  """Chooses how many tokens to draft per row and step from the recent acceptance (adaptive gamma).

  Each step, the number of accepted drafts n of the previous step is read off the committed lengths
  (n = new length - old length - 1, capped at what was drafted), and a per-row estimate of alpha is
  updated as an exponentially decayed ratio of Bernoulli outcomes (n successes, plus one failure if
  n < drafted), starting from `prior_alpha` with weight `prior_weight`. Then the row drafts

      k = argmax_{1 <= k <= gamma} E[tokens](alpha, k) / (k * draft_cost + v(k+1)),
      E[tokens](alpha, k) = 1 + alpha + ... + alpha^k   (Eq. 1 / Theorem 3.8 with the estimate),

  with v(T) = verify_costs[T-1] (a target T-token call / single step; default 1 for every T, right
  when the verify call has the static width gamma+1; pass measured v(T) with `adaptive_verify`).
  Exact for any rule: k depends only on the past. The inner drafter must be a `base.GuidedDrafter`
  (ModelDrafter is), so the draft loop really stops after k calls.

  Attributes:
    inner: the drafter (e.g. ModelDrafter(draft_model)); its `stop_below` rule still applies.
    draft_cost: c, draft step time / target step time (measured).
    verify_costs: None or (v(1), v(2), ...) with at least gamma+1 entries.
    decay: weight of the past per step in the alpha estimate (0 = only the last step).
    prior_alpha, prior_weight: the estimate before any observation.

  State: an `AdaptiveState`.
  """

  inner: base.GuidedDrafter
  draft_cost: float
  verify_costs: tuple[float, ...] | None = None
  decay: float = 0.7
  prior_alpha: float = 0.6
  prior_weight: float = 2.0

  def __post_init__(self):
    if not self.inner.supports_guided_draft:
      raise ValueError(
        'AdaptiveGammaDrafter needs a guided inner drafter (supports_guided_draft: '
        'a draft(..., max_drafted=...) method, e.g. ModelDrafter), got '
        f'{type(self.inner).__name__}'
      )
    if not float(self.draft_cost) >= 0:
      raise ValueError(f'draft_cost must be >= 0, got {self.draft_cost!r}')
    if not 0.0 <= float(self.decay) < 1.0:
      raise ValueError(f'decay must be in [0, 1), got {self.decay!r}')
    if not 0.0 <= float(self.prior_alpha) <= 1.0 or not float(self.prior_weight) > 0:
      raise ValueError('prior_alpha must be in [0, 1] and prior_weight > 0')
    if self.verify_costs is not None:
      object.__setattr__(self, 'verify_costs', tuple(float(v) for v in self.verify_costs))

  @property
  def vocab_size(self) -> int:
    return self.inner.vocab_size

  def start(self, prompt: base.DraftPrompt) -> base.DraftState:
    batch = prompt.prompt_tokens.shape[0]
    return AdaptiveState(
      inner=prompt.init(self.inner),
      prev_lengths=jnp.asarray(prompt.prompt_lengths, jnp.int32),
      prev_drafted=jnp.zeros((batch,), jnp.int32),
      successes=jnp.full((batch,), self.prior_alpha * self.prior_weight, jnp.float32),
      trials=jnp.full((batch,), self.prior_weight, jnp.float32),
    )

  def choose_gamma(self, alpha: jax.Array, gamma: int) -> jax.Array:
    """[B] alpha estimates -> [B] int32 k in [1, gamma] maximizing the predicted speed."""
    if self.verify_costs is not None and len(self.verify_costs) < gamma + 1:
      raise ValueError(
        f'verify_costs needs v(T) for T = 1..{gamma + 1}, got {len(self.verify_costs)} values'
      )
    ks = np.arange(1, gamma + 1)  # [G]
    verify = (
      np.ones(gamma) if self.verify_costs is None else np.asarray(self.verify_costs[1 : gamma + 1])
    )  # v(k+1), [G]
    cost = jnp.asarray(ks * float(self.draft_cost) + verify, jnp.float32)  # [G]
    powers = alpha[:, None] ** jnp.arange(gamma + 1, dtype=jnp.float32)[None, :]  # [B, G+1]
    expected = jnp.cumsum(powers, axis=1)[:, 1:]  # [B, G]: sum_{i<=k} alpha^i
    return (jnp.argmax(expected / cost[None, :], axis=1) + 1).astype(jnp.int32)

  def guided_step(
    self, call: base.DraftCall, state: base.DraftState, hooks: base.DraftHooks
  ) -> tuple[base.DraftProposal, base.DraftState]:
    """`propose` with ModelDrafter.draft's hooks (so it can be a PromptLookupDrafter fallback):
    an unforced row drafts min(k, max_drafted) tokens, a forced row exactly as asked."""
    lengths = call.lengths
    prev_drafted = state.prev_drafted
    advanced = lengths - state.prev_lengths  # [B], n+1 after a step (0 for a finished row)
    observed = (prev_drafted > 0) & (advanced > 0)
    num_accepted = jnp.clip(advanced - 1, 0, prev_drafted)  # [B]
    failures = (num_accepted < prev_drafted).astype(jnp.float32)
    successes = jnp.where(observed, self.decay * state.successes + num_accepted, state.successes)
    trials = jnp.where(observed, self.decay * state.trials + num_accepted + failures, state.trials)
    alpha = jnp.clip(successes / trials, 0.0, 1.0)  # [B]
    k = self.choose_gamma(alpha, call.gamma)  # [B]
    max_drafted, forced = hooks.max_drafted, hooks.forced
    if max_drafted is not None:
      limited = jnp.minimum(k, max_drafted)
      k = limited if forced is None else jnp.where(forced, max_drafted, limited)
    proposal, inner_state = call.ask(
      self.inner, state.inner, base.DraftHooks(k, hooks.forced_tokens, forced)
    )
    return proposal, AdaptiveState(
      inner=inner_state,
      prev_lengths=lengths,
      prev_drafted=proposal.num_drafted,
      successes=successes,
      trials=trials,
    )
