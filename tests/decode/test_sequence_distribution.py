"""Sequence-level exactness of the T5 path against an independent computation.

The expected distribution of every continuation comes from a plain NumPy (float64) forward of a
tiny T5 (written here from the T5 v1.1 equations, checked against `T5.forward` on the same params)
and NumPy top-k / top-p filters written here too (not `speculative.sampling.probs_from_logits`):
vocabulary 6, three new tokens, all 216 continuations of one source sentence enumerated. N samples
of the baseline and of speculative decoding (gamma 2, a correlated draft: the target without its
down-scaled second decoder layer) are drawn in one vectorized decode call each (N rows, one PRNG
stream per row), at temperature 1 with top-k, top-p and both, on XLA's dot and on the CPU kernels.

The check (`_verdict`): no continuation the target rules out is drawn, and the total-variation
distance between the empirical and the enumerated distribution is at most
`tv_bound(exact, N, FALSE_ALARM)` (a McDiarmid bound, see there: a correct sampler fails with
probability at most FALSE_ALARM per check). A sampler whose distribution is at TV distance D from
the target's fails with probability at least 1 - FALSE_ALARM once D > `detectable_tv` =
tv_bound(exact) + tv_bound(uniform over all 216). With N = 40,000 and FALSE_ALARM = 1e-6 the bound
is 0.024 to 0.032 for the three settings here and detectable_tv 0.074 to 0.082 (samples of the
correct decodes are at 0.008 to 0.016). Negative controls, decodes with a planted bug that the same
check must reject, their own distributions enumerated too (and asserted to be beyond detectable_tv
first): top-p applied before top-k (TV 0.24 from the target's), every draft accepted (TV 0.67).

Tiers: the fast tier runs the NumPy-forward check, speculative decoding on XLA with both filters and
the top-p-first control on the baseline (a few seconds each, mostly compiling); the other settings,
paths, modes and controls are slow (each (mode, path) compiles once; the settings are run-time
values of one static strategy).
"""

import dataclasses

import jax
import jax.numpy as jnp
import model_utils
import numpy as np
import pytest

from speculative import drafters
from speculative import sampling as sampling_lib
from speculative.decode import loops as decoding
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config
from speculative.models.t5 import pack_decode_params

VOCAB, NEW, GAMMA = 6, 3, 2
SAMPLES = 40_000
FALSE_ALARM = 1e-6
SOURCE = np.array([3, 5, 2, 4, 1], np.int32)  # no padding: every encoder position is attended
CONFIG = T5Config(
  vocab_size=VOCAB,
  emb_dim=16,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=2,
  head_dim=8,
  mlp_dim=32,
)
DRAFT_CONFIG = dataclasses.replace(CONFIG, num_decoder_layers=1)
TARGET_LAYER_1_SCALE = 0.5  # the draft is the target without this (down-scaled) decoder layer
SETTINGS = {
  'top_k': dict(top_k=3),
  'top_p': dict(top_p=0.8),
  'top_k+top_p': dict(top_k=4, top_p=0.7),
}


# ------------------------------------------------------------------------------------------------
# The independent computation: T5 v1.1 in NumPy, the filters, the enumerated distribution.
# ------------------------------------------------------------------------------------------------
def _rms_norm(x, scale):
  return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * scale


def _mlp(p, x):  # gated GELU (tanh approximation): gelu(x wi_0) * (x wi_1), then wo
  a = x @ p['wi_0']['kernel']
  gelu = 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a**3)))
  return (gelu * (x @ p['wi_1']['kernel'])) @ p['wo']['kernel']


def _attention(p, x, memory, bias, config):
  """x [N, Tq, d] attends to memory [N, Tk, d]; bias [H, Tq, Tk] (-inf = masked). T5 folds
  1/sqrt(head_dim) into the query weights, so the logits are not scaled here."""
  heads, dh = config.num_heads, config.head_dim
  split = lambda y: y.reshape(y.shape[:2] + (heads, dh))  # noqa: E731
  q, k, v = (
    split(inp @ p[n]['kernel']) for inp, n in ((x, 'query'), (memory, 'key'), (memory, 'value'))
  )
  logits = np.einsum('nqhd,nkhd->nhqk', q, k) + bias
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  out = np.einsum('nhqk,nkhd->nqhd', weights, v)
  return out.reshape(out.shape[:2] + (heads * dh,)) @ p['out']['kernel']


