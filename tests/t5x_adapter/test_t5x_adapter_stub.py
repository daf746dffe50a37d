"""The T5X adapter's own code, run without t5x: models.py, rows.py, tasks.py and the run file
configs/t5x/speculative.gin, against a stub of the T5X interfaces they call (t5x_stub/, README.md).

The stub is put on sys.path and into sys.modules by the `t5x_stub` fixture only, and taken out
again after this module; where real t5x is importable these tests skip (test_t5x_adapter.py then
checks the adapter against stock T5X). The references are independent of the adapter's decode
path: greedy decodes are recomputed by full teacher-forced forwards of the target (no cache, no
decode loop, no row layout code), and tests/fixtures/t5x_tiny holds tokens and a score that stock
T5X itself produced.

  PYTHONPATH=$PWD .venv/bin/python -m pytest -q -p no:xdist tests/t5x_adapter/test_t5x_adapter_stub.py
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
import inspect
import json
from pathlib import Path
import sys

import gin
import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest
import seqio

from speculative.models import t5 as t5_lib

REPO = Path(__file__).resolve().parents[2]
STUB = Path(__file__).resolve().parent / 't5x_stub'
FIXTURE = REPO / 'tests' / 'fixtures' / 't5x_tiny'  # written by stock T5X (its README.md)
GAMMA = 3
DECODE_LEN = 12  # with the smoke inputs: 3 rows end with EOS before it, 5 reach it
ADAPTER_MODULES = ('speculative.t5x_adapter.models',)


def _stubbed_names() -> list[str]:
  return [m for m in sys.modules if m == 't5x' or m.startswith('t5x.') or m in ADAPTER_MODULES]


@pytest.fixture(scope='module')
def t5x_stub():
  """The stub `t5x` package importable for this module's tests; afterwards sys.modules, sys.path
  and the adapter package are as before (no test elsewhere sees the stub)."""
  if importlib.util.find_spec('t5x') is not None:
    pytest.skip('real t5x is importable: test_t5x_adapter.py checks the adapter against it')
  import speculative.t5x_adapter as package

  had_models = 'models' in vars(package)
  sys.path.insert(0, str(STUB))
  try:
    import t5x

    assert getattr(t5x, 'IS_TEST_STUB', False), t5x.__file__
    yield t5x
  finally:
    sys.path.remove(str(STUB))
    for name in _stubbed_names():
      del sys.modules[name]
    if not had_models:
      vars(package).pop('models', None)
  # Reached after a normal teardown: what the tests imported through the stub is gone.
  assert not _stubbed_names() and str(STUB) not in sys.path, _stubbed_names()


@pytest.fixture(scope='module')
def adapter(t5x_stub):
  """speculative.t5x_adapter.models, imported against the stub."""
  from speculative.t5x_adapter import models

  return models


def _stock_config(config: t5_lib.T5Config):
  """T5X's `network.T5Config` (the stub's) with the fields of our config."""
  from t5x.examples.t5 import network

  fields = {f.name for f in dataclasses.fields(network.T5Config)}
  return network.T5Config(**{k: v for k, v in dataclasses.asdict(config).items() if k in fields})


@pytest.fixture(scope='module')
def pair(t5x_stub):
  """The correlated tiny pair (tests/model_utils.py) on the spm8k vocabulary: target config and
  params, draft config and params, and the target as T5X's `network.Transformer`."""
  from t5x.examples.t5 import network

  target, target_params, draft, draft_params = model_utils.correlated_tiny_pair()
  return dict(
    target=target,
    target_params=target_params,
    draft=draft,
    draft_params=draft_params,
    tree=dict(
      target_params, draft=draft_params
    ),  # as T5X's restore gives it (add_draft_checkpoint)
    module=network.Transformer(_stock_config(target)),
  )


@pytest.fixture(scope='module')
def smoke_inputs():
  """The 8 test examples of the smoke task (what configs/t5x/tiny_infer.gin decodes), 0-padded to
  64 input tokens as T5X's feature converter does: [8, 64] int32, ragged lengths."""
  from speculative.t5x_adapter import tasks

  task = seqio.get_mixture_or_task(tasks.SMOKE_TASK)
  dataset = task.get_dataset({'inputs': 64, 'targets': 32}, split='test', shuffle=False)
  inputs = [example['inputs'] for example in dataset.as_numpy_iterator()]
  encoder = np.zeros((len(inputs), 64), np.int32)
  for row, tokens in enumerate(inputs):
    encoder[row, : len(tokens)] = tokens
  return encoder


def _model(adapter, pair, vocabulary=None, **kwargs):
  vocabulary = vocabulary or seqio.PassThroughVocabulary(pair['target'].vocab_size, eos_id=1)
  kwargs = {'draft_config': pair['draft'], 'gamma': GAMMA, **kwargs}
  return adapter.SpeculativeEncoderDecoderModel(pair['module'], vocabulary, vocabulary, **kwargs)


def _batch(encoder, decode_len, prompts=None):
  encoder = jnp.asarray(encoder, jnp.int32)
  decoder = jnp.zeros((encoder.shape[0], decode_len), jnp.int32) if prompts is None else prompts
  return {'encoder_input_tokens': encoder, 'decoder_input_tokens': jnp.asarray(decoder, jnp.int32)}


@functools.partial(jax.jit, static_argnums=0)
def _forward(config, params, encoder, decoder_inputs):
  return t5_lib.T5(config).forward(params, encoder, decoder_inputs)  # [B, L, V]


