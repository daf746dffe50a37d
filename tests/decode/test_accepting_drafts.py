"""Greedy speculative decoding equals the baseline on pairs whose drafts are accepted: the fast
tier's exactness tests on the paths a never-accepting pair leaves untested (a fully accepted block
and its bonus token, an EOS inside an accepted block, a block accepted in part and its rejected
drafts rolled back, rows of a ragged batch finishing at different steps), at batch 1 and batch 4,
on XLA's dot and on the CPU kernels.

The target: a tiny T5 (vocab 37, two decoder layers) with random weights whose second decoder
layer's output projections are scaled by 0.3 and whose EOS logit column is doubled (so greedy rows
end at EOS at different lengths). Two drafts:

  'target'  the target itself: every draft is accepted, every call but a row's last commits
            GAMMA + 1 tokens (the block and its bonus token), and an EOS inside a block ends the row;
  'layer0'  the target without its second decoder layer (a 1-layer draft), under adaptive gamma
            and adaptive verify: it agrees often, not always, so blocks are accepted in full (with
            the bonus) and drafts rejected (rolled back), with proposals of 0 to GAMMA drafts and
            verify calls only as wide as the longest.

The expected counts (EXPECTED) are exact: the decodes are deterministic, and each row's counts are
the same at batch 1 and batch 4 and on both paths (rows do not interact). A mutation that breaks
the acceptance rule, the bonus token, the rollback or EOS handling changes them or the tokens.
"""

import copy
import dataclasses

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import drafters
from speculative import sampling as sampling_lib
from speculative.decode import modes
from speculative.models import t5 as t5_lib

CONFIG = t5_lib.T5Config(
  vocab_size=37,
  emb_dim=16,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=2,
  head_dim=8,
  mlp_dim=24,
  eos_id=1,
)
GAMMA = 3
MAX_NEW_TOKENS = 12
SEED, EOS_SCALE, LAYER_1_SCALE = 3, 2.0, 0.3
# (draft, batch size): the rows of ENCODER decoded. Batch 1: for the 'target' draft the row whose
# EOS ends its third block; for 'layer0' the longest row.
ROWS = {('target', 1): (3,), ('layer0', 1): (0,), ('target', 4): (0, 1, 2, 3)}
ROWS[('layer0', 4)] = ROWS[('target', 4)]

# Per row of ENCODER: the greedy output's length (EOS included) and, per draft, the target calls and
# accepted drafts. Rows 0 and 2 run to the 12-token cap; rows 1 and 3 end with EOS at tokens 3 and
# 10, inside an accepted block (with the 'target' draft: in the first block, and in the third
# after two full blocks of 3 drafts + the bonus token).
LENGTHS = (12, 3, 12, 10)
EXPECTED = dict(target_calls=(3, 1, 3, 3), accepted=(9, 3, 9, 9))  # the 'target' draft
# The 'layer0' draft under adaptive gamma (it stops below confidence 0.5) with the verify call as
# wide as the longest proposal (adaptive_verify).
ADAPTIVE = dict(target_calls=(6, 2, 4, 8), drafted=(13, 5, 10, 14), accepted=(8, 1, 9, 2))

PATHS = ['xla', pytest.param('kernels', marks=model_utils.kernels_run_here_mark())]


def _encoder_tokens() -> np.ndarray:
  rng = np.random.default_rng(0)
  tokens = rng.integers(2, CONFIG.vocab_size, (4, 6)).astype(np.int32)
  tokens[1, 4:] = 0  # padding
  return tokens


@pytest.fixture(scope='module')
def pair():
  """{'target': (model, params), 'layer0': (model, params)}, float32 numpy params."""
  target = t5_lib.T5(CONFIG)
  params = jax.tree.map(np.array, model_utils.random_params(target, seed=SEED, logit_scale=4.0))
  params['decoder']['logits_dense']['kernel'][:, CONFIG.eos_id] *= EOS_SCALE
  layer_1 = params['decoder']['layers_1']
  for projection in (
    layer_1['self_attention']['out'],
    layer_1['encoder_decoder_attention']['out'],
    layer_1['mlp']['wo'],
  ):
    projection['kernel'] *= LAYER_1_SCALE
  draft_params = copy.deepcopy(params)
  del draft_params['decoder']['layers_1']
  draft = t5_lib.T5(dataclasses.replace(CONFIG, num_decoder_layers=1))
  return {'target': (target, params), 'layer0': (draft, draft_params)}


@pytest.fixture(scope='module')
def baselines():
  return {}  # {(path, batch): DecodeResult}, shared by the tests of a module run


def _params(model, params, path):
  return t5_lib.pack_decode_params(model, params) if path == 'kernels' else params


