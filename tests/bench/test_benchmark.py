"""Tests of the walltime benchmark (speculative/bench/main.py, speculative/bench/).

  .venv/bin/python -m pytest -q -p no:xdist tests/bench/test_benchmark.py

One small sweep (batch 1, temperatures 0 and 1, gamma 2; two drafters: the target drafting for
itself through `ModelDrafter`, and a model-free drafter) runs once per module; the tests check the
report's structure and internal consistency (formulas recomputed from the reported counters and
times, exactness counts, files written), never timings. The cost model's noise verdict is tested
on made-up per-round times.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from speculative import benchmark
from speculative import drafters as drafters_lib
from speculative.bench import conclude
from speculative.bench import costs
from speculative.bench import main as bench_main
from speculative.bench import report as report_lib
from speculative.bench import sweep
from speculative.data.tasks import EOS_ID
from speculative.decode import batching
from speculative.infer.inputs import Example
from speculative.models.t5 import T5
from speculative.models.t5 import T5Config
from speculative.t5x_adapter import stock as t5x_stock

REPO = Path(__file__).resolve().parents[2]
VOCAB = 64
TARGET = T5Config(
  vocab_size=VOCAB,
  emb_dim=16,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=2,
  head_dim=8,
  mlp_dim=32,
)
DRAFT = T5Config(
  vocab_size=VOCAB,
  emb_dim=8,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=1,
  head_dim=4,
  mlp_dim=16,
)
NUM_EXAMPLES = 3
GAMMA = 2
MAX_NEW_TOKENS = 8


def synthetic_examples(
  num_examples: int, inputs_length: int, vocab_size: int, seed: int = 0
) -> list[Example]:
  """Random token inputs (EOS-terminated, lengths in [inputs_length/2, inputs_length]); for smoke
  tests only: they exercise the timing code, not translation."""
  rng = np.random.default_rng(seed)
  examples = []
  for i in range(num_examples):
    length = int(rng.integers(max(2, inputs_length // 2), inputs_length + 1))
    tokens = np.concatenate([rng.integers(2, vocab_size, length - 1), [EOS_ID]]).astype(np.int32)
    examples.append(Example(i, f"<synthetic {i}>", None, tokens, False))
  return examples


def _self_drafter(options: drafters_lib.DrafterOptions):
  """The target drafting for itself: greedy alpha must be exactly 1."""
  return drafters_lib.ModelDrafter(options.target_model), options.target_params


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


def _repeat_last_drafter(options: drafters_lib.DrafterOptions):
  return RepeatLastDrafter(options.vocab_size), None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  # Two test drafters in the one drafter registry, for this run only (the registry is global: other
  # tests iterate over it).
  registered = dict(drafters_lib.DRAFTERS)
  drafters_lib.register_drafter("self", _self_drafter)
  drafters_lib.register_drafter("repeat_last", _repeat_last_drafter)
  out = tmp_path_factory.mktemp("bench")
  examples = synthetic_examples(NUM_EXAMPLES, inputs_length=10, vocab_size=VOCAB, seed=3)
  try:
    report = _run_benchmark(examples, out)
  finally:
    drafters_lib.DRAFTERS.clear()
    drafters_lib.DRAFTERS.update(registered)
  return report, out


def _run_benchmark(examples, out):
  return benchmark.benchmark(
    target_config=TARGET,
    target_checkpoint=None,
    draft_config=DRAFT,
    draft_checkpoint=None,
    examples=examples,
    num_examples=NUM_EXAMPLES,
    inputs_length=10,
    max_new_tokens=MAX_NEW_TOKENS,
    batch_sizes=[1],
    temperatures=[0.0, 1.0],
    gammas=[GAMMA],
    drafters=["self", "repeat_last"],
    drafter_gammas={"repeat_last": {1: [GAMMA]}},
    repeats=2,
    cost_repeats=costs.MIN_ROUNDS,
    cost_min_seconds=0.005,
    cost_position=3,
    allow_random_init=True,
    output_dir=str(out),
    verbose=False,
    stock_t5x="off",  # the tests below list the methods; the same set with t5x importable
    whole_job_examples=NUM_EXAMPLES,
  )


@pytest.mark.slow
def test_files_written_and_json_matches(run):
  report, out = run
  for name in ("results.json", "results.md", "speedup_vs_gamma.png", "alpha.png"):
    assert (out / name).is_file() and (out / name).stat().st_size > 0, name
  assert json.loads((out / "results.json").read_text()) == report
  markdown = (out / "results.md").read_text()
  for heading in (
    "## Machine",
    "## Cost model",
    "Table 2",
    "Table 4",
    "## Targets",
    "## Profile",
    "## Best γ",
    "speedup_vs_gamma.png",
    "alpha.png",
    "| TASK | M_q | TEMP",
  ):
    assert heading in markdown, heading
  assert report["machine"]["cpu"] and report["machine"]["usable_cores"] >= 1
  assert any("RANDOM-INIT" in w for w in report["warnings"])


def _median_ratio(numerator, denominator):
  """The cost model's ratio estimate restated here, not imported: the median over the timing
  rounds of numerator / denominator (the two times of one round paired), over the rounds where
  that ratio is positive and finite; None where no round resolved it."""
  ratios = [a / b for a, b in zip(numerator, denominator) if b > 0 and 0 < a / b < math.inf]
  return float(np.median(ratios)) if ratios else None


@pytest.mark.slow
def test_cost_model_consistent(run):
  report, _ = run
  cm = report["costs"]["1"]
  from speculative import kernels  # the path our methods ran at batch 1, stated in the report

  want = kernels.policy.choose("auto", 1)
  assert cm["decode_path"] == {"name": want.name, "line": want.line}
  assert report["config"]["kernels"] == "auto"
  rounds = cm["rounds"]
  assert set(cm["v"]) == {str(t) for t in range(1, GAMMA + 2)}
  assert cm["v"]["1"] == pytest.approx(1.0)
  for t in range(2, GAMMA + 2):  # the median of per-round ratios, rounds paired
    median = _median_ratio(rounds[f"target_{t}"], rounds["target_1"])
    if median is not None:
      assert cm["v"][str(t)] == pytest.approx(median)
    else:  # no round resolved it: a stand-in value, refused
      assert f"v({t})" in cm["noise"]["refused"]
    assert cm["target_extend_s"][str(t)] > 0
  assert all(len(r) == costs.MIN_ROUNDS for r in rounds.values())
  d = cm["drafters"]["self"]  # a ModelDrafter: c from its extend(T=1) call
  assert d["kind"] == "model"
  median = _median_ratio(rounds["draft[self]_1"], rounds["target_1"])
  assert d["c"] > 0
  if median is not None:
    assert d["c"] == pytest.approx(median)
  else:
    assert "c[self]" in cm["noise"]["refused"]
  assert d["draft_step_s"] > 0 and d["draft_prefill_s"] > 0
  other = cm["drafters"]["repeat_last"]  # not a model: c from its timed propose(gamma) call
  assert other["kind"] == "propose"
  keys = {f"gamma={GAMMA},T=0", f"gamma={GAMMA},T=1"}
  assert set(other["propose_s"]) == set(other["c"]) == keys
  assert all(seconds > 0 for seconds in other["propose_s"].values())
  noise = cm["noise"]
  assert noise["max_spread"] == costs.MAX_SPREAD
  assert set(noise["refused"]) <= set(noise["estimates"])
  assert {
    "t(1)",
    "stock t(1)",
    "v(2)",
    "v(3)",
    "c[self]",
    f"c[repeat_last, gamma={GAMMA},T=0]",
  } <= set(noise["estimates"])
  assert cm["target_step_s_after"] > 0  # re-timed after the sweep (load drift check)


@pytest.mark.slow
def test_rows_consistent_with_formulas(run):
  report, _ = run
  assert [(g["group"]["batch_size"], g["group"]["temperature"]) for g in report["groups"]] == [
    (1, 0.0),
    (1, 1.0),
  ]
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
      assert row["block_efficiency"] == pytest.approx(row["generated_tokens"] / row["target_calls"])
      if row["drafter"] == "repeat_last" and temperature > 0:  # nothing drafted
        assert row["drafted_tokens"] == row["accepted_tokens"] == 0
        assert row["acceptance_rate"] is None and row["alpha_used"] == 0.0
        assert row["block_efficiency"] == pytest.approx(1.0)
        assert row["expected_tokens"] == 1.0
      else:
        assert row["acceptance_rate"] == pytest.approx(
          row["accepted_tokens"] / row["drafted_tokens"]
        )
        assert 0.0 <= row["alpha_used"] <= 1.0 and row["alpha_source"] == "distributions"
        assert row["drafted_tokens"] == GAMMA * row["target_calls"]
        assert row["drafted_per_call"] == pytest.approx(GAMMA)
      assert row["measured_speedup"] == pytest.approx(base["walltime_s"] / row["walltime_s"])
      assert row["speedup_vs_stock"] == pytest.approx(
        baselines["stock_equivalent"]["walltime_s"] / row["walltime_s"]
      )
      assert row["speedup_per_token"] == pytest.approx(base["ms_per_token"] / row["ms_per_token"])
      drafter_costs = cm["drafters"][row["drafter"]]
      if drafter_costs["kind"] == "model":
        assert row["c"] == pytest.approx(drafter_costs["c"])
        c_name = f"c[{row['drafter']}]"
      else:
        key = f"gamma={GAMMA},T={temperature:g}"
        assert row["c"] == pytest.approx(drafter_costs["c"][key])
        c_name = f"c[{row['drafter']}, {key}]"
      assert row["v"] == pytest.approx(cm["v"][str(GAMMA + 1)])
      refused = [n for n in (f"v({GAMMA + 1})", c_name) if n in cm["noise"]["refused"]]
      if refused:  # too noisy on this machine now: no prediction, the reasons given
        assert row["predicted_speedup"] is None and row["measured_over_predicted"] is None
        assert all(cm["noise"]["refused"][n] in row["prediction_refused"] for n in refused)
      else:
        assert row["prediction_refused"] is None
        # Theorem 3.8 with the measured verify cost, written out: E[#tokens] = sum_j<=gamma
        # alpha^j tokens per step, for gamma draft steps (c each) and one (gamma+1)-token call (v).
        tokens = sum(row["alpha_used"] ** j for j in range(GAMMA + 1))
        assert row["predicted_speedup"] == pytest.approx(tokens / (GAMMA * row["c"] + row["v"]))
        assert row["measured_over_predicted"] == pytest.approx(
          row["measured_speedup"] / row["predicted_speedup"]
        )
      p = row["profile"]
      if p["overhead_s"] is None:
        assert p["overhead_refused"] and p["overhead_fraction"] is None
      else:
        assert p["step_s"] == pytest.approx(p["draft_s"] + p["verify_s"] + p["overhead_s"])
      assert p["verify_s"] == pytest.approx(cm["target_extend_s"][str(GAMMA + 1)])
      if drafter_costs["kind"] == "model":  # the loop's draft calls: a 2-token catch-up + gamma-1
        assert p["draft_s"] == pytest.approx(
          drafter_costs["draft_catch_up_s"] + (GAMMA - 1) * drafter_costs["draft_step_s"]
        )
      assert row["compile_s"] > 0 and row["tokens_per_s"] > 0
      if temperature == 0:  # greedy speculative decoding is exact: token-identical outputs
        assert row["identical_to_baseline"] == NUM_EXAMPLES
      else:
        assert "identical_to_baseline" not in row
    if temperature == 0:  # same inputs, same greedy outputs: the same token counts everywhere
      assert len({r["generated_tokens"] for r in group["baselines"] + group["speculative"]}) == 1
      assert baselines["stock_equivalent"]["identical_to_baseline"] == NUM_EXAMPLES


@pytest.mark.slow
def test_self_drafting_accepts_everything(run):
  report, _ = run
  for group in report["groups"]:  # q == p: every draft is accepted, at any temperature
    (row,) = [r for r in group["speculative"] if r["drafter"] == "self"]
    assert row["alpha_used"] == pytest.approx(1.0, abs=1e-5)
    assert row["accepted_tokens"] == row["drafted_tokens"]
    # gamma + 1 tokens per target call except where EOS / max_new_tokens cut the last block.
    assert (
      NUM_EXAMPLES <= row["target_calls"] <= NUM_EXAMPLES * math.ceil(MAX_NEW_TOKENS / (GAMMA + 1))
    )
    assert row["expected_tokens"] == pytest.approx(GAMMA + 1)


@pytest.mark.slow
def test_best_gammas_and_targets_follow_the_rows(run):
  """Each group's best gammas are its rows' (one gamma per drafter in this sweep); each target's
  value is its row's figure, met exactly when it reaches the threshold."""
  report, _ = run
  rows = {
    (g["group"]["temperature"], r["drafter"]): r for g in report["groups"] for r in g["speculative"]
  }
  assert (
    {(c["temperature"], c["drafter"]) for c in report["best"]}
    == set(rows)
    == {
      (0.0, "self"),
      (0.0, "repeat_last"),
      (1.0, "self"),
      (1.0, "repeat_last"),
    }
  )
  for c in report["best"]:
    row = rows[(c["temperature"], c["drafter"])]
    assert (c["predicted_best_gamma"], c["predicted_speedup"]) == (GAMMA, row["predicted_speedup"])
    assert c["measured_speedup"] == c["best_measured_speedup"] == row["measured_speedup"]
    assert c["best_measured_gamma"] == GAMMA
  greedy, sampled = rows[(0.0, "self")], rows[(1.0, "self")]  # the primary (first) drafter's
  expected_targets = [
    ("batch 1, greedy: measured / predicted speedup", greedy["measured_over_predicted"]),
    ("batch 1, greedy: speedup over our baseline", greedy["measured_speedup"]),
    ("batch 1, greedy: speedup over stock_equivalent", greedy["speedup_vs_stock"]),
    ("batch 1, temperature 1: speedup over our baseline", sampled["measured_speedup"]),
  ]
  thresholds = [
    conclude.TARGET_EXP_RATIO,
    conclude.TARGET_GREEDY,
    conclude.TARGET_GREEDY_STOCK,
    conclude.TARGET_SAMPLED,
  ]
  assert [(t["target"], t["value"]) for t in report["targets"]] == expected_targets
  for t, threshold in zip(report["targets"], thresholds):
    assert t["drafter"] == "self" and t["threshold"] == threshold
    if t["value"] is None:  # a prediction refused as too noisy
      assert t["met"] is None and t["shortfall"] is None
    else:
      assert t["met"] == (t["value"] >= threshold)
      assert t["shortfall"] == (None if t["met"] else pytest.approx(threshold - t["value"]))


