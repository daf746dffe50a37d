"""Tests of `speculative.t5x_adapter`: the T5X model class, draft restore and decoder params.

tests/t5x_adapter/README.md says what runs where (test_t5x_adapter_stub.py runs the adapter's
model class against a stub of t5x). Without t5x (the project's own venv) the t5x-free parts here
run: decoder_params semantics, draft configs, the draft-restore state transformation, the exactness
check's core (`exactness`, on real tiny decodes and a deliberately inexact one), and the guarantee
that nothing else imports t5x. With t5x importable (a scratch venv with the google-research/t5x,
google/airio and google-research/jestimator source trees on PYTHONPATH, docs/design.md section 5)
the adapter is checked against stock T5X: identical greedy decodes on the tiny fixture
(tests/fixtures/t5x_tiny), `check_exactness`, and `python -m t5x.infer` writing predictions
through it under T5X's partitioner (4 host devices, 2-way model parallel).

  python -m pytest -q -p no:xdist tests/t5x_adapter/test_t5x_adapter.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import subprocess
import sys

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import checkpoints
from speculative import drafters
from speculative import sampling as sampling_lib
from speculative import t5x_adapter
from speculative.decode import loops as decoding
from speculative.models import t5 as t5_lib
from speculative.t5x_adapter import exactness
from speculative.t5x_adapter import options

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / 'tests' / 'fixtures' / 't5x_tiny'  # written by stock T5X (its README.md)
STUB = Path(__file__).resolve().parent / 't5x_stub'  # a stub of t5x's interfaces (README.md)
# Why the real-T5X tests skip where t5x is missing: it cannot be pip-installed here.
T5X_MISSING = 't5x is not importable (not on PyPI; README, "Installing T5X")'
TINY = t5_lib.T5Config(
  vocab_size=32128,
  emb_dim=8,
  num_heads=4,
  num_encoder_layers=2,
  num_decoder_layers=2,
  head_dim=3,
  mlp_dim=16,
)


def _fixture():
  return json.loads((FIXTURE / 'decode_results.json').read_text())


def _fixture_params():
  from flax import serialization

  return serialization.msgpack_restore((FIXTURE / 'params.msgpack').read_bytes())


# ----------------------------------------------------------------------------------------------
# Without t5x.
# ----------------------------------------------------------------------------------------------
def test_rest_of_package_never_imports_t5x():
  """Every public module except t5x_adapter.models imports without pulling in t5x (private
  `_name` modules, such as a compiled library, are not imported on their own). t5x is importable
  in the subprocess (the stub of t5x_stub/ first on its path), so an import of t5x that is guarded
  or conditional is caught too, not only one that would fail without t5x."""
  code = (
    'import importlib, importlib.util, pkgutil, sys\n'
    'assert importlib.util.find_spec("t5x") is not None\n'
    'import speculative\n'
    'names = [m.name for m in pkgutil.walk_packages(speculative.__path__, "speculative.")\n'
    '         if m.name != "speculative.t5x_adapter.models"\n'
    '         and not m.name.rsplit(".", 1)[-1].startswith("_")]\n'
    'for name in names:\n'
    '  importlib.import_module(name)\n'
    'bad = sorted(m for m in sys.modules if m == "t5x" or m.startswith("t5x."))\n'
    'assert not bad, bad\n'
    'print(len(names))\n'
  )
  path = os.pathsep.join([str(STUB), os.environ.get('PYTHONPATH', '')])
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3', PYTHONPATH=path)
  out = subprocess.run(
    [sys.executable, '-c', code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
  )
  assert out.returncode == 0, out.stderr[-3000:]
  assert int(out.stdout.split()[-1]) >= 10


def test_lazy_model_names_need_t5x():
  try:
    import t5x  # noqa: F401
  except ImportError:
    with pytest.raises(ImportError, match='needs t5x'):
      _ = t5x_adapter.SpeculativeEncoderDecoderModel
  else:
    assert t5x_adapter.SpeculativeEncoderDecoderModel.__name__ == 'SpeculativeEncoderDecoderModel'
  with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
    _ = t5x_adapter.NoSuchThing


def test_decoder_params_follow_t5x_temperature_sample():
  resolve = options.resolve_decoder_params
  # T5X defaults (temperature 1.0, topk 1, topp 0.0) are greedy; so is temperature <= 1e-4.
  assert resolve(None, gamma=4).sampling.greedy
  assert resolve({'temperature': 1e-5, 'topk': 0}, gamma=4).sampling.greedy
  assert resolve({'temperature': 0.7, 'topk': 1}, gamma=4).sampling.greedy
  exact = resolve({'temperature': 1.0, 'topk': 0}, gamma=4)
  assert exact.sampling == sampling_lib.SamplingConfig()
  assert float(exact.sampling_params.temperature) == 1.0
  topk = resolve({'temperature': 0.5, 'topk': 40}, gamma=4)
  assert topk.sampling == sampling_lib.SamplingConfig(top_k=True)
  assert int(topk.sampling_params.top_k) == 40
  topp = resolve({'temperature': 1.0, 'topk': 0, 'topp': 0.9}, gamma=4)
  assert topp.sampling == sampling_lib.SamplingConfig(top_p=True)
  assert float(topp.sampling_params.top_p) == pytest.approx(0.9)
  # Per-call overrides of the static values.
  opts = resolve({'gamma': 7, 'eos_id': 5, 'max_decode_steps': 9}, gamma=4)
  assert (opts.gamma, opts.eos_id, opts.max_decode_steps) == (7, 5, 9)
  assert (opts.method, opts.num_drafts) == ('speculative', 1)
  spectr = resolve({'method': 'spectr', 'num_drafts': 4, 'temperature': 1.0, 'topk': 0}, gamma=4)
  assert (spectr.method, spectr.num_drafts, spectr.gamma) == ('spectr', 4, 4)


@pytest.mark.parametrize(
  'params, message',
  [
    ({'topk': 5, 'topp': 0.9}, 'at most one of topk'),
    ({'temperature': -1.0}, 'temperature must be'),
    ({'topk': -1}, r"decoder_params\['topk'\] must be >= 0, got -1"),
    ({'topk': 2.7}, r"decoder_params\['topk'\] must be an int, got 2.7"),
    ({'topp': 1.5}, 'topp must be'),
    ({'gamma': 0}, r"decoder_params\['gamma'\] must be >= 1, got 0"),
    ({'gamma': 2.5}, r"decoder_params\['gamma'\] must be an int or 'auto', got 2.5"),
    ({'gamma': 'AUTO'}, r"decoder_params\['gamma'\] must be an int or 'auto', got 'AUTO'"),
    ({'gamma': None}, r"decoder_params\['gamma'\] must be an int or 'auto', got None"),
    ({'temperature': np.array([0.5, 1.0])}, 'per-example'),
    ({'beam_size': 4}, 'unknown decoder_params'),
    ({'rescale_log_probs': False}, 'not supported'),
    ({'method': 'medusa'}, 'method must be one of'),
    ({'num_drafts': 2}, "needs method = 'spectr'"),
    ({'method': 'spectr', 'num_drafts': 9, 'topk': 0}, 'must be <= 8'),
    ({'method': 'spectr', 'num_drafts': 1.5, 'topk': 0}, 'must be an int'),
    ({'method': 'spectr', 'num_drafts': 2}, 'needs sampling'),  # T5X's default topk=1: greedy
  ],
)
def test_decoder_params_errors(params, message):
  with pytest.raises(ValueError, match=message):
    options.resolve_decoder_params(params, gamma=4)


def test_traced_decoder_params_reproduce_t5x_rules_at_run_time():
  """Traced values select one generic strategy whose run-time values follow T5X's rules."""
  logits = jnp.array([[0.0, 3.0, 1.0, 2.0]], jnp.float32)

  @jax.jit
  def probs(temperature, topk, topp):
    opts = options.resolve_decoder_params(
      {'temperature': temperature, 'topk': topk, 'topp': topp}, gamma=3
    )
    assert opts.sampling == sampling_lib.SamplingConfig(top_k=True, top_p=True)
    return sampling_lib.probs_from_logits(logits, opts.sampling, opts.sampling_params)

  one_hot = np.array([[0.0, 1.0, 0.0, 0.0]])
  np.testing.assert_allclose(probs(1.0, 1, 0.0), one_hot)  # topk 1: argmax
  np.testing.assert_allclose(probs(0.0, 0, 0.0), one_hot)  # temperature 0: argmax
  np.testing.assert_allclose(probs(1.0, 0, 0.0), jax.nn.softmax(logits), rtol=1e-6)
  np.testing.assert_allclose(probs(1.0, 2, 0.0)[0, [0, 2]], 0.0)  # top-2 keeps ids 1 and 3


