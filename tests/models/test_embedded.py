"""The shipped embedded pair (models/embedded/) loads as stored and translates as recorded.

The expected outputs live in tests/fixtures/embedded_translation.json together with the SHA-256 of
the weight files they were recorded with. After retraining and re-exporting the pair, re-record
them (and review the diff) with
  .venv/bin/python tests/models/test_embedded.py --record
"""

import hashlib
import json
from pathlib import Path
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import checkpoints
from speculative import drafters
from speculative import sampling
from speculative.checkpoints import params_files
from speculative.data import tasks
from speculative.decode import loops as decoding
from speculative.jobs import gin_utils
from speculative.models import t5 as t5_lib

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 'embedded_translation.json'
WEIGHTS = {
  'target': REPO / 'models/embedded/target.msgpack',
  'draft': REPO / 'models/embedded/draft.msgpack',
}
NUM_SENTENCES = 3  # the first test-split sentences
INPUTS_LENGTH = 64
MAX_NEW_TOKENS = 48
GAMMA = 4
TOTAL_BYTES_LIMIT = 120 * 2**20  # the budget for the shipped pair


def _sha256(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _load(name: str):
  config = gin_utils.load_macro(
    str(REPO / f'configs/models/embedded_{name}.gin'), f'EMBEDDED_{name.upper()}', t5_lib.T5Config
  )
  return params_files.load_model(config, str(WEIGHTS[name]))


def translate() -> dict:
  """Greedy translations of the first test sentences: baseline tokens, and speculative metrics."""
  vocabulary = tasks.get_vocabulary()
  target, target_params = _load('target')
  draft, draft_params = _load('draft')
  config, params = sampling.make_sampling(0.0)
  out = {'weights_sha256': {k: _sha256(p) for k, p in WEIGHTS.items()}, 'sentences': []}
  for en, _ in tasks.load_split('test')[:NUM_SENTENCES]:
    ids = vocabulary.encode(tasks.make_inputs(en))[: INPUTS_LENGTH - 1] + [1]
    encoder_tokens = jnp.asarray([ids + [0] * (INPUTS_LENGTH - len(ids))], jnp.int32)  # [1, L]
    common = dict(
      max_new_tokens=MAX_NEW_TOKENS,
      sampling=config,
      sampling_params=params,
      rng=jax.random.PRNGKey(0),
      eos_id=1,
      encoder_tokens=encoder_tokens,
    )
    base = decoding.autoregressive_decode(target, target_params, None, **common)
    spec = decoding.speculative_decode(
      target, target_params, drafters.ModelDrafter(draft), draft_params, None, gamma=GAMMA, **common
    )
    length = int(base.lengths[0])
    tokens = np.asarray(base.tokens[0, :length]).tolist()
    out['sentences'].append(
      {
        'source': en,
        'tokens': tokens,
        'speculative_tokens': np.asarray(spec.tokens[0, : int(spec.lengths[0])]).tolist(),
        'text': vocabulary.decode([t for t in tokens if t != 1]),
        'target_calls': int(spec.metrics.target_calls[0]),
      }
    )
  return out


@pytest.fixture(scope='module')
def recorded():
  if not FIXTURE.exists():
    pytest.fail(
      f'{FIXTURE} is missing; record it with: python tests/models/test_embedded.py --record'
    )
  return json.loads(FIXTURE.read_text())


def test_shipped_weights_are_compact_and_as_recorded(recorded):
  assert sum(p.stat().st_size for p in WEIGHTS.values()) <= TOTAL_BYTES_LIMIT
  for name, path in WEIGHTS.items():
    assert _sha256(path) == recorded['weights_sha256'][name], (
      f'{path} changed since the expected translations were recorded; re-record them with '
      '`python tests/models/test_embedded.py --record` and review the diff'
    )
    stored = checkpoints.load_params(str(path), dtype=None)
    dtypes = {str(x.dtype) for x in jax.tree_util.tree_leaves(stored)}
    assert dtypes <= {'bfloat16', 'float16', 'int8', 'float32'}, dtypes


@pytest.mark.slow
def test_shipped_pair_translates_as_recorded(recorded):
  now = translate()
  assert len(now['sentences']) == len(recorded['sentences']) == NUM_SENTENCES
  for got, want in zip(now['sentences'], recorded['sentences']):
    assert got['source'] == want['source']
    assert got['tokens'] == want['tokens'], (got['text'], want['text'])
    assert got['text'] == want['text']
    # Greedy speculative decoding emits exactly the target's tokens, with fewer target calls
    # than tokens whenever a draft is accepted.
    assert got['speculative_tokens'] == got['tokens']
    assert got['target_calls'] == want['target_calls']


if __name__ == '__main__':
  if sys.argv[1:] != ['--record']:
    sys.exit('usage: python tests/models/test_embedded.py --record')
  result = translate()
  text = json.dumps(result, indent=1, ensure_ascii=False) + '\n'
  checkpoints.write_atomic(FIXTURE, text.encode())
  for sentence in result['sentences']:
    print(
      f"{sentence['source']}\n  -> {sentence['text']}  ({len(sentence['tokens'])} tokens, "
      f"{sentence['target_calls']} target calls)"
    )
  print(f'wrote {FIXTURE}')
