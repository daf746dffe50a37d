"""OracleDrafter: proposes a known continuation; with the target's own greedy output every draft
is accepted, so the decode needs ceil(new tokens / (gamma + 1)) target calls."""

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import drafters
from speculative import sampling as S
from speculative.decode import loops as decoding
from speculative.models.decoder_only import DecoderOnlyConfig
from speculative.models.decoder_only import DecoderOnlyLM

V = 16
TARGET = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=V, d_model=32, d_ff=64, num_layers=2, num_heads=4)
)
DRAFT = DecoderOnlyLM(
  DecoderOnlyConfig(vocab_size=V, d_model=16, d_ff=32, num_layers=1, num_heads=2)
)
TARGET_PARAMS = model_utils.random_params(TARGET, 0, logit_scale=1.5)
DRAFT_PARAMS = model_utils.random_params(DRAFT, 1, logit_scale=1.0)
GREEDY, GREEDY_PARAMS = S.make_sampling(0.0)
GAMMA, NEW = 3, 7


def _propose(drafter, params, prompt_lengths, lengths, width=12):
  """((proposal, state), the state `init` gave): one init and one propose, under one jit (one
  compile, not one per op)."""
  batch = len(lengths)

  @jax.jit
  def init_and_propose(params, prompt_lengths, lengths, sampling_params):
    prompts = jnp.ones((batch, 4), jnp.int32)
    state = drafter.init(params, prompts, prompt_lengths, width)
    tokens = jnp.ones((batch, width), jnp.int32)
    keys = jax.random.split(jax.random.key(0), batch)
    return drafter.propose(
      params, state, tokens, lengths, GAMMA, keys, GREEDY, sampling_params
    ), state

  return init_and_propose(
    params,
    jnp.asarray(prompt_lengths, jnp.int32),
    jnp.asarray(lengths, jnp.int32),
    GREEDY_PARAMS,
  )


def test_oracle_proposes_the_continuation_after_each_rows_prompt():
  generated = jnp.asarray([[10, 11, 12, 13, 14], [5, 6, 7, 8, 9]], jnp.int32)
  # Row 0: prompt 2, committed 3 (one token generated) -> generated[0, 1:4]; row 1: prompt 4,
  # committed 7 -> generated[1, 3:6], past the end clipped to the last token.
  (proposal, _), _ = _propose(
    drafters.OracleDrafter(V), {'generated': generated, 'inner': None}, [2, 4], [3, 7]
  )
  np.testing.assert_array_equal(proposal.tokens, [[11, 12, 13], [8, 9, 9]])
  np.testing.assert_array_equal(proposal.num_drafted, [GAMMA, GAMMA])
  np.testing.assert_array_equal(proposal.probs, jax.nn.one_hot(proposal.tokens, V))


def test_the_inner_drafter_runs_and_its_proposal_is_replaced():
  generated = jnp.asarray([[10, 11, 12, 13, 14]], jnp.int32)
  drafter = drafters.OracleDrafter(V, inner=drafters.ModelDrafter(DRAFT))
  (proposal, state), start = _propose(
    drafter, {'generated': generated, 'inner': DRAFT_PARAMS}, [2], [2]
  )
  np.testing.assert_array_equal(proposal.tokens, [[10, 11, 12]])
  changed = jax.tree.leaves(
    jax.tree.map(lambda a, b: bool(jnp.any(a != b)), state.inner, start.inner)
  )
  assert any(changed), "the inner drafter's cache was not written: its calls did not run"


@pytest.mark.parametrize('with_inner', [False, True])
def test_greedy_with_the_targets_own_output_accepts_every_draft(with_inner):
  rng = np.random.default_rng(3)
  prompts = jnp.asarray(rng.integers(2, V, (6, 5)), jnp.int32)
  lengths = jnp.asarray(rng.integers(1, 6, 6), jnp.int32)
  common = dict(max_new_tokens=NEW, sampling=GREEDY, sampling_params=GREEDY_PARAMS)
  baseline = decoding.autoregressive_decode(TARGET, TARGET_PARAMS, prompts, lengths, **common)
  inner = drafters.ModelDrafter(DRAFT) if with_inner else None
  params = {'generated': baseline.tokens, 'inner': DRAFT_PARAMS if with_inner else None}
  result = decoding.speculative_decode(
    TARGET,
    TARGET_PARAMS,
    drafters.OracleDrafter(V, inner=inner),
    params,
    prompts,
    lengths,
    gamma=GAMMA,
    **common,
  )
  np.testing.assert_array_equal(result.tokens, baseline.tokens)
  metrics = jax.tree.map(np.asarray, result.metrics)
  np.testing.assert_array_equal(metrics.target_calls, -(-NEW // (GAMMA + 1)))  # 2 per row
  np.testing.assert_array_equal(metrics.accepted, metrics.drafted)


def test_bad_params_and_vocabularies_are_refused():
  with pytest.raises(ValueError, match="OracleDrafter params must be"):
    _propose(drafters.OracleDrafter(V), {'generated': jnp.zeros((5,), jnp.int32)}, [1], [1])
  with pytest.raises(ValueError, match='2 generated rows for a batch of 1'):
    _propose(drafters.OracleDrafter(V), {'generated': jnp.zeros((2, 5), jnp.int32)}, [1], [1])
  with pytest.raises(ValueError, match='vocab_size 8 != inner vocab_size 16'):
    drafters.OracleDrafter(8, inner=drafters.ModelDrafter(DRAFT))