def test_draft_config_from_size_inherits_target_vocab_and_dtype():
  target = options.to_t5_config(
    {
      'vocab_size': 32128,
      'dtype': jnp.bfloat16,
      'emb_dim': 4096,
      'num_heads': 64,
      'num_encoder_layers': 24,
      'num_decoder_layers': 24,
      'head_dim': 64,
      'mlp_dim': 10240,
      'mlp_activations': ['gelu', 'linear'],
      'dropout_rate': 0.1,
    }
  )
  assert target.dtype == 'bfloat16' and target.mlp_activations == ('gelu', 'linear')
  small = options.draft_config(target, 'small')
  assert (
    small.emb_dim,
    small.num_heads,
    small.num_encoder_layers,
    small.num_decoder_layers,
    small.head_dim,
    small.mlp_dim,
  ) == (512, 6, 8, 8, 64, 1024)
  assert (small.vocab_size, small.dtype, small.dropout_rate) == (32128, 'bfloat16', 0.1)
  assert options.draft_config(target, config=TINY) == TINY
  with pytest.raises(ValueError, match='unknown draft size'):
    options.draft_config(target, 'medium')
  with pytest.raises(ValueError, match='exactly one'):
    options.draft_config(target)
  with pytest.raises(ValueError, match='vocabularies differ'):
    options.draft_config(target, config=options.to_t5_config(TINY, vocab_size=8000))


