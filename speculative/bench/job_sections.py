"""The results page's batch-job sections: resources per group and the whole-job row."""

from __future__ import annotations

from typing import Any

from speculative.bench import cells


def resources_section(report: dict[str, Any]) -> list[str]:
  """XLA compiles and peak RSS per (batch size, temperature) group."""
  rows = []
  for g in report["groups"]:
    group = g["group"]
    compiles = group.get("compiles")
    if compiles is None:  # a results.json written before this section existed
      continue
    rows.append(
      [
        group["batch_size"],
        cells.fmt(group["temperature"], 0),
        group["input_batches"],
        compiles["first_calls"],
        cells.fmt(compiles["first_calls_compile_s"], 1),
        compiles["timed_calls"],
        cells.fmt(group.get("peak_rss_mib"), 0)
        + ("" if group.get("peak_rss_reset") else " (process)"),
      ]
    )
  if not rows:
    return []
  return [
    "## Resources per group",
    "",
    "XLA compiles counted through `jax.monitoring` (every jitted program, the small ones of "
    "argument handling included) in the methods' first calls and in the timed calls after them "
    "(0: no method recompiled for a new input batch); peak resident memory of the process during "
    "the group (its high-water mark reset at the group's start; '(process)' where it could not "
    "be reset).",
    "",
    cells.table(
      [
        "batch",
        "TEMP",
        "input batches",
        "compiles (first calls)",
        "backend compile s",
        "compiles (timed calls)",
        "peak RSS MiB",
      ],
      rows,
    ),
    "",
  ]


def whole_job_section(report: dict[str, Any]) -> list[str]:
  """Every input of the split at the best batch size (bench/whole_job.py)."""
  job = report.get("whole_job")
  if not job:
    return []
  rows = [
    [
      r["name"],
      cells.fmt(r["walltime_s"], 1),
      r["generated_tokens"],
      cells.fmt(r["sentences_per_s"], 2),
      cells.fmt(r["tokens_per_s"], 1),
      cells.fmt(r["ms_per_token"]),
      cells.fmt(r["speedup_vs_baseline"], 2, "x"),
      cells.fmt(r["identical_to_baseline"]),
    ]
    for r in job["rows"]
  ]
  compiles = job["compiles"]
  return [
    "## Whole job",
    "",
    f"{job['inputs']} ({job['truncated_inputs']} inputs truncated to inputs_length, not "
    f"skipped), greedy, at batch {job['batch_size']} (the sweep's fastest baseline batch size), "
    f"each method once, interleaved batch by batch; the speculative method is the sweep's "
    f"fastest at that batch size ({job['chosen'] or 'none'}). XLA compiles: "
    f"{compiles['first_calls']} in the first calls, {compiles['timed_calls']} after; peak RSS "
    f"{cells.fmt(job['peak_rss_mib'], 0)} MiB.",
    "",
    cells.table(
      [
        "method",
        "walltime s",
        "tokens",
        "sentences/s",
        "tokens/s",
        "ms/token",
        "vs baseline",
        "identical",
      ],
      rows,
    ),
    "",
  ]