def test_bad_options_raise_before_any_work(tmp_path):
  kwargs = dict(
    target_config=TARGET,
    target_checkpoint=None,
    draft_config=DRAFT,
    draft_checkpoint=None,
    output_dir=None,
    verbose=False,
    examples=synthetic_examples(1, 8, VOCAB),
  )
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
  with pytest.raises(ValueError, match="kernels must be one of"):
    benchmark.benchmark(kernels="fast", allow_random_init=True, **kwargs)
  if not t5x_stock.t5x_available():
    with pytest.raises(ValueError, match="t5x is not importable"):
      benchmark.benchmark(stock_t5x="on", allow_random_init=True, **kwargs)
  with pytest.raises(FileNotFoundError, match="target checkpoint does not exist"):
    benchmark.benchmark(**{**kwargs, "target_checkpoint": str(tmp_path / "missing.msgpack")})


@pytest.mark.parametrize("platform", ["gpu", "tpu"])
def test_kernels_on_off_cpu_is_refused_before_any_work(monkeypatch, platform):
  """On a GPU or TPU backend (faked: `kernels.policy.backend`) 'on' is refused by the settings'
  checks, naming the backend; 'auto' passes them (XLA's dot at every batch size)."""
  from speculative.kernels import policy

  monkeypatch.setattr(policy, "backend", lambda given=None: platform)
  kwargs = dict(
    target_config=TARGET,
    target_checkpoint=None,
    draft_config=DRAFT,
    batch_sizes=[1, 8],
    allow_random_init=True,  # no weights: the settings' weights check passes
  )
  with pytest.raises(ValueError, match=rf"^kernels = on, but this job computes on {platform}: "):
    bench_main.BenchmarkSettings(kernels="on", **kwargs)
  assert bench_main.BenchmarkSettings(kernels="auto", **kwargs).kernels == "auto"
  with pytest.raises(ValueError, match="cannot import"):
    drafters_lib.registry.spec("no_such_module_xyz:factory")