@pytest.fixture(scope='module')
def tiny_draft_checkpoint(tmp_path_factory):
  """A random tiny T5 (seed 1, not the fixture's weights) written as a T5X checkpoint: the real
  init's shapes and scales, made in NumPy (`model_utils.random_params`; compiling T5's initializer
  for TINY took ~5 s of the fast tier's test_add_draft_checkpoint_errors)."""
  params = model_utils.random_params(t5_lib.T5(TINY), seed=1)
  directory = tmp_path_factory.mktemp('draft')
  path = checkpoints.save_t5x_checkpoint(params, directory, step=7)
  return path, params


@pytest.mark.slow
def test_add_draft_checkpoint_grafts_draft_into_restored_state(tiny_draft_checkpoint):
  path, params = tiny_draft_checkpoint
  shapes = jax.eval_shape(lambda: params)
  state = {'target': {'encoder': {'spec': 'left alone'}}, 'state': {'step': 3}}
  wanted = {'target': {'encoder': {}, 'draft': shapes}}
  out = t5x_adapter.add_draft_checkpoint(state, wanted, path=str(path))
  assert out['target']['encoder'] == {'spec': 'left alone'} and out['state'] == {'step': 3}
  assert 'draft' not in state['target']  # the input is not modified
  got = jax.tree_util.tree_leaves_with_path(out['target']['draft'])
  want = dict(jax.tree_util.tree_leaves_with_path(params))
  assert len(got) == len(want)
  for key, value in got:
    np.testing.assert_array_equal(value, want[key])
    assert value.dtype == np.float32


def test_add_draft_checkpoint_errors(tiny_draft_checkpoint, tmp_path):
  path, params = tiny_draft_checkpoint
  wrong = jax.eval_shape(
    lambda: t5_lib.T5(options.draft_config(TINY, 'small')).init_params(jax.random.PRNGKey(0))
  )
  state = {'target': {}, 'state': {}}
  with pytest.raises(checkpoints.CheckpointError, match='do not match the model: .* has shape'):
    t5x_adapter.add_draft_checkpoint(state, {'target': {'draft': wrong}}, path=str(path))
  shapes = {'target': {'draft': jax.eval_shape(lambda: params)}}
  with pytest.raises(ValueError, match='bind DRAFT_CHECKPOINT_PATH'):
    t5x_adapter.add_draft_checkpoint(state, shapes, path=None)
  with pytest.raises(ValueError, match='only local paths'):
    t5x_adapter.add_draft_checkpoint(state, shapes, path='gs://bucket/draft/checkpoint_1')
  with pytest.raises(FileNotFoundError, match='does not exist'):
    t5x_adapter.add_draft_checkpoint(state, shapes, path=str(tmp_path / 'missing'))
  with pytest.raises(ValueError, match="no 'draft' parameters"):
    t5x_adapter.add_draft_checkpoint(state, {'target': {}}, path=str(path))


