"""The results page: Markdown tables (the paper's Tables 2 and 4 layout, the cost model with its
noise verdict, the profile, the targets), the pages it includes, results.json; and re-rendering a
saved results.json."""

from __future__ import annotations

import json
import os
from typing import Any
from typing import Callable

from speculative.bench import cells
from speculative.bench import conclude
from speculative.bench import conclude as conclude_lib
from speculative.bench import cost_sections
from speculative.bench import job_sections
from speculative.bench import plots as plots_lib
from speculative.checkpoints import files
from speculative.jobs import runtime


def format_report(report: dict[str, Any]) -> str:
  """The results page (Markdown)."""
  lines = [f"# {report['title']}", ""]
  lines += [
    f"Regenerate with `{report['command']}` (from the repository root, on a quiet "
    f"machine). Generated {report['generated_at']}.",
    "",
  ]
  for section in (
    _machine_section,
    _setup_section,
    cost_sections.cost_section,
    _speedup_section,
    _predicted_section,
    _baselines_section,
    job_sections.whole_job_section,
    job_sections.resources_section,
    _choice_section,
    _targets_section,
    cost_sections.profile_section,
    cost_sections.roofline_section,
    _plots_section,
  ):
    lines += section(report)
  return "\n".join(lines)


def _machine_section(report: dict[str, Any]) -> list[str]:
  """The machine and its load."""
  machine = report["machine"]
  lines = [
    "## Machine",
    "",
    f"{machine['cpu']}; {machine['usable_cores']} usable of {machine['cpu_count']} CPU "
    f"cores; {cells.fmt(machine['memory_gib'], 1)} GiB RAM; {machine['platform']}; "
    f"Python {machine['python']}, jax {machine['jax']} (backend: {machine['backend']}). "
    f"Load average (1/5/15 min) at start {cells.loads(machine['load_average_start'])}, at end "
    f"{cells.loads(machine.get('load_average_end', []))}"
    " (a load above the core count means other processes shared the CPU and timings are "
    "noisy).",
    "",
    "Runtime settings in force (the same for every method, stock T5X included): "
    + (runtime.describe(machine["runtime"]) if "runtime" in machine else "not recorded")
    + ".",
    "",
  ]
  warn = [w for w in report.get("warnings", [])]
  if warn:
    lines += ["**Warnings:** " + " ".join(warn), ""]
  return lines


def _setup_section(report: dict[str, Any]) -> list[str]:
  """What was compared and how."""
  cfg = report["config"]
  lines = [
    "## Setup",
    "",
    f"- Target: `{cfg['target_name']}` ({report['models']['target']}). "
    f"Draft: `{cfg['draft_name']}` ({report['models'].get('draft', '-')}).",
    f"- Inputs: {report['inputs']}, padded to {cfg['inputs_length']} tokens; at most "
    f"{cfg['max_new_tokens']} new tokens, stop at EOS. f32 everywhere.",
    f"- Drafters: {', '.join(cfg['drafters'])}. Batch sizes {cfg['batch_sizes']}, "
    f"temperatures {cfg['temperatures']} (0 = greedy), top-k/top-p off.",
    f"- Timing: every method compiled first (compile time separate), then each input batch "
    f"decoded {cfg['repeats']}x by every method, interleaved; walltime = sum over input "
    "batches of the median; `block_until_ready` on each call. Speedup = baseline / "
    "speculative walltime on the same inputs and weights.",
    "- Baselines: `baseline` = our cached loop, one target call per token; "
    "`stock_equivalent` = the same loop with the cross-attention K/V recomputed from the "
    "encoder output at every step, as T5X's decoder does"
    + (
      "; `stock_t5x` = `t5x.decoding.temperature_sample` via T5X's `EncoderDecoderModel` "
      "and network on the same weights (topk=0 when sampling; T5X's default topk=1 would "
      "be greedy)."
      if cfg["stock_t5x"]
      else " (t5x is not installed here, so this stands in for stock T5X)."
    ),
    "- EXP (predicted) = E[#tokens] / (gamma c + v(gamma+1)) with E[#tokens] = "
    "(1 - alpha^(gamma+1)) / (1 - alpha) (Eq. 1, Thm 3.8 with the measured verify cost), "
    "alpha = mean over drafted positions of sum_x min(p, q); EMP = measured.",
    "",
  ]
  return lines


