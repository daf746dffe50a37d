"""Draft sources for speculative decoding: a small model, n-gram tables, prompt lookup (copying).

A drafter is a small frozen (hashable) dataclass: a jit static argument holding only configuration.
Its arrays (model weights, n-gram tables) are its `params`, passed to the decode loop as
`draft_params` (never stored in the dataclass, so big tables are not constant-folded into the HLO),
and its mutable part (a model cache, an acceptance estimate, ...) is a pytree "draft state" that the
decode loop threads through its `lax.while_loop` state. Every drafter implements:

  vocab_size: int
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

Exactness never depends on the drafter: any proposal whose tokens were drawn from the `probs` it
reports -- including a row that proposes fewer than gamma tokens, or stops drafting based on its own
(draft-side) confidence or on past acceptance -- yields exactly the target's distribution. A bad
drafter only lowers alpha.

Drafters here:
  ModelDrafter(model, stop_below=0.)   a smaller CachedLM with its own cache; `stop_below` > 0 makes
                                       gamma adaptive (stop after a token the draft is unsure of).
  AdaptiveGammaDrafter(inner, ...)     drafts k <= gamma tokens per row, k chosen each step from an
                                       online estimate of alpha (Theorem 3.8 with the estimate).
  UnigramDrafter / BigramDrafter       n-gram tables (c ~ 0; paper Table 3), from `estimate_unigram`
                                       / `estimate_bigram` on token ids of a corpus.
  PromptLookupDrafter(...)             copies the continuation of the latest n-gram match in the
                                       decoder stream or the encoder input (paper Sec. 3.6), with an
                                       optional fallback drafter for rows without a match.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Protocol, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

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


def _write_rows(tokens: jax.Array, block: jax.Array, start: jax.Array) -> jax.Array:
  """tokens [B, L] <- block [B, T] at per-row offsets start [B]."""
  return jax.vmap(lambda row, blk, s: jax.lax.dynamic_update_slice(row, blk, (s,)))(
      tokens, block, start)


def _fold_keys(keys: jax.Array, index: int | jax.Array) -> jax.Array:
  """[B] keys -> [B] keys fold_in(keys[b], index): one fresh key per use."""
  return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, index)


def _one_hot_proposal(tokens: jax.Array, num_drafted: jax.Array, vocab: int) -> DraftProposal:
  """A deterministic proposal: one-hot q at each token; filler past num_drafted becomes 0."""
  gamma = tokens.shape[1]
  tokens = jnp.where(jnp.arange(gamma)[None, :] < num_drafted[:, None], tokens, 0)
  return DraftProposal(tokens=tokens.astype(jnp.int32),
                       probs=jax.nn.one_hot(tokens, vocab, dtype=jnp.float32),
                       num_drafted=num_drafted.astype(jnp.int32))


def _check_gamma_static(gamma: Any) -> None:
  if not isinstance(gamma, (int, np.integer)) or gamma < 1:
    raise ValueError(f'gamma must be a static int >= 1, got {gamma!r}')


# --------------------------------------------------------------------------------------------------
# A small model.
# --------------------------------------------------------------------------------------------------


def draft_confidence(logits: jax.Array) -> jax.Array:
  """[..., V] logits -> [...] max_x softmax(logits)(x), the model's own (temperature-1) confidence.

  Used by the adaptive-gamma stop rule. It is taken before the sampling transform on purpose: under
  argmax decoding the standardized q is one-hot (confidence always 1).
  """
  logits = logits.astype(jnp.float32)
  shifted = logits - jnp.max(logits, axis=-1, keepdims=True)
  return 1.0 / jnp.sum(jnp.exp(shifted), axis=-1)  # = exp(max) / sum(exp)


@dataclasses.dataclass(frozen=True)
class ModelDrafter:
  """Drafts up to gamma tokens autoregressively with a small CachedLM and its own KV cache.

  Attributes:
    model: the draft CachedLM (same vocabulary as the target).
    stop_below: adaptive gamma (static; 0 = always draft gamma tokens). A row stops drafting after
      a token x_i whose draft confidence `draft_confidence(logits_i)` (max of the draft's
      temperature-1 softmax) is below `stop_below`; x_i itself is still proposed (it is already
      sampled, and the verify call has a static width anyway). At least one token is drafted. The
      loop over draft calls ends as soon as every row has stopped, so at batch 1 a low-confidence
      step saves draft calls; the target's verify call keeps its static width gamma+1 unless the
      decode loop runs with `adaptive_verify=True` (see decoding.py). Exact for any threshold: the
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
  model: CachedLM
  stop_below: float = 0.0

  def __post_init__(self):
    if not 0.0 <= float(self.stop_below) <= 1.0:
      raise ValueError(f'ModelDrafter.stop_below must be in [0, 1] (0 = fixed gamma), got '
                       f'{self.stop_below!r}')

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
    return self.draft(params, state, tokens, lengths, gamma, keys, sampling, sampling_params)

  def draft(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
            gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
            sampling_params: sampling_lib.SamplingParams, *,
            max_drafted: jax.Array | None = None, forced_tokens: jax.Array | None = None,
            forced: jax.Array | None = None) -> tuple[DraftProposal, DraftState]:
    """`propose` with two hooks for wrappers (AdaptiveGammaDrafter, PromptLookupDrafter).

    Args:
      max_drafted: [B] int32, row b drafts at most clip(max_drafted[b], 1, gamma) tokens (default
        gamma); the draft-call loop ends when no row has more to draft.
      forced_tokens: [B, gamma] int32 and forced: [B] bool. A forced row is fed forced_tokens
        instead of its own samples (so the draft cache holds what the wrapper proposes: its
        invariant above stays true when the wrapper's tokens are accepted) and ignores `stop_below`;
        its returned proposal is meaningless (the wrapper replaces it). When every row is forced,
        the draft loop is skipped: one call of width gamma+1 feeds the catch-up tokens and
        forced_tokens[:, :gamma-1] instead (1 draft call instead of gamma).
    """
    assert tokens.ndim == 2 and lengths.shape == tokens.shape[:1], (tokens.shape, lengths.shape)
    _check_gamma_static(gamma)
    batch = tokens.shape[0]
    vocab = self.vocab_size
    if max_drafted is None:
      max_drafted = jnp.full((batch,), gamma, jnp.int32)
    max_drafted = jnp.clip(max_drafted.astype(jnp.int32), 1, gamma)  # [B]
    guided = forced is not None
    if guided:
      assert forced_tokens is not None and forced_tokens.shape == (batch, gamma), (
          None if forced_tokens is None else forced_tokens.shape)
      forced = forced.astype(bool)
      forced_tokens = forced_tokens.astype(jnp.int32)
    else:
      forced = jnp.zeros((batch,), bool)
    adaptive = float(self.stop_below) > 0.0

    def keep_going(count, logits):
      """[B] bool: may this row draft another token after `count` tokens?"""
      more = count < max_drafted
      if adaptive:
        more = more & (forced | (draft_confidence(logits) >= self.stop_below))
      return more

    def sample_loop(cache):
      # Catch-up call: the last two committed tokens, T=2, at start = max(length-2, 0).
      start = jnp.maximum(lengths - 2, 0)  # [B]
      catch_up = _gather_rows(tokens, start[:, None] + jnp.arange(2)[None, :])  # [B, 2]
      logits, cache = self.model.extend(params, cache, catch_up, start)  # [B, 2, V]
      last_index = (lengths - 1 - start)[:, None, None]  # 1, or 0 when length == 1
      logits = jnp.take_along_axis(logits, last_index, axis=1)[:, 0]  # [B, V]
      probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)  # [B, V]
      token = sampling_lib.sample_rows(_fold_keys(keys, 0), probs)  # [B]
      count = jnp.ones((batch,), jnp.int32)
      out_tokens = jnp.zeros((batch, gamma), jnp.int32).at[:, 0].set(token)  # [B, gamma]
      out_probs = jnp.zeros((batch, gamma, vocab), jnp.float32).at[:, 0].set(probs)
      fed = jnp.where(forced, forced_tokens[:, 0], token) if guided else token  # [B]
      carry = (jnp.ones((), jnp.int32), cache, fed, out_tokens, out_probs, count,
               keep_going(count, logits))

      def cond(carry):
        position, *_, active = carry
        return (position < gamma) & jnp.any(active)

      def body(carry):
        # Feeds x_j (j = position, 1-based) at length-1+j and samples x_{j+1} with key j.
        position, cache, fed, out_tokens, out_probs, count, active = carry
        logits, cache = self.model.extend(params, cache, fed[:, None],
                                          lengths - 1 + position)  # [B, 1, V]
        logits = logits[:, 0]  # [B, V]
        probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)  # [B, V]
        token = sampling_lib.sample_rows(_fold_keys(keys, position), probs)  # [B]
        out_tokens = jax.lax.dynamic_update_slice(out_tokens, token[:, None], (0, position))
        out_probs = jax.lax.dynamic_update_slice(out_probs, probs[:, None], (0, position, 0))
        count = count + active.astype(jnp.int32)
        active = active & keep_going(count, logits)
        if guided:
          next_forced = jax.lax.dynamic_index_in_dim(
              forced_tokens, jnp.minimum(position, gamma - 1), axis=1, keepdims=False)  # [B]
          fed = jnp.where(forced, next_forced, token)
        else:
          fed = token
        return position + 1, cache, fed, out_tokens, out_probs, count, active

      _, cache, _, out_tokens, out_probs, count, _ = jax.lax.while_loop(cond, body, carry)
      return DraftProposal(tokens=out_tokens, probs=out_probs, num_drafted=count), cache

    if not guided:
      return sample_loop(state)

    def forced_call(cache):
      # Every row copies: write the forced tokens after the committed stream and feed the window
      # [length-2, length-2+gamma] in one call (at length 1: [0, gamma]); the cache then holds
      # exactly what the invariant needs if the forced tokens are accepted.
      stream = _write_rows(tokens, forced_tokens, lengths)  # [B, L_max]
      start = jnp.maximum(lengths - 2, 0)  # [B]
      window = _gather_rows(stream, start[:, None] + jnp.arange(gamma + 1)[None, :])  # [B, g+1]
      _, cache = self.model.extend(params, cache, window, start)
      return _one_hot_proposal(forced_tokens, max_drafted, vocab), cache

    return jax.lax.cond(jnp.all(forced), forced_call, sample_loop, state)