def reference_greedy(config, params, encoder, decode_len, eos_id, prompts=None, max_steps=None):
  """Greedy decodes in T5X's layout, by full teacher-forced forwards of the target: no KV cache,
  no decode loop and no adapter code. Row r's output is its prompt (prompts [B, L] as T5X's
  `decoder_input_tokens`, [0 (BOS), prompt..., EOS, 0...]; the EOS stripped) followed by the
  argmax continuation, 0 after the EOS, at most `max_steps` generated tokens, cut at decode_len.
  Returns (decodes [B, L] int32, generated tokens [B])."""
  forward = functools.partial(_forward, config, params, jnp.asarray(encoder))
  rows = encoder.shape[0]
  outputs = np.zeros((rows, decode_len), np.int32)
  prompt_len = np.zeros(rows, np.int64)
  if prompts is not None:
    for r, row in enumerate(np.asarray(prompts)):
      prompt = [t for t in row[1:] if t not in (0, eos_id)]
      outputs[r, : len(prompt)] = prompt
      prompt_len[r] = len(prompt)
  generated = np.zeros(rows, np.int64)
  ended = np.zeros(rows, bool)
  cap = decode_len if max_steps is None else max_steps
  for t in range(decode_len):
    active = ~ended & (t >= prompt_len) & (generated < cap)
    if not active.any():
      continue
    logits = np.asarray(forward(t5_lib.shift_right(jnp.asarray(outputs))))  # [B, L, V]
    token = logits[:, t].argmax(-1)
    outputs[active, t] = token[active]
    generated += active
    ended |= active & (token == eos_id)
  return outputs, generated


def _records(decodes, aux):
  """Per-row records in the shape model_utils.speculation_events reads."""
  return [
    dict(
      index=r,
      tokens=np.asarray(decodes)[r, : int(aux['num_tokens'][r])].tolist(),
      num_tokens=int(aux['num_tokens'][r]),
      drafted=int(aux['drafted'][r]),
      accepted=int(aux['accepted'][r]),
      target_calls=int(aux['target_calls'][r]),
    )
    for r in range(decodes.shape[0])
  ]


# ----------------------------------------------------------------------------------------------
# The stub and tasks.py.
# ----------------------------------------------------------------------------------------------
def test_stub_is_what_the_adapter_subclasses(adapter, t5x_stub):
  """The adapter's model class extends the stub's T5X base classes; only t5x.models and the
  network/utils modules the gin file names are provided (importing the adapter needs no more).
  That the stub leaves no trace is the `t5x_stub` fixture's check, at its teardown."""
  from t5x import models as stub_models

  assert adapter.t5x_models is stub_models
  assert issubclass(adapter.SpeculativeEncoderDecoderModel, stub_models.EncoderDecoderModel)
  loaded = sorted(m for m in sys.modules if m == 't5x' or m.startswith('t5x.'))
  assert set(loaded) <= {'t5x', 't5x.models', 't5x.utils', 't5x.examples', 't5x.examples.t5'} | {
    't5x.examples.t5.network'
  }, loaded
  # The package itself still loads models lazily through its own __getattr__.
  import speculative.t5x_adapter as package

  assert package.SpeculativeEncoderDecoderModel is adapter.SpeculativeEncoderDecoderModel


def test_tasks_module_registers_the_smoke_task_on_the_shipped_vocabulary(smoke_inputs):
  """tasks.py (imported by configs/t5x/tiny_infer.gin): registering on import, idempotently, the
  project's tasks plus the smoke task = the first SMOKE_EXAMPLES examples of libreoffice_ende, on
  the spm8k vocabulary that the run file's VOCABULARY names."""
  from speculative.data import metrics
  from speculative.data import tasks as tasks_lib
  from speculative.t5x_adapter import tasks

  assert tasks.TASK_NAMES == tasks_lib.register_tasks() + [tasks.SMOKE_TASK]
  assert tasks.register() == tasks.TASK_NAMES  # again: replaces, does not fail
  assert set(tasks.TASK_NAMES) <= set(seqio.TaskRegistry.names())
  smoke = seqio.get_mixture_or_task(tasks.SMOKE_TASK)
  vocabulary = tasks_lib.get_vocabulary()
  for name in ('inputs', 'targets'):
    feature = smoke.output_features[name]
    assert feature.vocabulary.vocab_size == vocabulary.vocab_size == 8000
    assert feature.vocabulary.eos_id == tasks_lib.EOS_ID == 1 and feature.add_eos
  assert smoke.metric_fns == [metrics.bleu]
  text = ' Hallo  Welt '
  assert smoke.postprocess_fn(text, is_target=True) == tasks_lib.postprocess_text(text)
  full = seqio.get_mixture_or_task('libreoffice_ende')
  lengths = {'inputs': 64, 'targets': 32}
  for split in ('train', 'test'):
    got = list(smoke.get_dataset(lengths, split=split, shuffle=False).as_numpy_iterator())
    want = list(full.get_dataset(lengths, split=split, shuffle=False).take(20).as_numpy_iterator())
    assert len(got) == tasks.SMOKE_EXAMPLES
    for a, b in zip(got, want):
      np.testing.assert_array_equal(a['inputs'], b['inputs'])
      np.testing.assert_array_equal(a['targets'], b['targets'])
  # What the adapter decodes: ragged inputs, each ending with EOS, ids inside the vocabulary.
  lengths = (smoke_inputs != 0).sum(1)
  assert len(set(lengths.tolist())) > 1
  assert all(smoke_inputs[r, n - 1] == 1 for r, n in enumerate(lengths))
  assert smoke_inputs.max() < vocabulary.vocab_size


# ----------------------------------------------------------------------------------------------
# models.py + rows.py: predict_batch_with_aux.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def greedy_run(adapter, pair, smoke_inputs):
  """One jitted greedy predict_batch_with_aux of the 8 smoke inputs (T5X's default decoder params
  topk=1: greedy) and the reference decode of the same rows."""
  from speculative.data import tasks as tasks_lib

  vocabulary = tasks_lib.get_vocabulary()
  model = _model(adapter, pair, vocabulary)  # eos_id comes from the output vocabulary
  decodes, aux = jax.jit(model.predict_batch_with_aux)(
    pair['tree'], _batch(smoke_inputs, DECODE_LEN)
  )
  expected, lengths = reference_greedy(
    pair['target'], pair['target_params'], smoke_inputs, DECODE_LEN, eos_id=1
  )
  return dict(
    decodes=np.asarray(decodes),
    aux={k: np.asarray(v) for k, v in aux.items()},
    expected=expected,
    lengths=lengths,
  )