def _lenient(decode):
  """A deliberately inexact speculative decode (the test double of tests/decode/test_audit.py): lenience
  1e-3 accepts any draft token within log(1000) of the target's top logit."""

  def wrong(*args, **kwargs):
    with pytest.warns(UserWarning, match='APPROXIMATE'):
      return decode(*args, lenience=1e-3, **kwargs)

  return wrong


@pytest.mark.slow
def test_exactness_check_core_without_t5x(monkeypatch):
  """exactness_aux + enforce (what check_exactness runs) on real tiny decodes, eagerly and under
  jit: an exact decode has verdict 0 everywhere; an inexact one raises naming row, position, gap
  and bound; near-ties are logged, not raised."""
  config = t5_lib.T5Config(
    vocab_size=61,
    emb_dim=16,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=2,
    head_dim=8,
    mlp_dim=24,
  )
  model = t5_lib.T5(config)
  params = model_utils.random_params(model, 1, logit_scale=4.0)
  encoder = jnp.asarray([[5, 9, 13, 2, 1, 0], [7, 3, 1, 0, 0, 0], [11, 4, 8, 6, 20, 1]], jnp.int32)
  streams = np.random.default_rng(2).integers(0, config.vocab_size, (20, 12))
  drafter = drafters.BigramDrafter(config.vocab_size)
  table = drafters.estimate_bigram(streams, config.vocab_size)
  greedy, greedy_params = sampling_lib.make_sampling(0.0)
  common = dict(
    max_new_tokens=10,
    sampling=greedy,
    sampling_params=greedy_params,
    eos_id=1,
    encoder_tokens=encoder,
  )
  baseline = decoding.autoregressive_decode(model, params, None, **common)

  def check(spec_decode):
    spec = spec_decode(model, params, drafter, table, None, gamma=3, **common)
    aux = exactness.exactness_aux(
      model, params, encoder, baseline.tokens, baseline.lengths, spec.tokens, spec.lengths
    )
    return exactness.enforce(aux)

  aux = check(decoding.speculative_decode)
  assert sorted(aux) == sorted(exactness.AUX_KEYS)  # the candidate tokens are not returned
  np.testing.assert_array_equal(aux['exactness_verdict'], exactness.IDENTICAL)
  np.testing.assert_array_equal(aux['exactness_position'], -1)
  with pytest.raises(
    exactness.ExactnessError,
    match=r'batch row \d+: first difference at '
    r'generated position \d+ .*gap .*bound',
  ):
    check(_lenient(decoding.speculative_decode))
  # Under jit the report runs as a host callback: the call fails with the same message.
  with pytest.raises(Exception, match='beyond rounding'):
    jax.block_until_ready(jax.jit(lambda: check(_lenient(decoding.speculative_decode)))())
  assert np.asarray(exactness.not_checked_aux(3)['exactness_verdict']).tolist() == [-1] * 3

  # Near-ties are logged, mismatches raised; rows are named by example and decode.
  logged = []
  monkeypatch.setattr(exactness.logging, 'info', lambda *args: logged.append(args))
  fields = dict(
    exactness_verdict=np.array([1, 0]),
    exactness_position=np.array([4, -1]),
    exactness_gap=np.array([0.01, 0.0]),
    exactness_deficit=np.array([0.01, 0.0]),
    exactness_bound=np.array([0.3, 0.0]),
    baseline_token=np.array([7, -1]),
    speculative_token=np.array([8, -1]),
  )
  out = exactness.enforce(fields, num_decodes=2)
  assert len(logged) == 1 and 'example 0 (decode 0): first difference' in logged[0][-1]
  assert 'baseline_token' not in out
  with pytest.raises(exactness.ExactnessError, match=r'example 0 \(decode 1\).*stopped'):
    exactness.enforce(
      dict(fields, exactness_verdict=np.array([0, 2]), baseline_token=np.array([7, -1])),
      num_decodes=2,
    )