def test_gin_configs_parse():
  import gin

  from speculative.jobs import gin_utils

  gin_utils.register_configurables()
  try:
    gin.external_configurable(benchmark.benchmark, "benchmark")
  except ValueError:  # already registered in this process
    pass
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    with gin.unlock_config():
      gin.parse_config_files_and_bindings(
        ["configs/benchmark/embedded.gin"], [], finalize_config=False
      )
      assert gin.query_parameter("benchmark.output_dir") == "docs"
      assert gin.query_parameter("benchmark.batch_sizes") == [1, 8, 32]
      gin.parse_config_files_and_bindings([bench_main.DEFAULT_QUICK_GIN], [], finalize_config=False)
      assert gin.query_parameter("benchmark.output_dir") == "outputs/benchmark_quick"
      assert gin.query_parameter("benchmark.allow_random_init") is True
    # Every other benchmark config parses, writes outside docs/ and names its own command (the
    # paper-shape run files are another runner's: tests/bench/test_paper_shape.py runs them).
    for path in sorted((REPO / "configs" / "benchmark").glob("*.gin")):
      if path.name in ("embedded.gin", "quick.gin") or path.name.startswith("paper_shape"):
        continue
      gin.clear_config()
      with gin.unlock_config():
        gin.parse_config_files_and_bindings([str(path)], [], finalize_config=False)
        command = gin.query_parameter("benchmark.command")
        assert command.endswith(f"--gin_file=configs/benchmark/{path.name}"), path
        assert command in path.read_text() and gin.query_parameter("benchmark.output_dir") != "docs"
  finally:
    gin.clear_config()
    os.chdir(cwd)


