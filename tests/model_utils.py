"""Shared test helpers for tiny random models and exact sequence-distribution tests."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np


def random_params(model, seed, logit_scale=1.0):
  """Random weights with the real init's shapes and scales, without compiling an initializer (fast).

  `logit_scale` multiplies the output projection: larger values give peakier distributions.
  """
  rng = np.random.default_rng(seed)
  shapes = jax.eval_shape(model.init_params, jax.random.key(0))

  def make(path, leaf):
    name = jax.tree_util.keystr(path)
    if leaf.ndim == 1:
      value = np.ones(leaf.shape) if 'scale' in name else np.zeros(leaf.shape)
    elif 'embedder' in name:
      value = rng.normal(size=leaf.shape)
    else:
      value = rng.normal(size=leaf.shape) / np.sqrt(leaf.shape[0])
      if 'logits_dense' in name:
        value = value * logit_scale
    return jnp.asarray(value, jnp.float32)

  return jax.tree_util.tree_map_with_path(make, shapes)


def pooled_chi_square(counts, exact):
  """Chi-square of observed `counts` against `len(samples) * exact` probabilities.

  Bins with expected count >= 5 are kept; the smaller ones are pooled into one bin so the
  chi-square approximation holds. Returns (statistic, degrees of freedom, p-value).
  """
  from scipy import stats

  expected = counts.sum() * exact
  big = expected >= 5
  observed_bins = np.append(counts[big], counts[~big].sum())
  expected_bins = np.append(expected[big], expected[~big].sum())
  keep = expected_bins > 0
  statistic = np.sum((observed_bins[keep] - expected_bins[keep]) ** 2 / expected_bins[keep])
  dof = keep.sum() - 1
  return statistic, dof, stats.chi2.sf(statistic, dof)


def all_continuations(vocab, length):
  """Every token sequence of `length` over `vocab`: [vocab**length, length] int32, row i spelling i
  in base `vocab` (the index `sequence_counts` uses)."""
  return np.array(list(itertools.product(range(vocab), repeat=length)), np.int32)


def sequence_probs(probs, continuations):
  """P(continuation) from the model's distributions at its positions.

  probs: [N, length, V], row n's next-token distributions given continuations[n]'s prefixes;
  continuations: [N, length] int32. Returns [N] float64, the product over positions.
  """
  per_token = np.take_along_axis(np.asarray(probs), continuations[..., None], axis=-1)[..., 0]
  return per_token.astype(np.float64).prod(axis=1)


def sequence_counts(tokens, vocab):
  """How often each continuation was sampled: tokens [S, length] -> [vocab**length] float64,
  indexed like `all_continuations`."""
  tokens = np.asarray(tokens)
  index = (tokens * vocab ** np.arange(tokens.shape[1] - 1, -1, -1)).sum(1)
  return np.bincount(index, minlength=vocab ** tokens.shape[1]).astype(np.float64)


def tiny_t5_config(decoder_layers):
  """A tiny T5Config on the shipped 8k vocabulary (the infer and job-safety tests' target and draft)."""
  from speculative.models.t5 import T5Config

  return T5Config(
    vocab_size=8000,
    dtype="float32",
    emb_dim=16,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=decoder_layers,
    head_dim=8,
    mlp_dim=32,
    mlp_activations=("gelu", "linear"),
    dropout_rate=0.0,
    logits_via_embedding=False,
    float32_attention_logits=False,
  )


# The correlated tiny pair of the job-level tests. Two unrelated random T5s agree on almost no greedy
# token (alpha 0, every row to the length cap), so a job's "identical outputs" would never involve
# an accepted draft, a bonus token, a rollback after a partial accept or an EOS. Here the draft IS
# the target minus its second decoder layer, whose output projections the target scales by
# TARGET_LAYER_1_SCALE (a perturbation: the draft agrees with it often, not always), and the shared
# logits head's EOS column is rescaled to norm EOS_COLUMN_NORM (the other columns' norms are about
# 1), so EOS is the argmax in some decoder states. With PAIR_SEED, test_infer's six sentences at a
# 12-token cap and gamma 3 give: three rows end with EOS after 6 to 8 tokens, three run to the cap,
# acceptance rate about 0.4, blocks of all three drafts accepted and partial accepts (the seed and
# scales were chosen for that; `speculation_events` checks it in every job test).
PAIR_SEED = 4
TARGET_LAYER_1_SCALE = 0.3
EOS_COLUMN_NORM = 1.7
EOS_ID = 1  # T5's EOS (speculative.data.tasks.EOS_ID)


@functools.cache
def _pair_init():
  """The target's initial weights (T5.init_params at PAIR_SEED) as numpy arrays, made once per
  process: many tests save the pair, and each module releases the compiled initializer."""
  from speculative.models.t5 import T5

  # The initializer does not depend on the activations' dtype: one init serves both dtypes.
  init = T5(tiny_t5_config(2)).init_params(jax.random.PRNGKey(PAIR_SEED))
  return jax.tree.map(np.array, init)


def correlated_tiny_pair(dtype="float32"):
  """(target config, target params, draft config, draft params) of the correlated pair (above):
  `tiny_t5_config(2)` and `tiny_t5_config(1)` with `dtype` (the activations' T5Config dtype; the
  weights are float32 either way), params as nested dicts of float32 numpy arrays."""
  import copy
  import dataclasses

  params = copy.deepcopy(_pair_init())  # a fresh copy: scaled in place below, and by callers
  target = dataclasses.replace(tiny_t5_config(2), dtype=dtype)
  draft = dataclasses.replace(tiny_t5_config(1), dtype=dtype)
  layer_1 = params["decoder"]["layers_1"]
  for projection in (
    layer_1["self_attention"]["out"],
    layer_1["encoder_decoder_attention"]["out"],
    layer_1["mlp"]["wo"],
  ):
    projection["kernel"] *= TARGET_LAYER_1_SCALE
  logits = params["decoder"]["logits_dense"]["kernel"]  # [d, V]
  logits[:, EOS_ID] *= EOS_COLUMN_NORM / np.linalg.norm(logits[:, EOS_ID])
  draft_params = copy.deepcopy(params)  # everything but the second decoder layer, shared
  del draft_params["decoder"]["layers_1"]
  return target, params, draft, draft_params


# The translation job's inputs of the job tests (tests/infer/), decoded by the correlated tiny pair.
JOB_SOURCES = [
  "Click OK.",
  "Open the file menu and choose Save.",
  "Hello",
  "Select a cell range.",
  "Press Enter to perform the search.",
  "Choose Format - Cells.",
]


JOB_MAX_NEW_TOKENS = 12


def tiny_job(root, sources=JOB_SOURCES, **settings):
  """`infer.infer`'s keyword arguments for a job of `sources` on the correlated tiny pair saved
  under `root` (`save_tiny_pair`): 24 input tokens, JOB_MAX_NEW_TOKENS new, no progress bar, then
  `settings`."""
  return dict(
    **save_tiny_pair(root, sources, record_config=False),
    input_prefix="translate English to German: ",
    task_feature_lengths={"inputs": 24, "targets": JOB_MAX_NEW_TOKENS},
    progress=False,
    **settings,
  )


def save_tiny_pair(root, sources, *, record_config, dtype="float32"):
  """The correlated tiny pair (`correlated_tiny_pair`: target 2 decoder layers, draft 1) as
  root/{t,d}.msgpack and `sources` as root/in.tsv (reference "Ref i"); returns the infer keyword
  arguments that name them. With `record_config` the weights carry their config sidecar."""
  from speculative import checkpoints

  target, target_params, draft, draft_params = correlated_tiny_pair(dtype)
  for config, params, name in (
    (target, target_params, "t.msgpack"),
    (draft, draft_params, "d.msgpack"),
  ):
    checkpoints.save_params(
      params, root / name, dtype=None, config=config if record_config else None
    )
  (root / "in.tsv").write_text("".join(f"{s}\tRef {i}\n" for i, s in enumerate(sources)))
  return dict(
    target_config=target,
    target_checkpoint=str(root / "t.msgpack"),
    draft_config=draft,
    draft_checkpoint=str(root / "d.msgpack"),
    input_file=str(root / "in.tsv"),
  )


def speculation_events(spec_records, gamma, max_new_tokens):
  """What a greedy job's speculative records show happened, from each example's totals (a model
  drafter proposes gamma tokens at every target call, checked here):

    accepted, drafted  the totals
    bonus              examples with a block of all gamma drafts accepted (then the target's token
                       after them is the bonus): accepted > (gamma - 1) * calls, by pigeonhole
    partial            examples with a block of 0 < n < gamma accepted drafts (the rejected drafts'
                       cache entries rolled back): accepted is no multiple of gamma, which blocks of
                       0 or gamma alone cannot give
    eos                examples that ended with EOS before the length cap
    capped             examples that ran to the length cap
  """
  for r in spec_records:
    assert r["drafted"] == gamma * r["target_calls"], r
  return dict(
    accepted=sum(r["accepted"] for r in spec_records),
    drafted=sum(r["drafted"] for r in spec_records),
    bonus=[r["index"] for r in spec_records if r["accepted"] > (gamma - 1) * r["target_calls"]],
    partial=[r["index"] for r in spec_records if r["accepted"] % gamma],
    eos=[
      r["index"]
      for r in spec_records
      if r["tokens"][-1] == EOS_ID and r["num_tokens"] < max_new_tokens
    ],
    capped=[r["index"] for r in spec_records if r["num_tokens"] == max_new_tokens],
  )


def assert_speculation_exercised(spec_records, gamma, max_new_tokens):
  """Drafts were accepted and rejected, some block got its bonus token, some was accepted in part,
  and the rows ended ragged: some at EOS before the cap, some at the cap (`speculation_events`)."""
  events = speculation_events(spec_records, gamma, max_new_tokens)
  assert 0 < events["accepted"] < events["drafted"], events
  assert events["bonus"] and events["partial"], events
  assert events["eos"] and events["capped"], events
  return events


# The CPU kernels' FFI targets (speculative/kernels/library.py) as they appear in compiled HLO.
KERNEL_TARGETS = (
  "speculative_packed_matmul",
  "speculative_decode_attention",
  "speculative_rms_norm",
)


def kernel_calls(hlo_text):
  """{FFI target: how many custom calls to it} in a compiled program's HLO text."""
  return {t: hlo_text.count(f'custom_call_target="{t}"') for t in KERNEL_TARGETS}


def record_decode_programs(monkeypatch):
  """Records the first call of each jitted decode loop (baseline and speculative,
  speculative/decode/loops.py) from here on; returns a function that compiles each call recorded
  since it was last called again and returns {mode: the compiled program's HLO text}: what that
  call executed."""
  from speculative.decode import loops

  seen = {}
  for mode, name in (("baseline", "_autoregressive_jit"), ("speculative", "_speculative_jit")):
    real = getattr(loops, name)

    def recorder(*args, _real=real, _mode=mode, **kwargs):
      seen.setdefault(_mode, (_real, args, kwargs))
      return _real(*args, **kwargs)

    monkeypatch.setattr(loops, name, recorder)

  def compiled_hlo():
    hlo = {
      mode: real.lower(*args, **kwargs).compile().as_text()
      for mode, (real, args, kwargs) in seen.items()
    }
    seen.clear()
    return hlo

  return compiled_hlo


def assert_path_ran(out, summary, hlo_by_mode):
  """The path the manifest and report name is the one the compiled decodes execute: the kernels'
  custom calls in both modes' programs iff the job says 'kernels' (a job that skipped packing the
  weights would run XLA's dot under a report that says CPU kernels)."""
  import json

  path = json.loads((out / "manifest.json").read_text())["decode_path"]
  assert path in ("kernels", "xla")
  assert summary["decode_path"].startswith("CPU kernels" if path == "kernels" else "XLA dot")
  assert f"Decode path: {summary['decode_path']}" in (out / "report.md").read_text()
  assert sorted(hlo_by_mode) == sorted(("baseline", "speculative"))
  for mode, hlo in hlo_by_mode.items():
    calls = kernel_calls(hlo)
    if path == "kernels":
      assert all(calls.values()), f"{mode}: the job reports the kernels but runs {calls}"
    else:
      assert not any(calls.values()), f"{mode}: the job reports XLA but runs {calls}"


def kernels_cannot_run_here() -> str | None:
  """Why the CPU kernels' tests cannot run on this machine, or None: the job computes on a GPU or
  TPU (the kernels' FFI handlers are CPU's), the host cannot build them (not x86-64, no C++
  compiler, no XLA FFI headers), or SPECULATIVE_KERNELS=0 turned them off. Anywhere else the tests
  run, so a library that is missing, stale or does not load fails them instead of skipping: that
  is an install that was not (re)built (`make install`), not a limit of the machine."""
  from speculative.kernels import build
  from speculative.kernels import library
  from speculative.kernels import policy

  if library.switched_off():
    return library.status()
  return policy.off_cpu() or build.unbuildable()


def kernels_run_here_mark():
  """A skipif mark for the tests that need the CPU kernels (`kernels_cannot_run_here`)."""
  import pytest

  reason = kernels_cannot_run_here()
  return pytest.mark.skipif(reason is not None, reason=f"CPU kernels cannot run here: {reason}")


def loop_times(costs, steps=None):
  """`autogamma.costs.LoopTimes` whose costs are `costs`: each gamma's loop timed over `steps`
  loop steps (default MIN_STEPS), no stepless call (what a cache entry holds)."""
  from speculative.autogamma import costs as costs_lib

  steps = steps or costs_lib.MIN_STEPS
  own = [costs_lib.BatchTiming()] * (costs.gamma_max + 1)
  for gamma, step in costs.loop_steps:
    own[gamma] = costs_lib.BatchTiming(step * steps, steps)
  return costs_lib.LoopTimes(tuple(own), (costs_lib.BatchTiming(),) * len(own))
