"""N-gram table drafters (paper Table 3: unigram and bigram drafts with c ~ 0) and their estimates.

`estimate_unigram` / `estimate_bigram` build the tables (the drafters' params) from token ids of a
corpus (e.g. `speculative.data.tasks.target_token_sequences('train')`).
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import ClassVar
from typing import Iterable
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib
from speculative.drafters import base


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


def estimate_unigram(
  sequences: Iterable[Sequence[int]], vocab_size: int, add_k: float = 1.0
) -> dict[str, jax.Array]:
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


def estimate_bigram(
  sequences: Iterable[Sequence[int]],
  vocab_size: int,
  add_k: float = 1.0,
  prior_weight: float = 1.0,
  max_next: int = 128,
) -> dict[str, jax.Array]:
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
  return {
    'unigram_log_probs': unigram['log_probs'],
    'next_tokens': jnp.asarray(next_tokens),
    'next_counts': jnp.asarray(next_counts),
    'prior_weight': jnp.asarray(prior_weight, jnp.float32),
  }


def bigram_log_probs(params: dict[str, jax.Array], previous: jax.Array) -> jax.Array:
  """[B] previous tokens -> [B, V] log q(. | previous) of an `estimate_bigram` table."""
  unigram = jnp.exp(params['unigram_log_probs'])  # [V]
  next_tokens = params['next_tokens'][previous]  # [B, K]
  next_counts = params['next_counts'][previous]  # [B, K]
  total = jnp.sum(next_counts, axis=1, keepdims=True) + params['prior_weight']  # [B, 1]
  dense = params['prior_weight'] * unigram[None, :] / total  # [B, V]
  dense = jax.vmap(lambda row, ids, add: row.at[ids].add(add))(
    dense, next_tokens, next_counts / total
  )
  return jnp.log(dense)


def _check_table(params: Any, key: str, vocab_size: int, name: str) -> None:
  if not isinstance(params, dict) or key not in params:
    raise ValueError(
      f'{name} params must be a dict with {key!r} (see estimate_'
      f'{name.lower().replace("drafter", "")}), got {type(params).__name__}'
    )
  if params[key].shape[0] != vocab_size:
    raise ValueError(f'{name}: table has {params[key].shape[0]} tokens, vocab_size is {vocab_size}')


@dataclasses.dataclass(frozen=True)
class _TableDrafter(base.DrafterBase):
  """A drafter that draws from a token table in its params (`table_key`); it has no state."""

  vocab_size: int

  table_key: ClassVar[str]

  def start(self, prompt: base.DraftPrompt) -> base.DraftState:
    _check_table(prompt.params, self.table_key, self.vocab_size, type(self).__name__)
    return None


@dataclasses.dataclass(frozen=True)
class UnigramDrafter(_TableDrafter):
  """Drafts gamma tokens i.i.d. from a unigram table (params: `estimate_unigram`); no state.

  q = probs_from_logits(log table): the table's log-probabilities are treated as logits and get the
  same standardization as the target (argmax -> the most frequent token, temperature, top-k/p).
  """

  table_key: ClassVar[str] = 'log_probs'

  def step(
    self, call: base.DraftCall, state: base.DraftState
  ) -> tuple[base.DraftProposal, base.DraftState]:
    batch, gamma = call.tokens.shape[0], call.gamma
    logits = jnp.broadcast_to(call.params['log_probs'], (batch, self.vocab_size))  # [B, V]
    probs = sampling_lib.probs_from_logits(logits, call.sampling, call.sampling_params)  # [B, V]
    draft = jnp.stack(
      [
        sampling_lib.sample_rows(base.fold_keys(call.keys, j), probs, call.sampling.greedy)
        for j in range(gamma)
      ],
      axis=1,
    )  # [B, gamma]
    probs = jnp.broadcast_to(probs[:, None], (batch, gamma, self.vocab_size))
    return base.DraftProposal(
      tokens=draft, probs=probs, num_drafted=jnp.full((batch,), gamma, jnp.int32)
    ), state


@dataclasses.dataclass(frozen=True)
class BigramDrafter(_TableDrafter):
  """Drafts gamma tokens from a bigram table (params: `estimate_bigram`), each conditioned on the
  previous token (the last committed one, then its own drafts); no state. Standardized like
  UnigramDrafter."""

  table_key: ClassVar[str] = 'next_tokens'

  def step(
    self, call: base.DraftCall, state: base.DraftState
  ) -> tuple[base.DraftProposal, base.DraftState]:
    batch = call.tokens.shape[0]
    last = base.gather_rows(call.tokens, (call.lengths - 1)[:, None])[:, 0]  # [B]

    def step(previous, j):
      logits = bigram_log_probs(call.params, previous)  # [B, V]
      probs = sampling_lib.probs_from_logits(logits, call.sampling, call.sampling_params)  # [B, V]
      keys = base.fold_keys(call.keys, j)
      token = sampling_lib.sample_rows(keys, probs, call.sampling.greedy)  # [B]
      return token, (token, probs)

    _, (draft, probs) = jax.lax.scan(step, last, jnp.arange(call.gamma, dtype=jnp.int32))
    return base.DraftProposal(
      tokens=jnp.swapaxes(draft, 0, 1),
      probs=jnp.swapaxes(probs, 0, 1),
      num_drafted=jnp.full((batch,), call.gamma, jnp.int32),
    ), state
