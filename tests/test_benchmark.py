"""Smoke test of the walltime benchmark (speculative/benchmark.py) on tiny random models.

  .venv/bin/python -m pytest -q -p no:xdist tests/test_benchmark.py

One small sweep (batch 1, temperatures 0 and 1, gamma 2; two drafters: the target drafting for
itself through `ModelDrafter`, and a model-free drafter) runs once per module; the tests check the
report's structure and internal consistency (formulas recomputed from the reported counters and
times, exactness counts, files written), never timings.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from speculative import analysis
from speculative import benchmark
from speculative import drafters as drafters_lib
from speculative.models.t5 import T5Config

REPO = Path(__file__).resolve().parents[1]
VOCAB = 64
TARGET = T5Config(vocab_size=VOCAB, emb_dim=16, num_heads=2, num_encoder_layers=1,
                  num_decoder_layers=2, head_dim=8, mlp_dim=32)
DRAFT = T5Config(vocab_size=VOCAB, emb_dim=8, num_heads=2, num_encoder_layers=1,
                 num_decoder_layers=1, head_dim=4, mlp_dim=16)
NUM_EXAMPLES = 3
GAMMA = 2
MAX_NEW_TOKENS = 8


def _self_drafter(ctx: benchmark.DrafterContext):
  """The target drafting for itself: greedy alpha must be exactly 1."""
  return drafters_lib.ModelDrafter(ctx.target), ctx.target_params


@dataclasses.dataclass(frozen=True)
class RepeatLastDrafter:
  """A model-free drafter (like n-gram / prompt lookup): proposes the last committed token gamma
  times, one-hot, with no state; when sampling it proposes nothing (num_drafted = 0, like prompt
  lookup without a match). Exercises the benchmark's paths for drafters that are not models."""
  vocab_size: int

  def init(self, params, prompt_tokens, prompt_lengths, max_length, encoder_tokens=None):
    return jnp.zeros((), jnp.int32)

  def propose(self, params, state, tokens, lengths, gamma, keys, sampling, sampling_params):
    # The decode loop's key contract: one typed PRNG key per row.
    assert keys.shape == lengths.shape and jnp.issubdtype(keys.dtype, jax.dtypes.prng_key)
    last = jnp.take_along_axis(tokens, (lengths - 1)[:, None], axis=1)  # [B, 1]
    draft = jnp.repeat(last, gamma, axis=1)  # [B, gamma]
    probs = jax.nn.one_hot(draft, self.vocab_size, dtype=jnp.float32)  # [B, gamma, V]
    num = jnp.full((tokens.shape[0],), gamma if sampling.greedy else 0, jnp.int32)
    return drafters_lib.DraftProposal(tokens=draft, probs=probs, num_drafted=num), state


def _repeat_last_drafter(ctx: benchmark.DrafterContext):
  return RepeatLastDrafter(ctx.vocab_size), None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  benchmark.register_drafter("self", _self_drafter)
  benchmark.register_drafter("repeat_last", _repeat_last_drafter)
  out = tmp_path_factory.mktemp("bench")
  examples = benchmark.synthetic_examples(NUM_EXAMPLES, inputs_length=10, vocab_size=VOCAB, seed=3)
  report = benchmark.benchmark(
      target_config=TARGET, target_checkpoint=None, draft_config=DRAFT, draft_checkpoint=None,
      examples=examples, num_examples=NUM_EXAMPLES, inputs_length=10,
      max_new_tokens=MAX_NEW_TOKENS, batch_sizes=[1], temperatures=[0.0, 1.0], gammas=[GAMMA],
      drafters=["self", "repeat_last"], drafter_gammas={"repeat_last": {1: [GAMMA]}},
      repeats=2, cost_repeats=2, cost_min_seconds=0.005,
      cost_position=3, allow_random_init=True, output_dir=str(out), verbose=False)
  return report, out