@dataclasses.dataclass(frozen=True)
class AdaptiveGammaDrafter:
  """Chooses how many tokens to draft per row and step from the recent acceptance (adaptive gamma).

  Each step, the number of accepted drafts n of the previous step is read off the committed lengths
  (n = new length - old length - 1, capped at what was drafted), and a per-row estimate of alpha is
  updated as an exponentially decayed ratio of Bernoulli outcomes (n successes, plus one failure if
  n < drafted), starting from `prior_alpha` with weight `prior_weight`. Then the row drafts

      k = argmax_{1 <= k <= gamma} E[tokens](alpha, k) / (k * draft_cost + v(k+1)),
      E[tokens](alpha, k) = 1 + alpha + ... + alpha^k   (Eq. 1 / Theorem 3.8 with the estimate),

  with v(T) = verify_costs[T-1] (a target T-token call / single step; default 1 for every T, right
  when the verify call has the static width gamma+1; pass measured v(T) with `adaptive_verify`).
  Exact for any rule: k depends only on the past. The inner drafter must support
  `draft(..., max_drafted=...)` (ModelDrafter does), so the draft loop really stops after k calls.

  Attributes:
    inner: the drafter (e.g. ModelDrafter(draft_model)); its `stop_below` rule still applies.
    draft_cost: c, draft step time / target step time (measured).
    verify_costs: None or (v(1), v(2), ...) with at least gamma+1 entries.
    decay: weight of the past per step in the alpha estimate (0 = only the last step).
    prior_alpha, prior_weight: the estimate before any observation.

  State: dict(inner=inner state, prev_lengths [B] int32, prev_drafted [B] int32,
              successes [B] float32, trials [B] float32).
  """
  inner: Any
  draft_cost: float
  verify_costs: tuple[float, ...] | None = None
  decay: float = 0.7
  prior_alpha: float = 0.6
  prior_weight: float = 2.0

  def __post_init__(self):
    if not hasattr(self.inner, 'draft'):
      raise ValueError('AdaptiveGammaDrafter needs an inner drafter with a draft(..., '
                       'max_drafted=...) method (e.g. ModelDrafter), got '
                       f'{type(self.inner).__name__}')
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

  def init(self, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
           max_length: int, encoder_tokens: jax.Array | None = None) -> DraftState:
    batch = prompt_tokens.shape[0]
    return dict(
        inner=self.inner.init(params, prompt_tokens, prompt_lengths, max_length, encoder_tokens),
        prev_lengths=jnp.asarray(prompt_lengths, jnp.int32),
        prev_drafted=jnp.zeros((batch,), jnp.int32),
        successes=jnp.full((batch,), self.prior_alpha * self.prior_weight, jnp.float32),
        trials=jnp.full((batch,), self.prior_weight, jnp.float32))

  def choose_gamma(self, alpha: jax.Array, gamma: int) -> jax.Array:
    """[B] alpha estimates -> [B] int32 k in [1, gamma] maximizing the predicted speed."""
    if self.verify_costs is not None and len(self.verify_costs) < gamma + 1:
      raise ValueError(f'verify_costs needs v(T) for T = 1..{gamma + 1}, got '
                       f'{len(self.verify_costs)} values')
    ks = np.arange(1, gamma + 1)  # [G]
    verify = (np.ones(gamma) if self.verify_costs is None
              else np.asarray(self.verify_costs[1:gamma + 1]))  # v(k+1), [G]
    cost = jnp.asarray(ks * float(self.draft_cost) + verify, jnp.float32)  # [G]
    powers = alpha[:, None] ** jnp.arange(gamma + 1, dtype=jnp.float32)[None, :]  # [B, G+1]
    expected = jnp.cumsum(powers, axis=1)[:, 1:]  # [B, G]: sum_{i<=k} alpha^i
    return (jnp.argmax(expected / cost[None, :], axis=1) + 1).astype(jnp.int32)

  def propose(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
              gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
              sampling_params: sampling_lib.SamplingParams) -> tuple[DraftProposal, DraftState]:
    return self.draft(params, state, tokens, lengths, gamma, keys, sampling, sampling_params)

  def draft(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
            gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
            sampling_params: sampling_lib.SamplingParams, *,
            max_drafted: jax.Array | None = None, forced_tokens: jax.Array | None = None,
            forced: jax.Array | None = None) -> tuple[DraftProposal, DraftState]:
    """`propose` with ModelDrafter.draft's hooks (so it can be a PromptLookupDrafter fallback):
    an unforced row drafts min(k, max_drafted) tokens, a forced row exactly as asked."""
    prev_drafted = state['prev_drafted']
    advanced = lengths - state['prev_lengths']  # [B], n+1 after a step (0 for a finished row)
    observed = (prev_drafted > 0) & (advanced > 0)
    num_accepted = jnp.clip(advanced - 1, 0, prev_drafted)  # [B]
    failures = (num_accepted < prev_drafted).astype(jnp.float32)
    successes = jnp.where(observed, self.decay * state['successes'] + num_accepted,
                          state['successes'])
    trials = jnp.where(observed, self.decay * state['trials'] + num_accepted + failures,
                       state['trials'])
    alpha = jnp.clip(successes / trials, 0.0, 1.0)  # [B]
    k = self.choose_gamma(alpha, gamma)  # [B]
    if max_drafted is not None:
      limited = jnp.minimum(k, max_drafted)
      k = limited if forced is None else jnp.where(forced, max_drafted, limited)
    proposal, inner_state = self.inner.draft(params, state['inner'], tokens, lengths, gamma, keys,
                                             sampling, sampling_params, max_drafted=k,
                                             forced_tokens=forced_tokens, forced=forced)
    return proposal, dict(inner=inner_state, prev_lengths=lengths,
                          prev_drafted=proposal.num_drafted, successes=successes, trials=trials)