def test_greedy_batch_equals_the_reference_decode(greedy_run):
  """Batch 8, ragged inputs, a correlated draft: the speculative tokens are the target's greedy
  tokens (T5X layout, 0 after EOS), with drafts accepted and rejected, bonus tokens, partial
  accepts, rows ending at EOS and rows reaching the length."""
  decodes, aux = greedy_run['decodes'], greedy_run['aux']
  assert decodes.shape == (8, DECODE_LEN) and decodes.dtype == np.int32
  np.testing.assert_array_equal(decodes, greedy_run['expected'])
  np.testing.assert_array_equal(aux['num_tokens'], greedy_run['lengths'])
  model_utils.assert_speculation_exercised(_records(decodes, aux), GAMMA, DECODE_LEN)


def test_greedy_aux_metrics(greedy_run):
  """aux holds T5X's 'scores' (0 for greedy: log 1 per token) and the per-row speculative metrics,
  one value per example, related as their definitions say (docs/design.md)."""
  aux = greedy_run['aux']
  assert sorted(aux) == sorted(
    [
      'scores',
      'num_tokens',
      'target_calls',
      'drafted',
      'accepted',
      'alpha_sum',
      'alpha',
      'acceptance_rate',
      'block_efficiency',
      'invalid',
    ]
  )
  assert all(v.shape == (8,) for v in aux.values())
  np.testing.assert_array_equal(aux['scores'], 0.0)
  np.testing.assert_array_equal(aux['invalid'], 0)
  np.testing.assert_array_equal(aux['drafted'], GAMMA * aux['target_calls'])
  assert np.all(aux['accepted'] <= aux['drafted']) and np.all(aux['alpha_sum'] <= aux['drafted'])
  np.testing.assert_allclose(aux['alpha'], aux['alpha_sum'] / aux['drafted'], rtol=1e-6)
  np.testing.assert_allclose(aux['acceptance_rate'], aux['accepted'] / aux['drafted'], rtol=1e-6)
  np.testing.assert_allclose(
    aux['block_efficiency'], aux['num_tokens'] / aux['target_calls'], rtol=1e-6
  )
  # Each target call commits its accepted drafts plus one token (a correction or the bonus),
  # except that a row's last call may be cut by EOS or the length.
  assert np.all(aux['num_tokens'] <= aux['accepted'] + aux['target_calls'])
  assert np.all(aux['num_tokens'] > aux['accepted'] + aux['target_calls'] - 1 - GAMMA)


def test_score_batch_equals_stock_t5x_recorded_score(adapter, t5x_stub):
  """score_batch (T5X eval's scoring path: the stub's T5X computation over the adapter's
  `_compute_logits`) on the fixture's sampled tokens gives the score stock T5X recorded for them;
  packed batches and intermediates are refused."""
  from flax import serialization
  from t5x.examples.t5 import network

  fixture = json.loads((FIXTURE / 'decode_results.json').read_text())
  config = dict(fixture['T5Config'], mlp_activations=tuple(fixture['T5Config']['mlp_activations']))
  params = serialization.msgpack_restore((FIXTURE / 'params.msgpack').read_bytes())
  vocabulary = seqio.PassThroughVocabulary(config['vocab_size'], eos_id=1)
  model = adapter.SpeculativeEncoderDecoderModel(
    network.Transformer(network.T5Config(**config)), vocabulary, vocabulary, draft_size='tiny'
  )
  sample = fixture['results']['sample_t1_topk0']
  targets = jnp.asarray([sample['tokens']], jnp.int32)
  batch = {
    'encoder_input_tokens': jnp.asarray(fixture['encoder_input_tokens'], jnp.int32),
    'decoder_target_tokens': targets,
    'decoder_input_tokens': t5_lib.shift_right(targets),
    'decoder_loss_weights': (targets > 0).astype(jnp.float32),
  }
  scores = np.asarray(jax.jit(model.score_batch)(params, batch))
  np.testing.assert_allclose(scores, [sample['score']], rtol=1e-5)
  with pytest.raises(ValueError, match='packed examples are not supported'):
    model.score_batch(params, dict(batch, decoder_segment_ids=jnp.ones_like(targets)))
  with pytest.raises(NotImplementedError, match='intermediates.*not supported by Speculative'):
    model.score_batch(params, batch, return_intermediates=True)


@pytest.mark.slow
def test_adapter_reproduces_stock_t5x_greedy_tokens(adapter, t5x_stub):
  """On the fixture written by stock T5X, with target-only params (the model restores the draft
  from draft_checkpoint_path itself) and the draft = the target: the 64 tokens stock T5X's
  temperature_sample produced, every draft accepted, gamma + 1 tokens per target call."""
  from flax import serialization
  from t5x.examples.t5 import network

  fixture = json.loads((FIXTURE / 'decode_results.json').read_text())
  config = dict(fixture['T5Config'], mlp_activations=tuple(fixture['T5Config']['mlp_activations']))
  params = serialization.msgpack_restore((FIXTURE / 'params.msgpack').read_bytes())
  vocabulary = seqio.PassThroughVocabulary(config['vocab_size'], eos_id=1)
  model = adapter.SpeculativeEncoderDecoderModel(
    network.Transformer(network.T5Config(**config)),
    vocabulary,
    vocabulary,
    draft_size='tiny',
    draft_checkpoint_path=str(FIXTURE / 'ckpt'),
    gamma=GAMMA,
  )
  batch = _batch(fixture['encoder_input_tokens'], fixture['decoder_len'])
  decodes, aux = model.predict_batch_with_aux(params, batch)
  np.testing.assert_array_equal(np.asarray(decodes)[0], fixture['results']['greedy_t0']['tokens'])
  assert np.asarray(aux['num_tokens']).tolist() == [64]
  assert int(aux['accepted'][0]) == int(aux['drafted'][0]) == GAMMA * int(aux['target_calls'][0])
  assert float(aux['block_efficiency'][0]) == pytest.approx(GAMMA + 1)


