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
from speculative.jobs import checks
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
  lines = cells.section(
    "Machine",
    f"{machine['cpu']}; {machine['usable_cores']} usable of {machine['cpu_count']} CPU "
    f"cores; {cells.fmt(machine['memory_gib'], 1)} GiB RAM; {machine['platform']}; "
    f"Python {machine['python']}, jax {machine['jax']} (backend: {machine['backend']}). "
    f"Load average (1/5/15 min) at start {cells.loads(machine['load_average_start'])}, at end "
    f"{cells.loads(machine.get('load_average_end', []))}"
    " (a load above the core count means other processes shared the CPU and timings are "
    "noisy).",
    "Runtime settings in force (the same for every method, stock T5X included): "
    + (runtime.describe(machine["runtime"]) if "runtime" in machine else "not recorded")
    + ".",
  )
  warn = [w for w in report.get("warnings", [])]
  if warn:
    lines += ["**Warnings:** " + " ".join(warn), ""]
  return lines


def _setup_section(report: dict[str, Any]) -> list[str]:
  """What was compared and how."""
  cfg = report["config"]
  bullets = [
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
  ]
  return cells.section("Setup", "\n".join(bullets))


_DRAFTER = cells.column("M_q", "drafter")
_GAMMA = cells.column("γ", "gamma")
_EMP = cells.column("EMP", "measured_speedup", 2, "X")
# A speculative method as the paper's tables name it: drafter, temperature, batch size, gamma.
_METHOD_COLUMNS = [_DRAFTER, cells.TEMP, cells.column("BATCH", "batch_size"), _GAMMA]
# The columns of the speedup table after its TASK column (the paper's Table 2).
_SPEEDUP_COLUMNS = _METHOD_COLUMNS + [
  cells.column("α", "alpha_used"),
  cells.column("SPEED", "measured_speedup", 2, "X"),
  cells.column("SPEED per token", "speedup_per_token", 2, "X"),
  cells.column("SPEED vs stock", "speedup_vs_stock", 2, "X"),
]


def _speedup_section(report: dict[str, Any]) -> list[str]:
  """Speedups in the layout of the paper's Table 2."""
  cfg = report["config"]
  task = ("TASK", lambda r: cfg["task_label"])
  return cells.section(
    "Speedup (layout of the paper's Table 2)",
    cells.columns_table([task] + _SPEEDUP_COLUMNS, cells.rows_of(report, "speculative")),
    "SPEED = baseline walltime / speculative walltime (our own baseline); SPEED per "
    "token = ratio of ms per generated token (differs from SPEED under sampling, where "
    "output lengths differ by chance); SPEED vs stock is over "
    + ("stock T5X." if cfg["stock_t5x"] else "the stock-T5X-equivalent loop."),
  )


# The predicted-vs-measured table (the paper's Table 4, with our diagnostics).
_PREDICTED_COLUMNS = _METHOD_COLUMNS + [
  cells.column("α", "alpha_used", 3),
  cells.column("drafted/call", "drafted_per_call"),
  cells.column("accept rate", "acceptance_rate", 3),
  cells.column("block eff.", "block_efficiency"),
  cells.column("E[#tokens]", "expected_tokens"),
  cells.column("c", "c", 3),
  cells.column("v(γ+1)", "v"),
  cells.column("EXP", "predicted_speedup", 2, "X", refused=True),
  _EMP,
  cells.column("EMP/EXP", "measured_over_predicted", refused=True),
  cells.TOKENS_PER_S,
  cells.COMPILE_S,
  cells.IDENTICAL,
]


def _predicted_section(report: dict[str, Any]) -> list[str]:
  """Predicted vs measured, in the layout of the paper's Table 4."""
  return cells.section(
    "Predicted vs measured (layout of the paper's Table 4)",
    cells.columns_table(_PREDICTED_COLUMNS, cells.rows_of(report, "speculative")),
    "accept rate = accepted / drafted (counts drafts after a rejection as not accepted, "
    "so it is below α for γ > 1); block eff. = generated tokens / target calls; "
    "identical = rows token-identical to the baseline (greedy only); drafted/call < γ "
    "for a drafter that sometimes proposes fewer tokens (prompt lookup without a match), "
    "where EXP, which assumes γ drafts per call, is optimistic.",
  )