def _speedup_section(report: dict[str, Any]) -> list[str]:
  """Speedups in the layout of the paper's Table 2."""
  cfg = report["config"]
  lines = ["## Speedup (layout of the paper's Table 2)", ""]
  rows = []
  for r in cells.rows_of(report, "speculative"):
    rows.append(
      [
        cfg["task_label"],
        r["drafter"],
        cells.fmt(r["temperature"], 0),
        r["batch_size"],
        r["gamma"],
        cells.fmt(r["alpha_used"]),
        cells.fmt(r["measured_speedup"], 2, "X"),
        cells.fmt(r["speedup_per_token"], 2, "X"),
        cells.fmt(r["speedup_vs_stock"], 2, "X"),
      ]
    )
  lines += [
    cells.table(
      ["TASK", "M_q", "TEMP", "BATCH", "γ", "α", "SPEED", "SPEED per token", "SPEED vs stock"], rows
    ),
    "",
    "SPEED = baseline walltime / speculative walltime (our own baseline); SPEED per "
    "token = ratio of ms per generated token (differs from SPEED under sampling, where "
    "output lengths differ by chance); SPEED vs stock is over "
    + ("stock T5X." if cfg["stock_t5x"] else "the stock-T5X-equivalent loop."),
    "",
  ]
  return lines


def _predicted_section(report: dict[str, Any]) -> list[str]:
  """Predicted vs measured, in the layout of the paper's Table 4."""
  lines = ["## Predicted vs measured (layout of the paper's Table 4)", ""]
  rows = []
  for r in cells.rows_of(report, "speculative"):
    rows.append(
      [
        r["drafter"],
        cells.fmt(r["temperature"], 0),
        r["batch_size"],
        r["gamma"],
        cells.fmt(r["alpha_used"], 3),
        cells.fmt(r["drafted_per_call"]),
        cells.fmt(r["acceptance_rate"], 3),
        cells.fmt(r["block_efficiency"]),
        cells.fmt(r["expected_tokens"]),
        cells.fmt(r["c"], 3),
        cells.fmt(r["v"]),
        cells.refusable(r, r["predicted_speedup"], 2, "X"),
        cells.fmt(r["measured_speedup"], 2, "X"),
        cells.refusable(r, r["measured_over_predicted"]),
        cells.fmt(r["tokens_per_s"], 1),
        cells.fmt(r["compile_s"], 1),
        cells.fmt(r.get("identical_to_baseline")),
      ]
    )
  lines += [
    cells.table(
      [
        "M_q",
        "TEMP",
        "BATCH",
        "γ",
        "α",
        "drafted/call",
        "accept rate",
        "block eff.",
        "E[#tokens]",
        "c",
        "v(γ+1)",
        "EXP",
        "EMP",
        "EMP/EXP",
        "tokens/s",
        "compile s",
        "identical",
      ],
      rows,
    ),
    "",
    "accept rate = accepted / drafted (counts drafts after a rejection as not accepted, "
    "so it is below α for γ > 1); block eff. = generated tokens / target calls; "
    "identical = rows token-identical to the baseline (greedy only); drafted/call < γ "
    "for a drafter that sometimes proposes fewer tokens (prompt lookup without a match), "
    "where EXP, which assumes γ drafts per call, is optimistic.",
    "",
  ]
  return lines


def _baselines_section(report: dict[str, Any]) -> list[str]:
  """The non-speculative methods."""
  lines = ["## Baselines", ""]
  rows = []
  for r in cells.rows_of(report, "baselines"):
    rows.append(
      [
        r["batch_size"],
        cells.fmt(r["temperature"], 0),
        r["name"],
        cells.fmt(r["walltime_s"], 3),
        r["generated_tokens"],
        cells.fmt(r["tokens_per_s"], 1),
        cells.fmt(r["ms_per_token"]),
        cells.fmt(r["speedup_vs_baseline"], 2, "X"),
        cells.fmt(r["compile_s"], 1),
        cells.fmt(r.get("identical_to_baseline")),
      ]
    )
  lines += [
    cells.table(
      [
        "batch",
        "TEMP",
        "method",
        "walltime s",
        "tokens",
        "tokens/s",
        "ms/token",
        "vs baseline",
        "compile s",
        "identical",
      ],
      rows,
    ),
    "",
  ]
  return lines


