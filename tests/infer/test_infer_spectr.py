"""SpecTr as a method of the batch job (METHOD = 'spectr', NUM_DRAFTS = K): K = 1 is speculative
decoding token for token, K > 1 samples the target's distribution through the job's decode path
(with a negative control the test rejects), the manifest, metrics and report, and every refusal.

Run (repository root): .venv/bin/python -m pytest -q -n 0 tests/infer/test_infer_spectr.py
"""

import json

import jax
import jax.numpy as jnp
import model_utils
from model_utils import save_tiny_pair
import numpy as np
import pytest
from scipy import stats

from speculative import drafters
from speculative import infer
from speculative.infer import run as infer_run
from speculative.infer import settings as infer_settings
from speculative.models import t5 as t5_lib
from speculative.spectr import sequence as spectr_sequence

SOURCES = model_utils.JOB_SOURCES
L = 3


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("spectr_job")
  kwargs = model_utils.tiny_job(
    root, batch_size=2, gamma=L, temperature=1.0, seed=3, method="spectr"
  )
  return root, kwargs


def _records(out, mode):
  return [json.loads(line) for line in (out / f"predictions-{mode}.jsonl").open()]


def test_k1_is_speculative_decoding_and_a_resume_with_another_k_or_method_is_refused(setup):
  """K = 1 at temperature 1, batch 2: predictions-spectr.jsonl holds the speculative mode's
  tokens, predictions and target calls on every example (same seed); the manifest records method
  and K, so the same directory with K = 2 or METHOD = 'speculative' is refused, naming the field."""
  root, kwargs = setup
  out = root / "k1"
  summary = infer.infer(output_dir=str(out), num_drafts=1, **kwargs)
  spec, spectr = _records(out, "speculative"), _records(out, "spectr")
  fields = ("index", "tokens", "prediction", "num_tokens", "target_calls", "drafted", "accepted")
  assert [{k: r[k] for k in fields} for r in spectr] == [{k: r[k] for k in fields} for r in spec]
  # Sampling at temperature 1 really happened: the baseline (other random numbers) differs.
  assert [r["tokens"] for r in _records(out, "baseline")] != [r["tokens"] for r in spec]
  events = model_utils.speculation_events(spectr, L, 12)  # sampled: every row runs to the cap
  assert 0 < events["accepted"] < events["drafted"] and events["bonus"] and events["partial"]
  assert summary["spectr"]["identical_to_speculative"] == len(SOURCES)
  assert (summary["method"], summary["num_drafts"], summary["spectr"]["L"]) == ("spectr", 1, L)
  manifest = json.loads((out / "manifest.json").read_text())
  assert (manifest["method"], manifest["num_drafts"], manifest["gamma"]) == ("spectr", 1, L)
  with pytest.raises(ValueError, match=r"(?s)different settings.*num_drafts: was 1, now 2"):
    infer.infer(output_dir=str(out), num_drafts=2, **kwargs)
  with pytest.raises(ValueError, match=r'(?s)different settings.*method: was "spectr", now null'):
    infer.infer(output_dir=str(out), **{**kwargs, "method": "speculative"})


def test_k2_job_reports_method_acceptance_and_walltime(setup):
  """K = 2 at batch 2 (4 rows a SpecTr call): block efficiency in [1, L+1] with its interval, the
  acceptance with K drafts at least one draft's at the same conditionals, drafted and accepted
  counts, the walltime against the baseline and speculative; metrics.json and report.md say so."""
  root, kwargs = setup
  out = root / "k2"
  summary = infer.infer(output_dir=str(out), num_drafts=2, **kwargs)
  m = summary["spectr"]
  assert (m["K"], m["L"], m["method"]) == (2, L, "spectr")
  assert 1.0 <= m["block_efficiency"] <= L + 1
  low, high = m["block_efficiency_ci95"]
  assert low <= m["block_efficiency"] <= high
  assert m["alpha"] >= m["alpha_one_draft"] - 1e-6 and 0 < m["alpha_one_draft"] < 1
  assert 0 < m["accepted"] <= m["drafted"] and m["selections"] > 0
  assert m["drafted"] == L * m["target_calls"]
  for other in ("baseline", "speculative"):
    assert m[f"speedup_per_token_vs_{other}"] > 0
  assert json.loads((out / "metrics.json").read_text())["spectr"]["K"] == 2
  report = (out / "report.md").read_text()
  assert "method spectr (K = 2 drafts of L = 3 tokens)" in report
  assert "| spectr |" in report and "with one draft at the same conditionals" in report
  assert "against baseline" in report and "against speculative" in report
  assert summary["decode_path"].startswith("CPU kernels") == ("batch 4" in summary["decode_path"])


