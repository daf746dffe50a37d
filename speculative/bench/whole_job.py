"""The whole-job row: every sentence of the split decoded at the sweep's best batch size.

What a user of a batch job looks at is the throughput of the whole job, not of a 32-sentence
sample. After the sweep, `run` takes the greedy group whose baseline had the most tokens/s (the
best batch size), the fastest speculative method of that group (its drafter and gamma), and decodes
every input of the split with the baseline, the stock yardstick (`stock_t5x` when t5x imports,
else `stock_equivalent`) and that speculative method, interleaved batch by batch, each once
(`sweep.run_group` with repeats=1). Inputs longer than inputs_length are truncated, not skipped (a
job decodes every sentence); the row says how many.
"""

from __future__ import annotations

import copy
from typing import Any
from typing import Callable

from speculative.bench import inputs as inputs_lib
from speculative.bench import methods
from speculative.bench import paths
from speculative.bench import sweep


def pick(groups: list[dict[str, Any]]) -> tuple[int, dict[str, Any] | None]:
  """(best batch size, fastest speculative row there or None) from the greedy groups."""
  greedy = [g for g in groups if g["group"]["temperature"] == 0]
  if not greedy:
    raise ValueError("the whole-job row needs a greedy group (temperature 0) in the sweep")

  def baseline_tokens_per_s(g):
    return next(r for r in g["baselines"] if r["method"] == "baseline")["tokens_per_s"]

  best = max(greedy, key=baseline_tokens_per_s)
  fastest = min(best["speculative"], key=lambda r: r["walltime_s"], default=None)
  return best["group"]["batch_size"], fastest


def run(
  settings,
  models: dict[str, Any],
  costs: dict[str, Any],
  groups: list[dict[str, Any]],
  *,
  step_timers,
  stock_t5x_decode: Callable | None,
  position: int,
  log: Callable[[str], None],
) -> dict[str, Any]:
  """Decodes the whole split (settings.whole_job_examples inputs at most) as described above."""
  s = settings
  batch_size, fastest = pick(groups)
  models = paths.for_batch(models, batch_size, s.kernels)  # the path that batch size's groups ran
  examples, source = _job_inputs(s)
  stock_name = methods.STOCK_T5X if stock_t5x_decode is not None else methods.STOCK_EQUIVALENT
  only = {stock_name} | ({fastest["name"]} if fastest else set())
  gammas = {fastest["drafter"]: [fastest["gamma"]]} if fastest else {}
  log(f"whole job: {len(examples)} inputs at batch {batch_size}: {sorted(only)}")
  result = sweep.run_group(
    sweep.GroupSettings(
      batch_size=batch_size,
      temperature=0.0,
      examples=examples,
      inputs_length=s.inputs_length,
      max_new_tokens=s.max_new_tokens,
      target=models["target"],
      target_params=models["target_params"],
      stock_target=models["stock_target"],
      drafters={k: v for k, v in models["drafters"].items() if k in gammas},
      gammas=gammas,
      # A copy: run_group re-times a model-free drafter's propose call into its costs, and the
      # sweep's rows must keep the c they were computed with.
      costs=copy.deepcopy(costs[str(batch_size)]),
      repeats=1,
      seed=s.seed,
      stock_t5x_decode=stock_t5x_decode,
      cost_repeats=s.cost_repeats,
      cost_min_seconds=s.cost_min_seconds,
      position=position,
      target_step_timer=step_timers[batch_size]["target_1"],
      log=log,
      only=frozenset(only),
    )
  )
  truncated = sum(bool(getattr(e, "truncated", False)) for e in examples)
  rows = [_row(r, len(examples)) for r in result["baselines"] + result["speculative"]]
  return {
    "inputs": source,
    "examples": len(examples),
    "truncated_inputs": truncated,
    "batch_size": batch_size,
    "chosen": fastest["name"] if fastest else None,
    "rows": rows,
    "compiles": result["group"]["compiles"],
    "peak_rss_mib": result["group"]["peak_rss_mib"],
  }


def _job_inputs(s) -> tuple[list[Any], str]:
  """(examples, their description): the first `whole_job_examples` inputs of the benchmark's
  source, those longer than inputs_length truncated rather than skipped."""
  examples, source, _ = inputs_lib.benchmark_inputs(
    s, num_examples=s.whole_job_examples, skip_truncated=False
  )
  return examples, source


def _row(r: dict[str, Any], examples: int) -> dict[str, Any]:
  """One method over the whole job: walltime, sentences/s, tokens/s, vs baseline, identical."""
  return {
    "name": r["name"],
    "walltime_s": r["walltime_s"],
    "sentences_per_s": examples / r["walltime_s"],
    "tokens_per_s": r["tokens_per_s"],
    "ms_per_token": r["ms_per_token"],
    "generated_tokens": r["generated_tokens"],
    "speedup_vs_baseline": r.get("speedup_vs_baseline", r.get("measured_speedup")),
    "identical_to_baseline": r.get("identical_to_baseline"),
    "compile_s": r["compile_s"],
  }