SPECTR_AUX = ('num_drafts', 'draft_length', 'selections', 'single_alpha_sum', 'alpha_one_draft')


def test_spectr_k1_emits_speculative_tokens_and_k2_reports_its_aux(adapter, pair, smoke_inputs):
  """SpecTr through the adapter at temperature 1 (exact sampling), 4 smoke inputs: with K = 1
  (gin's METHOD / NUM_DRAFTS) the decodes equal speculative decoding's for the same rng, token for
  token; K = 2 per call (decoder_params) gives other samples; aux holds K, L, the selections and
  the acceptance with K drafts (alpha) beside one draft's at the same conditionals."""
  batch = _batch(smoke_inputs[:4], DECODE_LEN)
  rng = jax.random.PRNGKey(5)
  speculative = _model(adapter, pair, temperature=1.0, topk=0)
  spectr = _model(adapter, pair, temperature=1.0, topk=0, method='spectr', num_drafts=1)
  want, want_aux = speculative.predict_batch_with_aux(pair['tree'], batch, rng=rng)
  got, aux = spectr.predict_batch_with_aux(pair['tree'], batch, rng=rng)
  np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  for key in ('num_tokens', 'target_calls', 'drafted', 'accepted', 'block_efficiency'):
    np.testing.assert_array_equal(np.asarray(aux[key]), np.asarray(want_aux[key]))
  assert set(aux) == set(want_aux) | set(SPECTR_AUX)
  np.testing.assert_array_equal(aux['num_drafts'], 1)
  np.testing.assert_array_equal(aux['draft_length'], GAMMA)
  np.testing.assert_allclose(aux['alpha'], aux['alpha_one_draft'], rtol=1e-6)  # K = 1: the same
  events = model_utils.speculation_events(_records(got, aux), GAMMA, DECODE_LEN)
  assert 0 < events['accepted'] < events['drafted'] and events['bonus'] and events['partial']

  k2, aux2 = speculative.predict_batch_with_aux(
    pair['tree'], batch, rng=rng, decoder_params={'method': 'spectr', 'num_drafts': 2}
  )
  aux2 = {k: np.asarray(v) for k, v in aux2.items()}
  assert set(aux2) == set(aux) and not np.array_equal(np.asarray(k2), np.asarray(got))
  np.testing.assert_array_equal(aux2['num_drafts'], 2)
  assert np.all(aux2['alpha'] >= aux2['alpha_one_draft'] - 1e-6)
  assert np.all((aux2['block_efficiency'] >= 1) & (aux2['block_efficiency'] <= GAMMA + 1))
  np.testing.assert_array_equal(aux2['drafted'], GAMMA * aux2['target_calls'])
  assert np.all(aux2['accepted'] <= aux2['drafted']) and np.all(aux2['selections'] > 0)
  with pytest.raises(ValueError, match="method = 'spectr' needs sampling"):
    speculative.predict_batch_with_aux(
      pair['tree'], batch, decoder_params={'method': 'spectr', 'num_drafts': 2, 'topk': 1}
    )


@pytest.mark.slow
def test_sampled_decodes_their_scores_and_the_rng(adapter, pair, smoke_inputs):
  """Temperature 1 (exact sampling), num_decodes 3, return_all_decodes: [B, 3, L] decodes sorted
  by ascending score (as T5X sorts), each score the target's log-probability of its generated
  tokens (= score_batch); the same rng gives the same samples, another rng others."""
  model = _model(adapter, pair, temperature=1.0, topk=0)
  batch = _batch(smoke_inputs[:2], 8)
  predict = functools.partial(model.predict_batch_with_aux, num_decodes=3, return_all_decodes=True)
  decodes, aux = predict(pair['tree'], batch, rng=jax.random.PRNGKey(3))
  assert decodes.shape == (2, 3, 8) and all(v.shape == (2, 3) for v in aux.values())
  scores = np.asarray(aux['scores'])
  assert np.all(np.diff(scores, axis=1) >= 0) and np.all(scores < 0)
  assert len({tuple(r) for r in np.asarray(decodes).reshape(6, 8).tolist()}) == 6
  targets = jnp.asarray(decodes).reshape(6, 8)
  score_batch = {
    'encoder_input_tokens': jnp.repeat(batch['encoder_input_tokens'], 3, axis=0),
    'decoder_target_tokens': targets,
    'decoder_input_tokens': t5_lib.shift_right(targets),
    'decoder_loss_weights': (targets > 0).astype(jnp.float32),
  }
  np.testing.assert_allclose(
    scores.reshape(6), np.asarray(model.score_batch(pair['tree'], score_batch)), rtol=1e-5
  )
  again, _ = predict(pair['tree'], batch, rng=jax.random.PRNGKey(3))
  np.testing.assert_array_equal(np.asarray(again), np.asarray(decodes))
  other, _ = predict(pair['tree'], batch, rng=jax.random.PRNGKey(4))
  assert not np.array_equal(np.asarray(other), np.asarray(decodes))
  # Without return_all_decodes: the highest-scoring decode of each example, as T5X returns it.
  best, best_aux = model.predict_batch_with_aux(
    pair['tree'], batch, rng=jax.random.PRNGKey(3), num_decodes=3
  )
  np.testing.assert_array_equal(np.asarray(best), np.asarray(decodes)[:, -1])
  np.testing.assert_array_equal(np.asarray(best_aux['scores']), scores[:, -1])


