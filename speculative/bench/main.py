"""Walltime benchmark: speculative decoding vs autoregressive decoding, with the paper's formulas.

`python -m speculative.benchmark --gin_file=configs/benchmark/embedded.gin` (add --quick for a smoke
run into outputs/benchmark_quick/; --render docs/results.json re-renders without timing) writes the
results page; its commands and what it measures: docs/benchmark.md.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import logging
import sys
import time
from typing import Any
from typing import Mapping
from typing import Sequence

from speculative import kernels
from speculative import timing
from speculative.bench import conclude as conclude_lib
from speculative.bench import costs as costs_lib
from speculative.bench import markdown
from speculative.bench import methods as methods_lib
from speculative.bench import report as report_lib
from speculative.bench import sweep
from speculative.drafters import registry as drafter_registry
from speculative.infer import inputs as infer_inputs
from speculative.jobs import checks
from speculative.jobs import interrupts
from speculative.jobs import runtime
from speculative.models import t5 as t5_lib
from speculative.t5x_adapter import stock as t5x_stock

DEFAULT_GIN = "configs/benchmark/embedded.gin"  # the results page's run file (--help's default)
DEFAULT_QUICK_GIN = "configs/benchmark/quick.gin"
DRIFT_WARNING = 0.15  # relative change of t(1) between before and after the sweep


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings(sweep.TimingSettings):
  """Every argument of `benchmark`, same names and defaults, checked on construction.

  Attributes (the timing fields: sweep.TimingSettings):
    target_config, target_checkpoint: the target (T5X checkpoint dir or .msgpack params file).
    draft_config, draft_checkpoint: the draft model (needed by the 'model' drafter).
    task/split or input_file(+input_prefix): the inputs; or `examples` directly (e.g. synthetic).
    skip_truncated: skip inputs longer than inputs_length (every batch is padded to it).
    batch_sizes (with temperatures): the groups; gammas: a list, or {batch size: list}.
    drafters: drafter names (`drafters.registry.spec`); the first is the primary one
      (its targets).
    drafter_gammas: optional {drafter: gammas} overriding `gammas` for that drafter, again a list
      or {batch size: list}; an empty list skips the drafter at that batch size.
    allow_random_init: time random weights when a checkpoint is missing (smoke runs only).
    whole_job_examples: 0 (off), or decode this many inputs of the split (all of it, if fewer)
      at the best batch size as the "whole job" row (`whole_job`).
  """

  target_config: t5_lib.T5Config
  target_checkpoint: str | None
  draft_config: t5_lib.T5Config | None = None
  draft_checkpoint: str | None = None
  target_name: str = "target"
  draft_name: str = "draft"
  task: str | None = "libreoffice_ende"
  split: str = "test"
  input_file: str | None = None
  input_prefix: str = ""
  examples: Sequence[infer_inputs.Example] | None = None
  skip_truncated: bool = True
  batch_sizes: Sequence[int] = (1, 8)
  gammas: Sequence[int] | Mapping[Any, Sequence[int]] = (1, 2, 3, 4, 5, 6, 7)
  drafters: Sequence[str] = ("model",)
  drafter_gammas: Mapping[str, Any] | None = None
  allow_random_init: bool = False
  output_dir: str | None = "docs"
  title: str = "Results: speculative decoding walltime on this machine"
  command: str = "python -m speculative.benchmark --gin_file=configs/benchmark/embedded.gin"
  plots: bool = True
  whole_job_examples: int = 0
  verbose: bool = True

  def __post_init__(self):
    # Relative input paths missing here are the repository's (`checks.resolve_input_path`), so the
    # shipped run files work from any working directory; output_dir stays relative to it.
    checks.resolve_input_fields(self, ("target_checkpoint", "draft_checkpoint", "input_file"))
    if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
      raise ValueError(f"batch_sizes must be integers >= 1; got {self.batch_sizes!r}")
    self.check_timing(self.batch_sizes)
    checks.check_int("whole_job_examples", self.whole_job_examples, 0)
    if not self.drafters:
      raise ValueError("drafters is empty")
    for name in self.drafters:
      drafter_registry.spec(name)
    if self.whole_job_examples and 0 not in [float(t) for t in self.temperatures]:
      raise ValueError("whole_job_examples needs temperature 0 in temperatures (greedy groups)")
    # Last: it reads (hashes) the weights. A missing one is refused unless allow_random_init.
    for what, config, path in (
      ("target", self.target_config, self.target_checkpoint),
      ("draft", self.draft_config, self.draft_checkpoint),
    ):
      if config is not None:
        methods_lib.check_checkpoint(
          config, path, allow_random_init=self.allow_random_init, what=what
        )


def _batches(s, models, examples, plan, stock_t5x_decode, log) -> dict[int, sweep.Batch]:
  """{batch size: its sweep.Batch}, with its cost model for the gammas of `plan`."""
  out = {}
  for batch_size in sorted(plan):
    max_gamma = max(max(g, default=1) for g in plan[batch_size].values())
    view = methods_lib.for_batch(models, batch_size, s.kernels)
    log(f"cost model, batch {batch_size} ({view['decode_path']['line']}) ...")
    timers: dict[str, timing.Timer] = {}
    cm = costs_lib.measure_costs(s, view, examples, batch_size, max_gamma, timers)
    cm["decode_path"] = view["decode_path"]
    out[batch_size] = sweep.Batch(s, batch_size, view, cm, timers, stock_t5x_decode, log)
    # The progress line: the steps, each draft model's c (none for a table or a copy), v(T).
    steps = [("target", cm["target_step_s"]), ("stock-equivalent", cm["stock_equivalent_step_s"])]
    parts = [f"{name} step {1e3 * t:.2f} ms" for name, t in steps]
    parts += [
      f"{n}: step {1e3 * d['draft_step_s']:.3f} ms c={d['c']:.3f}"
      for n, d in cm["drafters"].items()
    ]
    v = ", ".join(f"{k}:{v:.2f}" for k, v in cm["v"].items())
    noisy = "".join(f"\n  too noisy: {reason}" for reason in cm["noise"]["refused"].values())
    log(f"  {', '.join(parts)}; v={v}{noisy}")
  return out


def _drift_warnings(s, batches: dict[int, sweep.Batch]) -> list[str]:
  """t(1) again after the sweep; a warning per batch size where it drifted."""
  warnings = []
  for batch_size, b in batches.items():
    cm = b.costs
    cm["target_step_s_after"] = costs_lib.time_rounds(s, {"t": b.timers["target_1"]})[1]["t"]
    drift = cm["target_step_s_after"] / cm["target_step_s"] - 1
    if abs(drift) > DRIFT_WARNING:
      warnings.append(
        f"The target step time drifted by {100 * drift:+.0f}% between the cost "
        f"model (before the sweep) and after it at batch {batch_size}: the machine's "
        "load changed; c and v(T) ratios are still comparable, absolute profile "
        "times are not."
      )
  return warnings


def _sweep(s, batches: dict[int, sweep.Batch], plan, examples, warnings) -> list[dict[str, Any]]:
  """A group for every (batch size, temperature); warns of greedy rows that differ from the
  baseline, and stops on an audited mismatch."""
  groups = []
  for batch_size in sorted(plan):
    for temperature in s.temperatures:
      batches[batch_size].log(f"group: batch {batch_size}, temperature {temperature}")
      groups.append(
        sweep.run_group(batches[batch_size], float(temperature), examples, plan[batch_size])
      )
      for row in groups[-1]["speculative"]:
        if float(temperature) == 0 and row["identical_to_baseline"] < len(examples):
          warnings.append(
            f"greedy {row['name']} at batch {batch_size}: "
            f"{row['identical_to_baseline']}/{len(examples)} outputs identical to the "
            f"baseline; divergence audit: {row['audit_near_tie']} near-tie, "
            f"{row['audit_mismatch']} mismatch (docs/exactness.md)."
          )
          if row["audit_mismatch"]:
            raise AssertionError(
              f"greedy {row['name']} at batch {batch_size} differs from the baseline beyond "
              f"rounding (audit verdict 'mismatch'): {row['divergences'][:3]}"
            )
  return groups


def whole_job(s, batches: dict[int, sweep.Batch], groups) -> dict[str, Any]:
  """The whole-job row: the first `whole_job_examples` inputs of the split (truncated, not skipped)
  decoded once at the best greedy baseline's batch size by the baseline, the stock yardstick and
  that group's fastest speculative method, interleaved."""
  greedy = [g for g in groups if g["group"]["temperature"] == 0]
  if not greedy:
    raise ValueError("the whole-job row needs a greedy group (temperature 0) in the sweep")
  best = max(greedy, key=lambda g: g["baselines"][0]["tokens_per_s"])  # the baseline comes first
  b = batches[best["group"]["batch_size"]]  # its groups' decode path, cost model and timers
  fastest = min(best["speculative"], key=lambda r: r["walltime_s"], default=None)
  examples, source, _ = methods_lib.benchmark_inputs(
    s, num_examples=s.whole_job_examples, skip_truncated=False
  )
  stock_name = methods_lib.STOCK_T5X if b.stock_t5x_decode else methods_lib.STOCK_EQUIVALENT
  only = {stock_name} | ({fastest["name"]} if fastest else set())
  gammas = {fastest["drafter"]: [fastest["gamma"]]} if fastest else {}
  b.log(f"whole job: {len(examples)} inputs at batch {b.batch_size}: {sorted(only)}")
  b = dataclasses.replace(
    b,
    models=dict(b.models, drafters={k: v for k, v in b.models["drafters"].items() if k in gammas}),
    # A copy: run_group re-times a model-free drafter's propose call into its costs, and the
    # sweep's rows must keep the c they were computed with.
    costs=copy.deepcopy(b.costs),
  )
  result = sweep.run_group(b, 0.0, examples, gammas, repeats=1, only=frozenset(only))
  keys = ("name", "walltime_s", "tokens_per_s", "ms_per_token", "generated_tokens", "compile_s")
  rows = [
    {
      **{k: r[k] for k in keys},
      "sentences_per_s": len(examples) / r["walltime_s"],
      "speedup_vs_baseline": r.get("speedup_vs_baseline", r.get("measured_speedup")),
      "identical_to_baseline": r.get("identical_to_baseline"),
    }
    for r in result["baselines"] + result["speculative"]
  ]
  return {
    "inputs": source,
    "examples": len(examples),
    "truncated_inputs": sum(bool(getattr(e, "truncated", False)) for e in examples),
    "batch_size": b.batch_size,
    "chosen": fastest["name"] if fastest else None,
    "rows": rows,
    "compiles": result["group"]["compiles"],
    "peak_rss_mib": result["group"]["peak_rss_mib"],
  }


