"""The results page's batch-job sections: resources per group and the whole-job row."""

from __future__ import annotations

from typing import Any

from speculative.bench import cells


def _peak_rss(group: dict[str, Any]) -> str:
  """The group's peak RSS in MiB, marked '(process)' where the high-water mark was not reset."""
  return cells.fmt(group.get("peak_rss_mib"), 0) + (
    "" if group.get("peak_rss_reset") else " (process)"
  )


# The resources of a (batch size, temperature) group, from its record and its compile counts.
_RESOURCE_COLUMNS = [
  cells.BATCH,
  cells.TEMP,
  cells.column("input batches", "input_batches"),
  ("compiles (first calls)", lambda g: g["compiles"]["first_calls"]),
  ("backend compile s", lambda g: cells.fmt(g["compiles"]["first_calls_compile_s"], 1)),
  ("compiles (timed calls)", lambda g: g["compiles"]["timed_calls"]),
  ("peak RSS MiB", _peak_rss),
]


def resources_section(report: dict[str, Any]) -> list[str]:
  """XLA compiles and peak RSS per (batch size, temperature) group."""
  # A results.json written before this section existed has no compile counts.
  groups = [g["group"] for g in report["groups"] if g["group"].get("compiles") is not None]
  if not groups:
    return []
  return cells.section(
    "Resources per group",
    "XLA compiles counted through `jax.monitoring` (every jitted program, the small ones of "
    "argument handling included) in the methods' first calls and in the timed calls after them "
    "(0: no method recompiled for a new input batch); peak resident memory of the process during "
    "the group (its high-water mark reset at the group's start; '(process)' where it could not "
    "be reset).",
    cells.columns_table(_RESOURCE_COLUMNS, groups),
  )


_WHOLE_JOB_COLUMNS = [
  cells.column("method", "name"),
  cells.column("walltime s", "walltime_s", 1),
  cells.column("tokens", "generated_tokens"),
  cells.column("sentences/s", "sentences_per_s", 2),
  cells.TOKENS_PER_S,
  cells.MS_PER_TOKEN,
  cells.column("vs baseline", "speedup_vs_baseline", 2, "x"),
  cells.IDENTICAL,
]


def whole_job_section(report: dict[str, Any]) -> list[str]:
  """Every input of the split at the best batch size (bench/main.py, `whole_job`)."""
  job = report.get("whole_job")
  if not job:
    return []
  compiles = job["compiles"]
  return cells.section(
    "Whole job",
    f"{job['inputs']} ({job['truncated_inputs']} inputs truncated to inputs_length, not "
    f"skipped), greedy, at batch {job['batch_size']} (the sweep's fastest baseline batch size), "
    f"each method once, interleaved batch by batch; the speculative method is the sweep's "
    f"fastest at that batch size ({job['chosen'] or 'none'}). XLA compiles: "
    f"{compiles['first_calls']} in the first calls, {compiles['timed_calls']} after; peak RSS "
    f"{cells.fmt(job['peak_rss_mib'], 0)} MiB.",
    cells.columns_table(_WHOLE_JOB_COLUMNS, job["rows"]),
  )
