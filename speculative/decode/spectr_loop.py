"""SpecTr decoding (Sun et al., NeurIPS 2023): K i.i.d. draft sequences per step, one target call.

`spectr_decode` is `decode/loops.py`'s `speculative_decode` with K drafts instead of one: every step drafts K
sequences of length L (= gamma) for each row, verifies all K x (L+1) positions in one batched target
`extend`, and picks the emitted block with the sequence-level selection of the paper's Algorithm 3
(`spectr/sequence.py`'s `spectr_sequence_select`, k-Seq with the optimal rho* at every depth). The output is
distributed exactly as the target's (identical to it under argmax), and K = 1 is Leviathan's
algorithm: the same tokens as `speculative_decode` for the same rng (tested).

Layout: the K drafts of row b live in rows b*K .. b*K+K-1 of "expanded" caches ([K*B, ...]; both
the target's and the drafter's state are repeated K times along axis 0 after the prefill, for
encoder-decoder models too, so the encoder runs once per row). The token buffer, lengths, done
flags and metrics stay per original row ([B, ...]). A step:
  1. drafter.propose on all K*B rows in one batched call (the committed tokens repeated K times);
     copy j of row b gets its own PRNG key, so the K drafts are i.i.d.;
  2. one target `extend` over [K*B, L+1] = [last committed token, draft j] at start = length-1;
  3. `spectr_sequence_select` per original row (vectorized): n accepted tokens, the next token and
     the branch (a draft whose first n tokens were emitted);
  4. commit the block exactly as `speculative_decode` does (EOS, max_new_tokens);
  5. all K copies of row b adopt the chosen branch's caches: its cache rows are gathered into all K
     slots. The chosen branch's caches hold exactly the committed stream on the positions the
     invariants of `decode/loops.py` / `ModelDrafter` need (the other branches differ only there);
     entries beyond the committed length are stale and never read, so copying whole rows is
     correct. Cache leaves that the target's `extend` passes through unchanged (e.g. a T5's encoder
     output and cross-attention keys/values) are identical in all K copies and are not copied.

Keys (row b, step s; `decode/state.py`'s `row_keys` = fold_in(fold_in(fold_in(rng, row_id), s), use)):
  * draft copy 0 uses use=0, the key speculative_decode's drafter gets; copy j >= 1 uses
    fold_in(use=2 key, j);
  * use=1 is split as in `speculative_accept`: fold_in(., 0) gives the acceptance uniforms, shape
    [L, K] (for K = 1 the same numbers as speculative_accept's [gamma]), fold_in(., 1) the one
    residual / bonus sample (Gumbel-max, as speculative_accept).
So with K = 1 every random number is consumed for the same purpose as in speculative_decode.

Metrics (`SpecTrMetrics`, per original row, steps in which the row was not yet done):
  target_calls counts steps (one batched call over the K drafts is one call: on a TPU the K*(L+1)
  positions cost about what L+1 do; on this CPU they do not, which the walltime shows); `drafted`
  counts L per step (the draft length; the draft model produced K*L tokens, batched); block
  efficiency = generated tokens / target_calls, as everywhere (docs/design.md section 7). The token-level
  acceptance probability with the surviving drafts is `alpha_sum / selections` (compare
  `single_alpha_sum / selections`: one draft at the same conditionals, Leviathan's alpha).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from speculative import sampling as sampling_lib
from speculative.decode import inputs as decode_inputs
from speculative.decode import options as decode_options
from speculative.decode import state as decoding_state
from speculative.drafters import base as drafter_base
from speculative.models import interface
from speculative.spectr import kseq
from speculative.spectr import sequence

# Key `use` ids (see the module docstring); 0 and 1 are decode/loops.py's.
_USE_DRAFT, _USE_SELECT, _USE_EXTRA_DRAFTS = 0, 1, 2


@flax.struct.dataclass
class SpecTrMetrics:
  """Per-row counters (original rows), accumulated over the steps in which the row was not done.

  Attributes:
    target_calls: [B] int32, steps (one batched target call over the K drafts each).
    drafted: [B] int32, draft length L per step (each of the K drafts has L tokens).
    accepted: [B] int32, draft tokens accepted by the selection (before EOS/max-length truncation).
    alpha_sum: [B] float32, sum over selections of the k-Seq acceptance probability with the
      surviving drafts, 1 - (1 - beta(rho*))^k.
    single_alpha_sum: [B] float32, sum over the same selections of sum_x min(p(x), q(x)).
    selections: [B] int32, depths at which a selection ran (min(n+1, L) per step).
    invalid: [B] bool, a target or draft distribution was NaN (NaN/+inf/all -inf logits).
  """

  target_calls: jax.Array
  drafted: jax.Array
  accepted: jax.Array
  alpha_sum: jax.Array
  single_alpha_sum: jax.Array
  selections: jax.Array
  invalid: jax.Array

  @classmethod
  def zeros(cls, batch: int) -> 'SpecTrMetrics':
    ints = jnp.zeros((batch,), jnp.int32)
    floats = jnp.zeros((batch,), jnp.float32)
    return cls(
      target_calls=ints,
      drafted=ints,
      accepted=ints,
      alpha_sum=floats,
      single_alpha_sum=floats,
      selections=ints,
      invalid=jnp.zeros((batch,), bool),
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


def _copy_keys(rng: jax.Array, row_ids: jax.Array, step: jax.Array, num_drafts: int) -> jax.Array:
  """[B*K] draft keys: copy 0 = speculative_decode's draft key, copy j >= 1 from a separate use."""
  first = decoding_state.row_keys(rng, row_ids, step, _USE_DRAFT)[:, None]  # [B, 1]
  if num_drafts == 1:
    return first[:, 0]
  extra = decoding_state.row_keys(rng, row_ids, step, _USE_EXTRA_DRAFTS)  # [B]
  copies = jnp.arange(1, num_drafts, dtype=jnp.int32)
  others = jax.vmap(lambda key: jax.vmap(lambda j: jax.random.fold_in(key, j))(copies))(extra)
  return jnp.concatenate([first, others], axis=1).reshape(-1)  # [B*K], row-major (b, j)