@checks.settings_entry(BenchmarkSettings)
def benchmark(s: BenchmarkSettings) -> dict[str, Any]:
  """Inputs, models, the cost model, the sweep, the report: returned, and written to output_dir
  (unless None). The arguments (`BenchmarkSettings`') are checked before any work."""
  return _run(s)


def _run(s: BenchmarkSettings) -> dict[str, Any]:
  """`benchmark` after its checks (the command-line tests replace it: nothing computed)."""
  report_log = print if s.verbose else (lambda *_: None)
  plan = sweep.gamma_plan(s.gammas, dict(s.drafter_gammas or {}), s.drafters, s.batch_sizes)
  machine = runtime.machine()
  warnings: list[str] = []
  t_start = time.perf_counter()
  log = lambda msg: report_log(f"[{time.perf_counter() - t_start:6.0f}s] {msg}")  # noqa: E731
  examples, source, task_label = methods_lib.benchmark_inputs(
    s, num_examples=s.num_examples, skip_truncated=s.skip_truncated
  )
  log(f"inputs: {source}")
  # The target, its stock-equivalent twin, the draft model and the drafters (same weights for
  # every method).
  pair = methods_lib.build_pair(
    (s.target_config, s.target_checkpoint),
    (s.draft_config, s.draft_checkpoint),
    allow_random_init=s.allow_random_init,
    seed=s.seed,
  )
  descriptions = pair.descriptions
  if "random init" in descriptions["target"] or "random init" in descriptions.get("draft", ""):
    warnings.append("RANDOM-INIT weights: α and speedups do not describe trained models.")
  models = methods_lib.bench_models(pair, s.drafters, s.kernels, s.batch_sizes, warnings)
  log(f"target: {descriptions['target']}; draft: {descriptions.get('draft', '-')}")
  stock_t5x_decode = methods_lib.stock_t5x_decoder(s, models["target_params"])
  batches = _batches(s, models, examples, plan, stock_t5x_decode, log)
  groups = _sweep(s, batches, plan, examples, warnings)
  warnings += _drift_warnings(s, batches)
  job = whole_job(s, batches, groups) if s.whole_job_examples else None
  report = {
    "title": s.title,
    "command": s.command,
    "generated_at": datetime.datetime.now().isoformat(timespec="seconds"),
    "elapsed_s": time.perf_counter() - t_start,
    "machine": machine,
    "models": descriptions,
    "inputs": source,
    "warnings": warnings + markdown.busy_warnings(machine),
    "config": _config_record(s, plan, models, task_label),
    "costs": {str(b): batch.costs for b, batch in batches.items()},
    "groups": groups,
  }
  if job:
    report["whole_job"] = job
  report = conclude_lib.conclude(report)
  if s.output_dir:
    report_lib.write_report(report, s.output_dir, plots=s.plots, log=report_log)
  return report