@pytest.mark.slow
def test_render_from_saved_json_reproduces_the_page(run, tmp_path):
  report, out = run
  rendered = report_lib.render(str(out / "results.json"), str(tmp_path))
  assert rendered["targets"] == report["targets"] and rendered["best"] == report["best"]
  assert (tmp_path / "results.md").read_text() == (out / "results.md").read_text()
  assert (tmp_path / "speedup_vs_gamma.png").is_file()


def test_related_pages_are_linked_when_found(tmp_path):
  assert report_lib.related_section(str(tmp_path)) == []
  (tmp_path / "spectr").mkdir()
  (tmp_path / "spectr" / "results.md").write_text("# SpecTr\n\n## Table\n| K | BE |\n")
  text = "\n".join(report_lib.related_section(str(tmp_path)))
  assert text.startswith("## Related pages") and "(spectr/results.md)" in text
  assert "| K | BE |" not in text and "drafters" not in text  # a link, not a copy


# ----------------------------------------------------------------------------------------------
# The cost model's noise verdict, on made-up per-round times.
# ----------------------------------------------------------------------------------------------


def test_estimate_is_median_and_relative_iqr():
  est = costs.estimate([1.0, 1.0, 1.5, 2.0, 2.0])
  assert est.value == 1.5 and est.rounds == 5 and est.unresolved == 0
  assert est.spread == pytest.approx((2.0 - 1.0) / 1.5)
  assert costs.estimate([3.0] * 4).spread == 0.0
  # The interquartile range, not the range: one outlying round does not make an estimate noisy.
  assert costs.estimate([1.0, 1.0, 1.0, 1.0, 5.0]).spread == 0.0
  with pytest.raises(ValueError, match="no samples"):
    costs.estimate([])


