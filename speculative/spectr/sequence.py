"""SpecTr's sequence-level selection (the paper's Algorithm 3), K i.i.d. draft sequences of length L
per row, with k-Seq (rho*, spectr/kseq.py) as the token-level selection; vectorized over rows. The
decode loop around it is decode/spectr_loop.py's `spectr_decode`, whose step (decode/step.py) calls it
in `accept`.

The K drafts of a row form a tree walked depth by depth. At depth i (0-based) the drafts still in
the running ("survivors": those whose first i tokens equal the i tokens emitted so far) hold i.i.d.
samples of the draft's conditional q(. | prefix) (their tokens at depth i were drawn independently
of everything that decided the survival). k-Seq among the k survivors (rho* for that k, acceptance
uniforms u[i, j] per draft j, in draft order) outputs a token distributed as the target's
conditional p(. | prefix):
  * a draft is accepted: emit its token, keep the survivors that carry the same token, go deeper;
  * none is accepted: emit the k-Seq residual sample and stop (the first correction).
After L accepted depths, emit the bonus token from p(. | all L tokens) of a surviving draft. Every
emitted token is then distributed as the target's conditional given the tokens before it, so a
decode loop that repeats this is exact. (Algorithm 3 as printed continues while the output token
equals some survivor's token; after a residual sample that is an event of probability zero at the
exact rho* — every survivor's token x has rho* q(x) >= p(x), where the residual has no mass — so
stopping at the first correction is the same rule, and it needs one sample per step.)

With K = 1 this is Leviathan's Algorithm 1 operation for operation (rho = 1, g = 1, the same
acceptance test and the same unnormalized residual max(0, p - q), the same Gumbel-max sample with
the same key), so `speculative_accept` and `spectr_sequence_select` emit the same tokens for the
same uniforms and keys (tested through the decode loops).

Notation: q is the DRAFT, p the TARGET (as in sampling.py).
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp

from speculative import sampling as sampling_lib
from speculative.spectr import kseq


def _geometric_sum_counted(beta_value: jax.Array, count: jax.Array, max_count: int) -> jax.Array:
  """g(beta) = sum_{j < count} (1 - beta)^j for a run-time count in [0, max_count]. [...] float32.

  Equals `kseq.geometric_sum(beta, count)` (the masked terms are exact zeros); count == 1 gives 1.0
  exactly, count == 0 gives 0.
  """
  one_minus = 1.0 - jnp.clip(beta_value, 0.0, 1.0)  # [...]
  exponents = jnp.arange(max_count, dtype=jnp.float32)  # [max_count]
  powers = one_minus[..., None] ** exponents  # [..., max_count]
  powers = jnp.where(exponents < count[..., None], powers, 0.0)
  return jnp.sum(powers, axis=-1)


def rho_star_counted(
  q: jax.Array,
  p: jax.Array,
  count: jax.Array,
  max_count: int,
  num_iters: int = kseq.DEFAULT_BISECTION_ITERS,
) -> jax.Array:
  """`rho_star` with a run-time number of drafts per row: count [...] int32 in [0, max_count].

  At depth i of the sequence-level selection only the drafts whose prefix agrees with the tokens
  emitted so far take part, so K varies per row and per depth; `max_count` (static) bounds it.
  Bisection on [1, max(count, 1)] exactly as in `rho_star`; count <= 1 gives rho = 1 exactly (a
  single draft is Leviathan's rule; with no draft rho is irrelevant).

  Args:
    q: [..., V] draft distribution.
    p: [..., V] target distribution.
    count: [...] int, the number of i.i.d. drafts of this row.
    max_count: static upper bound of count (>= 1).
    num_iters: bisection steps (static).

  Returns:
    [...] float32 in [1, max(count, 1)].
  """
  max_count = kseq.check_num_drafts(max_count)
  q, p = kseq.as_distributions(q, p)
  count = jnp.asarray(count, jnp.int32)
  batch_shape = q.shape[:-1]
  if count.shape != batch_shape:
    raise ValueError(f"count must have the batch shape {batch_shape}; got {count.shape}")
  one = jnp.ones(batch_shape, jnp.float32)
  if max_count == 1:
    return one

  def is_valid(rho):
    b = kseq.beta(rho, q, p)
    return (b <= 0.0) | (rho >= _geometric_sum_counted(b, count, max_count))

  upper = jnp.maximum(count, 1).astype(jnp.float32)
  return kseq.bisect_smallest_valid(is_valid, one, upper, num_iters)


@flax.struct.dataclass
class SequenceSelection:
  """Outcome of the sequence-level selection for a batch of rows (K drafts of length L each).

  Attributes:
    num_accepted: [B] int32, n in [0, L]: the number of depths at which a draft was accepted.
    next_token: [B] int32, the token emitted after them: the k-Seq residual sample at depth n, or
      the bonus token from the target's conditional at depth L when n == L (or a sample from the
      target's conditional at depth n when no draft reached that depth; see `num_drafted`).
    tokens: [B, L+1] int32, the emitted block: tokens[:, :n] are the accepted draft tokens,
      tokens[:, n] is next_token, entries after n are filler (the chosen branch's drafts, then 0).
    branch: [B] int32 in [0, K): a draft whose first n tokens equal tokens[:, :n] (the draft whose
      caches the decode loop adopts).
    acceptance_sum: [B] float32, sum over the depths where a selection ran of the k-Seq acceptance
      probability 1 - (1 - beta(rho*))^k with k the number of drafts still in the running there.
    single_draft_acceptance_sum: [B] float32, the same sum of sum_x min(q(x), p(x)) (what one draft
      would be accepted with at those conditionals; Leviathan's alpha).
    num_selections: [B] int32, the number of depths where a selection ran (min(n + 1, L), less when
      drafts were shorter than L).
  """

  num_accepted: jax.Array
  next_token: jax.Array
  tokens: jax.Array
  branch: jax.Array
  acceptance_sum: jax.Array
  single_draft_acceptance_sum: jax.Array
  num_selections: jax.Array


@flax.struct.dataclass
class DepthState:
  """Carry of the depth loop of `spectr_sequence_select` (B rows, K drafts, V vocabulary).

  Attributes:
    alive: [B, K] bool, the survivors: drafts whose first tokens equal the tokens emitted so far.
    running: [B] bool, a draft was accepted at every depth so far (the row is still walking).
    num_accepted: [B] int32, the depths accepted so far (n).
    next_dist: [B, V] float32, the distribution of the token after them: the k-Seq residual at the
      first rejection (the bonus distribution is put in after the loop for rows still running).
    acceptance: [B] float32, sum of the k-Seq acceptance probabilities where a selection ran.
    single: [B] float32, sum of sum_x min(q(x), p(x)) at the same depths.
    selections: [B] int32, the depths where a selection ran.
  """

  alive: jax.Array
  running: jax.Array
  num_accepted: jax.Array
  next_dist: jax.Array
  acceptance: jax.Array
  single: jax.Array
  selections: jax.Array

  @classmethod
  def start(cls, batch: int, k: int, vocab: int) -> 'DepthState':
    return cls(
      alive=jnp.ones((batch, k), bool),
      running=jnp.ones((batch,), bool),
      num_accepted=jnp.zeros((batch,), jnp.int32),
      next_dist=jnp.zeros((batch, vocab), jnp.float32),
      acceptance=jnp.zeros((batch,), jnp.float32),
      single=jnp.zeros((batch,), jnp.float32),
      selections=jnp.zeros((batch,), jnp.int32),
    )


def spectr_sequence_select(
  draft_tokens: jax.Array,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  accept_uniforms: jax.Array,
  sample_keys: jax.Array,
  num_drafted: jax.Array | None = None,
  num_iters: int = kseq.DEFAULT_BISECTION_ITERS,
) -> SequenceSelection:
  """The paper's Algorithm 3 with k-Seq (rho*) as the token-level selection (module docstring).

  Args:
    draft_tokens: [B, K, L] int32, K i.i.d. draft sequences per row.
    draft_probs: [B, K, L, V] float32, draft_probs[b, j, i] is the distribution token i of draft j
      was drawn from (it conditions on draft j's tokens before i).
    target_probs: [B, K, L+1, V] float32, target_probs[b, j, i] is the target's conditional given
      draft j's first i tokens (the verify call over [last token, draft j]).
    accept_uniforms: [B, L, K] float32 in [0, 1), u for (depth, draft).
    sample_keys: [B] PRNG keys, one per row, used once (residual or bonus sample).
    num_drafted: [B, K] int32 in [0, L], tokens each draft really proposed (default L). Positions
      at or beyond it take no part; when no survivor has a token at depth i the row emits a sample
      of p at depth i, as `speculative_accept` does. Exactness then needs num_drafted to depend
      only on the draft's own earlier tokens (a stopping rule), so survivors agree on it.
    num_iters: bisection steps for rho* (static).

  Returns:
    SequenceSelection.
  """
  draft_tokens = jnp.asarray(draft_tokens)
  if draft_tokens.ndim != 3:
    raise ValueError(f"draft_tokens must be [batch, K, L]; got shape {draft_tokens.shape}")
  batch, k, length = draft_tokens.shape
  vocab = target_probs.shape[-1]
  num_drafted = _check_shapes(
    draft_probs, target_probs, accept_uniforms, sample_keys, num_drafted, (batch, k, length, vocab)
  )
  step = functools.partial(
    _depth_step,
    draft_tokens=draft_tokens.astype(jnp.int32),
    draft_probs=draft_probs.astype(jnp.float32),
    target_probs=target_probs.astype(jnp.float32),
    accept_uniforms=accept_uniforms.astype(jnp.float32),
    num_drafted=num_drafted,
    num_iters=num_iters,
  )
  walk = jax.lax.fori_loop(0, length, step, DepthState.start(batch, k, vocab))
  return _emit(walk, draft_tokens.astype(jnp.int32), target_probs.astype(jnp.float32), sample_keys)


def _check_shapes(draft_probs, target_probs, accept_uniforms, sample_keys, num_drafted, shape):
  """ValueError naming the first input whose shape does not fit (batch, K, L, V) = `shape`;
  returns num_drafted ([B, K], default L)."""
  batch, k, length, vocab = shape
  if draft_probs.shape != (batch, k, length, vocab):
    raise ValueError(
      f"draft_probs must be [batch, K, L, V] = {(batch, k, length, vocab)}; got {draft_probs.shape}"
    )
  if target_probs.shape != (batch, k, length + 1, vocab):
    raise ValueError(
      f"target_probs must be [batch, K, L+1, V] = {(batch, k, length + 1, vocab)}; "
      f"got {target_probs.shape}"
    )
  if accept_uniforms.shape != (batch, length, k):
    raise ValueError(
      f"accept_uniforms must be [batch, L, K] = {(batch, length, k)}; got {accept_uniforms.shape}"
    )
  if sample_keys.shape != (batch,):
    raise ValueError(f"sample_keys must be [batch] = {(batch,)}; got {sample_keys.shape}")
  if num_drafted is None:
    num_drafted = jnp.full((batch, k), length, jnp.int32)
  if num_drafted.shape != (batch, k):
    raise ValueError(f"num_drafted must be [batch, K] = {(batch, k)}; got {num_drafted.shape}")
  return num_drafted


def _depth_step(
  i: jax.Array,
  walk: DepthState,
  *,
  draft_tokens: jax.Array,
  draft_probs: jax.Array,
  target_probs: jax.Array,
  accept_uniforms: jax.Array,
  num_drafted: jax.Array,
  num_iters: int,
) -> DepthState:
  """k-Seq among the survivors at depth i: accept a draft token (go deeper) or leave the residual."""
  rows = jnp.arange(draft_tokens.shape[0])
  k = draft_tokens.shape[1]
  participants = walk.alive & (i < num_drafted)  # [B, K]
  count = jnp.sum(participants, axis=1).astype(jnp.int32)  # [B]
  has_drafts = count > 0
  # Survivors share their prefix, so any one of them gives the conditionals q and p at depth i;
  # where none has a token here (each stopped drafting), a survivor still gives p, not draft 0,
  # which may have died at a shallower depth.
  representative = jnp.where(
    has_drafts, jnp.argmax(participants, axis=1), jnp.argmax(walk.alive, axis=1)
  )  # [B]
  q = draft_probs[rows, representative, i]  # [B, V]
  p = target_probs[rows, representative, i]  # [B, V]
  q = jnp.where(has_drafts[:, None], q, 0.0)  # no draft here: the residual below is p itself
  rho = rho_star_counted(q, p, count, k, num_iters)  # [B]
  tokens_here = draft_tokens[:, :, i]  # [B, K]
  q_at = jnp.take_along_axis(q, tokens_here, axis=1)  # [B, K]
  p_at = jnp.take_along_axis(p, tokens_here, axis=1)  # [B, K]
  accepted = (
    participants & (accept_uniforms[:, i, :] * rho[:, None] * q_at <= p_at) & (p_at > 0.0)
  )  # [B, K]
  any_accepted = jnp.any(accepted, axis=1)  # [B]
  first = jnp.argmax(accepted, axis=1)  # [B]
  emitted = jnp.take_along_axis(tokens_here, first[:, None], axis=1)[:, 0]  # [B]

  beta_rho = kseq.beta(rho, q, p)  # [B]
  g = _geometric_sum_counted(beta_rho, count, k)  # [B]
  # Unnormalized residual (Gumbel-max needs no normalization); p when it has no mass.
  residual = jnp.maximum(p - jnp.minimum(q, p / rho[:, None]) * g[:, None], 0.0)  # [B, V]
  residual = jnp.where(jnp.sum(residual, axis=1, keepdims=True) > 0.0, residual, p)

  selecting = walk.running & has_drafts
  advance = walk.running & any_accepted
  return DepthState(
    alive=jnp.where(advance[:, None], participants & (tokens_here == emitted[:, None]), walk.alive),
    running=advance,
    num_accepted=walk.num_accepted + advance.astype(jnp.int32),
    next_dist=jnp.where((walk.running & ~any_accepted)[:, None], residual, walk.next_dist),
    acceptance=walk.acceptance + jnp.where(selecting, beta_rho * g, 0.0),
    single=walk.single + jnp.where(selecting, jnp.sum(jnp.minimum(q, p), axis=1), 0.0),
    selections=walk.selections + selecting.astype(jnp.int32),
  )


def _emit(
  walk: DepthState, draft_tokens: jax.Array, target_probs: jax.Array, sample_keys: jax.Array
) -> SequenceSelection:
  """The block after the walk: the accepted draft tokens of a surviving branch, then the residual
  sample (or, after L accepted depths, the bonus token)."""
  batch, _, length = draft_tokens.shape
  rows = jnp.arange(batch)
  branch = jnp.argmax(walk.alive, axis=1).astype(jnp.int32)  # [B]; all K alive when n == 0
  bonus = target_probs[rows, branch, length]  # [B, V]
  next_dist = jnp.where(walk.running[:, None], bonus, walk.next_dist)
  next_token = sampling_lib.sample_rows(sample_keys, next_dist)  # [B]

  chosen = draft_tokens[rows, branch]  # [B, L]
  block = sampling_lib.emitted_block(chosen, walk.num_accepted, next_token)  # [B, L+1]
  return SequenceSelection(
    num_accepted=walk.num_accepted,
    next_token=next_token,
    tokens=block,
    branch=branch,
    acceptance_sum=walk.acceptance,
    single_draft_acceptance_sum=walk.single,
    num_selections=walk.selections,
  )