# Refusals: one line naming the setting, before any model loads (the command line's exit status 2
# is `checks.user_errors`' for every ValueError of the settings; one CLI case below).
REFUSALS = [
  (dict(num_drafts=0), r"^num_drafts \(NUM_DRAFTS\) must be in \[1, 8\], got 0$"),
  (dict(num_drafts=9), r"^num_drafts \(NUM_DRAFTS\) must be in \[1, 8\], got 9$"),
  (dict(method="medusa"), r"^unknown method \(METHOD\) 'medusa'"),
  (dict(method="speculative", num_drafts=2), r"^num_drafts \(NUM_DRAFTS\) = 2 needs method"),
  (dict(drafter="prompt_lookup"), r"^method \(METHOD\) = 'spectr': drafter 'prompt_lookup' is det"),
  (dict(drafter="prompt_lookup+model"), r"^method \(METHOD\) = 'spectr': drafter 'prompt_lookup\+"),
  (dict(temperature=0.0), r"^method \(METHOD\) = 'spectr': at temperature 0 "),
  (dict(draft_stop_below=0.5), r"^method \(METHOD\) = 'spectr': draft_stop_below"),
  (dict(adaptive_verify=True), r"^method \(METHOD\) = 'spectr': adaptive_verify"),
  (dict(lenience=0.5), r"^method \(METHOD\) = 'spectr': lenience"),
  (dict(modes=("baseline",)), r"^method \(METHOD\) = 'spectr': SpecTr is decoded beside"),
  (dict(method="speculative", drafter="bigram"), r"^drafter 'bigram' is benchmark-only"),
  (dict(drafter="unigram"), r"^drafter 'unigram' is benchmark-only"),
]


@pytest.mark.parametrize("change, message", REFUSALS)
def test_bad_settings_are_refused_in_one_line_before_any_model_loads(
  setup, tmp_path, monkeypatch, change, message
):
  from speculative import checkpoints

  _, kwargs = setup
  monkeypatch.setattr(
    checkpoints, "load_model", lambda *a, **k: pytest.fail("weights loaded before the refusal")
  )
  with pytest.raises(ValueError, match=message) as refused:
    infer.infer(output_dir=str(tmp_path / "job"), **{**kwargs, "num_drafts": 2, **change})
  assert "\n" not in str(refused.value)
  assert not (tmp_path / "job").exists()


def test_gamma_auto_with_spectr_is_refused(setup, tmp_path):
  """GAMMA = 'auto' (a one-draft gamma chosen from measured costs) is refused with SpecTr in one
  line naming it, before any model loads."""
  _, kwargs = setup
  with pytest.raises(ValueError, match=r"^method \(METHOD\) = 'spectr': GAMMA must be an integer"):
    infer_settings.InferSettings(
      output_dir=str(tmp_path), **{**kwargs, "gamma": "auto", "num_drafts": 2}
    )


def test_the_kernels_batch_policy_counts_k_times_b_rows(setup, tmp_path):
  _, kwargs = setup
  s = infer_settings.InferSettings(
    output_dir=str(tmp_path), **{**kwargs, "batch_size": 8, "num_drafts": 2}
  )
  assert s.decode_rows == 16 and s.job_modes == ("baseline", "speculative", "spectr")
  assert s.decode_path().name == "xla"
  one = infer_settings.InferSettings(
    output_dir=str(tmp_path), **{**kwargs, "method": "speculative"}
  )
  assert one.decode_rows == 2 and one.job_modes == ("baseline", "speculative")
  assert "method" not in one.output_settings() and "num_drafts" not in one.output_settings()
  assert s.output_settings()["method"] == "spectr" and s.output_settings()["num_drafts"] == 2


# ----------------------------------------------------------------------------------------------
# Exactness through the job's decode path.
# ----------------------------------------------------------------------------------------------
# A tiny encoder-decoder pair with a 6-token vocabulary, so every outcome of 3 new tokens (each
# sequence cut after its first EOS) can be enumerated with its exact probability under the target.
VOCAB, NEW, SAMPLES, K = 6, 3, 24_000, 3
FALSE_FAILURE_RATE = 1e-4