def test_per_round_ratios_cancel_load_drift():
  # The load doubles every round: each time is noisy on its own, the per-round ratio is exact.
  target_1 = [1.0, 2.0, 4.0, 8.0, 16.0]
  target_3 = [1.5 * t for t in target_1]
  assert costs.judge(costs.estimate(target_1), "t(1)") is not None  # the times: too noisy
  v3 = costs.estimate(costs.ratio_samples(target_3, target_1))
  assert v3.value == pytest.approx(1.5) and v3.spread == pytest.approx(0.0)
  assert costs.judge(v3, "v(3)", minimum=1.0) is None
  assert costs.ratio_samples([2.0, 3.0], [1.0, 0.0], scale=0.5)[0] == 1.0
  assert math.isnan(costs.ratio_samples([2.0, 3.0], [1.0, 0.0])[1])
  with pytest.raises(ValueError, match="rounds differ"):
    costs.ratio_samples([1.0], [1.0, 2.0])


@pytest.mark.parametrize(
  "samples, minimum, reason",
  [
    ([1.0, 1.6, 1.0, 1.6, 1.3], None, "spread"),  # IQR / median 0.46 > 0.25
    ([0.28, 0.29, 0.28, 0.27, 0.28], 1.0, "impossible"),  # v(2) = 0.28 (issue 13)
    ([1.2, 1.2], None, "too few"),  # 2 rounds < MIN_ROUNDS
    ([1.2, -0.1, 1.2, 1.2], None, "not resolved"),  # a non-positive marginal time
    ([math.nan, math.nan, math.nan], None, "not resolved"),
  ],
)
def test_judge_refuses_noise(samples, minimum, reason):
  verdict = costs.judge(costs.estimate(samples), "v(2)", minimum=minimum)
  assert verdict is not None and reason in verdict and verdict.startswith("v(2)")