_BASELINE_COLUMNS = [
  cells.BATCH,
  cells.TEMP,
  cells.column("method", "name"),
  cells.column("walltime s", "walltime_s", 3),
  cells.column("tokens", "generated_tokens"),
  cells.TOKENS_PER_S,
  cells.MS_PER_TOKEN,
  cells.column("vs baseline", "speedup_vs_baseline", 2, "X"),
  cells.COMPILE_S,
  cells.IDENTICAL,
]


def _baselines_section(report: dict[str, Any]) -> list[str]:
  """The non-speculative methods."""
  return cells.section(
    "Baselines", cells.columns_table(_BASELINE_COLUMNS, cells.rows_of(report, "baselines"))
  )


# The gamma policy's decision per (batch size, temperature, drafter).
_CHOICE_COLUMNS = [
  cells.BATCH,
  cells.TEMP,
  _DRAFTER,
  cells.column("decision", "decision"),
  _GAMMA,
  cells.column("EXP", "predicted_speedup", 2, "X"),
  _EMP,
  cells.column("best measured γ", "best_measured_gamma"),
  cells.column("its EMP", "best_measured_speedup", 2, "X"),
]


def _choice_section(report: dict[str, Any]) -> list[str]:
  """The gamma policy."""
  policy = (
    f"Policy: among the measured gammas, the one with the best predicted speedup (EXP); if "
    f"that is below {report['config']['fallback_threshold']:.2f}X, plain decoding. Where "
    "every prediction was refused as too noisy: plain decoding if every measured gamma was "
    f"slower than the baseline (\"{conclude.MEASURED_FALLBACK}\"), else no decision. The best "
    "measured gamma is shown for comparison (picking it is optimistic: it is the maximum "
    "of noisy measurements)."
  )
  return cells.section(
    "gamma choice", policy, cells.columns_table(_CHOICE_COLUMNS, report["choices"])
  )


def _targets_section(report: dict[str, Any]) -> list[str]:
  """The targets check and the explanations of missed ones."""
  lines = cells.section("Targets")
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
  lines = cells.section("Plots")
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


def summary_lines(report: dict[str, Any]) -> list[str]:
  """What the command line prints once the page is written (the page itself is in the file): one
  line per group with its best measured gamma and the policy's decision, and the warnings count."""
  elapsed = report.get("elapsed_s")
  lines = [
    f"{report['title']}: {len(report['groups'])} group{'' if len(report['groups']) == 1 else 's'}"
    + (f", {elapsed:.0f} s" if elapsed is not None else "")
  ]
  for choice in report.get("choices", []):
    lines.append(
      f"  batch {choice['batch_size']}, temperature {cells.fmt(choice['temperature'], 1)}: "
      f"{choice['drafter']} best measured gamma {cells.fmt(choice['best_measured_gamma'])} "
      f"({cells.fmt(choice['best_measured_speedup'], suffix='x')}); policy: {choice['decision']}"
    )
  if report.get("warnings"):
    lines.append(f"  {len(report['warnings'])} warning(s): see the page's Machine section")
  return lines


def write_report(
  report: dict[str, Any], output_dir: str, *, plots: bool = True, log: Callable[[str], None] = print
) -> None:
  """Writes results.json, results.md and (if `plots`) the PNG plots to output_dir, atomically;
  logs a short summary (`summary_lines`) and the paths written, not the page."""
  os.makedirs(output_dir, exist_ok=True)
  if plots:
    report["plots"] = plots_lib.make_plots(report, output_dir)
  markdown = format_report(report) + related_sections(output_dir)
  files.write_atomic(
    os.path.join(output_dir, "results.json"),
    json.dumps(report, indent=1, ensure_ascii=False) + "\n",
  )
  page = os.path.join(output_dir, "results.md")
  files.write_atomic(page, markdown + "\n")
  for line in summary_lines(report):
    log(line)
  log(
    f"wrote the results page {page}, and results.json"
    + (", speedup_vs_gamma.png, alpha.png" if plots else "")
    + f" in {output_dir}"
  )


def render(results_json: str, output_dir: str | None = None) -> dict[str, Any]:
  """Re-concludes and re-renders a saved results.json (no timing): results.md, plots, JSON. A
  missing or unreadable file, or one that is not JSON, is the user's to fix (`checks.user_errors`:
  one line at the command line)."""
  with checks.user_errors():
    checks.check_readable("--render results file", results_json)
    with open(results_json, encoding="utf-8") as f:
      try:
        report = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{results_json} is not a results.json: {e}") from e
  report = conclude_lib.conclude(report)
  write_report(report, output_dir or os.path.dirname(os.path.abspath(results_json)))
  return report