def _tiny_t5(decoder_layers, scale_seed):
  config = t5_lib.T5Config(
    vocab_size=VOCAB,
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
  model = t5_lib.T5(config)
  return model, model_utils.random_params(model, scale_seed, logit_scale=1.5)


def _outcome_index(tokens):
  """[S, NEW] tokens (0 after EOS) -> [S] outcome ids: the base-V number of the tokens up to and
  including the first EOS (1), the rest zeroed."""
  tokens = np.asarray(tokens).copy()
  after_eos = np.cumsum(tokens == 1, axis=1) - (tokens == 1) > 0
  tokens[after_eos] = 0
  return (tokens * VOCAB ** np.arange(NEW - 1, -1, -1)).sum(1)


def _exact_outcome_probs(target, params, encoder_row, temperature):
  """P(outcome) under the target at `temperature`: all V^NEW continuations teacher-forced, each
  continuation's probability summed into its outcome (the free tokens after an EOS sum out)."""
  continuations = model_utils.all_continuations(VOCAB, NEW)
  encoder = jnp.asarray(np.tile(encoder_row, (len(continuations), 1)))
  logits = target.forward(params, encoder, t5_lib.shift_right(jnp.asarray(continuations)))
  probs = jax.nn.softmax(np.asarray(logits, np.float64) / temperature, axis=-1)
  exact = model_utils.sequence_probs(probs, continuations)
  return np.bincount(_outcome_index(continuations), weights=exact, minlength=VOCAB**NEW)


def _job_spectr_samples(tmp_path, target, target_params, draft, draft_params, encoder_row):
  """SAMPLES outcomes of the job's SpecTr mode (`run._decode_fns`: the settings' options and
  modes.decode_fns, as the job decodes) in one batch of SAMPLES rows."""
  pair = save_tiny_pair(tmp_path, SOURCES[:1], record_config=False)  # paths for the settings
  settings = infer_settings.InferSettings(
    output_dir=str(tmp_path / "out"),
    **pair,
    task_feature_lengths={"inputs": len(encoder_row), "targets": NEW},
    batch_size=SAMPLES,
    gamma=2,
    temperature=1.0,
    method="spectr",
    num_drafts=K,
    kernels="off",
  )
  drafter, _ = drafters.build_drafter("model", vocab_size=VOCAB, draft_model=draft)
  models = infer_run.Models(target, target_params, drafter, draft_params)
  decode = infer_run._decode_fns(settings, models)["spectr"]
  encoder = jnp.asarray(np.tile(encoder_row, (SAMPLES, 1)))
  result = decode(encoder, jax.random.PRNGKey(11))
  return result, np.bincount(_outcome_index(result.tokens), minlength=VOCAB**NEW)


@pytest.mark.slow  # 24,000 rows twice, two compiles: 35-75 s on a loaded 2-core machine
def test_spectr_job_samples_the_target_distribution_and_rejects_a_wrong_residual(
  tmp_path, monkeypatch
):
  """Exactness through the job's decode path (K = 3 drafts of L = 2, temperature 1, encoder-decoder):
  the outcome counts of 24,000 rows against the exact outcome distribution by a chi-square test
  whose bins are pooled to an expected count >= 5 (so the chi-square approximation holds at this
  sample size) and whose level is FALSE_FAILURE_RATE = 1e-4: it fails a correct implementation
  once in 10,000 runs. The negative control replaces SpecTr's residual by p (the geometric factor
  of the k-Seq residual forced to 0: after a rejection the token is drawn from p itself, which
  over-weights the drafts' tokens); the same test must reject it."""
  target, target_params = _tiny_t5(2, 21)
  draft, draft_params = _tiny_t5(1, 22)
  encoder_row = np.array([3, 4, 2, 5, 1], np.int32)
  exact = _exact_outcome_probs(target, target_params, encoder_row, 1.0)
  assert abs(exact.sum() - 1) < 1e-6
  result, counts = _job_spectr_samples(
    tmp_path / "exact", target, target_params, draft, draft_params, encoder_row
  )
  assert counts[exact == 0].sum() == 0
  statistic, dof, p_value = model_utils.pooled_chi_square(counts, exact)
  threshold = stats.chi2.isf(FALSE_FAILURE_RATE, dof)
  assert p_value > FALSE_FAILURE_RATE, f"chi2 {statistic:.1f} > {threshold:.1f} on {dof} dof"
  print(f"exact: chi2 {statistic:.1f} on {dof} dof (threshold {threshold:.1f}), p {p_value:.3g}")
  metrics = jax.tree.map(np.asarray, result.metrics)
  alpha = metrics.alpha_sum.sum() / metrics.selections.sum()
  single = metrics.single_alpha_sum.sum() / metrics.selections.sum()
  assert 0.2 < single < 0.9 and alpha > single, (alpha, single)  # rejections happened, K helped

  jax.clear_caches()  # the patched selection must be traced afresh, and not kept after
  monkeypatch.setattr(
    spectr_sequence, "_geometric_sum_counted", lambda beta, count, max_count: jnp.zeros_like(beta)
  )
  try:
    _, wrong = _job_spectr_samples(
      tmp_path / "control", target, target_params, draft, draft_params, encoder_row
    )
  finally:
    jax.clear_caches()
  statistic, dof, p_value = model_utils.pooled_chi_square(wrong, exact)
  assert p_value < FALSE_FAILURE_RATE, f"the control passed: chi2 {statistic:.1f} on {dof} dof"
  print(f"control: chi2 {statistic:.1f} on {dof} dof, p {p_value:.3g}")