# ----------------------------------------------------------------------------------------------
# Against real T5X (skipped where t5x is not importable).
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope='module')
def t5x_tiny():
  pytest.importorskip('t5x', reason=T5X_MISSING)
  import seqio
  from t5x import decoding as t5x_decoding
  from t5x import models as t5x_models
  from t5x.examples.t5 import network

  fixture = _fixture()
  config = dict(fixture['T5Config'], mlp_activations=tuple(fixture['T5Config']['mlp_activations']))
  vocabulary = seqio.PassThroughVocabulary(size=config['vocab_size'], eos_id=1)
  module = network.Transformer(network.T5Config(**config))
  stock = t5x_models.EncoderDecoderModel(
    module, vocabulary, vocabulary, optimizer_def=None, decode_fn=t5x_decoding.temperature_sample
  )
  return dict(
    fixture=fixture, module=module, vocabulary=vocabulary, stock=stock, params=_fixture_params()
  )


def _batch(fixture, decode_len=None):
  encoder = jnp.asarray(fixture['encoder_input_tokens'], jnp.int32)  # [1, 64]
  decode_len = decode_len or fixture['decoder_len']
  return {
    'encoder_input_tokens': encoder,
    'decoder_input_tokens': jnp.zeros((encoder.shape[0], decode_len), jnp.int32),
  }


def test_adapter_greedy_equals_stock_t5x_temperature_sample(t5x_tiny, tiny_draft_checkpoint):
  fixture, params = t5x_tiny['fixture'], t5x_tiny['params']
  batch = _batch(fixture)
  stock_decodes, stock_aux = t5x_tiny['stock'].predict_batch_with_aux(
    params, batch, decoder_params={'temperature': 0.0, 'topk': 0}
  )
  expected = np.asarray(fixture['results']['greedy_t0']['tokens'])
  np.testing.assert_array_equal(np.asarray(stock_decodes)[0], expected)

  # Draft = the target itself (restored by the model from the T5X checkpoint), T5X's default
  # decoder params (temperature 1.0, topk 1: greedy): every draft is accepted.
  model = t5x_adapter.SpeculativeEncoderDecoderModel(
    t5x_tiny['module'],
    t5x_tiny['vocabulary'],
    t5x_tiny['vocabulary'],
    draft_size='tiny',
    draft_checkpoint_path=str(FIXTURE / 'ckpt'),
    gamma=3,
  )
  decodes, aux = model.predict_batch_with_aux(params, batch)
  np.testing.assert_array_equal(np.asarray(decodes), np.asarray(stock_decodes))
  np.testing.assert_array_equal(np.asarray(aux['scores']), np.asarray(stock_aux['scores']))
  assert int(aux['num_tokens'][0]) == 64
  assert int(aux['accepted'][0]) == int(aux['drafted'][0]) > 0
  assert float(aux['alpha'][0]) == pytest.approx(1.0, abs=1e-5)
  assert float(aux['block_efficiency'][0]) == pytest.approx(4.0)  # gamma + 1 tokens per call

  # A different random draft in the parameter tree (as T5X's restore provides it), under jit.
  draft_path, draft_params = tiny_draft_checkpoint
  tree = dict(params, draft=draft_params)
  other = t5x_adapter.SpeculativeEncoderDecoderModel(
    t5x_tiny['module'],
    t5x_tiny['vocabulary'],
    t5x_tiny['vocabulary'],
    draft_config=TINY,
    gamma=4,
    temperature=0.0,
    topk=0,
  )
  decodes, aux = jax.jit(other.predict_batch_with_aux)(tree, batch)
  np.testing.assert_array_equal(np.asarray(decodes)[0], expected)
  # Two unrelated random models rarely agree: fewer drafts accepted, more target calls.
  assert int(aux['accepted'][0]) < int(aux['drafted'][0])
  assert float(aux['alpha'][0]) < 1.0
  assert int(aux['target_calls'][0]) > 64 / 5