def _bucket(relative, bidirectional, num_buckets=32, max_distance=128):
  """T5's relative position bucket of key position - query position (Raffel et al. 2020)."""
  distance, bucket = -relative, 0
  if bidirectional:
    num_buckets //= 2
    bucket = num_buckets if distance < 0 else 0
    distance = abs(distance)
  else:
    distance = max(distance, 0)
  exact = num_buckets // 2
  if distance < exact:
    return bucket + distance
  log_bucket = exact + int(
    np.log(distance / exact) / np.log(max_distance / exact) * (num_buckets - exact)
  )
  return bucket + min(log_bucket, num_buckets - 1)


def _position_bias(rel_embedding, length, bidirectional):
  """[H, T, T] relative position biases; causal (not bidirectional): -inf on future keys."""
  bias = np.empty((rel_embedding.shape[0], length, length))
  for i in range(length):
    for j in range(length):
      bias[:, i, j] = rel_embedding[:, _bucket(j - i, bidirectional)]
      if not bidirectional and j > i:
        bias[:, i, j] = -np.inf
  return bias


def numpy_t5_logits(params, config, source, decoder_inputs):
  """Teacher-forced logits [N, T, V] (float64) of decoder_inputs [N, T] given one source [S]."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  embed = p['token_embedder']['embedding']
  enc, dec = p['encoder'], p['decoder']
  x = embed[source][None]  # [1, S, d]
  bias = _position_bias(enc['relpos_bias']['rel_embedding'], len(source), True)
  for i in range(config.num_encoder_layers):
    layer = enc[f'layers_{i}']
    h = _rms_norm(x, layer['pre_attention_layer_norm']['scale'])
    x = x + _attention(layer['attention'], h, h, bias, config)
    x = x + _mlp(layer['mlp'], _rms_norm(x, layer['pre_mlp_layer_norm']['scale']))
  encoded = _rms_norm(x, enc['encoder_norm']['scale'])
  encoded = np.broadcast_to(encoded, (len(decoder_inputs),) + encoded.shape[1:])  # [N, S, d]
  y = embed[decoder_inputs]  # [N, T, d]
  bias = _position_bias(dec['relpos_bias']['rel_embedding'], decoder_inputs.shape[1], False)
  for i in range(config.num_decoder_layers):
    layer = dec[f'layers_{i}']
    h = _rms_norm(y, layer['pre_self_attention_layer_norm']['scale'])
    y = y + _attention(layer['self_attention'], h, h, bias, config)
    h = _rms_norm(y, layer['pre_cross_attention_layer_norm']['scale'])
    y = y + _attention(layer['encoder_decoder_attention'], h, encoded, 0.0, config)
    y = y + _mlp(layer['mlp'], _rms_norm(y, layer['pre_mlp_layer_norm']['scale']))
  return _rms_norm(y, dec['decoder_norm']['scale']) @ dec['logits_dense']['kernel']


def filtered(logits, top_k=0, top_p=1.0, top_p_first=False):
  """Temperature-1 next-token distributions [..., V] of logits [..., V] under a top-k filter (the
  k largest logits; 0 = off), then a top-p filter on the renormalized result (the smallest set of
  most likely tokens whose mass reaches top_p; 1 = off). `top_p_first` swaps the two (wrong: the
  negative control). Checks that no filter decision is within float32 rounding of its boundary,
  where the decode (float32) and this (float64) could legitimately disagree."""
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)

  def keep_top_k(p):
    if not top_k:
      return p
    ranked = -np.sort(-p, axis=-1)
    kth, next_ = ranked[..., top_k - 1 : top_k], ranked[..., top_k : top_k + 1]
    # The k-th and the next token's logits at least 1e-4 apart (where the next one is not
    # filtered out already), far beyond the decode's float32 rounding.
    assert np.all((next_ == 0) | (kth > next_ * np.exp(1e-4))), 'a near tie at top_k'
    p = np.where(p >= kth, p, 0.0)
    return p / p.sum(-1, keepdims=True)

  def keep_top_p(p):
    if top_p >= 1:
      return p
    order = np.argsort(-p, axis=-1)
    ranked = np.take_along_axis(p, order, -1)
    before = np.cumsum(ranked, -1) - ranked  # mass of the more likely tokens
    assert np.all(np.abs(before - top_p) > 1e-4), 'a cumulative mass at top_p'
    kept = np.zeros_like(p)
    np.put_along_axis(kept, order, np.where(before < top_p, ranked, 0.0), -1)
    return kept / kept.sum(-1, keepdims=True)

  return keep_top_k(keep_top_p(probs)) if top_p_first else keep_top_p(keep_top_k(probs))


def decoder_inputs():
  """[V^3, 3] every continuation (all_continuations' order) shifted right after the start token 0."""
  continuations = model_utils.all_continuations(VOCAB, NEW)
  return np.concatenate([np.zeros((len(continuations), 1), np.int32), continuations[:, :-1]], 1)


def teacher_forced(params, config):
  """NumPy logits [V^3, 3, V] at every prefix of every continuation."""
  return numpy_t5_logits(params, config, SOURCE, decoder_inputs())


def sequence_distribution(next_token_probs):
  """P(continuation) [V^3] from next-token distributions [V^3, 3, V] at its prefixes."""
  return model_utils.sequence_probs(next_token_probs, model_utils.all_continuations(VOCAB, NEW))


def tv_bound(exact, n, false_alarm):
  """A TV distance that the empirical distribution of n samples of `exact` exceeds with
  probability at most `false_alarm`: E ||p_hat - p||_1 <= sum_i sqrt(p_i (1 - p_i) / n) (Jensen),
  and one sample moves ||p_hat - p||_1 by at most 2/n, so McDiarmid gives
  P(||p_hat - p||_1 >= E + t) <= exp(-n t^2 / 2); TV is half the L1 distance."""
  expected = np.sum(np.sqrt(exact * (1 - exact) / n))
  return 0.5 * (expected + np.sqrt(2 * np.log(1 / false_alarm) / n))


def detectable_tv(exact, n, false_alarm):
  """A sampler at TV distance above this from `exact` fails the check with probability at least
  1 - false_alarm: its own empirical distance to its distribution is below tv_bound of the uniform
  distribution (the largest sum of sqrt(q_i (1 - q_i)) over V^3 outcomes) but for that chance."""
  uniform = np.full(VOCAB**NEW, 1.0 / VOCAB**NEW)
  return tv_bound(exact, n, false_alarm) + tv_bound(uniform, n, false_alarm)


def empirical_tv(tokens, exact):
  counts = model_utils.sequence_counts(tokens, VOCAB)
  return 0.5 * np.abs(counts / counts.sum() - exact).sum(), counts


# ------------------------------------------------------------------------------------------------
# The models and the decodes.
# ------------------------------------------------------------------------------------------------
def _pair():
  """Target (random weights, seed 4) and draft: the target without its second decoder layer,
  whose output projections the target scales by TARGET_LAYER_1_SCALE (their unfiltered next-token
  distributions overlap 0.86 on average; under the filters about 0.56 of the drafts are accepted)."""
  target = T5(CONFIG)
  params = jax.tree.map(np.array, model_utils.random_params(target, 4, logit_scale=1.0))
  layer_1 = params['decoder']['layers_1']
  for projection in (
    layer_1['self_attention']['out'],
    layer_1['encoder_decoder_attention']['out'],
    layer_1['mlp']['wo'],
  ):
    projection['kernel'] *= TARGET_LAYER_1_SCALE
  draft_decoder = {k: v for k, v in params['decoder'].items() if k != 'layers_1'}
  return target, params, T5(DRAFT_CONFIG), {**params, 'decoder': draft_decoder}


TARGET, TARGET_PARAMS, DRAFT, DRAFT_PARAMS = _pair()
# One static strategy for every setting: the run-time values switch the filters off (top_k 0,
# top_p 1), so each (mode, path) compiles once for all three settings.
SAMPLING = sampling_lib.SamplingConfig(top_k=True, top_p=True)
KERNELS_RUN_HERE = model_utils.kernels_run_here_mark()


# The fast tier's case; every other one is slow (each (mode, path) compiles once, a few seconds).
FAST_CASE = ('top_k+top_p', 'xla', 'speculative')


def _cases():
  """(setting, path, mode) for every setting, path and mode."""
  for setting in SETTINGS:
    for path in ('xla', 'kernels'):
      for mode in ('baseline', 'speculative'):
        marks = [] if (setting, path, mode) == FAST_CASE else [pytest.mark.slow]
        marks += [KERNELS_RUN_HERE] if path == 'kernels' else []
        yield pytest.param(setting, path, mode, marks=marks, id=f'{setting}-{path}-{mode}')


@dataclasses.dataclass(frozen=True)
class _ControlT5(T5):
  """T5 under another class, named by its negative control: a jit static argument that no correct
  decode and no other control shares, so the control's decode traces afresh with its planted bug,
  and its program is never reused."""

  control: str = ''


def _decode(mode, path, setting, seed, target=TARGET):
  """SAMPLES continuations [N, 3] of SOURCE from one vectorized decode ('baseline' or
  'speculative'; N rows, each its own PRNG stream) on path 'xla' (plain params) or 'kernels'
  (packed params), and the decode's metrics."""
  target_params, draft_params = TARGET_PARAMS, DRAFT_PARAMS
  if path == 'kernels':
    target_params = pack_decode_params(target, target_params)
    draft_params = pack_decode_params(DRAFT, draft_params)
  common = dict(
    max_new_tokens=NEW,
    sampling=SAMPLING,
    sampling_params=sampling_lib.SamplingParams.create(**SETTINGS[setting]),
    rng=seed,
    eos_id=None,
    encoder_tokens=jnp.asarray(np.tile(SOURCE, (SAMPLES, 1))),
  )
  if mode == 'baseline':
    result = decoding.autoregressive_decode(target, target_params, None, **common)
  else:
    drafter = drafters.ModelDrafter(DRAFT)
    result = decoding.speculative_decode(
      target, target_params, drafter, draft_params, None, gamma=GAMMA, **common
    )
  return np.asarray(result.tokens), jax.tree.map(np.asarray, result.metrics)


def _exact(setting, **wrong):
  """The enumerated distribution [V^3] of the target under `setting` (NumPy throughout)."""
  logits = teacher_forced(TARGET_PARAMS, CONFIG)
  return sequence_distribution(filtered(logits, **SETTINGS[setting], **wrong))


def _verdict(tokens, exact):
  """None when the samples are consistent with `exact`, else why not (the check of the docstring:
  a continuation of probability 0 drawn, or the empirical TV distance above `tv_bound`)."""
  tv, counts = empirical_tv(tokens, exact)
  bound = tv_bound(exact, len(tokens), FALSE_ALARM)
  if counts[exact == 0].sum():
    return f'{int(counts[exact == 0].sum())} samples of continuations of probability 0'
  if tv > bound:
    return f'TV distance {tv:.4f} > {bound:.4f}'
  return None


# ------------------------------------------------------------------------------------------------
# The tests.
# ------------------------------------------------------------------------------------------------
def test_numpy_t5_matches_the_model_forward():
  """The independent forward agrees with `T5.forward` (float32) on every teacher-forced prefix,
  target and draft; and the enumerated distributions are distributions."""
  inputs = jnp.asarray(decoder_inputs())
  encoder = jnp.asarray(np.tile(SOURCE, (len(inputs), 1)))
  for model, params, config in (
    (TARGET, TARGET_PARAMS, CONFIG),
    (DRAFT, DRAFT_PARAMS, DRAFT_CONFIG),
  ):
    want = np.asarray(jax.jit(model.forward)(params, encoder, inputs))
    got = teacher_forced(params, config)
    assert np.abs(got - want).max() < 1e-4, np.abs(got - want).max()
    assert np.ptp(got) > 1.0  # not a degenerate (constant) model
  for setting in SETTINGS:
    assert abs(_exact(setting).sum() - 1) < 1e-9


@pytest.mark.parametrize('setting,path,mode', _cases())
def test_samples_follow_the_enumerated_distribution(monkeypatch, setting, path, mode):
  """SAMPLES continuations of one decode call pass `_verdict` against the NumPy enumeration; the
  speculative decode accepted drafts and rejected some (both branches of the rule ran); the
  compiled decode calls the kernels iff the path is 'kernels'."""
  compiled_hlo = model_utils.record_decode_programs(monkeypatch)
  tokens, metrics = _decode(mode, path, setting, seed={'baseline': 1, 'speculative': 2}[mode])
  assert (verdict := _verdict(tokens, _exact(setting))) is None, verdict
  if mode == 'speculative':
    assert 0 < metrics.accepted.sum() < metrics.drafted.sum()
  calls = model_utils.kernel_calls(compiled_hlo()[mode]).values()
  assert all(calls) if path == 'kernels' else not any(calls), calls


def _accept_always(uniforms, draft_prob, target_prob, lenience=None):
  """The planted bug of a negative control: every draft token accepted."""
  return jnp.ones(uniforms.shape, bool)


def _top_p_first(logits, config, params):
  """The planted bug of a negative control: `probs_from_logits` (temperature 1) with top-p applied
  before top-k."""
  scaled = logits.astype(jnp.float32) - jnp.max(logits, axis=-1, keepdims=True)
  scaled = sampling_lib._top_p_filter(scaled, params.top_p)  # pylint: disable=protected-access
  scaled = sampling_lib._top_k_filter(scaled, params.top_k)  # pylint: disable=protected-access
  return jax.nn.softmax(scaled, axis=-1)


@pytest.mark.parametrize(
  'control,mode',
  [
    ('top_p_first', 'baseline'),
    pytest.param('top_p_first', 'speculative', marks=pytest.mark.slow),
    pytest.param('accept_always', 'speculative', marks=pytest.mark.slow),
  ],
)
def test_the_check_rejects_known_wrong_samplers(monkeypatch, control, mode):
  """Negative controls: a decode with a planted bug, whose output distribution (enumerated in
  NumPy too) is farther from the target's than `detectable_tv`, fails `_verdict` (and passes it
  against its own distribution). top_p_first: top-p applied before top-k (in the target's and the
  draft's distributions). accept_always: every draft accepted, so x1 and x2 come from the draft and
  x3 (the bonus) from the target."""
  setting, exact = 'top_k+top_p', _exact('top_k+top_p')
  if control == 'accept_always':
    monkeypatch.setattr(sampling_lib, 'accept_test', _accept_always)
    target_probs = filtered(teacher_forced(TARGET_PARAMS, CONFIG), **SETTINGS[setting])
    draft_probs = filtered(teacher_forced(DRAFT_PARAMS, DRAFT_CONFIG), **SETTINGS[setting])
    wrong = sequence_distribution(
      np.concatenate([draft_probs[:, :GAMMA], target_probs[:, GAMMA:]], 1)
    )
  else:
    monkeypatch.setattr(sampling_lib, 'probs_from_logits', _top_p_first)
    wrong = _exact(setting, top_p_first=True)
  distance = 0.5 * np.abs(wrong - exact).sum()
  assert distance > detectable_tv(exact, SAMPLES, FALSE_ALARM)  # the control is within reach
  target = _ControlT5(CONFIG, control=control)
  tokens, _ = _decode(mode, 'xla', setting, seed=3, target=target)
  assert _verdict(tokens, exact) is not None
  assert _verdict(tokens, wrong) is None  # and the planted bug is what ran


def test_auto_gamma_batches_sample_exactly(monkeypatch):
  """GAMMA = 'auto': SAMPLES rows of SOURCE in two batches, each decoded by the program
  `infer.auto_gamma.AutoGamma` runs for the gamma it chose (forced here to 0, plain decoding, then
  2), its choices observed in between: together the samples pass `_verdict` against the NumPy
  enumeration under top-k and top-p (XLA's dot). The choice depends only on finished batches, so
  each batch is an exact sampler whatever it chose."""
  from speculative.autogamma import costs as costs_lib
  from speculative.autogamma import policy
  from speculative.decode import modes
  from speculative.decode import options as decode_options
  from speculative.infer import auto_gamma

  setting = 'top_k+top_p'
  options = decode_options.DecodeOptions(max_new_tokens=NEW, sampling=SAMPLING, eos_id=None)
  params = sampling_lib.SamplingParams.create(**SETTINGS[setting])

  def fns_for_gamma(gamma):
    fns = modes.decode_fns(
      TARGET,
      TARGET_PARAMS,
      drafters.ModelDrafter(DRAFT) if gamma else None,
      DRAFT_PARAMS,
      options=dataclasses.replace(options, gamma=gamma or None),
      sampling_params=params,
    )
    return fns['speculative' if gamma else 'baseline']

  costs = costs_lib.Costs(((0, 1e-3), (1, 1.1e-3)), 2)
  times = model_utils.loop_times(costs)
  calibration = costs_lib.Calibration(times, costs, 'k', {'gamma_max': 2}, 'cache')
  auto = auto_gamma.AutoGamma(calibration, fns_for_gamma, cache_path='unused', plain_beside=False)
  forced = iter([0, 2])
  monkeypatch.setattr(
    policy, 'choose', lambda costs, state: policy.Choice(next(forced), policy.BEST, 0.5, {})
  )
  half = SAMPLES // 2
  samples = []
  for batch in range(2):
    choice = auto.choose()
    result = auto.decode_fn(choice.gamma)(jnp.asarray(np.tile(SOURCE, (half, 1))), 10 + batch)
    metrics = jax.tree.map(np.asarray, result.metrics)
    auto.observe(
      choice,
      [
        {
          'drafted': metrics.drafted.sum(),
          'alpha_sum': metrics.alpha_sum.sum(),
          'index': batch,
          'decode_s': 0.0,
          'target_calls': 1,
          'num_tokens': NEW,
        }
      ],
    )
    samples.append(np.asarray(result.tokens))
  assert [b.choice.gamma for b in auto.batches] == [0, 2]
  assert auto.state.drafted > 0  # the gamma-2 batch drafted and was observed
  assert (verdict := _verdict(np.concatenate(samples), _exact(setting))) is None, verdict