# --------------------------------------------------------------------------------------------------
# N-gram tables (paper Table 3: unigram and bigram drafts with c ~ 0).
# --------------------------------------------------------------------------------------------------


def _check_sequences(sequences: Iterable[Sequence[int]], vocab_size: int) -> list[np.ndarray]:
  arrays = [np.asarray(seq, np.int64).reshape(-1) for seq in sequences]
  arrays = [a for a in arrays if a.size]
  if not arrays:
    raise ValueError('no token sequences to estimate n-gram tables from')
  lo = min(int(a.min()) for a in arrays)
  hi = max(int(a.max()) for a in arrays)
  if lo < 0 or hi >= vocab_size:
    raise ValueError(f'token ids must be in [0, {vocab_size}), got range [{lo}, {hi}]')
  return arrays


def estimate_unigram(sequences: Iterable[Sequence[int]], vocab_size: int,
                     add_k: float = 1.0) -> dict[str, jax.Array]:
  """Unigram table from decoder streams, with add-k smoothing.

  Args:
    sequences: token id sequences as the decoder sees them (e.g. [start, t_1, ..., t_n, eos]); the
      first token of each is context only (it is never predicted), every other one is counted.
    vocab_size: V.
    add_k: pseudo-count added to every token (> 0 keeps every q(x) > 0).

  Returns:
    params {'log_probs': [V] float32}: log q(x) = log((count(x) + k) / (N + k V)).
  """
  if not add_k > 0:
    raise ValueError(f'add_k must be > 0, got {add_k!r}')
  arrays = _check_sequences(sequences, vocab_size)
  counts = np.bincount(np.concatenate([a[1:] for a in arrays]), minlength=vocab_size)
  smoothed = counts.astype(np.float64) + add_k
  return {'log_probs': jnp.asarray(np.log(smoothed / smoothed.sum()), jnp.float32)}