def test_stock_decode_is_t5x_temperature_sample(t5x_tiny):
  """The benchmark's `stock_t5x` method (`stock.make_stock_t5x_decode`, from our config) decodes
  the fixture's greedy tokens, as stock T5X wrote them."""
  from speculative.t5x_adapter import stock

  fixture = t5x_tiny['fixture']
  decode = stock.make_stock_t5x_decode(
    options.to_t5_config(fixture['T5Config']),
    t5x_tiny['params'],
    max_new_tokens=fixture['decoder_len'],
    temperature=0.0,
  )
  decodes = decode(_batch(fixture)['encoder_input_tokens'], jax.random.PRNGKey(0))
  expected = np.asarray(fixture['results']['greedy_t0']['tokens'])
  np.testing.assert_array_equal(np.asarray(decodes)[0], expected)


def test_adapter_check_exactness(t5x_tiny, tiny_draft_checkpoint, monkeypatch):
  """check_exactness=True: verdict 0 for exact greedy decodes (under jit, as T5X calls it), -1 for
  sampled ones, and an ExactnessError from a deliberately inexact speculative decode."""
  _, draft_params = tiny_draft_checkpoint
  tree = dict(t5x_tiny['params'], draft=draft_params)
  model = t5x_adapter.SpeculativeEncoderDecoderModel(
    t5x_tiny['module'],
    t5x_tiny['vocabulary'],
    t5x_tiny['vocabulary'],
    draft_config=TINY,
    gamma=4,
    temperature=0.0,
    topk=0,
    check_exactness=True,
  )
  assert model.check_exactness
  batch = _batch(t5x_tiny['fixture'])
  decodes, aux = jax.jit(model.predict_batch_with_aux)(tree, batch)
  expected = np.asarray(t5x_tiny['fixture']['results']['greedy_t0']['tokens'])
  np.testing.assert_array_equal(np.asarray(decodes)[0], expected)
  assert int(aux['accepted'][0]) < int(aux['drafted'][0])  # a real draft: some rejections
  assert {k: np.asarray(aux[k]).tolist() for k in exactness.AUX_KEYS} == {
    'exactness_verdict': [0],
    'exactness_position': [-1],
    'exactness_gap': [0.0],
    'exactness_deficit': [0.0],
    'exactness_bound': [0.0],
  }
  short = _batch(t5x_tiny['fixture'], decode_len=8)
  _, sampled = model.predict_batch_with_aux(
    tree, short, decoder_params={'temperature': 1.0, 'topk': 0}
  )
  assert np.asarray(sampled['exactness_verdict']).tolist() == [-1]
  monkeypatch.setattr(decoding, 'speculative_decode', _lenient(decoding.speculative_decode))
  with pytest.raises(exactness.ExactnessError, match=r'batch row 0: first difference at'):
    model.predict_batch_with_aux(tree, short)


def test_adapter_parameter_tree_restores_stock_checkpoints(t5x_tiny):
  """Target tree == T5X's network tree; the 'draft' subtree and its axes come on top."""
  model = t5x_adapter.SpeculativeEncoderDecoderModel(
    t5x_tiny['module'], t5x_tiny['vocabulary'], t5x_tiny['vocabulary'], draft_size='tiny'
  )
  shapes = {'encoder_input_tokens': (1, 8), 'decoder_input_tokens': (1, 8)}
  ours = jax.eval_shape(lambda rng: model.get_initial_variables(rng, shapes), jax.random.PRNGKey(0))
  stock = jax.eval_shape(
    lambda rng: t5x_tiny['stock'].get_initial_variables(rng, shapes), jax.random.PRNGKey(0)
  )
  flat = lambda tree: {
    jax.tree_util.keystr(k): v.shape  # noqa: E731
    for k, v in jax.tree_util.tree_leaves_with_path(tree)
  }
  target = {k: v for k, v in ours['params'].items() if k != 'draft'}
  assert flat(target) == flat(stock['params'])
  assert flat(ours['params']['draft']) == flat(stock['params'])  # tiny draft: same shapes
  from flax.linen import partitioning as flax_partitioning

  axes = flax_partitioning.get_axis_names(ours['params_axes'])
  stock_axes = flax_partitioning.get_axis_names(stock['params_axes'])
  assert {k: v for k, v in axes.items() if k != 'draft'} == stock_axes
  assert axes['draft'] == stock_axes