def _choice_section(report: dict[str, Any]) -> list[str]:
  """The gamma policy."""
  lines = [
    "## gamma choice",
    "",
    f"Policy: among the measured gammas, the one with the best predicted speedup (EXP); if "
    f"that is below {report['config']['fallback_threshold']:.2f}X, plain decoding. Where "
    "every prediction was refused as too noisy: plain decoding if every measured gamma was "
    f"slower than the baseline (\"{conclude.MEASURED_FALLBACK}\"), else no decision. The best "
    "measured gamma is shown for comparison (picking it is optimistic: it is the maximum "
    "of noisy measurements).",
    "",
  ]
  rows = [
    [
      c["batch_size"],
      cells.fmt(c["temperature"], 0),
      c["drafter"],
      c["decision"],
      cells.fmt(c["gamma"]),
      cells.fmt(c["predicted_speedup"], 2, "X"),
      cells.fmt(c["measured_speedup"], 2, "X"),
      cells.fmt(c["best_measured_gamma"]),
      cells.fmt(c["best_measured_speedup"], 2, "X"),
    ]
    for c in report["choices"]
  ]
  lines += [
    cells.table(
      ["batch", "TEMP", "M_q", "decision", "γ", "EXP", "EMP", "best measured γ", "its EMP"], rows
    ),
    "",
  ]
  return lines


def _targets_section(report: dict[str, Any]) -> list[str]:
  """The targets check and the explanations of missed ones."""
  lines = ["## Targets", ""]
  rows = [
    [
      t["target"],
      cells.fmt(t["value"], 2),
      cells.fmt(t["threshold"], 2),
      "met"
      if t["met"]
      else conclude.TOO_NOISY
      if t["met"] is None
      else f"**missed by {t['shortfall']:.2f} ({100 * (1 - t['relative']):.0f}%)**",
      t["note"],
    ]
    for t in report["targets"]
  ]
  lines += [
    cells.table(["target", "value", "threshold", "result", "note"], rows)
    if rows
    else "(no target applies to this sweep)",
    "",
  ]
  if report.get("analysis"):
    lines += report["analysis"] + [""]
  return lines


def _plots_section(report: dict[str, Any]) -> list[str]:
  """The plots written."""
  lines = ["## Plots", ""]
  for name, caption in report.get("plots", {}).items():
    lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
  return lines


# Pages written by bench/spectr_page.py and bench/drafters_page.py into subfolders of the output
# dir; the results page includes them (each keeps its own command, date and machine line).
RELATED_PAGES = (
  ("spectr/results.md", "SpecTr: K drafts (python -m speculative.bench.spectr_page)"),
  (
    "drafters/drafters.md",
    "Draft sources, lenience, adaptive gamma (python -m speculative.bench.drafters_page)",
  ),
)


def related_sections(output_dir: str) -> str:
  """The RELATED_PAGES found under output_dir, as sections (headings demoted one level)."""
  parts = []
  for relative, title in RELATED_PAGES:
    path = os.path.join(output_dir, relative)
    if not os.path.exists(path):
      continue
    with open(path, encoding="utf-8") as f:
      body = f.read().strip()
    body = "\n".join("#" + line if line.startswith("#") else line for line in body.splitlines())
    parts.append(
      f"\n\n## {title}\n\nIncluded from `{relative}` (regenerated by its own "
      f"command, given below).\n\n{body}"
    )
  return "".join(parts)


def write_report(
  report: dict[str, Any], output_dir: str, *, plots: bool = True, log: Callable[[str], None] = print
) -> None:
  """Writes results.json, results.md and (if `plots`) the PNG plots to output_dir, atomically."""
  os.makedirs(output_dir, exist_ok=True)
  if plots:
    report["plots"] = plots_lib.make_plots(report, output_dir)
  markdown = format_report(report) + related_sections(output_dir)
  files.write_atomic(
    os.path.join(output_dir, "results.json"),
    json.dumps(report, indent=1, ensure_ascii=False) + "\n",
  )
  files.write_atomic(os.path.join(output_dir, "results.md"), markdown + "\n")
  log(markdown)
  log(
    f"wrote {output_dir}/results.md, results.json"
    + (", speedup_vs_gamma.png, alpha.png" if plots else "")
  )


def render(results_json: str, output_dir: str | None = None) -> dict[str, Any]:
  """Re-concludes and re-renders a saved results.json (no timing): results.md, plots, JSON."""
  with open(results_json, encoding="utf-8") as f:
    report = json.load(f)
  report = conclude_lib.conclude(report)
  write_report(report, output_dir or os.path.dirname(os.path.abspath(results_json)))
  return report