def test_judge_accepts_a_tight_estimate_and_noise_log_records():
  tight = [1.50, 1.52, 1.49, 1.51, 1.50]
  assert costs.judge(costs.estimate(tight), "v(2)", minimum=1.0) is None
  log = costs.NoiseLog()
  assert log.add("v(2)", tight, minimum=1.0) == pytest.approx(1.50)
  log.add("v(3)", [0.5, 0.5, 0.5], minimum=1.0)
  assert set(log.data["estimates"]) == {"v(2)", "v(3)"} and set(log.data["refused"]) == {"v(3)"}
  assert costs.refusal(log.data, ["v(2)"]) is None
  assert "impossible" in costs.refusal(log.data, ["v(2)", "v(3)"])
  assert costs.refusal(None, ["v(3)"]) is None  # results measured before the verdict existed


def test_profile_refuses_a_negative_overhead():
  row = {"loop_steps": 10, "walltime_per_batch_s": [0.1], "walltime_s": 0.1}
  parts = {"draft_s": 0.002, "verify_s": 0.006}  # 8 ms of calls in a 10 ms step: 2 ms overhead
  p = sweep.profile(row, 0.0, parts)
  assert p["overhead_s"] == pytest.approx(0.002) and p["overhead_fraction"] == pytest.approx(0.2)
  assert "overhead_refused" not in p
  slower_calls = {"draft_s": 0.002, "verify_s": 0.009}  # calls timed under more load than the step
  p = sweep.profile(row, 0.0, slower_calls)
  assert p["overhead_s"] is None and p["overhead_fraction"] is None
  assert p["overhead_refused"].startswith("negative overhead")
  noisy = sweep.profile(row, 0.0, parts, "v(2): spread 0.90 > 0.25")
  assert noisy["overhead_s"] is None and noisy["overhead_refused"] == "v(2): spread 0.90 > 0.25"