def estimate_bigram(sequences: Iterable[Sequence[int]], vocab_size: int, add_k: float = 1.0,
                    prior_weight: float = 1.0, max_next: int = 128) -> dict[str, jax.Array]:
  """Bigram table from decoder streams, stored sparsely and smoothed toward the unigram.

  A dense V x V table (8000^2 floats = 256 MB) would be almost all zeros, so each previous token y
  keeps its `max_next` most frequent continuations (on the LibreOffice train split, 8k vocabulary,
  the top 32 / 64 / 128 hold 74% / 82% / 88% of all bigram counts; 128 x 8000 entries = 8 MB); the
  rest of its counts and all unseen continuations share the prior mass. With c(y, x) the kept
  counts and C(y) = sum_x c(y, x):

      q(x | y) = (c(y, x) + m u(x)) / (C(y) + m),  u = the add-k smoothed unigram, m = prior_weight,

  i.e. additive (Dirichlet) smoothing whose pseudo-counts follow the unigram instead of being
  uniform (plain add-k with V = 8000 would drown rare contexts); a context never seen gives u.

  Returns:
    params {'unigram_log_probs': [V] float32, 'next_tokens': [V, K] int32,
            'next_counts': [V, K] float32 (0 for unused slots), 'prior_weight': [] float32}.
  """
  if not prior_weight > 0:
    raise ValueError(f'prior_weight must be > 0, got {prior_weight!r}')
  if not isinstance(max_next, (int, np.integer)) or max_next < 1:
    raise ValueError(f'max_next must be an int >= 1, got {max_next!r}')
  arrays = _check_sequences(sequences, vocab_size)
  unigram = estimate_unigram(arrays, vocab_size, add_k)
  prev = np.concatenate([a[:-1] for a in arrays])
  nxt = np.concatenate([a[1:] for a in arrays])
  pair_ids, pair_counts = np.unique(prev * vocab_size + nxt, return_counts=True)
  pair_prev, pair_next = np.divmod(pair_ids, vocab_size)
  order = np.lexsort((-pair_counts, pair_prev))  # by previous token, then count descending
  pair_prev, pair_next, pair_counts = pair_prev[order], pair_next[order], pair_counts[order]
  rank = np.arange(len(pair_prev)) - np.searchsorted(pair_prev, pair_prev, side='left')
  keep = rank < max_next
  next_tokens = np.zeros((vocab_size, max_next), np.int32)
  next_counts = np.zeros((vocab_size, max_next), np.float32)
  next_tokens[pair_prev[keep], rank[keep]] = pair_next[keep]
  next_counts[pair_prev[keep], rank[keep]] = pair_counts[keep]
  return {'unigram_log_probs': unigram['log_probs'], 'next_tokens': jnp.asarray(next_tokens),
          'next_counts': jnp.asarray(next_counts),
          'prior_weight': jnp.asarray(prior_weight, jnp.float32)}