@pytest.mark.slow
def test_prompts_and_max_decode_steps(adapter, pair, smoke_inputs):
  """prompt_with_targets (ragged prompts, EOS stripped, output = prompt then continuation) and
  decoder_params['max_decode_steps'], against the reference decode."""
  model = _model(adapter, pair, temperature=0.0, topk=0)
  prompts = np.zeros((3, 10), np.int32)
  prompts[0, 1:5] = [3275, 5398, 4361, 1]  # [BOS, prompt..., EOS, pad...]
  prompts[1, 1:3] = [2158, 1]
  prompts[2, 1:2] = [1]  # an empty prompt
  encoder = smoke_inputs[:3]
  decodes, aux = model.predict_batch_with_aux(
    pair['tree'], _batch(encoder, 10, prompts), prompt_with_targets=True
  )
  expected, lengths = reference_greedy(
    pair['target'], pair['target_params'], encoder, 10, eos_id=1, prompts=prompts
  )
  np.testing.assert_array_equal(np.asarray(decodes), expected)
  np.testing.assert_array_equal(np.asarray(aux['num_tokens']), lengths)
  np.testing.assert_array_equal(np.asarray(decodes)[0, :3], [3275, 5398, 4361])

  decodes, aux = model.predict_batch_with_aux(
    pair['tree'], _batch(encoder, 10), decoder_params={'max_decode_steps': 4}
  )
  expected, lengths = reference_greedy(
    pair['target'], pair['target_params'], encoder, 10, eos_id=1, max_steps=4
  )
  np.testing.assert_array_equal(np.asarray(decodes), expected)
  np.testing.assert_array_equal(np.asarray(decodes)[:, 4:], 0)
  assert np.asarray(aux['num_tokens']).max() == 4


@pytest.mark.slow
def test_eos_and_gamma_come_from_the_vocabulary_and_decoder_params(
  adapter, pair, smoke_inputs, greedy_run
):
  """The stop token is the output vocabulary's eos_id unless decoder_params['eos_id'] overrides
  it; decoder_params['gamma'] overrides the model's gamma (drafts per target call)."""
  row, stop = 6, 4  # a token that row 6 emits first at position 4 becomes the vocabulary's EOS
  token = int(greedy_run['expected'][row, stop])
  assert token != 1 and token not in greedy_run['expected'][row, :stop]
  model = _model(adapter, pair, seqio.PassThroughVocabulary(8000, eos_id=token))
  batch = _batch(smoke_inputs, DECODE_LEN)
  decodes, aux = model.predict_batch_with_aux(pair['tree'], batch)
  want, lengths = reference_greedy(
    pair['target'], pair['target_params'], smoke_inputs, DECODE_LEN, eos_id=token
  )
  np.testing.assert_array_equal(np.asarray(decodes), want)
  np.testing.assert_array_equal(np.asarray(aux['num_tokens']), lengths)
  assert int(lengths[row]) == stop + 1 and not np.asarray(decodes)[row, stop + 1 :].any()
  np.testing.assert_array_equal(aux['drafted'], GAMMA * np.asarray(aux['target_calls']))

  decodes, aux = model.predict_batch_with_aux(
    pair['tree'], batch, decoder_params={'eos_id': 1, 'gamma': 2}
  )
  np.testing.assert_array_equal(np.asarray(decodes), greedy_run['expected'])
  np.testing.assert_array_equal(aux['drafted'], 2 * np.asarray(aux['target_calls']))


def _lenient(decode):
  """A deliberately inexact speculative decode (lenience 1e-3 accepts any draft token within
  log(1000) of the target's top logit; the test double of tests/decode/test_audit.py)."""

  def wrong(*args, **kwargs):
    with pytest.warns(UserWarning, match='APPROXIMATE'):
      return decode(*args, lenience=1e-3, **kwargs)

  return wrong


@pytest.mark.slow
def test_check_exactness(adapter, pair, smoke_inputs, monkeypatch):
  """check_exactness=True: verdict 0 on exact greedy decodes, -1 (not checked) on sampled ones,
  and an ExactnessError naming the row when the speculative decode is inexact."""
  from speculative.decode import loops
  from speculative.t5x_adapter import exactness

  model = _model(adapter, pair, temperature=0.0, topk=0, check_exactness=True)
  batch = _batch(smoke_inputs[:3], 8)
  _, aux = model.predict_batch_with_aux(pair['tree'], batch)
  assert {k: np.asarray(aux[k]).tolist() for k in exactness.AUX_KEYS} == {
    'exactness_verdict': [0, 0, 0],
    'exactness_position': [-1, -1, -1],
    'exactness_gap': [0.0, 0.0, 0.0],
    'exactness_deficit': [0.0, 0.0, 0.0],
    'exactness_bound': [0.0, 0.0, 0.0],
  }
  _, sampled = model.predict_batch_with_aux(
    pair['tree'], batch, decoder_params={'temperature': 1.0}
  )
  assert np.asarray(sampled['exactness_verdict']).tolist() == [-1, -1, -1]
  monkeypatch.setattr(loops, 'speculative_decode', _lenient(loops.speculative_decode))
  with pytest.raises(exactness.ExactnessError, match=r'batch row \d: first difference at'):
    model.predict_batch_with_aux(pair['tree'], batch)


# ----------------------------------------------------------------------------------------------
# models.py: construction, options, parameters, the network's T5X signatures.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
  'kwargs, message',
  [
    ({'topk': -1}, r"topk'\] must be >= 0"),
    ({'temperature': 0.5, 'topk': 5, 'topp': 0.9}, 'at most one of topk'),
    ({'gamma': 0}, 'gamma.* must be >= 1, got 0'),
    ({'drafter': 'bigram'}, 'estimates tables from a corpus'),
    ({'draft_size': 'tiny'}, 'give exactly one of draft size'),
    ({'draft_config': None, 'draft_size': 'medium'}, 'unknown draft size'),
    ({'method': 'medusa'}, 'method must be one of'),
    ({'num_drafts': 2}, "num_drafts = 2 needs method = 'spectr'"),
    ({'method': 'spectr', 'num_drafts': 9, 'topk': 0}, r"num_drafts'\] must be <= 8"),
    ({'method': 'spectr', 'num_drafts': 0, 'topk': 0}, r"num_drafts'\] must be >= 1"),
    ({'method': 'spectr', 'num_drafts': 2}, "method = 'spectr' needs sampling"),
    (
      {'method': 'spectr', 'num_drafts': 2, 'topk': 0, 'drafter': 'prompt_lookup+model'},
      "needs drafter = 'model'",
    ),
  ],
)
def test_bad_model_arguments_fail_at_construction(adapter, pair, kwargs, message):
  """A bad gin binding fails when T5X builds the model, not mid-job."""
  with pytest.raises(ValueError, match=message):
    _model(adapter, pair, **kwargs)