@pytest.mark.slow
def test_refused_predictions_read_too_noisy_everywhere(run, tmp_path):
  report, _ = run
  noisy = json.loads(json.dumps(report))
  for group in noisy["groups"]:
    for row in group["speculative"]:
      row.update(
        predicted_speedup=None,
        measured_over_predicted=None,
        prediction_refused="v(3): spread 0.90 > 0.25",
      )
      row["profile"].update(
        overhead_s=None, overhead_fraction=None, overhead_refused="v(3): spread 0.90 > 0.25"
      )
  noisy = conclude.conclude(noisy)
  for c in noisy["best"]:  # no prediction: the best measured gamma stands in
    assert c["predicted_speedup"] is None
    assert c["predicted_best_gamma"] == c["best_measured_gamma"]
  (ratio,) = [t for t in noisy["targets"] if "measured / predicted" in t["target"]]
  assert ratio["value"] is None and ratio["met"] is None
  page = report_lib.format_report(noisy)
  table4 = page[page.index("Table 4") : page.index("## Baselines")]
  assert table4.count(conclude.TOO_NOISY) >= 2 * len(noisy["groups"])
  best = page[page.index("## Best γ") : page.index("## Targets")]
  assert best.count(conclude.TOO_NOISY) == len(noisy["best"])
  profile = page[page.index("## Profile") :]
  assert conclude.TOO_NOISY in profile
  report_lib.write_report(noisy, str(tmp_path), plots=True, log=lambda *_: None)
  assert (tmp_path / "speedup_vs_gamma.png").is_file()


def _best_rows(measured, predicted):
  return [
    {"gamma": g, "measured_speedup": m, "predicted_speedup": p, "speedup_per_token": m}
    for g, m, p in zip((1, 2, 3), measured, predicted)
  ]


def test_best_gammas_without_a_prediction_fall_back_on_the_measurements():
  group = {"batch_size": 1, "temperature": 1.0}
  unpredicted = conclude._best(group, "model", _best_rows((0.9, 1.05, 0.7), (None,) * 3))
  assert (unpredicted["predicted_best_gamma"], unpredicted["predicted_speedup"]) == (2, None)
  assert unpredicted["measured_speedup"] == unpredicted["best_measured_speedup"] == 1.05
  # An accepted prediction names the best predicted gamma, whatever the measurements say.
  predicted = conclude._best(group, "model", _best_rows((0.86, 1.2, 0.7), (1.3, 1.2, None)))
  assert (predicted["predicted_best_gamma"], predicted["predicted_speedup"]) == (1, 1.3)
  assert predicted["measured_speedup"] == 0.86
  assert (predicted["best_measured_gamma"], predicted["best_measured_speedup"]) == (2, 1.2)
  (target,) = conclude._best_targets(unpredicted, _best_rows((1.05,), (None,))[0])
  assert target[1:3] == (1.05, conclude.TARGET_SAMPLED) and "too noisy" in target[3]


def test_decode_step_kernels_are_the_weights_a_step_reads():
  shapes = T5(TARGET).param_shapes()
  kernels = costs.decode_step_kernels(shapes, logits_via_embedding=False)
  assert all(name.startswith("decoder/") for name in kernels)
  assert not any(
    "encoder_decoder_attention/key" in n or "encoder_decoder_attention/value" in n for n in kernels
  )  # cached once per input
  assert "decoder/logits_dense/kernel" in kernels
  with_embedding = costs.decode_step_kernels(
    {**shapes, "token_embedder/embedding": (VOCAB, 16)}, logits_via_embedding=True
  )
  assert costs.weight_bytes(with_embedding) == costs.weight_bytes(kernels) + 4 * VOCAB * 16


def test_batches_pad_like_t5x():
  examples = synthetic_examples(3, inputs_length=6, vocab_size=VOCAB, seed=1)
  (chunk0, first), (chunk1, last) = batching.batches(examples, 2, 6)
  assert [e.index for e in chunk0] == [0, 1] and [e.index for e in chunk1] == [2]
  assert first.shape == last.shape == (2, 6) and first.dtype == last.dtype == np.int32
  for row, example in enumerate(chunk0):
    n = len(example.input_tokens)
    assert (first[row, :n] == example.input_tokens).all() and (first[row, n:] == 0).all()
  assert (last[1] == last[0]).all()  # the pad row repeats row 0 (its outputs are discarded)
  with pytest.raises(ValueError, match="do not fit"):
    batching.pad_batch(examples, 2, 6)