def bigram_log_probs(params: dict[str, jax.Array], previous: jax.Array) -> jax.Array:
  """[B] previous tokens -> [B, V] log q(. | previous) of an `estimate_bigram` table."""
  unigram = jnp.exp(params['unigram_log_probs'])  # [V]
  next_tokens = params['next_tokens'][previous]  # [B, K]
  next_counts = params['next_counts'][previous]  # [B, K]
  total = jnp.sum(next_counts, axis=1, keepdims=True) + params['prior_weight']  # [B, 1]
  dense = params['prior_weight'] * unigram[None, :] / total  # [B, V]
  dense = jax.vmap(lambda row, ids, add: row.at[ids].add(add))(dense, next_tokens,
                                                               next_counts / total)
  return jnp.log(dense)


def _check_table(params: Any, key: str, vocab_size: int, name: str) -> None:
  if not isinstance(params, dict) or key not in params:
    raise ValueError(f'{name} params must be a dict with {key!r} (see estimate_'
                     f'{name.lower().replace("drafter", "")}), got {type(params).__name__}')
  if params[key].shape[0] != vocab_size:
    raise ValueError(f'{name}: table has {params[key].shape[0]} tokens, vocab_size is {vocab_size}')


@dataclasses.dataclass(frozen=True)
class UnigramDrafter:
  """Drafts gamma tokens i.i.d. from a unigram table (params: `estimate_unigram`); no state.

  q = probs_from_logits(log table): the table's log-probabilities are treated as logits and get the
  same standardization as the target (argmax -> the most frequent token, temperature, top-k/p).
  """
  vocab_size: int

  def init(self, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
           max_length: int, encoder_tokens: jax.Array | None = None) -> DraftState:
    _check_table(params, 'log_probs', self.vocab_size, 'UnigramDrafter')
    return None

  def propose(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
              gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
              sampling_params: sampling_lib.SamplingParams) -> tuple[DraftProposal, DraftState]:
    batch = tokens.shape[0]
    logits = jnp.broadcast_to(params['log_probs'], (batch, self.vocab_size))  # [B, V]
    probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)  # [B, V]
    draft = jnp.stack([sampling_lib.sample_rows(_fold_keys(keys, j), probs)
                       for j in range(gamma)], axis=1)  # [B, gamma]
    probs = jnp.broadcast_to(probs[:, None], (batch, gamma, self.vocab_size))
    return DraftProposal(tokens=draft, probs=probs,
                         num_drafted=jnp.full((batch,), gamma, jnp.int32)), state