def _decode(pair, baselines, path, batch, draft, **options):
  """(baseline, speculative) DecodeResults of ENCODER's ROWS[draft, batch] on `path`, greedy."""
  target, target_params = pair['target']
  draft_model, draft_params = pair[draft]
  stop_below = options.pop('stop_below', 0.0)
  drafter, drafter_params = drafters.build_drafter(
    'model',
    vocab_size=CONFIG.vocab_size,
    draft_model=draft_model,
    draft_params=_params(draft_model, draft_params, path),
    stop_below=stop_below,
  )
  sampling, sampling_params = sampling_lib.make_sampling(0.0, 0, 1.0)
  fns = modes.decode_fns(
    target,
    _params(target, target_params, path),
    drafter,
    drafter_params,
    gamma=GAMMA,
    max_new_tokens=MAX_NEW_TOKENS,
    sampling=sampling,
    sampling_params=sampling_params,
    eos_id=CONFIG.eos_id,
    **options,
  )
  rows = ROWS[draft, batch]
  encoder = jnp.asarray(_encoder_tokens()[list(rows)])
  rng = jax.random.PRNGKey(0)
  if (path, rows) not in baselines:
    baselines[path, rows] = fns['baseline'](encoder, rng)
  return baselines[path, rows], fns['speculative'](encoder, rng)


def _counts(result) -> dict[str, tuple[int, ...]]:
  metrics = result.metrics
  return {
    name: tuple(int(x) for x in np.asarray(getattr(metrics, name)))
    for name in ('target_calls', 'drafted', 'accepted')
  }


def _rows(values, batch, draft):
  return tuple(values[row] for row in ROWS[draft, batch])


def _assert_identical(base, spec, batch, draft):
  lengths = np.asarray(spec.lengths)
  assert tuple(lengths.tolist()) == _rows(LENGTHS, batch, draft)
  np.testing.assert_array_equal(np.asarray(base.lengths), lengths)
  np.testing.assert_array_equal(np.asarray(base.tokens), np.asarray(spec.tokens))
  tokens = np.asarray(spec.tokens)
  for row, length in enumerate(lengths):  # EOS ends exactly the rows that stop before the cap
    assert (tokens[row, length - 1] == CONFIG.eos_id) == (length < MAX_NEW_TOKENS)


@pytest.mark.parametrize('batch', [1, 4])
@pytest.mark.parametrize('path', PATHS)
def test_a_draft_that_is_the_target_has_every_block_accepted(pair, baselines, path, batch):
  base, spec = _decode(pair, baselines, path, batch, 'target')
  _assert_identical(base, spec, batch, 'target')
  counts = _counts(spec)
  calls = np.asarray(counts['target_calls'])
  assert counts['target_calls'] == _rows(EXPECTED['target_calls'], batch, 'target')
  assert counts['accepted'] == _rows(EXPECTED['accepted'], batch, 'target')
  assert counts['drafted'] == counts['accepted'] == tuple(GAMMA * calls)  # every draft accepted
  # Every call but a row's last committed its GAMMA accepted drafts and the bonus token; the last
  # one ends the row at the cap or at an EOS inside the block (the drafts after it dropped).
  lengths = np.asarray(spec.lengths)
  np.testing.assert_array_equal(calls, -(-lengths // (GAMMA + 1)))
  if batch > 1:  # ragged: the rows finish at different steps
    assert len(set(calls.tolist())) > 1
  # An EOS inside a block: a row that stops before the cap mid-block (row 3 at batch 1).
  assert any(n % (GAMMA + 1) and n < MAX_NEW_TOKENS for n in lengths)


@pytest.mark.parametrize('batch', [1, 4])
@pytest.mark.parametrize('path', PATHS)
def test_a_draft_that_mostly_agrees_under_adaptive_gamma_and_verify_stays_exact(
  pair, baselines, path, batch
):
  """The 1-layer draft stops proposing below confidence 0.5 (proposals of 0 to GAMMA drafts) and
  the verify call is only as wide as the longest proposal (adaptive_verify): the outputs are the
  baseline's, with blocks accepted in full (and their bonus token) and drafts rejected."""
  base, spec = _decode(pair, baselines, path, batch, 'layer0', adaptive_verify=True, stop_below=0.5)
  _assert_identical(base, spec, batch, 'layer0')
  counts = _counts(spec)
  assert counts == {name: _rows(values, batch, 'layer0') for name, values in ADAPTIVE.items()}
  calls, drafted, accepted = (
    np.asarray(counts[k]) for k in ('target_calls', 'drafted', 'accepted')
  )
  assert np.all(drafted < GAMMA * calls)  # the draft stopped early in some calls of every row
  # Some row had a call whose drafts were all accepted (else accepted <= drafted - calls: rows 0
  # and 2), and every row had drafts rejected (their cache entries rolled back).
  assert np.any(accepted > drafted - calls) and np.all(accepted < drafted)