def test_the_eos_id_is_the_output_vocabularys_zero_included(adapter, pair):
  """A vocabulary whose EOS is 0 stops the decode at 0; one that names none, at T5's 1."""
  vocab_size = pair['target'].vocab_size
  for eos_id, want in ((0, 0), (5, 5), (None, 1)):
    vocabulary = seqio.PassThroughVocabulary(vocab_size, eos_id=eos_id)
    assert _model(adapter, pair, vocabulary)._resolve_options(None, None).eos_id == want


def test_options_the_model_reads(adapter, pair, t5x_stub):
  """Model defaults (T5X's temperature_sample defaults: greedy), per-call decoder_params checks,
  the rng / decode_rng exclusion, num_decodes from T5X's DecoderParams, the batch's shape and the
  draft parameters' presence: each refused with its message before anything is decoded."""
  from t5x import models as stub_models

  model = _model(adapter, pair)
  assert model.decode_defaults == {'gamma': GAMMA, 'temperature': 1.0, 'topk': 1, 'topp': 0.0}
  assert model.gamma == GAMMA and not model.check_exactness
  assert model.target.config == pair['target'] and model.draft.config == pair['draft']
  batch = _batch(np.array([[5, 6, 1]]), 4)
  tree = pair['tree']
  cases = [
    (
      dict(rng=jax.random.PRNGKey(0), decoder_params={'decode_rng': jax.random.PRNGKey(1)}),
      'both from the `rng` argument',
    ),
    (dict(decoder_params={'logit_callback_fn': None}), 'not supported by speculative decoding'),
    (dict(decoder_params={'beam_size': 4}), 'unknown decoder_params'),
    (dict(decoder_params={'temperature': np.ones(2)}), 'per-example'),
    (dict(num_decodes=0), 'num_decodes must be >= 1'),
  ]
  for kwargs, message in cases:
    with pytest.raises(ValueError, match=message):
      model.predict_batch_with_aux(tree, batch, **kwargs)
  defaults = stub_models.DecoderParams(num_decodes=0)
  with pytest.raises(ValueError, match='num_decodes must be >= 1'):
    _model(adapter, pair, default_decoder_params=defaults).predict_batch_with_aux(tree, batch)
  with pytest.raises(ValueError, match=r'must be \[batch, length\]'):
    model.predict_batch_with_aux(tree, dict(batch, encoder_input_tokens=jnp.array([5, 6, 1])))
  with pytest.raises(ValueError, match="no draft parameters: params has no 'draft' subtree"):
    model.predict_batch_with_aux(pair['target_params'], batch)


def test_initial_variables_hold_target_draft_and_their_axes(adapter, pair):
  """get_initial_variables: T5X's {'params', 'params_axes'}; the target's tree (what a stock T5X
  checkpoint restores into) plus 'draft', each parameter with its logical axis names."""
  from flax.linen import partitioning as flax_partitioning

  model = _model(adapter, pair)
  shapes = {'encoder_input_tokens': (2, 8), 'decoder_input_tokens': (2, 8)}
  variables = jax.eval_shape(
    lambda rng: model.get_initial_variables(rng, shapes), jax.random.PRNGKey(0)
  )
  assert sorted(variables) == ['params', 'params_axes']

  def flat(tree):
    return {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(tree)}

  params = flat(variables['params'])
  want = flat(dict(pair['target_params'], draft=pair['draft_params']))
  assert {k: v.shape for k, v in params.items()} == {k: v.shape for k, v in want.items()}
  axes = flax_partitioning.get_axis_names(variables['params_axes'])
  target_axes = {k: v for k, v in axes.items() if k != 'draft'}
  assert flat(target_axes) == flat(model.target.logical_axes())
  assert flat(axes['draft']) == flat(model.draft.logical_axes())
  # T5X's own names for two of them (t5x/examples/t5/network.py), not only our models' round trip.
  for tree in (target_axes, axes['draft']):
    assert tuple(tree['token_embedder']['embedding']) == ('vocab', 'embed')
    assert tuple(tree['decoder']['layers_0']['mlp']['wo']['kernel']) == ('mlp', 'embed')
  for key, spec in flat(axes).items():
    assert len(spec) == len(params[key].shape), key


def test_network_has_t5x_signatures(adapter, pair, smoke_inputs):
  """t5x_network(T5X's T5Config) = our T5 behind T5X's `network.Transformer` call signatures."""
  ours = adapter.t5x_network(pair['module'].config)
  assert ours.config == pair['target']
  encoder = jnp.asarray(smoke_inputs[:2])
  targets = jnp.asarray([[3275, 5398, 1, 0], [2158, 993, 7955, 1]], jnp.int32)
  variables = {'params': pair['target_params']}
  args = (encoder, t5_lib.shift_right(targets), targets)

  @jax.jit
  def both(variables, encoder, decoder_inputs, targets):
    theirs = t5_lib.T5(pair['target']).forward(
      variables['params'], encoder, decoder_inputs, decoder_target_tokens=targets
    )
    logits = ours.apply(variables, encoder, decoder_inputs, targets, enable_dropout=False)
    encoded = ours.apply(variables, encoder, enable_dropout=False, method=ours.encode)
    return logits, theirs, encoded

  logits, theirs, encoded = both(variables, *args)
  np.testing.assert_array_equal(np.asarray(logits), np.asarray(theirs))
  assert encoded.shape == (2, 64, pair['target'].emb_dim)
  with pytest.raises(NotImplementedError, match='no single-token decode'):
    ours.apply(variables, *args, decode=True)
  with pytest.raises(ValueError, match='packed examples are not supported'):
    ours.apply(variables, *args, encoder_segment_ids=jnp.ones_like(encoder))