@functools.partial(
  jax.jit,
  static_argnames=('target', 'drafter', 'options', 'num_drafts', 'num_iters'),
)
def _spectr_jit(
  target_params,
  draft_params,
  inputs: decode_inputs.DecodeInputs,
  *,
  target: interface.CachedLM,
  drafter: drafter_base.Drafter,
  options: decode_options.DecodeOptions,
  num_drafts: int,
  num_iters: int,
):
  decoding_state.TRACE_COUNTS['spectr_decode'] += 1
  k, length = num_drafts, options.gamma
  max_new_tokens, sampling = options.max_new_tokens, options.sampling
  prompt_lengths, sampling_params = inputs.prompt_lengths, inputs.sampling_params
  rng, row_ids = inputs.rng, inputs.row_ids
  batch, vocab = prompt_lengths.shape[0], target.vocab_size
  # Prefill once per original row, then hold K copies.
  state = decoding_state.start(
    target, target_params, inputs, options, SpecTrMetrics, drafter, draft_params
  )
  state = state.replace(
    target_cache=_repeat_rows(state.target_cache, k, batch, 'target cache'),
    draft_state=_repeat_rows(state.draft_state, k, batch, 'draft state'),
  )

  def body(state: decoding_state.DecodeState) -> decoding_state.DecodeState:
    tokens_k = jnp.repeat(state.tokens, k, axis=0)  # [K*B, L_max]
    lengths_k = jnp.repeat(state.lengths, k, axis=0)  # [K*B]
    # Every row's K drafts; one verify call over all of them at start = length-1.
    drafts = decoding_state.propose(
      drafter,
      draft_params,
      options,
      sampling_params,
      state.draft_state,
      tokens_k,
      lengths_k,
      _copy_keys(rng, row_ids, state.step, k),
    )
    proposal, draft_tokens = drafts.proposal, drafts.tokens  # [K*B, L]
    logits, cache = target.extend(
      target_params, state.target_cache, drafts.verify_tokens, lengths_k - 1
    )  # [K*B, L+1, V]
    target_probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)
    draft_probs = drafts.masked_probs()  # [K*B, L, V]

    select_keys = decoding_state.row_keys(rng, row_ids, state.step, _USE_SELECT)  # [B]
    uniform_keys = jax.vmap(lambda key: jax.random.fold_in(key, 0))(select_keys)
    sample_keys = jax.vmap(lambda key: jax.random.fold_in(key, 1))(select_keys)
    uniforms = jax.vmap(lambda key: jax.random.uniform(key, (length, k), jnp.float32))(
      uniform_keys
    )  # [B, L, K]
    selection = sequence.spectr_sequence_select(
      draft_tokens.reshape(batch, k, length),
      draft_probs.reshape(batch, k, length, vocab),
      target_probs.reshape(batch, k, length + 1, vocab),
      uniforms,
      sample_keys,
      proposal.num_drafted.reshape(batch, k),
      num_iters=num_iters,
    )
    tokens, lengths, done, active = decoding_state.commit_tokens(
      state,
      selection.tokens,
      selection.num_accepted + 1,
      prompt_lengths,
      max_new_tokens,
      options.eos_id,
    )
    # Every copy of row b adopts the chosen branch's caches (rows b*K + branch[b]).
    source = jnp.arange(batch, dtype=jnp.int32) * k + selection.branch  # [B]
    index = jnp.repeat(source, k, axis=0)  # [K*B]
    cache = _adopt_rows(cache, state.target_cache, index)
    draft_state = _adopt_rows(drafts.draft_state, state.draft_state, index)

    num_drafted = proposal.num_drafted.reshape(batch, k)
    invalid = jnp.any(drafts.invalid(target_probs).reshape(batch, k), axis=1)  # [B]
    metrics = state.metrics
    metrics = SpecTrMetrics(
      target_calls=metrics.target_calls + active,
      drafted=metrics.drafted + jnp.where(active, jnp.max(num_drafted, axis=1), 0),
      accepted=metrics.accepted + jnp.where(active, selection.num_accepted, 0),
      alpha_sum=metrics.alpha_sum + jnp.where(active, selection.acceptance_sum, 0.0),
      single_alpha_sum=metrics.single_alpha_sum
      + jnp.where(active, selection.single_draft_acceptance_sum, 0.0),
      selections=metrics.selections + jnp.where(active, selection.num_selections, 0),
      invalid=metrics.invalid | (active & invalid),
    )
    return state.advance(tokens, lengths, done, cache, draft_state, metrics)

  return decoding_state.run_loop(body, state, prompt_lengths, max_new_tokens)


