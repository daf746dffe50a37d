"""The results page (results.md, its sections in SECTIONS), the pages it includes, its plots,
results.json, and re-rendering a saved results.json."""

from __future__ import annotations

import json
import os
from typing import Any
from typing import Callable
from typing import Sequence

import numpy as np

from speculative import analysis
from speculative.bench import conclude
from speculative.bench import costs
from speculative.bench import markdown
from speculative.jobs import checks
from speculative.jobs import runtime

column, fmt, section = markdown.column, markdown.fmt, markdown.section
TOO_NOISY = costs.TOO_NOISY


def _refusable(header: str, key: str, *args: Any, **kwargs: Any) -> markdown.Column:
  """The column of record[key], or TOO_NOISY where the record's costs were refused."""
  refused = lambda r: r.get("prediction_refused") or r.get("overhead_refused")
  return column(header, lambda r: TOO_NOISY if refused(r) else fmt(r[key], *args, **kwargs))


def _rows(report: dict[str, Any], *kinds: str) -> list[dict[str, Any]]:  # group by group
  return [r for g in report["groups"] for kind in kinds for r in g[kind]]


def _by_batch(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:  # (b, cost model)
  return sorted(report["costs"].items(), key=lambda kv: int(kv[0]))


# Columns of several tables; METHOD_COLUMNS name a speculative method as the paper's tables do.
BATCH, TEMP = column("batch", "batch_size"), column("TEMP", "temperature", 0)
METHOD, DRAFTER, GAMMA = column("method", "name"), column("M_q", "drafter"), column("γ", "gamma")
TOKENS_PER_S = column("tokens/s", "tokens_per_s", 1)
MS_PER_TOKEN = column("ms/token", "ms_per_token")
COMPILE_S, EMP = column("compile s", "compile_s", 1), column("EMP", "measured_speedup", 2, "X")
IDENTICAL = column("identical", "identical_to_baseline")
METHOD_COLUMNS = [DRAFTER, TEMP, column("BATCH", "batch_size"), GAMMA]


def _machine_section(report: dict[str, Any]) -> list[str]:
  machine = report["machine"]
  return section(
    "Machine",
    f"{runtime.cpu_line(machine)}; {machine['usable_cores']} usable of {machine['cpu_count']} CPU "
    f"cores; {fmt(machine['memory_gib'], 1)} GiB RAM; {machine['platform']}; "
    f"Python {machine['python']}, jax {machine['jax']} (backend: {machine['backend']}). "
    f"Load average (1/5/15 min) at start {markdown.loads(machine['load_average_start'])}, at end "
    f"{markdown.loads(machine.get('load_average_end', []))}"
    " (a load above the core count means other processes shared the CPU and timings are "
    "noisy).",
    "Runtime settings in force (the same for every method, stock T5X included): "
    + (runtime.describe(machine["runtime"]) if "runtime" in machine else "not recorded")
    + ".",
    "**Warnings:** " + " ".join(report["warnings"]) if report.get("warnings") else None,
  )


def _setup_section(report: dict[str, Any]) -> list[str]:
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
  return section("Setup", "\n".join(bullets))


def _cost_section(report: dict[str, Any]) -> list[str]:
  """The target's and drafters' costs, the decode paths, the noise verdicts."""
  t_max = max(max(int(k) for k in cm["v"]) for cm in report["costs"].values())
  rows = [
    [b]
    + [fmt(cm.get(key), scale=1e3) for key in ("target_step_s", "target_step_s_after")]
    + [fmt(cm[key], scale=1e3) for key in ("stock_equivalent_step_s", "target_prefill_s")]
    + [fmt(cm["v"].get(str(t)), 2) for t in range(2, t_max + 1)]
    for b, cm in _by_batch(report)
  ]
  header = ["batch", "target step ms", "(after the sweep)", "stock-equiv. step ms"]
  header += ["target prefill ms"] + [f"v({t})" for t in range(2, t_max + 1)]
  paths = [
    f"batch {b}: {cm['decode_path']['line']}" for b, cm in _by_batch(report) if "decode_path" in cm
  ]
  draft_rows = []
  for b, cm in _by_batch(report):
    for name, dc in cm.get("drafters", {}).items():
      if dc["kind"] == "model":
        ms = [fmt(dc[key], 3, scale=1e3) for key in ("draft_step_s", "draft_catch_up_s")]
        draft_rows.append([b, name, *ms, fmt(dc["c"], 3), fmt(dc["draft_prefill_s"], scale=1e3)])
      else:
        per_gamma = ", ".join(f"{k}: {1e3 * s:.3f}" for k, s in dc["propose_s"].items())
        draft_rows.append([b, name, f"propose ms {per_gamma}", "-", "per γ", "-"])
  draft_header = ["batch", "drafter", "draft step ms", "draft 2-token call ms", "c"]
  draft_header += ["draft prefill ms"]
  return section(
    "Cost model (measured)",
    "Per-call times of warm jitted `extend` calls on a realistic cache (encoder run on the "
    "real inputs, decoder cache prefilled to a mid-sentence position), median of repeats. "
    "c = draft step / target step; v(T) = target T-token call / target 1-token call.",
    markdown.table(header, rows),
    "Decode path of our baseline and speculative methods (the stock-equivalent loop and stock "
    f"T5X run XLA's dot): {'; '.join(paths)}."
    if paths
    else None,
    markdown.table(draft_header, draft_rows) if draft_rows else None,
    *_noise_paragraphs(report),
  )


def _noise_paragraphs(report: dict[str, Any]) -> list[str]:
  """The noise verdict of every cost estimate (none in results measured before it existed)."""
  rows, noise = [], None
  for b, cm in _by_batch(report):
    for name, est in (cm.get("noise") or {}).get("estimates", {}).items():
      noise = cm["noise"]
      verdict = f"**{TOO_NOISY}**" if name in noise["refused"] else "ok"
      rows.append([b, name, fmt(est["value"], 3), fmt(est["spread"], 2), est["rounds"], verdict])
  if not rows:
    return []
  return [
    f"Noise: every quantity is the median over interleaved timing rounds (all timers once "
    f"per round, the order rotating); a ratio is taken per round. spread = interquartile "
    f"range / median over the rounds. An estimate is refused, and the predictions (EXP) and "
    f"overheads that use it are reported as \"{TOO_NOISY}\", when its spread exceeds "
    f"{noise['max_spread']:.2f}, when fewer than {noise['min_rounds']} rounds were timed, when a "
    "round did not resolve it above timer jitter, or when v(T) < 1 (impossible).",
    markdown.table(["batch", "estimate", "value", "spread", "rounds", "verdict"], rows),
  ]


# The speedup table after its TASK column (the paper's Table 2).
SPEEDUP_COLUMNS = METHOD_COLUMNS + [
  column("α", "alpha_used"),
  column("SPEED", "measured_speedup", 2, "X"),
  column("SPEED per token", "speedup_per_token", 2, "X"),
  column("SPEED vs stock", "speedup_vs_stock", 2, "X"),
]


def _speedup_section(report: dict[str, Any]) -> list[str]:
  cfg = report["config"]
  task = column("TASK", lambda r: cfg["task_label"])
  return section(
    "Speedup (layout of the paper's Table 2)",
    markdown.columns_table([task] + SPEEDUP_COLUMNS, _rows(report, "speculative")),
    "SPEED = baseline walltime / speculative walltime (our own baseline); SPEED per "
    "token = ratio of ms per generated token (differs from SPEED under sampling, where "
    "output lengths differ by chance); SPEED vs stock is over "
    + ("stock T5X." if cfg["stock_t5x"] else "the stock-T5X-equivalent loop."),
  )


def _tabled(
  title: str, columns: Sequence[markdown.Column], records: Callable, before=None, after=None
):
  """The section of the table of `records(report)` (if any) between `before` and `after` (texts,
  or functions of the report)."""

  def write(report: dict[str, Any]) -> list[str]:
    found = records(report)
    if not found:
      return []
    text = [t(report) if callable(t) else t for t in (before, after)]
    return section(title, text[0], markdown.columns_table(columns, found), text[1])

  return write


PREDICTED_COLUMNS = METHOD_COLUMNS + [
  column("α", "alpha_used", 3),
  column("drafted/call", "drafted_per_call"),
  column("accept rate", "acceptance_rate", 3),
  column("block eff.", "block_efficiency"),
  column("E[#tokens]", "expected_tokens"),
  column("c", "c", 3),
  column("v(γ+1)", "v"),
  _refusable("EXP", "predicted_speedup", 2, "X"),
  EMP,
  _refusable("EMP/EXP", "measured_over_predicted"),
  TOKENS_PER_S,
  COMPILE_S,
  IDENTICAL,
]
_predicted_section = _tabled(
  "Predicted vs measured (layout of the paper's Table 4)",
  PREDICTED_COLUMNS,
  lambda report: _rows(report, "speculative"),
  after="accept rate = accepted / drafted (counts drafts after a rejection as not accepted, "
  "so it is below α for γ > 1); block eff. = generated tokens / target calls; "
  "identical = rows token-identical to the baseline (greedy only); drafted/call < γ "
  "for a drafter that sometimes proposes fewer tokens (prompt lookup without a match), "
  "where EXP, which assumes γ drafts per call, is optimistic.",
)
BASELINE_COLUMNS = [
  BATCH,
  TEMP,
  METHOD,
  column("walltime s", "walltime_s", 3),
  column("tokens", "generated_tokens"),
  TOKENS_PER_S,
  MS_PER_TOKEN,
  column("vs baseline", "speedup_vs_baseline", 2, "X"),
  COMPILE_S,
  IDENTICAL,
]
_baselines_section = _tabled(
  "Baselines", BASELINE_COLUMNS, lambda report: _rows(report, "baselines")
)
WHOLE_JOB_COLUMNS = [
  METHOD,
  column("walltime s", "walltime_s", 1),
  column("tokens", "generated_tokens"),
  column("sentences/s", "sentences_per_s", 2),
  TOKENS_PER_S,
  MS_PER_TOKEN,
  column("vs baseline", "speedup_vs_baseline", 2, "x"),
  IDENTICAL,
]


def _whole_job_text(report: dict[str, Any]) -> str:
  job = report["whole_job"]
  return (
    f"{job['inputs']} ({job['truncated_inputs']} inputs truncated to inputs_length, not "
    f"skipped), greedy, at batch {job['batch_size']} (the sweep's fastest baseline batch size), "
    f"each method once, interleaved batch by batch; the speculative method is the sweep's "
    f"fastest at that batch size ({job['chosen'] or 'none'}). XLA compiles: "
    f"{job['compiles']['first_calls']} in the first calls, {job['compiles']['timed_calls']} "
    f"after; peak RSS {fmt(job['peak_rss_mib'], 0)} MiB."
  )


_whole_job_section = _tabled(
  "Whole job",
  WHOLE_JOB_COLUMNS,
  lambda report: (report.get("whole_job") or {}).get("rows"),
  _whole_job_text,
)
RESOURCE_COLUMNS = [
  BATCH,
  TEMP,
  column("input batches", "input_batches"),
  column("compiles (first calls)", lambda g: g["compiles"]["first_calls"]),
  column("backend compile s", lambda g: g["compiles"]["first_calls_compile_s"], 1),
  column("compiles (timed calls)", lambda g: g["compiles"]["timed_calls"]),
  column(
    "peak RSS MiB",
    lambda g: fmt(g.get("peak_rss_mib"), 0) + ("" if g.get("peak_rss_reset") else " (process)"),
  ),
]
_resources_section = _tabled(
  "Resources per group",
  RESOURCE_COLUMNS,
  # A results.json written before this section existed has no compile counts.
  lambda report: [g["group"] for g in report["groups"] if g["group"].get("compiles") is not None],
  "XLA compiles counted through `jax.monitoring` (every jitted program, the small ones of "
  "argument handling included) in the methods' first calls and in the timed calls after them "
  "(0: no method recompiled for a new input batch); peak resident memory of the process during "
  "the group (its high-water mark reset at the group's start; '(process)' where it could not "
  "be reset).",
)
BEST_COLUMNS = [
  BATCH,
  TEMP,
  DRAFTER,
  column("best predicted γ", "predicted_best_gamma"),
  column("EXP", lambda r: costs.speedup_cell(r["predicted_speedup"], "X")),
  EMP,
  column("best measured γ", "best_measured_gamma"),
  column("its EMP", "best_measured_speedup", 2, "X"),
]
_best_section = _tabled(
  "Best γ",
  BEST_COLUMNS,
  lambda report: report["best"],
  "The γ with the best predicted speedup (EXP) and its measured one (EMP), beside the best "
  "measured γ (the maximum of noisy measurements: an optimistic pick). Which γ a job decodes "
  "at, 0 (plain decoding) included, is its own choice from what it measures: GAMMA = 'auto' "
  "(docs/auto_gamma.md).",
)


def _targets_section(report: dict[str, Any]) -> list[str]:
  rows = [
    [t["target"], fmt(t["value"], 2), fmt(t["threshold"], 2)]
    + [
      "met"
      if t["met"]
      else TOO_NOISY
      if t["met"] is None
      else f"**missed by {t['shortfall']:.2f} ({100 * (1 - t['relative']):.0f}%)**",
      t["note"],
    ]
    for t in report["targets"]
  ]
  header = ["target", "value", "threshold", "result", "note"]
  table = markdown.table(header, rows) if rows else "(no target applies to this sweep)"
  return section("Targets", table) + (report["analysis"] + [""] if report.get("analysis") else [])


# A row's time per loop step split into its parts (its profile with its batch, temperature, name).
PROFILE_COLUMNS = [
  BATCH,
  TEMP,
  METHOD,
  column("step ms", "step_s", scale=1e3),
  column("draft ms", lambda p: p.get("draft_s", 0.0), scale=1e3),
  column("verify/target ms", lambda p: p.get("verify_s", p.get("target_step_s")), scale=1e3),
  _refusable("overhead ms", "overhead_s", scale=1e3),
  _refusable("overhead %", "overhead_fraction", 0, "%", scale=100),
  column("prefill ms", "prefill_s_per_decode", scale=1e3),
  column("prefill % of walltime", "prefill_fraction", 0, "%", scale=100),
]
_profile_section = _tabled(
  "Profile (time per loop step)",
  PROFILE_COLUMNS,
  lambda report: [
    dict(r["profile"], batch_size=r["batch_size"], temperature=r["temperature"], name=r["name"])
    for r in _rows(report, "baselines", "speculative")
    if r.get("profile")
  ],
  "step = (decode walltime - prefill) / loop steps (a loop step is one target call; at "
  "batch > 1 the loop runs until the slowest row is done). draft = the draft model's calls "
  "of a step (a 2-token catch-up call + gamma-1 one-token calls) or a drafter's propose "
  "call, verify = target (gamma+1)-token call, both from the cost model; overhead = the "
  "rest (sampling and acceptance over the vocabulary, the draft loop's control flow, "
  "bookkeeping). A negative overhead is impossible (the calls were timed under another load "
  f'than the decode), so it is reported as "{TOO_NOISY}" too.',
)


def _plots_section(report: dict[str, Any]) -> list[str]:
  plots = report.get("plots", {}).items()
  return section("Plots") + [line for n, c in plots for line in (f"![{c}]({n})", "", f"*{c}*", "")]


SECTIONS = (
  _machine_section,
  _setup_section,
  _cost_section,
  _speedup_section,
  _predicted_section,
  _baselines_section,
  _whole_job_section,
  _resources_section,
  _best_section,
  _targets_section,
  _profile_section,
  _plots_section,
)


def format_report(report: dict[str, Any]) -> str:
  """The results page (Markdown)."""
  lines = section(
    report["title"],
    f"Regenerate with `{report['command']}` (from the repository root, on a quiet "
    f"machine). Generated {report['generated_at']}.",
    level=1,
  )
  return "\n".join(lines + [line for write in SECTIONS for line in write(report)])


# The benchmark's own pages (bench/spectr_page.py, bench/drafters_page.py), linked when found.
RELATED_PAGES = (
  ("spectr/results.md", "SpecTr: K drafts (python -m speculative.bench.spectr_page)"),
  (
    "drafters/drafters.md",
    "Draft sources, lenience, adaptive gamma (python -m speculative.bench.drafters_page)",
  ),
)


def related_section(output_dir: str) -> list[str]:
  """Links to the RELATED_PAGES found under output_dir (each page states its command and date)."""
  links = [f"- [{t}]({p})" for p, t in RELATED_PAGES if os.path.exists(os.path.join(output_dir, p))]
  return section("Related pages", "\n".join(links)) if links else []


# The plots: {file name: caption}.
PLOTS = {
  "speedup_vs_gamma.png": "Walltime speedup over our baseline vs γ; lines: predicted "
  "(Thm 3.8 with measured v(γ+1), dotted: v=1)",
  "alpha.png": "α per drafter and temperature",
}


def make_plots(report: dict[str, Any], output_dir: str) -> dict[str, str]:
  """Draws PLOTS into output_dir; returns them."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  for name, draw in zip(PLOTS, (_speedup_plot, _alpha_plot)):
    fig = draw(plt, report)
    fig.tight_layout()
    fig.savefig(os.path.join(output_dir, name), dpi=110)
    plt.close(fig)
  return dict(PLOTS)


def _predicted_curves(ax, rows, cm: dict[str, Any], color, label: str) -> None:
  """Theorem 3.8 with the rows' mean alpha and c, with the measured v and with v = 1 (no curve
  where a prediction was refused as too noisy)."""
  if len(rows) < 2 or any(r.get("predicted_speedup") is None for r in rows):
    return
  v_fn = analysis.verify_cost_fn({int(k): v for k, v in cm["v"].items()})
  t_max = max(int(k) for k in cm["v"])
  alpha = float(np.mean([r["alpha_used"] for r in rows]))
  c = float(np.mean([r["c"] for r in rows]))
  gammas = np.arange(1, max(max(r["gamma"] for r in rows), t_max - 1) + 1)
  curves = (
    ("-", dict(marker="."), v_fn, f"predicted (α={alpha:.2f}, c={c:.3f}, measured v)"),
    (":", dict(alpha=0.6), lambda t: 1.0, "predicted with v=1 (free verify)"),
  )
  for style, kwargs, v, text in curves:
    speedups = [
      float(analysis.walltime_improvement(alpha, int(k), c, v(int(k) + 1))) for k in gammas
    ]
    ax.plot(gammas, speedups, style, color=color, label=f"{label}: {text}", **kwargs)


def _speedup_plot(plt, report: dict[str, Any]):
  """Measured speedup vs gamma (points) and the predicted curves, one panel per batch size."""
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top

  groups = report["groups"]
  batch_sizes = sorted({g["group"]["batch_size"] for g in groups})
  fig, axes = plt.subplots(
    1, len(batch_sizes), figsize=(6.4 * len(batch_sizes), 6.0), squeeze=False
  )
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, batch_size in zip(axes[0], batch_sizes):
    batch = [g for g in groups if g["group"]["batch_size"] == batch_size]
    drafters = [
      (g, d) for g in batch for d in dict.fromkeys(r["drafter"] for r in g["speculative"])
    ]
    for i, (g, drafter) in enumerate(drafters):
      rows = sorted(
        (r for r in g["speculative"] if r["drafter"] == drafter), key=lambda r: r["gamma"]
      )
      label = f"{drafter}, T={g['group']['temperature']:g}"
      gammas, speedups = [r["gamma"] for r in rows], [r["measured_speedup"] for r in rows]
      color = colors[i % len(colors)]
      ax.plot(gammas, speedups, "o", color=color, ms=7, label=f"{label}: measured")
      _predicted_curves(ax, rows, report["costs"][str(batch_size)], color, label)
    ax.axhline(1.0, color="gray", lw=0.8)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(0.5, max(max(line.get_xdata()) for line in ax.get_lines()) + 0.5)
    ax.set(title=f"batch {batch_size}", xlabel="γ (drafted tokens per step)")
    ax.set_ylabel("walltime speedup over baseline")
    ax.grid(alpha=0.3)
    # Below the axes, so no measured point is hidden.
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=1, frameon=False)
  fig.suptitle(
    "Speedup vs γ: measured (points) and Theorem 3.8 with measured α, c, v(γ+1) (lines)",
    fontsize=10,
  )
  return fig


def _alpha_plot(plt, report: dict[str, Any]):
  """alpha per drafter and temperature (averaged over gammas at the smallest batch size)."""
  groups = report["groups"]
  batch_size = min(g["group"]["batch_size"] for g in groups)
  drafters = list(dict.fromkeys(r["drafter"] for g in groups for r in g["speculative"]))
  temperatures = sorted({g["group"]["temperature"] for g in groups})
  width_in = min(10.0, max(6.5, 1.2 * len(drafters) * len(temperatures)))
  fig, ax = plt.subplots(figsize=(width_in, 4.2))
  width = 0.8 / max(len(temperatures), 1)
  for ti, temperature in enumerate(temperatures):
    where = dict(batch_size=batch_size, temperature=temperature)
    rows = [conclude.rows_of(report, where, "speculative", drafter=d) for d in drafters]
    alphas = [[r["alpha_used"] for r in drafter_rows] for drafter_rows in rows]
    values = [float(np.mean(a)) if a else 0.0 for a in alphas]
    errors = [float(np.std(a)) if a else 0.0 for a in alphas]
    x = np.arange(len(drafters)) + ti * width
    bars = ax.bar(x, values, width, yerr=errors, capsize=3, label=f"temperature {temperature:g}")
    for bar, value in zip(bars, values):
      ax.text(
        bar.get_x() + bar.get_width() / 2, value + 0.02, f"{value:.2f}", ha="center", fontsize=9
      )
  ax.set_xticks(np.arange(len(drafters)) + width * (len(temperatures) - 1) / 2)
  ax.set_xticklabels(drafters)
  ax.set(ylim=(0, 1.1), ylabel="α = mean Σ_x min(p(x), q(x))")
  ax.set_title(
    f"α per drafter and temperature\n(batch {batch_size}, mean ± sd over γ)", fontsize=10
  )
  ax.legend(fontsize=8)
  ax.grid(axis="y", alpha=0.3)
  return fig


def write_report(
  report: dict[str, Any], output_dir: str, *, plots: bool = True, log: Callable[[str], None] = print
) -> None:
  """Writes results.json, results.md and (if `plots`) the plots to output_dir; logs
  `conclude.summary_lines`."""
  os.makedirs(output_dir, exist_ok=True)
  if plots:
    report["plots"] = make_plots(report, output_dir)
  page = "\n".join([format_report(report), *related_section(output_dir)]).rstrip() + "\n"
  markdown.write_page(output_dir, {"results.json": report, "results.md": page}, indent=1)
  for line in conclude.summary_lines(report):
    log(line)
  log(
    f"wrote the results page {os.path.join(output_dir, 'results.md')}, and results.json"
    + "".join(f", {name}" for name in report.get("plots", {}) if plots)
    + f" in {output_dir}"
  )


def render(results_json: str, output_dir: str | None = None) -> dict[str, Any]:
  """Re-concludes and re-renders a saved results.json (no timing); a bad file is a user error."""
  with checks.user_errors():
    checks.check_readable("--render results file", results_json)
    with open(results_json, encoding="utf-8") as f:
      try:
        report = json.load(f)
      except json.JSONDecodeError as e:
        raise ValueError(f"{results_json} is not a results.json: {e}") from e
    needed = ("groups", "costs", "config", "machine")
    if not (isinstance(report, dict) and report.get("groups") and set(needed) <= set(report)):
      raise ValueError(
        f"{results_json} is not the benchmark's results.json (it needs a non-empty 'groups' "
        f"and {', '.join(repr(k) for k in needed[1:])}; python -m speculative.benchmark writes it)"
      )
  report = conclude.conclude(report)
  write_report(report, output_dir or os.path.dirname(os.path.abspath(results_json)))
  return report