def _config_record(s: BenchmarkSettings, plan, models: dict[str, Any], task_label: str) -> dict:
  """The report's `config`: what was compared, as run."""
  copied = lambda *names: {name: getattr(s, name) for name in names}  # noqa: E731
  return {
    **copied("target_name", "draft_name"),
    "task_label": task_label,
    **copied("inputs_length", "max_new_tokens"),
    "batch_sizes": sorted(plan),
    "temperatures": [float(t) for t in s.temperatures],
    "gammas": {
      str(b): {name: g for name, g in per.items() if name in models["drafters"]}
      for b, per in plan.items()
    },
    "drafters": [name for name in s.drafters if name in models["drafters"]],
    **copied("repeats", "cost_repeats", "cost_position"),
    "stock_t5x": s.use_t5x,
    "kernels": s.kernels,
    "kernels_status": kernels.status(),
    **copied("seed", "target_checkpoint", "draft_checkpoint"),
  }


def main(argv: Sequence[str] | None = None) -> None:
  """`speculative-benchmark`: the runners' command line plus `--quick` and `--render`."""
  from speculative.jobs import gin_utils  # pylint: disable=g-import-not-at-top

  parser = gin_utils.runner_parser("benchmark", __doc__.splitlines()[0])
  parser.add_argument(
    "--quick",
    action="store_true",
    help=f"smoke run: also parse {DEFAULT_QUICK_GIN} (a few inputs, one gamma, one repeat, "
    "random weights if a checkpoint is missing; its header says the rest)",
  )
  parser.add_argument(
    "--render",
    metavar="RESULTS_JSON",
    help="no timing: re-render results.md and the plots from a saved "
    "results.json (into its directory)",
  )
  args = parser.parse_args(sys.argv[1:] if argv is None else argv)
  if args.render:
    runtime.apply_cpu_defaults()  # before jax starts a backend; the user's XLA_FLAGS win
    logging.basicConfig(level=logging.WARNING)
    prefix = f"{parser.prog}: error: "
    # The job's own handling of SIGINT/SIGTERM (not `before_job`'s exit at once): a write the
    # signal cuts removes its temporary, then one line.
    with interrupts.installed():
      gin_utils.call_with_user_errors(lambda: report_lib.render(args.render), prefix, args.debug)
    return
  if not args.gin_file and not args.help:
    parser.error(
      f"--gin_file is required (e.g. --gin_file={DEFAULT_GIN}) or --render RESULTS_JSON; "
      "--help lists the knobs of a run file"
    )
  t5x_stock.register_gin_configurables()  # before the config is parsed (and locked)
  gin_utils.run_parsed(
    parser,
    args,
    benchmark,
    "benchmark",
    default_gin_files=(DEFAULT_GIN,),
    extra_gin_files=[DEFAULT_QUICK_GIN] if args.quick else [],
  )


if __name__ == "__main__":
  main(sys.argv[1:])