def spectr_decode(
  target: interface.CachedLM,
  target_params: Any,
  drafter: drafter_base.Drafter,
  draft_params: Any,
  prompt_tokens: jax.Array | None,
  prompt_lengths: jax.Array | None = None,
  *,
  num_drafts: int,
  draft_length: int | None = None,
  options: decode_options.DecodeOptions | None = None,
  sampling_params: sampling_lib.SamplingParams | None = None,
  rng: Any = 0,
  encoder_tokens: jax.Array | None = None,
  draft_encoder_tokens: jax.Array | None = None,
  row_ids: jax.Array | None = None,
  num_iters: int = kseq.DEFAULT_BISECTION_ITERS,
  check_finite: bool = True,
  **option_fields: Any,
) -> decoding_state.DecodeResult:
  """SpecTr decoding: K i.i.d. drafts of length L, one target call over K x (L+1) positions a step.

  Arguments as in `decode/loops.py`'s `speculative_decode` (gamma is `draft_length`), plus:
    num_drafts: K, drafts per row and step (static, >= 1). K = 1 is `speculative_decode`.
    draft_length: L, tokens per draft (static, >= 1): the options' gamma.
    num_iters: bisection steps for rho* (static).
  The drafter must sample its copies independently given different keys (`ModelDrafter` does; a
  deterministic drafter gives K identical drafts, which is exact but gains nothing), and its state
  must have the batch on axis 0 of every leaf.

  Returns:
    decoding.DecodeResult whose `metrics` is a SpecTrMetrics (per original row).
  """
  decode_options.check_positive_int('num_drafts', num_drafts)
  if draft_length is not None:
    decode_options.check_positive_int('draft_length', draft_length)
    option_fields['gamma'] = draft_length
  decode_options.check_positive_int('num_iters', num_iters)
  options = decode_options.DecodeOptions.create(options, **option_fields).speculative()
  inputs = decode_inputs.prepare_inputs(
    target, options, prompt_tokens, prompt_lengths, encoder_tokens, sampling_params, rng, row_ids
  ).with_drafter(target, drafter, draft_encoder_tokens)
  result = _spectr_jit(
    target_params,
    draft_params,
    inputs,
    target=target,
    drafter=drafter,
    options=options,
    num_drafts=int(num_drafts),
    num_iters=int(num_iters),
  )
  decode_inputs.raise_if_invalid(result, check_finite)
  return result