@dataclasses.dataclass(frozen=True)
class BigramDrafter:
  """Drafts gamma tokens from a bigram table (params: `estimate_bigram`), each conditioned on the
  previous token (the last committed one, then its own drafts); no state. Standardized like
  UnigramDrafter."""
  vocab_size: int

  def init(self, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
           max_length: int, encoder_tokens: jax.Array | None = None) -> DraftState:
    _check_table(params, 'next_tokens', self.vocab_size, 'BigramDrafter')
    return None

  def propose(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
              gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
              sampling_params: sampling_lib.SamplingParams) -> tuple[DraftProposal, DraftState]:
    batch = tokens.shape[0]
    last = _gather_rows(tokens, (lengths - 1)[:, None])[:, 0]  # [B]

    def step(previous, j):
      logits = bigram_log_probs(params, previous)  # [B, V]
      probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)  # [B, V]
      token = sampling_lib.sample_rows(_fold_keys(keys, j), probs)  # [B]
      return token, (token, probs)

    _, (draft, probs) = jax.lax.scan(step, last, jnp.arange(gamma, dtype=jnp.int32))
    return DraftProposal(tokens=jnp.swapaxes(draft, 0, 1), probs=jnp.swapaxes(probs, 0, 1),
                         num_drafted=jnp.full((batch,), gamma, jnp.int32)), state