def test_network_matches_stock_t5x_network(t5x_tiny):
  """T5XTransformer == T5X's network.Transformer on the same weights, through T5X's signatures."""
  fixture, params, stock = t5x_tiny['fixture'], t5x_tiny['params'], t5x_tiny['module']
  ours = t5x_adapter.t5x_network(stock.config)
  encoder = jnp.asarray(fixture['encoder_input_tokens'], jnp.int32)
  targets = jnp.asarray([fixture['results']['sample_t1_topk0']['tokens']], jnp.int32)
  args = (encoder, t5_lib.shift_right(targets), targets)
  np.testing.assert_array_equal(
    np.asarray(ours.apply({'params': params}, *args, enable_dropout=False)),
    np.asarray(stock.apply({'params': params}, *args, enable_dropout=False)),
  )
  np.testing.assert_array_equal(
    np.asarray(ours.apply({'params': params}, encoder, enable_dropout=False, method=ours.encode)),
    np.asarray(stock.apply({'params': params}, encoder, enable_dropout=False, method=stock.encode)),
  )
  with pytest.raises(NotImplementedError, match='no single-token decode'):
    ours.apply({'params': params}, *args, decode=True)
  with pytest.raises(ValueError, match='packed examples are not supported'):
    ours.apply({'params': params}, *args, encoder_segment_ids=jnp.ones_like(encoder))


def test_adapter_num_decodes_sampling_and_scores(t5x_tiny, tiny_draft_checkpoint):
  _, draft_params = tiny_draft_checkpoint
  model = t5x_adapter.SpeculativeEncoderDecoderModel(
    t5x_tiny['module'], t5x_tiny['vocabulary'], t5x_tiny['vocabulary'], draft_config=TINY, gamma=2
  )
  tree = dict(t5x_tiny['params'], draft=draft_params)
  batch = _batch(t5x_tiny['fixture'], decode_len=12)
  decodes, aux = model.predict_batch_with_aux(
    tree,
    batch,
    rng=jax.random.PRNGKey(3),
    decoder_params={'temperature': 1.0, 'topk': 0},
    num_decodes=3,
    return_all_decodes=True,
  )
  assert decodes.shape == (1, 3, 12) and aux['scores'].shape == (1, 3)
  scores = np.asarray(aux['scores'])[0]
  assert np.all(np.diff(scores) >= 0) and np.all(scores < 0)  # sorted ascending, as T5X
  assert len({tuple(row) for row in np.asarray(decodes)[0]}) == 3  # independent samples
  # The scores are the target's log-probabilities of the sampled tokens (stock score_batch).
  targets = np.asarray(decodes)[0]
  score_batch = {
    'encoder_input_tokens': jnp.repeat(batch['encoder_input_tokens'], 3, axis=0),
    'decoder_target_tokens': jnp.asarray(targets),
    'decoder_input_tokens': t5_lib.shift_right(jnp.asarray(targets)),
    'decoder_loss_weights': jnp.asarray(targets > 0, jnp.float32),
  }
  stock_scores = t5x_tiny['stock'].score_batch(t5x_tiny['params'], score_batch)
  np.testing.assert_allclose(scores, np.asarray(stock_scores), rtol=1e-4)
  # score_batch (T5X eval's scoring path) runs the target network only, ignoring 'draft'.
  np.testing.assert_allclose(
    np.asarray(model.score_batch(tree, score_batch)), np.asarray(stock_scores), rtol=1e-5
  )
  with pytest.raises(ValueError, match='both from the `rng` argument'):
    model.predict_batch_with_aux(
      tree, batch, rng=jax.random.PRNGKey(0), decoder_params={'decode_rng': jax.random.PRNGKey(1)}
    )