@pytest.mark.slow
def test_greedy_rows_that_differ_are_audited():
  """A speculative method whose row 0 emits a token no rounding explains (float32 model) gets
  an audit verdict 'mismatch'; identical rows are not audited."""
  from types import SimpleNamespace

  from model_utils import random_params
  import numpy as np

  from speculative.bench import methods as methods_lib
  from speculative.bench import sweep
  from speculative.models.t5 import T5
  from speculative.models.t5 import T5Config

  config = T5Config(
    vocab_size=32,
    emb_dim=16,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=1,
    head_dim=8,
    mlp_dim=32,
    dtype="float32",
  )
  model = T5(config)
  params = random_params(model, 0, logit_scale=3.0)
  encoder_tokens = np.array([[5, 6, 7, 1], [8, 9, 1, 0]], np.int32)  # [rows, S]
  chunk = [SimpleNamespace(index=10), SimpleNamespace(index=11)]
  logits = np.asarray(model.forward(params, encoder_tokens, np.zeros((2, 1), np.int32)))[:, 0]
  best = logits.argmax(-1)
  worst = logits.argmin(-1)
  ref_tokens = np.stack([best, best], 1).astype(np.int32)  # [rows, 2]
  out_tokens = ref_tokens.copy()
  out_tokens[0, 0] = worst[0]  # a token far below the top logit
  lengths = np.array([2, 2], np.int32)
  make = lambda tokens: methods_lib.Method(  # noqa: E731
    "m", methods_lib.SPECULATIVE, None, outputs=[{"tokens": tokens, "lengths": lengths}]
  )
  row = sweep.audited(
    {"identical_to_baseline": 1},
    make(out_tokens),
    make(ref_tokens),
    [(chunk, encoder_tokens)],
    model,
    params,
  )
  assert row["audit_mismatch"] == 1 and row["audit_near_tie"] == 0
  assert row["divergences"][0]["example"] == 10 and row["divergences"][0]["position"] == 0
  untouched = sweep.audited({"identical_to_baseline": 2}, None, None, [(chunk, None)], None, None)
  assert "divergences" not in untouched


@pytest.mark.slow
def test_whole_job_row_and_resources_per_group(run):
  """The whole-job row decodes every input at the best batch size with baseline, stock and the
  fastest speculative method; every group reports its compiles (none in the timed calls: one
  program per shape) and its peak RSS."""
  report, out = run
  job = report["whole_job"]
  assert job["examples"] == NUM_EXAMPLES and job["batch_size"] == 1
  names = [r["name"] for r in job["rows"]]
  assert names[:2] == ["baseline", "stock_equivalent"] and job["chosen"] in names
  fastest = min(
    (r for g in report["groups"] if g["group"]["temperature"] == 0 for r in g["speculative"]),
    key=lambda r: r["walltime_s"],
  )
  assert job["chosen"] == fastest["name"]
  for row in job["rows"]:
    assert row["sentences_per_s"] == pytest.approx(NUM_EXAMPLES / row["walltime_s"])
    # Greedy: every method of the row, the stock yardstick and the speculative one included, emits
    # the baseline's tokens (the sweep's groups hold the same).
    assert row["identical_to_baseline"] == NUM_EXAMPLES
  assert job["compiles"]["timed_calls"] == 0
  for g in report["groups"]:
    assert g["group"]["compiles"]["timed_calls"] == 0
    if os.path.exists("/proc/self/status"):  # measured on Linux (here and in CI), else None
      assert g["group"]["peak_rss_mib"] > 0
    else:
      assert g["group"]["peak_rss_mib"] is None
  page = (out / "results.md").read_text()
  assert "## Whole job" in page and "## Resources per group" in page


def test_a_bad_setting_on_the_command_line_is_one_line(capsys):
  argv = [
    "--gin_file=configs/benchmark/embedded.gin",
    "--gin_bindings=benchmark.batch_sizes = (0,)",
  ]
  with pytest.raises(SystemExit, match="^2$") as exit_info:
    bench_main.main(argv)
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert err.strip().endswith("error: batch_sizes must be integers >= 1; got (0,)")
  assert "Traceback" not in err and len(err.strip().splitlines()) == 1
  with pytest.raises(ValueError, match="batch_sizes"):
    bench_main.main(argv + ["--debug"])