# ----------------------------------------------------------------------------------------------
# configs/t5x/speculative.gin: the bindings that switch a stock T5X run to the adapter.
# ----------------------------------------------------------------------------------------------
# What T5X's t5x/examples/t5/t5_1_1/{base,tiny}.gin bind (their macros, the tiny shape), on the
# fixture's vocabulary and dtype, then the run file, then the restore config T5X's infer.gin builds.
TINY_MODEL_GIN = """
from __gin__ import dynamic_registration
import seqio
from t5x import utils
from t5x.examples.t5 import network

Z_LOSS = 0.0001
LABEL_SMOOTHING = 0.0
LOSS_NORMALIZING_FACTOR = None
OPTIMIZER = None
VOCABULARY = @seqio.PassThroughVocabulary()
seqio.PassThroughVocabulary.size = 32128
seqio.PassThroughVocabulary.eos_id = 1
network.Transformer.config = @network.T5Config()
network.T5Config:
  vocab_size = 32128
  dtype = 'float32'
  emb_dim = 8
  num_heads = 4
  num_encoder_layers = 2
  num_decoder_layers = 2
  head_dim = 3
  mlp_dim = 16
  mlp_activations = ('gelu', 'linear')
  dropout_rate = 0.0
  logits_via_embedding = False

include 'configs/t5x/speculative.gin'

RESTORE = @utils.RestoreCheckpointConfig()
utils.RestoreCheckpointConfig:
  path = %CHECKPOINT_PATH
  mode = 'specific'
  dtype = 'float32'
"""


def _gin_value(reference):
  if isinstance(reference, gin.config.ConfigurableReference):
    return reference.scoped_configurable_fn() if reference.evaluate else reference
  return reference


@pytest.fixture
def clean_gin():
  gin.clear_config()
  gin.add_config_file_search_path(str(REPO))
  yield
  gin.clear_config()


def test_speculative_gin_builds_the_model_and_restores_the_draft(
  adapter, t5x_stub, clean_gin, tmp_path
):
  """configs/t5x/speculative.gin after a T5X model file: MODEL is the adapter's model on the stock
  network config, with the run file's macros; the restore config's state transformation puts the
  DRAFT_CHECKPOINT_PATH weights under params['draft'] of the checkpoint T5X read."""
  from flax import serialization

  checkpoint = str((FIXTURE / 'ckpt' / 'checkpoint_0').resolve())
  model_file = tmp_path / 'tiny_model.gin'
  model_file.write_text(TINY_MODEL_GIN)
  macros = [
    f"CHECKPOINT_PATH = '{checkpoint}'",
    f"DRAFT_CHECKPOINT_PATH = '{checkpoint}'",
    "DRAFT_SIZE = 'tiny'",
    'GAMMA = 5',
  ]
  gin.parse_config_files_and_bindings([str(model_file)], macros, finalize_config=False)
  model = _gin_value(gin.query_parameter('%MODEL'))
  assert type(model) is adapter.SpeculativeEncoderDecoderModel
  tiny = (8, 4, 2, 2, 3, 16)
  for config in (model.target.config, model.draft.config):
    shape = (
      config.emb_dim,
      config.num_heads,
      config.num_encoder_layers,
      config.num_decoder_layers,
      config.head_dim,
      config.mlp_dim,
    )
    assert shape == tiny and config.vocab_size == 32128 and config.dtype == 'float32'
  # The run file's defaults: argmax (TEMPERATURE 0.0, TOPK 0, TOPP 0.0), no exactness check.
  assert model.decode_defaults == {'gamma': 5, 'temperature': 0.0, 'topk': 0, 'topp': 0.0}
  assert not model.check_exactness
  # The acceptance GAMMA = 'auto' assumes: the run file's default is the constructor's.
  python_default = inspect.signature(adapter.SpeculativeEncoderDecoderModel).parameters
  assert model._expected_alpha == python_default['expected_alpha'].default == 0.8
  assert model.output_vocabulary.eos_id == 1 and model.optimizer_def is None
  assert model._z_loss == 0.0001  # the stock loss settings reach T5X's base class

  restore = _gin_value(gin.query_parameter('%RESTORE'))
  assert restore.path == checkpoint and len(restore.state_transformation_fns) == 1
  target_params = serialization.msgpack_restore((FIXTURE / 'params.msgpack').read_bytes())
  expected = jax.eval_shape(lambda rng: model.get_initial_variables(rng, {}), jax.random.PRNGKey(0))
  state = {'target': target_params, 'state': {'step': 0}}
  for fn in restore.state_transformation_fns:  # as t5x.checkpoints applies them after reading
    state = fn(state, {'target': expected['params']})
  assert state['state'] == {'step': 0} and state['target']['encoder'] is target_params['encoder']
  draft = dict(jax.tree_util.tree_leaves_with_path(state['target']['draft']))
  want = jax.tree_util.tree_leaves_with_path(target_params)  # the draft checkpoint = the target's
  assert len(draft) == len(want)
  for key, value in want:
    np.testing.assert_array_equal(draft[key], value)

  # Overriding the macros, as an experiment file or --gin.NAME=VALUE does.
  gin.clear_config()
  overrides = ['TEMPERATURE = 0.7', 'TOPK = 40', 'CHECK_EXACTNESS = True']
  gin.parse_config_files_and_bindings([str(model_file)], macros + overrides, finalize_config=False)
  model = _gin_value(gin.query_parameter('%MODEL'))
  assert model.decode_defaults == {'gamma': 5, 'temperature': 0.7, 'topk': 40, 'topp': 0.0}
  assert model.check_exactness
  # SpecTr through the macros: METHOD and NUM_DRAFTS reach the model's defaults.
  gin.clear_config()
  spectr = ['TEMPERATURE = 1.0', "METHOD = 'spectr'", 'NUM_DRAFTS = 4']
  gin.parse_config_files_and_bindings([str(model_file)], macros + spectr, finalize_config=False)
  model = _gin_value(gin.query_parameter('%MODEL'))
  assert model.decode_defaults == {
    'gamma': 5,
    'temperature': 1.0,
    'topk': 0,
    'topp': 0.0,
    'method': 'spectr',
    'num_drafts': 4,
  }
  # GAMMA = 'auto' through the macros, with its cost cache and expected acceptance.
  gin.clear_config()
  auto = ["GAMMA = 'auto'", f"CALIBRATION_FILE = '{tmp_path / 'c.json'}'", 'EXPECTED_ALPHA = 0.7']
  gin.parse_config_files_and_bindings(
    [str(model_file)],
    [m for m in macros if not m.startswith('GAMMA')] + auto,
    finalize_config=False,
  )
  model = _gin_value(gin.query_parameter('%MODEL'))
  assert model.gamma == 'auto' and model._calibration_file == str(tmp_path / 'c.json')
  assert model._expected_alpha == 0.7


