"""One step of every decode loop, as named functions in the order they run: draft, verify, accept,
commit.

`run` is the loop of `loops.autoregressive_decode`, `loops.speculative_decode` and
`spectr_loop.spectr_decode`: the state before the first step (`state.start`), then `step` in one
`lax.while_loop` until every row is done (`state.run_loop`). A step is, state in and state out:

  keys = step_keys(spec, state.step)               # this step's PRNG keys, per row
  drafts = draft(spec, state, keys)                # the drafter's proposal and the verify tokens
  verified = verify(spec, state, drafts)           # one target call over them; its distributions
  emitted = accept(spec, drafts, verified, keys)   # the block each row emits
  return commit(spec, state, drafts, verified, emitted)  # EOS, max length, metrics, next state

`LoopSpec` says which decode it is (static): no drafter is the baseline (the block is one token sampled
from the target after the last committed one), a drafter is speculative decoding (Leviathan et al.
2023, Algorithm 1), a drafter with `num_drafts` K is SpecTr (Sun et al. 2023: K i.i.d. drafts,
`speculative.spectr`'s sequence-level selection). The stream conventions and the loop state are
decode/state.py's; SpecTr's layout and keys are decode/spectr_loop.py's docstring.

Keys (row b, step s; `row_keys` = fold_in(fold_in(fold_in(rng, row_id), s), use)): the baseline's
sample uses use=0; speculative decoding drafts with use=0 and accepts with use=1; SpecTr's draft
copy 0 uses use=0, copy j >= 1 fold_in(use=2 key, j), and its selection use=1 (fold_in(., 0): the
acceptance uniforms, fold_in(., 1): the one residual or bonus sample). So with K = 1 every random
number is consumed for the same purpose as in speculative decoding.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculative import sampling as sampling_lib
from speculative.decode import inputs as decode_inputs
from speculative.decode import options as decode_options
from speculative.decode import state as decode_state
from speculative.drafters import base as drafter_base
from speculative.models import interface
from speculative.spectr import sequence

# Key `use` ids (see the module docstring).
_USE_DRAFT, _USE_ACCEPT, _USE_EXTRA_DRAFTS = 0, 1, 2


@dataclasses.dataclass(frozen=True, eq=False)
class LoopSpec:
  """What every step of one decode reads (built inside its jitted function; never an argument).

  Attributes:
    target: the CachedLM (static); target_params: its parameters.
    options: the static DecodeOptions.
    inputs: the DecodeInputs (prompts, sampling values, rng, row ids, max_steps).
    drafter: the Drafter (static), None for the baseline; draft_params: its parameters.
    num_drafts: SpecTr's K (static), None for one draft (or none).
    num_iters: SpecTr's bisection steps for rho* (static).
    lenience: speculative decoding's run-time l ([] float32), None for the exact rule.
    lockstep: the baseline's rows all sit at one length (static; `loops._lockstep`).
  """

  target: interface.CachedLM
  target_params: Any
  options: decode_options.DecodeOptions
  inputs: decode_inputs.DecodeInputs
  drafter: drafter_base.Drafter | None = None
  draft_params: Any = None
  num_drafts: int | None = None
  num_iters: int = 0
  lenience: jax.Array | None = None
  lockstep: bool = False

  @property
  def batch(self) -> int:
    return self.inputs.prompt_lengths.shape[0]

  @property
  def copies(self) -> int:
    """Rows of the caches per original row: K for SpecTr, else 1."""
    return 1 if self.num_drafts is None else self.num_drafts


def run(spec: LoopSpec) -> decode_state.DecodeResult:
  """The decode of `spec`: its state before the first step, then `step` until every row is done
  (or `inputs.max_steps` steps), then the DecodeResult."""
  state = decode_state.start(
    spec.target,
    spec.target_params,
    spec.inputs,
    spec.options,
    _metrics_type(spec),
    spec.drafter,
    spec.draft_params,
  )
  if spec.num_drafts is not None:  # SpecTr: prefill once per original row, then hold K copies
    state = state.replace(
      target_cache=_repeat_rows(state.target_cache, spec.copies, spec.batch, 'target cache'),
      draft_state=_repeat_rows(state.draft_state, spec.copies, spec.batch, 'draft state'),
    )

  def body(state: decode_state.DecodeState) -> decode_state.DecodeState:
    return step(spec, state)

  return decode_state.run_loop(
    body, state, spec.inputs.prompt_lengths, spec.options.max_new_tokens, spec.inputs.max_steps
  )


def step(spec: LoopSpec, state: decode_state.DecodeState) -> decode_state.DecodeState:
  """One step: draft, verify, accept, commit (the module docstring)."""
  keys = step_keys(spec, state.step)
  drafts = draft(spec, state, keys)
  verified = verify(spec, state, drafts)
  emitted = accept(spec, drafts, verified, keys)
  return commit(spec, state, drafts, verified, emitted)


# --------------------------------------------------------------------------------------------------
# The step's values, from one named function to the next.
# --------------------------------------------------------------------------------------------------


@flax.struct.dataclass
class StepKeys:
  """One step's PRNG keys (the module docstring).

  Attributes:
    draft: [R] keys of the drafter (R = B, or K*B for SpecTr), None for the baseline.
    accept: [B] keys of the acceptance (the baseline's: of its one sample).
  """

  draft: jax.Array | None
  accept: jax.Array


@flax.struct.dataclass
class Drafts:
  """One step's drafts over R rows (B; K*B in SpecTr), as the verify call takes them.

  Attributes:
    lengths: [R] int32, the committed lengths (SpecTr: each row's repeated K times).
    verify_tokens: [R, gamma+1] int32, [last committed token, x_1..x_gamma], for one verify call
      at start = lengths-1 (the baseline: [R, 1], the last token alone).
    proposal: the drafter's DraftProposal (tokens [R, gamma], probs [R, gamma, V], num_drafted);
      None for the baseline, and so are the fields below.
    draft_state: the drafter's state after proposing.
    drafted: [R, gamma] bool, the positions below num_drafted.
    tokens: [R, gamma] int32, the proposal's tokens with the filler past num_drafted set to 0: any
      id is fine for exactness (p at a position only conditions on earlier tokens), but an
      out-of-range id could make NaN keys/values in the cache.
  """

  lengths: jax.Array
  verify_tokens: jax.Array
  proposal: drafter_base.DraftProposal | None = None
  draft_state: Any = None
  drafted: jax.Array | None = None
  tokens: jax.Array | None = None

  def masked_probs(self) -> jax.Array:
    """[R, gamma, V]: q at the drafted positions, 0 past them."""
    return jnp.where(self.drafted[..., None], self.proposal.probs, 0.0)

  def invalid(self, target_probs: jax.Array) -> jax.Array:
    """[R] bool: NaN in a distribution that can matter, q at drafted positions or p (the verify
    call's, [R, gamma+1, V]) at positions <= num_drafted (the baseline: its one p, [R, V])."""
    if self.proposal is None:
      return has_nan(target_probs)
    gamma = self.tokens.shape[1]
    verified = jnp.arange(gamma + 1)[None, :] <= self.proposal.num_drafted[:, None]  # [R, gamma+1]
    return has_nan(jnp.where(verified[..., None], target_probs, 0.0)) | has_nan(self.masked_probs())


@flax.struct.dataclass
class Verified:
  """The verify call's output over R rows.

  Attributes:
    logits: [R, gamma+1, V] (the baseline: [R, 1, V]).
    probs: the standardized target distributions of `logits` (the baseline: [R, V]).
    cache: the target's cache after the call.
  """

  logits: jax.Array
  probs: jax.Array
  cache: Any


@flax.struct.dataclass
class Emitted:
  """What each original row emits this step, and what the metrics count of it.

  Attributes:
    block: [B, T] int32, the first `num_accepted + 1` tokens are emitted.
    num_accepted: [B] int32, draft tokens accepted (0 for the baseline).
    selection: SpecTr's SequenceSelection (its branch, acceptance sums), else None.
    alpha: [B] float32, speculative decoding's sum over positions of sum_x min(p, q), else None.
  """

  block: jax.Array
  num_accepted: jax.Array
  selection: sequence.SequenceSelection | None = None
  alpha: jax.Array | None = None


# --------------------------------------------------------------------------------------------------
# The step, in the order it runs.
# --------------------------------------------------------------------------------------------------


def step_keys(spec: LoopSpec, step_index: jax.Array) -> StepKeys:
  """This step's keys: the drafter's (SpecTr: one per copy) and the acceptance's."""
  rng, row_ids = spec.inputs.rng, spec.inputs.row_ids
  if spec.drafter is None:
    return StepKeys(draft=None, accept=row_keys(rng, row_ids, step_index, _USE_DRAFT))
  first = row_keys(rng, row_ids, step_index, _USE_DRAFT)  # [B]
  accept_keys = row_keys(rng, row_ids, step_index, _USE_ACCEPT)  # [B]
  if spec.copies == 1:
    return StepKeys(draft=first, accept=accept_keys)
  extra = row_keys(rng, row_ids, step_index, _USE_EXTRA_DRAFTS)  # [B]
  copies = jnp.arange(1, spec.copies, dtype=jnp.int32)
  others = jax.vmap(lambda key: jax.vmap(lambda j: jax.random.fold_in(key, j))(copies))(extra)
  draft_keys = jnp.concatenate([first[:, None], others], axis=1).reshape(-1)  # [B*K], (b, j)
  return StepKeys(draft=draft_keys, accept=accept_keys)


def draft(spec: LoopSpec, state: decode_state.DecodeState, keys: StepKeys) -> Drafts:
  """The drafter's proposal of options.gamma tokens (under options.sampling) after the committed
  rows (SpecTr: every row K times, copy j with its own key, so the K drafts are i.i.d.), and the
  verify call's tokens. The baseline drafts nothing: it verifies the last committed token."""
  tokens, lengths = state.tokens, state.lengths  # [B, L_max], [B]
  if spec.copies > 1:
    tokens = jnp.repeat(tokens, spec.copies, axis=0)  # [K*B, L_max]
    lengths = jnp.repeat(lengths, spec.copies, axis=0)  # [K*B]
  last = last_tokens(tokens, lengths)  # [R]
  if spec.drafter is None:
    return Drafts(lengths=lengths, verify_tokens=last[:, None])
  gamma, sampling = spec.options.gamma, spec.options.sampling
  proposal, draft_state = spec.drafter.propose(
    spec.draft_params,
    state.draft_state,
    tokens,
    lengths,
    gamma,
    keys.draft,
    sampling,
    spec.inputs.sampling_params,
  )
  rows = tokens.shape[0]
  assert proposal.tokens.shape == (rows, gamma), proposal.tokens.shape
  assert proposal.probs.shape == (rows, gamma, spec.drafter.vocab_size), proposal.probs.shape
  drafted = jnp.arange(gamma)[None, :] < proposal.num_drafted[:, None]  # [R, gamma]
  draft_tokens = jnp.where(drafted, proposal.tokens, 0)  # [R, gamma]
  verify_tokens = jnp.concatenate([last[:, None], draft_tokens], axis=1)  # [R, gamma+1]
  return Drafts(lengths, verify_tokens, proposal, draft_state, drafted, draft_tokens)


def verify(spec: LoopSpec, state: decode_state.DecodeState, drafts: Drafts) -> Verified:
  """One target call over drafts.verify_tokens [R, W] at start = lengths-1, and its distributions.

  The baseline in lockstep (equal prompt lengths, target.lockstep_extend): rows not done all sit at
  the longest length, so one scalar start serves the batch (done rows' writes are discarded).
  Speculative decoding with options.adaptive_verify: only as wide as the longest proposal of a row
  that is not done (`_extend`).
  """
  target, sampling = spec.target, spec.options.sampling
  start = drafts.lengths - 1  # [R]
  if spec.lockstep:
    start = jnp.max(state.lengths) - 1
  width = None
  if spec.drafter is not None and spec.num_drafts is None and spec.options.adaptive_verify:
    width = 1 + jnp.max(jnp.where(state.done, 0, drafts.proposal.num_drafted))
  logits, cache = _extend(
    target, spec.target_params, state.target_cache, drafts.verify_tokens, start, width
  )  # [R, W, V]
  if drafts.proposal is None:
    logits_at = logits[:, 0]  # [R, V]: the baseline's one position
  else:
    logits_at = logits
  probs = sampling_lib.probs_from_logits(logits_at, sampling, spec.inputs.sampling_params)
  return Verified(logits=logits, probs=probs, cache=cache)


def accept(spec: LoopSpec, drafts: Drafts, verified: Verified, keys: StepKeys) -> Emitted:
  """The block each original row emits: SpecTr's sequence-level selection over its K drafts, the
  acceptance rule over the one draft (exact, or lenient with `spec.lenience`), or the baseline's
  one sample from the target."""
  sampling, sampling_params = spec.options.sampling, spec.inputs.sampling_params
  if spec.num_drafts is not None:
    return _select(spec, drafts, verified, keys.accept)
  if drafts.proposal is None:
    token = sampling_lib.sample_rows(keys.accept, verified.probs, sampling.greedy)  # [B]
    return Emitted(block=token[:, None], num_accepted=jnp.zeros((spec.batch,), jnp.int32))
  lenient = {}
  if spec.lenience is not None:
    # APPROXIMATE for l < 1 (bit-identical to the exact rule at l = 1). Under argmax decoding the
    # standardized p is one-hot, so the argmax form (p(x) >= l max p, on the raw logits) applies.
    gamma = drafts.tokens.shape[1]
    argmax_mode = jnp.asarray(True) if sampling.greedy else sampling_params.temperature == 0
    lenient_accepts = (
      sampling_lib.lenient_argmax_accept(verified.logits[:, :gamma], drafts.tokens, spec.lenience)
      & argmax_mode
    )
    lenient = dict(lenience=spec.lenience, lenient_accepts=lenient_accepts)
  result = sampling_lib.speculative_accept(
    drafts.tokens,
    drafts.proposal.probs,
    verified.probs,
    keys.accept,
    drafts.proposal.num_drafted,
    greedy=sampling.greedy,
    **lenient,
  )
  return Emitted(result.tokens, result.num_accepted, alpha=result.min_mass.sum(axis=1))


def commit(
  spec: LoopSpec,
  state: decode_state.DecodeState,
  drafts: Drafts,
  verified: Verified,
  emitted: Emitted,
) -> decode_state.DecodeState:
  """The state after the step: each row not done writes its emitted block at its length and
  advances by it (tokens after an EOS inside the block are dropped, the EOS is kept; the overshoot
  past max_new_tokens is truncated); the metrics count the step for those rows; SpecTr's K copies
  of a row adopt the chosen branch's caches."""
  options, prompt_lengths = spec.options, spec.inputs.prompt_lengths
  active = ~state.done  # [B]
  metrics = _count(spec, state.metrics, active, drafts, verified, emitted)
  cache, draft_state = verified.cache, drafts.draft_state
  if spec.num_drafts is not None:
    # Every copy of row b adopts the chosen branch's caches (rows b*K + branch[b]).
    source = jnp.arange(spec.batch, dtype=jnp.int32) * spec.copies + emitted.selection.branch
    index = jnp.repeat(source, spec.copies, axis=0)  # [K*B]
    cache = _adopt_rows(cache, state.target_cache, index)
    draft_state = _adopt_rows(draft_state, state.draft_state, index)
  block, num_emitted = emitted.block, emitted.num_accepted + 1  # [B, T], [B]
  width = block.shape[1]
  if options.eos_id is not None:
    is_eos = (block == options.eos_id) & (jnp.arange(width)[None, :] < num_emitted[:, None])
    hit_eos = jnp.any(is_eos, axis=1)  # [B]
    num_emitted = jnp.where(hit_eos, jnp.argmax(is_eos, axis=1) + 1, num_emitted)
  else:
    hit_eos = jnp.zeros_like(state.done)
  generated = state.lengths - prompt_lengths
  num_emitted = jnp.minimum(num_emitted, options.max_new_tokens - generated)  # the overshoot
  lengths = jnp.where(active, state.lengths + num_emitted, state.lengths)
  done = state.done | (active & hit_eos) | (lengths - prompt_lengths >= options.max_new_tokens)
  # Filler past the new length is stale.
  tokens = drafter_base.write_rows(state.tokens, block, state.lengths)
  return decode_state.DecodeState(
    state.step + 1, tokens, lengths, done, cache, draft_state, metrics
  )


# --------------------------------------------------------------------------------------------------
# The steps' parts.
# --------------------------------------------------------------------------------------------------


def _extend(
  target: interface.CachedLM,
  target_params: Any,
  cache: Any,
  verify_tokens: jax.Array,
  start: jax.Array,
  width: jax.Array | None,
) -> tuple[jax.Array, Any]:
  """The target's verify call over verify_tokens [B, gamma+1] at offsets `start`.

  width None: one call of the static width gamma+1. Otherwise `width` ([] int32 in [1, gamma+1])
  picks one of gamma+1 compiled calls (lax.switch) that feeds only verify_tokens[:, :width]; the
  logits past `width` are zeros (a uniform p that is never used: the caller guarantees width >
  num_drafted for every active row) and the cache is written only on the fed positions. What the
  switch costs: docs/design.md, section 2.
  """
  full = verify_tokens.shape[1]
  if width is None:
    return target.extend(target_params, cache, verify_tokens, start)

  def branch(w):
    def call(cache):
      logits, cache = target.extend(target_params, cache, verify_tokens[:, :w], start)  # [B, w, V]
      logits = jnp.pad(logits.astype(jnp.float32), ((0, 0), (0, full - w), (0, 0)))
      return logits, cache

    return call

  return jax.lax.switch(width - 1, [branch(w) for w in range(1, full + 1)], cache)


def _select(spec: LoopSpec, drafts: Drafts, verified: Verified, select_keys: jax.Array) -> Emitted:
  """SpecTr's accept: `spectr_sequence_select` per original row over its K drafts; select_keys [B]
  split as in `speculative_accept` (the module docstring)."""
  batch, k, length, vocab = spec.batch, spec.copies, spec.options.gamma, spec.target.vocab_size
  uniform_keys = jax.vmap(lambda key: jax.random.fold_in(key, 0))(select_keys)
  sample_keys = jax.vmap(lambda key: jax.random.fold_in(key, 1))(select_keys)
  uniforms = jax.vmap(lambda key: jax.random.uniform(key, (length, k), jnp.float32))(
    uniform_keys
  )  # [B, L, K]
  draft_probs = drafts.masked_probs()  # [K*B, L, V]
  selection = sequence.spectr_sequence_select(
    drafts.tokens.reshape(batch, k, length),
    draft_probs.reshape(batch, k, length, vocab),
    verified.probs.reshape(batch, k, length + 1, vocab),
    uniforms,
    sample_keys,
    drafts.proposal.num_drafted.reshape(batch, k),
    num_iters=spec.num_iters,
  )
  return Emitted(selection.tokens, selection.num_accepted, selection=selection)


def _metrics_type(spec: LoopSpec) -> Any:
  return decode_state.DecodeMetrics if spec.num_drafts is None else decode_state.SpecTrMetrics


def _count(
  spec: LoopSpec,
  metrics: Any,
  active: jax.Array,
  drafts: Drafts,
  verified: Verified,
  emitted: Emitted,
) -> Any:
  """The metrics after this step, counted for the `active` rows [B] (decode/state.py's
  DecodeMetrics, SpecTrMetrics)."""
  invalid = drafts.invalid(verified.probs)  # [R]
  if drafts.proposal is None:
    return metrics.replace(
      target_calls=metrics.target_calls + active, invalid=metrics.invalid | (active & invalid)
    )
  if spec.num_drafts is None:
    num_drafted = drafts.proposal.num_drafted
    return decode_state.DecodeMetrics(
      target_calls=metrics.target_calls + active,
      drafted=metrics.drafted + jnp.where(active, num_drafted, 0),
      accepted=metrics.accepted + jnp.where(active, emitted.num_accepted, 0),
      alpha_sum=metrics.alpha_sum + jnp.where(active, emitted.alpha, 0.0),
      invalid=metrics.invalid | (active & invalid),
    )
  batch, k, selection = spec.batch, spec.copies, emitted.selection
  num_drafted = drafts.proposal.num_drafted.reshape(batch, k)
  invalid = jnp.any(invalid.reshape(batch, k), axis=1)  # [B]
  return decode_state.SpecTrMetrics(
    target_calls=metrics.target_calls + active,
    drafted=metrics.drafted + jnp.where(active, jnp.max(num_drafted, axis=1), 0),
    accepted=metrics.accepted + jnp.where(active, selection.num_accepted, 0),
    alpha_sum=metrics.alpha_sum + jnp.where(active, selection.acceptance_sum, 0.0),
    single_alpha_sum=metrics.single_alpha_sum
    + jnp.where(active, selection.single_draft_acceptance_sum, 0.0),
    selections=metrics.selections + jnp.where(active, selection.num_selections, 0),
    invalid=metrics.invalid | (active & invalid),
  )


def _repeat_rows(tree: Any, copies: int, batch: int, what: str) -> Any:
  """Every leaf [B, ...] -> [B*copies, ...], row b's copies adjacent (b*copies + j)."""

  def repeat(leaf):
    if leaf.ndim < 1 or leaf.shape[0] != batch:
      raise ValueError(
        f'spectr_decode needs every leaf of the {what} to have the batch ({batch}) '
        f'on axis 0 to hold K copies per row; got a leaf of shape {leaf.shape}'
      )
    return jnp.repeat(leaf, copies, axis=0)

  return jax.tree_util.tree_map(repeat, tree)


def _adopt_rows(new: Any, old: Any, index: jax.Array) -> Any:
  """Gathers rows `index` [K*B] of every leaf of `new`; leaves passed through unchanged from `old`
  (the same traced value) are identical across the K copies already and are left as they are."""
  new_leaves, treedef = jax.tree_util.tree_flatten(new)
  old_leaves = jax.tree_util.tree_leaves(old)
  if len(old_leaves) != len(new_leaves):
    old_leaves = [None] * len(new_leaves)
  out = [
    leaf if leaf is before else jnp.take(leaf, index, axis=0)
    for leaf, before in zip(new_leaves, old_leaves)
  ]
  return jax.tree_util.tree_unflatten(treedef, out)


def row_keys(rng: jax.Array, row_ids: jax.Array, step_index: jax.Array, use: int) -> jax.Array:
  """[B] keys: fold_in(fold_in(fold_in(rng, row), step), use); `use` separates consumers."""

  def one(row):
    return jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(rng, row), step_index), use)

  return jax.vmap(one)(row_ids)


def last_tokens(tokens: jax.Array, lengths: jax.Array) -> jax.Array:
  """[B]: the last committed token of each row."""
  return jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)[:, 0]


def has_nan(probs: jax.Array) -> jax.Array:
  """[B, ..., V] -> [B] bool."""
  return jnp.any(jnp.isnan(probs.reshape(probs.shape[0], -1)), axis=1)
