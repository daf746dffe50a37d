"""`OracleDrafter`: proposes a continuation known in advance (the target's own greedy output), for
measuring what a perfect draft would give; not a draft source for real jobs.

Under greedy decoding, a drafter that proposes the target's own greedy output is accepted in full
at every step (alpha = 1, block efficiency gamma + 1 but at the end), so a speculative decode with
it measures the speculative loop's ceiling on a machine: the verify calls, the loop's own work and
the encoder, with no draft cost. With `inner` (a drafter, e.g. the job's `ModelDrafter`), each step
also runs the inner drafter's own proposal, at its real cost, and discards it: the ceiling of a
perfect draft that costs what that one does (the inner drafter's state then follows its own drafts,
not the accepted tokens; only its cost is used). `speculative.bench.ceiling` measures both on a job.

The continuation comes in the params, so it is per call and never recompiles:
  params = {'generated': [B, N] int32, the tokens to propose after each row's prompt (the
            baseline's `DecodeResult.tokens`), 'inner': the inner drafter's params (or None)}.
Row b at committed length L proposes generated[b, L - P_b : L - P_b + gamma] (P_b its prompt
length), with one-hot q; past N it proposes filler (a token the target rejects at most once, at
the end). Exactness holds as for any drafter (the proposal is drawn from the q it reports); under
sampling the oracle is not the target's sample, so it is only meaningful under greedy decoding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculative.drafters import base


@flax.struct.dataclass
class OracleState:
  """Draft state of `OracleDrafter`.

  Attributes:
    prompt_lengths: [B] int32, P_b: the stream position of generated[b, 0].
    inner: the inner drafter's state (None without one).
  """

  prompt_lengths: jax.Array
  inner: Any


@dataclasses.dataclass(frozen=True)
class OracleDrafter(base.DrafterBase):
  """Proposes `params['generated']` (see the module docstring); `inner` runs too, at its cost."""

  vocab_size: int
  inner: base.Drafter | None = None

  def __post_init__(self):
    if self.inner is not None and self.inner.vocab_size != self.vocab_size:
      raise ValueError(
        f'OracleDrafter vocab_size {self.vocab_size} != inner vocab_size {self.inner.vocab_size}'
      )

  def start(self, prompt: base.DraftPrompt) -> base.DraftState:
    """The prompt lengths, and the inner drafter started on its own params."""
    generated = prompt.params.get('generated') if isinstance(prompt.params, dict) else None
    if generated is None or generated.ndim != 2:
      raise ValueError(
        "OracleDrafter params must be {'generated': [B, N] int32, 'inner': ...}, got "
        f'{jax.tree.map(jnp.shape, prompt.params)!r}'
      )
    if generated.shape[0] != prompt.prompt_tokens.shape[0]:
      raise ValueError(
        f'OracleDrafter: {generated.shape[0]} generated rows for a batch of '
        f'{prompt.prompt_tokens.shape[0]}'
      )
    inner_state = None
    if self.inner is not None:
      inner_state = dataclasses.replace(prompt, params=prompt.params['inner']).init(self.inner)
    return OracleState(prompt_lengths=prompt.prompt_lengths.astype(jnp.int32), inner=inner_state)

  def step(
    self, call: base.DraftCall, state: base.DraftState
  ) -> tuple[base.DraftProposal, base.DraftState]:
    """generated[b, L - P_b :][:gamma] as one-hot proposals (the inner drafter runs first)."""
    generated = call.params['generated']  # [B, N]
    batch, gamma = generated.shape[0], call.gamma
    if self.inner is not None:
      inner_call = dataclasses.replace(call, params=call.params['inner'])
      _, inner_state = inner_call.ask(self.inner, state.inner)  # its proposal is discarded
      state = state.replace(inner=inner_state)
    first = call.lengths - state.prompt_lengths  # [B], index of the next token in generated
    positions = jnp.clip(first[:, None] + jnp.arange(gamma)[None, :], 0, generated.shape[1] - 1)
    tokens = base.gather_rows(generated.astype(jnp.int32), positions)  # [B, gamma]
    return base.one_hot_proposal(
      tokens, jnp.full((batch,), gamma, jnp.int32), self.vocab_size
    ), state