def test_adapter_prompts_and_max_decode_steps_match_stock_t5x(t5x_tiny):
  """prompt_with_targets (ragged prompts, EOS stripped) and max_decode_steps, as T5X does them."""
  encoder = jnp.asarray(t5x_tiny['fixture']['encoder_input_tokens'], jnp.int32)
  prompts = np.zeros((2, 16), np.int32)
  prompts[0, 1:6] = [5, 6, 7, 8, 1]  # [BOS, prompt..., EOS, pad...]
  prompts[1, 1:3] = [9, 1]
  batch = {
    'encoder_input_tokens': jnp.concatenate([encoder, encoder[:, ::-1]]),
    'decoder_input_tokens': jnp.asarray(prompts),
  }
  model = t5x_adapter.SpeculativeEncoderDecoderModel(
    t5x_tiny['module'],
    t5x_tiny['vocabulary'],
    t5x_tiny['vocabulary'],
    draft_size='tiny',
    draft_checkpoint_path=str(FIXTURE / 'ckpt'),
    gamma=3,
  )
  greedy = {'temperature': 0.0, 'topk': 0}
  for kwargs in ({'prompt_with_targets': True}, {'decoder_params': {'max_decode_steps': 4}}):
    stock_params = dict(greedy, **kwargs.get('decoder_params', {}))
    stock_decodes, _ = t5x_tiny['stock'].predict_batch_with_aux(
      t5x_tiny['params'],
      batch,
      decoder_params=stock_params,
      prompt_with_targets=kwargs.get('prompt_with_targets', False),
    )
    decodes, aux = model.predict_batch_with_aux(t5x_tiny['params'], batch, **kwargs)
    np.testing.assert_array_equal(np.asarray(decodes), np.asarray(stock_decodes))
  np.testing.assert_array_equal(np.asarray(decodes)[:, 4:], 0)
  assert np.asarray(aux['num_tokens']).tolist() == [4, 4]


def test_t5x_infer_writes_predictions_through_the_adapter(t5x_tiny, tmp_path):
  """`python -m t5x.infer` with configs/t5x/tiny_infer.gin, sharded over 4 host devices, with the
  exactness check on."""
  checkpoint = str((FIXTURE / 'ckpt' / 'checkpoint_0').resolve())
  output_dir = tmp_path / 'infer'
  env = dict(
    os.environ, TF_CPP_MIN_LOG_LEVEL='3', XLA_FLAGS='--xla_force_host_platform_device_count=4'
  )
  command = [
    sys.executable,
    '-m',
    't5x.infer',
    '--gin_file=configs/t5x/tiny_infer.gin',
    f"--gin.CHECKPOINT_PATH='{checkpoint}'",
    f"--gin.DRAFT_CHECKPOINT_PATH='{checkpoint}'",
    f"--gin.INFER_OUTPUT_DIR='{output_dir}'",
    '--gin.partitioning.PjitPartitioner.num_partitions=2',
    '--gin.CHECK_EXACTNESS=True',  # the greedy baseline and audit run inside T5X's pjit
  ]
  run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-4000:]
  files = sorted(output_dir.glob('libreoffice_ende_smoke-predict_with_aux.jsonl-*-of-*'))
  files = [f for f in files if not f.name.endswith('.COMPLETED')]
  assert len(files) == 1, sorted(p.name for p in output_dir.iterdir())
  records = [json.loads(line) for line in files[0].read_text().splitlines()]
  assert len(records) == 8
  for record in records:
    aux = record['aux']
    assert aux['alpha'] == pytest.approx(1.0, abs=1e-5) and aux['accepted'] == aux['drafted']
    assert aux['exactness_verdict'] == 0 and aux['exactness_position'] == -1
    assert 0 < aux['num_tokens'] <= 32 and record['prediction_tokens']
  # Same tokens as stock T5X greedy decoding of the same examples.
  import seqio

  from speculative.t5x_adapter import tasks as adapter_tasks

  task = seqio.get_mixture_or_task(adapter_tasks.SMOKE_TASK)
  dataset = task.get_dataset({'inputs': 64, 'targets': 32}, split='test', shuffle=False)
  inputs = [np.asarray(ex['inputs']) for ex in dataset.as_numpy_iterator()]
  encoder = np.zeros((len(inputs), 64), np.int32)
  for row, tokens in enumerate(inputs):
    encoder[row, : len(tokens)] = tokens
  stock_decodes, _ = t5x_tiny['stock'].predict_batch_with_aux(
    t5x_tiny['params'],
    {
      'encoder_input_tokens': jnp.asarray(encoder),
      'decoder_input_tokens': jnp.zeros((len(inputs), 32), jnp.int32),
    },
    decoder_params={'temperature': 0.0, 'topk': 0},
  )
  for record, row in zip(records, np.asarray(stock_decodes)):
    row = row.tolist()
    assert record['prediction_tokens'] == (row[: row.index(0)] if 0 in row else row)