def _cost_cache(path, model, batch, costs):
  """A calibration cache with one XLA-path entry of `costs` for `model`'s target and draft at
  `batch` rows on this device (what a speculative.infer job with GAMMA = 'auto' writes)."""
  from speculative import checkpoints
  from speculative.autogamma import costs as costs_lib

  fields = costs_lib.key_fields(
    decode_path='XLA dot (kernels = off)',
    batch=batch,
    encoder_length=64,
    max_length=64,
    gamma_max=costs.gamma_max,
    target_config=checkpoints.config_dict(model.target.config),
    draft_config=checkpoints.config_dict(model.draft.config),
    loop='drafter model, greedy, lenience exact',  # as a job's: its drafter first
  )
  calibration = costs_lib.Calibration(None, None, costs_lib.cache_key(fields), fields, 'measured')
  costs_lib.store(str(path), model_utils.loop_times(costs), calibration)
  return str(path)


def test_gamma_auto_chooses_from_the_measured_costs(adapter, pair, smoke_inputs, tmp_path):
  """GAMMA = 'auto' (gin default or decoder_params) at batch 8: where the cache's costs say only
  plain decoding pays, the decodes are the reference greedy tokens with no draft (aux gamma 0);
  where gamma 3 pays at the expected alpha, gamma 3 with drafts accepted; no costs for this batch
  size: one error naming the file and what to run."""
  from speculative.autogamma import costs as costs_lib

  batch = _batch(smoke_inputs, DECODE_LEN)
  expected, lengths = reference_greedy(
    pair['target'], pair['target_params'], smoke_inputs, DECODE_LEN, eos_id=1
  )
  # Loop steps (ms) at gamma 0..4: a step that grows by 1.5 ms a gamma never pays; a flat one with
  # a jump at gamma 4 pays most at gamma 3.
  plain_pays = costs_lib.Costs(tuple((g, (1 + 1.5 * g) * 1e-3) for g in range(5)), 4)
  three_pays = costs_lib.Costs(
    tuple((g, (1 + 0.3 * g) * 1e-3) for g in range(4)) + ((4, 3.1e-3),), 4
  )
  model = _model(adapter, pair, gamma='auto', calibration_file=str(tmp_path / 'plain.json'))
  _cost_cache(tmp_path / 'plain.json', model, 8, plain_pays)
  decodes, aux = jax.jit(model.predict_batch_with_aux)(pair['tree'], batch)
  np.testing.assert_array_equal(np.asarray(decodes), expected)
  np.testing.assert_array_equal(aux['gamma'], 0)
  np.testing.assert_array_equal(aux['drafted'], 0)

  model = _model(
    adapter, pair, gamma='auto', calibration_file=str(tmp_path / 'three.json'), expected_alpha=0.8
  )
  _cost_cache(tmp_path / 'three.json', model, 8, three_pays)
  assert model.auto_gamma(8) == 3  # at 0.8: 1 + a + a^2 + a^3 = 2.952 over 1.9 steps, 1.55x
  decodes, aux = model.predict_batch_with_aux(pair['tree'], batch)
  np.testing.assert_array_equal(np.asarray(decodes), expected)
  np.testing.assert_array_equal(aux['gamma'], 3)
  events = model_utils.speculation_events(_records(decodes, aux), 3, DECODE_LEN)
  assert 0 < events['accepted'] < events['drafted'] and events['bonus'], events
  # Per call, on a model whose default gamma is an int.
  fixed = _model(adapter, pair, calibration_file=str(tmp_path / 'three.json'), expected_alpha=0.8)
  _, aux = fixed.predict_batch_with_aux(pair['tree'], batch, decoder_params={'gamma': 'auto'})
  np.testing.assert_array_equal(aux['gamma'], 3)
  _, aux = fixed.predict_batch_with_aux(pair['tree'], batch)
  assert 'gamma' not in aux
  with pytest.raises(ValueError, match=r"no measured costs for batch 4 .*three\.json"):
    model.predict_batch_with_aux(pair['tree'], _batch(smoke_inputs[:4], DECODE_LEN))
  with pytest.raises(ValueError, match="gamma = 'auto' chooses one draft's length"):
    _model(adapter, pair, gamma='auto', method='spectr', num_drafts=2, temperature=1.0, topk=0)
  with pytest.raises(ValueError, match='expected_alpha must be in'):
    _model(adapter, pair, gamma='auto', expected_alpha=1.5)