def libreoffice_target_sequences(split: str = 'train', vocabulary_path: str | None = None,
                                 data_dir: str | None = None,
                                 limit: int | None = None) -> list[np.ndarray]:
  """Decoder streams [0 (start), ids of the German target..., 1 (eos)] of a LibreOffice split.

  Tokenized with the shipped SentencePiece model (`speculative.tasks.get_vocabulary()`'s file, no
  extra ids), read directly with sentencepiece so TensorFlow is not imported.
  """
  import sentencepiece  # pylint: disable=g-import-not-at-top
  from speculative import tasks  # pylint: disable=g-import-not-at-top
  pairs = tasks.load_split(split, data_dir)
  if limit is not None:
    pairs = pairs[:limit]
  processor = sentencepiece.SentencePieceProcessor(
      model_file=str(vocabulary_path or tasks.VOCAB_PATH))
  ids = processor.encode([target for _, target in pairs])
  return [np.asarray([0] + seq + [1], np.int32) for seq in ids]


# --------------------------------------------------------------------------------------------------
# Prompt lookup (copying; paper Sec. 3.6).
# --------------------------------------------------------------------------------------------------


def _latest_match(haystack: jax.Array, haystack_lengths: jax.Array, suffix: jax.Array,
                  suffix_ok: jax.Array, gamma: int) -> tuple[jax.Array, jax.Array, jax.Array]:
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
    match = match & (haystack[:, i:i + candidates] == suffix[:, i:i + 1])  # [B, J]
  starts = jnp.arange(candidates, dtype=jnp.int32)[None, :]  # [1, J]
  match = match & (starts + n < haystack_lengths[:, None]) & suffix_ok[:, None]
  best = jnp.max(jnp.where(match, starts, -1), axis=1)  # [B], latest occurrence
  found = best >= 0
  first = jnp.maximum(best, 0) + n  # [B], first continuation position
  count = jnp.where(found, jnp.clip(haystack_lengths - first, 0, gamma), 0)
  positions = jnp.minimum(first[:, None] + jnp.arange(gamma)[None, :], width - 1)  # [B, gamma]
  continuation = jnp.where(jnp.arange(gamma)[None, :] < count[:, None],
                           _gather_rows(haystack, positions), 0)
  return found, continuation.astype(jnp.int32), count.astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class PromptLookupDrafter:
  """Copies the continuation of the latest n-gram match (prompt lookup decoding).

  For each row, the last n committed tokens (n from `ngram_sizes`, longest first) are searched for
  in the earlier decoder stream (prompt + generated tokens; for a decoder-only model the prompt) and
  with `search_source`, in the encoder input (T5: the source sentence, right-padded with `pad_id`;
  copying helps with names, numbers, UI labels, markup). For the longest n with a match (the stream
  before the source), the row proposes the up to gamma tokens that followed the latest occurrence,
  with one-hot q (num_drafted = how many tokens were available). Rows without a match take the
  `fallback` drafter's proposal (or propose nothing: num_drafted 0, a plain target step).

  Params: the fallback's params (None without a fallback).
  State: dict(source [B, S] int32, source_lengths [B] int32, fallback=the fallback's state).

  A stateful fallback must support `draft(..., forced_tokens=, forced=, max_drafted=)`
  (ModelDrafter and AdaptiveGammaDrafter do): rows that copy feed the copied tokens to the
  fallback, so its cache stays in sync, and a step where every row copies costs one draft call
  instead of gamma. Stateless fallbacks (n-gram drafters) are simply called every step.
  """
  vocab_size: int
  ngram_sizes: tuple[int, ...] = (3, 2, 1)
  fallback: Any = None
  search_source: bool = True
  pad_id: int = 0

  def __post_init__(self):
    sizes = tuple(int(n) for n in self.ngram_sizes)
    if not sizes or min(sizes) < 1:
      raise ValueError(f'ngram_sizes must be a non-empty tuple of ints >= 1, got '
                       f'{self.ngram_sizes!r}')
    object.__setattr__(self, 'ngram_sizes', tuple(sorted(set(sizes), reverse=True)))
    if self.fallback is not None and self.fallback.vocab_size != self.vocab_size:
      raise ValueError(f'PromptLookupDrafter vocab_size {self.vocab_size} != fallback vocab_size '
                       f'{self.fallback.vocab_size}')

  def init(self, params: Any, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
           max_length: int, encoder_tokens: jax.Array | None = None) -> DraftState:
    batch = prompt_tokens.shape[0]
    if encoder_tokens is None or not self.search_source:
      source = jnp.zeros((batch, 1), jnp.int32)
      source_lengths = jnp.zeros((batch,), jnp.int32)
    else:
      source = jnp.asarray(encoder_tokens, jnp.int32)
      source_lengths = jnp.sum(source != self.pad_id, axis=1).astype(jnp.int32)
    fallback_state = (None if self.fallback is None else
                      self.fallback.init(params, prompt_tokens, prompt_lengths, max_length,
                                         encoder_tokens))
    return dict(source=source, source_lengths=source_lengths, fallback=fallback_state)

  def lookup(self, state: DraftState, tokens: jax.Array, lengths: jax.Array,
             gamma: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(found [B] bool, continuation [B, gamma] int32, count [B] int32) for committed streams."""
    batch = tokens.shape[0]
    found = jnp.zeros((batch,), bool)
    continuation = jnp.zeros((batch, gamma), jnp.int32)
    count = jnp.zeros((batch,), jnp.int32)
    for n in self.ngram_sizes:  # longest first; the first hit per row wins
      suffix_ok = lengths >= n
      suffix = _gather_rows(tokens, jnp.maximum(lengths[:, None] - n + jnp.arange(n)[None, :], 0))
      haystacks = [(tokens, lengths)]
      if self.search_source:
        haystacks.append((state['source'], state['source_lengths']))
      for haystack, haystack_lengths in haystacks:
        hit, cont, num = _latest_match(haystack, haystack_lengths, suffix, suffix_ok, gamma)
        take = hit & ~found
        continuation = jnp.where(take[:, None], cont, continuation)
        count = jnp.where(take, num, count)
        found = found | hit
    return found, continuation, count

  def propose(self, params: Any, state: DraftState, tokens: jax.Array, lengths: jax.Array,
              gamma: int, keys: jax.Array, sampling: sampling_lib.SamplingConfig,
              sampling_params: sampling_lib.SamplingParams) -> tuple[DraftProposal, DraftState]:
    found, continuation, count = self.lookup(state, tokens, lengths, gamma)
    copied = _one_hot_proposal(continuation, count, self.vocab_size)
    if self.fallback is None:
      return copied, state
    if hasattr(self.fallback, 'draft'):
      fallback, fallback_state = self.fallback.draft(
          params, state['fallback'], tokens, lengths, gamma, keys, sampling, sampling_params,
          max_drafted=jnp.where(found, count, gamma), forced_tokens=continuation, forced=found)
    else:
      fallback, fallback_state = self.fallback.propose(params, state['fallback'], tokens, lengths,
                                                       gamma, keys, sampling, sampling_params)
    proposal = jax.tree.map(
        lambda a, b: jnp.where(found.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), copied, fallback)
    return proposal, dict(state, fallback=fallback_state)