def test_files_written_and_json_matches(run):
  report, out = run
  for name in ("results.json", "results.md", "speedup_vs_gamma.png", "alpha.png"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0, name
  assert json.loads((out / "results.json").read_text()) == report
  markdown = (out / "results.md").read_text()
  for heading in ("## Machine", "## Cost model", "Table 2", "Table 4", "## Targets",
                  "## Profile", "speedup_vs_gamma.png", "alpha.png", "| TASK | M_q | TEMP"):
    assert heading in markdown, heading
  assert report["machine"]["cpu"] and report["machine"]["usable_cores"] >= 1
  assert any("RANDOM-INIT" in w for w in report["warnings"])


def test_cost_model_consistent(run):
  report, _ = run
  cm = report["costs"]["1"]
  assert set(cm["v"]) == {str(t) for t in range(1, GAMMA + 2)}
  assert cm["v"]["1"] == pytest.approx(1.0)
  for t, ratio in cm["v"].items():
    assert ratio == pytest.approx(cm["target_extend_s"][t] / cm["target_step_s"])
  d = cm["drafters"]["self"]  # a ModelDrafter: c from its extend(T=1) call
  assert d["kind"] == "model"
  assert d["c"] == pytest.approx(d["draft_step_s"] / cm["target_step_s"])
  assert d["draft_step_s"] > 0 and d["draft_prefill_s"] > 0
  other = cm["drafters"]["repeat_last"]  # not a model: c from its timed propose(gamma) call
  assert other["kind"] == "propose"
  assert set(other["propose_s"]) == {f"gamma={GAMMA},T=0", f"gamma={GAMMA},T=1"}
  assert all(seconds > 0 for seconds in other["propose_s"].values())
  assert set(cm["loop_matmuls"]) == {"baseline", "stock_equivalent"}
  assert cm["target_step_s_after"] > 0  # re-timed after the sweep (load drift check)


def test_rows_consistent_with_formulas(run):
  report, _ = run
  assert [(g["group"]["batch_size"], g["group"]["temperature"]) for g in report["groups"]] == [
      (1, 0.0), (1, 1.0)]
  cm = report["costs"]["1"]
  for group in report["groups"]:
    temperature = group["group"]["temperature"]
    baselines = {r["name"]: r for r in group["baselines"]}
    assert set(baselines) == {"baseline", "stock_equivalent"}
    base = baselines["baseline"]
    assert base["target_calls"] == base["generated_tokens"]
    assert [r["drafter"] for r in group["speculative"]] == ["self", "repeat_last"]
    for row in group["speculative"]:
      assert row["gamma"] == GAMMA and row["batch_size"] == 1
      assert row["examples"] == NUM_EXAMPLES
      assert len(row["walltime_per_batch_s"]) == NUM_EXAMPLES  # batch 1: one input per batch
      assert row["walltime_s"] == pytest.approx(sum(row["walltime_per_batch_s"]))
      assert row["walltime_min_s"] <= row["walltime_s"] + 1e-12
      assert row["block_efficiency"] == pytest.approx(
          row["generated_tokens"] / row["target_calls"])
      if row["drafter"] == "repeat_last" and temperature > 0:  # nothing drafted
        assert row["drafted_tokens"] == row["accepted_tokens"] == 0
        assert row["acceptance_rate"] is None and row["alpha_used"] == 0.0
        assert row["block_efficiency"] == pytest.approx(1.0)
        assert row["expected_tokens"] == 1.0
      else:
        assert row["acceptance_rate"] == pytest.approx(
            row["accepted_tokens"] / row["drafted_tokens"])
        assert 0.0 <= row["alpha_used"] <= 1.0 and row["alpha_source"] == "distributions"
        assert row["drafted_tokens"] == GAMMA * row["target_calls"]
        assert row["drafted_per_call"] == pytest.approx(GAMMA)
      assert row["measured_speedup"] == pytest.approx(base["walltime_s"] / row["walltime_s"])
      assert row["speedup_vs_stock"] == pytest.approx(
          baselines["stock_equivalent"]["walltime_s"] / row["walltime_s"])
      assert row["speedup_per_token"] == pytest.approx(base["ms_per_token"] / row["ms_per_token"])
      drafter_costs = cm["drafters"][row["drafter"]]
      if drafter_costs["kind"] == "model":
        assert row["c"] == pytest.approx(drafter_costs["c"])
      else:
        propose_s = drafter_costs["propose_s"][f"gamma={GAMMA},T={temperature:g}"]
        assert row["c"] == pytest.approx(propose_s / GAMMA / cm["target_step_s"])
      assert row["v"] == pytest.approx(cm["v"][str(GAMMA + 1)])
      assert row["predicted_speedup"] == pytest.approx(
          float(analysis.walltime_improvement(row["alpha_used"], GAMMA, row["c"], row["v"])))
      assert row["measured_over_predicted"] == pytest.approx(
          row["measured_speedup"] / row["predicted_speedup"])
      p = row["profile"]
      assert p["step_s"] == pytest.approx(p["draft_s"] + p["verify_s"] + p["overhead_s"])
      assert p["verify_s"] == pytest.approx(cm["target_extend_s"][str(GAMMA + 1)])
      assert row["compile_s"] > 0 and row["tokens_per_s"] > 0
      if temperature == 0:  # greedy speculative decoding is exact: token-identical outputs
        assert row["identical_to_baseline"] == NUM_EXAMPLES
      else:
        assert "identical_to_baseline" not in row
    if temperature == 0:  # same inputs, same greedy outputs: the same token counts everywhere
      assert len({r["generated_tokens"] for r in group["baselines"] + group["speculative"]}) == 1
      assert baselines["stock_equivalent"]["identical_to_baseline"] == NUM_EXAMPLES


def test_self_drafting_accepts_everything(run):
  report, _ = run
  for group in report["groups"]:  # q == p: every draft is accepted, at any temperature
    (row,) = [r for r in group["speculative"] if r["drafter"] == "self"]
    assert row["alpha_used"] == pytest.approx(1.0, abs=1e-5)
    assert row["accepted_tokens"] == row["drafted_tokens"]
    # gamma + 1 tokens per target call except where EOS / max_new_tokens cut the last block.
    assert NUM_EXAMPLES <= row["target_calls"] <= NUM_EXAMPLES * math.ceil(
        MAX_NEW_TOKENS / (GAMMA + 1))
    assert row["expected_tokens"] == pytest.approx(GAMMA + 1)


def test_choices_and_targets_structure(run):
  report, _ = run
  assert {(c["temperature"], c["drafter"]) for c in report["choices"]} == {
      (0.0, "self"), (0.0, "repeat_last"), (1.0, "self"), (1.0, "repeat_last")}
  for c in report["choices"]:
    assert c["decision"] in ("speculative", "plain decoding")
    assert c["predicted_best_gamma"] == GAMMA
    if c["decision"] == "plain decoding":
      assert c["gamma"] is None and c["measured_speedup"] == 1.0
      assert c["predicted_speedup"] < report["config"]["fallback_threshold"]
    else:
      assert c["gamma"] == GAMMA
  names = [t["target"] for t in report["targets"]]
  assert names == ["batch 1, greedy: measured / predicted speedup",
                   "batch 1, greedy: speedup over our baseline",
                   "batch 1, greedy: speedup over stock_equivalent",
                   "batch 1, temperature 1: speedup over our baseline"]
  for t in report["targets"]:
    assert t["drafter"] == "self"  # the primary (first) drafter
    assert t["met"] == (t["value"] >= t["threshold"])
    assert (t["shortfall"] is None) == t["met"]


def test_bad_options_raise_before_any_work(tmp_path):
  kwargs = dict(target_config=TARGET, target_checkpoint=None, draft_config=DRAFT,
                draft_checkpoint=None, output_dir=None, verbose=False,
                examples=benchmark.synthetic_examples(1, 8, VOCAB))
  with pytest.raises(ValueError, match="unknown drafter"):
    benchmark.benchmark(drafters=["no_such_drafter"], allow_random_init=True, **kwargs)
  with pytest.raises(ValueError, match="gammas"):
    benchmark.benchmark(gammas=[0], allow_random_init=True, **kwargs)
  with pytest.raises(ValueError, match="gammas has no entry for batch size 8"):
    benchmark.benchmark(gammas={1: [2]}, batch_sizes=[1, 8], allow_random_init=True, **kwargs)
  with pytest.raises(ValueError, match="drafter_gammas names drafters not in"):
    benchmark.benchmark(drafter_gammas={"bigram": [2]}, allow_random_init=True, **kwargs)
  with pytest.raises(ValueError, match="temperatures"):
    benchmark.benchmark(temperatures=[-1.0], allow_random_init=True, **kwargs)
  with pytest.raises(ValueError, match="stock_t5x"):
    benchmark.benchmark(stock_t5x="maybe", allow_random_init=True, **kwargs)
  if not benchmark.t5x_available():
    with pytest.raises(ValueError, match="t5x is not importable"):
      benchmark.benchmark(stock_t5x="on", allow_random_init=True, **kwargs)
  with pytest.raises(FileNotFoundError, match="target checkpoint does not exist"):
    benchmark.benchmark(**{**kwargs, "target_checkpoint": str(tmp_path / "missing.msgpack")})
  with pytest.raises(ValueError, match="cannot import"):
    benchmark.resolve_drafter("no_such_module_xyz:factory")


def test_gin_configs_parse():
  import gin

  from speculative import gin_utils
  gin_utils.register_configurables()
  try:
    gin.external_configurable(benchmark.benchmark, "benchmark")
  except ValueError:  # already registered in this process
    pass
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    with gin.unlock_config():
      gin.parse_config_files_and_bindings(["configs/benchmark/embedded.gin"], [],
                                          finalize_config=False)
      assert gin.query_parameter("benchmark.output_dir") == "docs"
      assert gin.query_parameter("benchmark.batch_sizes") == [1, 8]
      gin.parse_config_files_and_bindings([benchmark.DEFAULT_QUICK_GIN], [],
                                          finalize_config=False)
      assert gin.query_parameter("benchmark.output_dir") == "outputs/benchmark_quick"
      assert gin.query_parameter("benchmark.allow_random_init") is True
  finally:
    gin.clear_config()
    os.chdir(cwd)


def test_render_from_saved_json_reproduces_the_page(run, tmp_path):
  report, out = run
  rendered = benchmark.render(str(out / "results.json"), str(tmp_path))
  assert rendered["targets"] == report["targets"] and rendered["choices"] == report["choices"]
  assert (tmp_path / "results.md").read_text() == (out / "results.md").read_text()
  assert (tmp_path / "speedup_vs_gamma.png").is_file()


def test_related_pages_are_included_with_demoted_headings(tmp_path):
  assert benchmark.related_sections(str(tmp_path)) == ""
  (tmp_path / "spectr").mkdir()
  (tmp_path / "spectr" / "results.md").write_text("# SpecTr\n\n## Table\n| K | BE |\n")
  text = benchmark.related_sections(str(tmp_path))
  assert "## SpecTr: K drafts" in text and "\n## SpecTr\n" in text and "\n### Table\n" in text
  assert "drafters" not in text
