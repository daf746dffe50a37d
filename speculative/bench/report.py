"""The results page: Markdown tables (the paper's Tables 2 and 4 layout, the cost model with its
noise verdict, the profile, the targets), the pages it includes, results.json; and re-rendering a
saved results.json."""

from __future__ import annotations

import json
import math
import os
from typing import Any
from typing import Callable
from typing import Sequence

import numpy as np

from speculative import infer
from speculative.bench import conclude as conclude_lib
from speculative.bench import plots as plots_lib
from speculative.bench.conclude import TOO_NOISY


def _fmt(value: Any, digits: int = 2, suffix: str = "", scale: float = 1.0) -> str:
  """A table cell: floats to `digits` decimals after multiplying by `scale`; None -> '-'."""
  if value is None:
    return "-"
  if isinstance(value, float) and math.isnan(value):
    return "nan"
  if isinstance(value, (float, np.floating)):
    return f"{scale * value:.{digits}f}{suffix}"
  if scale != 1.0 and isinstance(value, (int, np.integer)):
    return f"{scale * value:.{digits}f}{suffix}"
  return f"{value}{suffix}"


def _refusable(record: dict[str, Any], value: Any, *args, **kwargs) -> str:
  """_fmt(value, ...), or TOO_NOISY where `record` (a row or a profile) says its costs were
  refused as too noisy."""
  if record.get("prediction_refused") or record.get("overhead_refused"):
    return TOO_NOISY
  return _fmt(value, *args, **kwargs)


def _rows(report: dict[str, Any], *kinds: str) -> list[dict[str, Any]]:
  """The rows of every group, of the given kinds ('baselines', 'speculative'), group by group."""
  return [r for g in report["groups"] for kind in kinds for r in g[kind]]


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  return "\n".join(lines)


def _loads(values: Sequence[float]) -> str:
  return ", ".join(f"{x:.2f}" for x in values)


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
    _cost_section,
    _speedup_section,
    _predicted_section,
    _baselines_section,
    _choice_section,
    _targets_section,
    _profile_section,
    _roofline_section,
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
    f"cores; {_fmt(machine['memory_gib'], 1)} GiB RAM; {machine['platform']}; "
    f"Python {machine['python']}, jax {machine['jax']} (backend: {machine['backend']}). "
    f"Load average (1/5/15 min) at start {_loads(machine['load_average_start'])}, at end "
    f"{_loads(machine.get('load_average_end', []))}"
    " (a load above the core count means other processes shared the CPU and timings are "
    "noisy).",
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


def _cost_section(report: dict[str, Any]) -> list[str]:
  """The measured cost model, with its noise."""
  cfg = report["config"]
  lines = [
    "## Cost model (measured)",
    "",
    "Per-call times of warm jitted `extend` calls on a realistic cache (encoder run on the "
    "real inputs, decoder cache prefilled to a mid-sentence position), median of repeats. "
    "c = draft step / target step; v(T) = target T-token call / target 1-token call.",
    "",
  ]
  header = [
    "batch",
    "target step ms",
    "(after the sweep)",
    "stock-equiv. step ms",
    "target prefill ms",
  ]
  t_max = max(max(int(k) for k in cm["v"]) for cm in report["costs"].values())
  header += [f"v({t})" for t in range(2, t_max + 1)]
  rows, draft_rows = [], []
  for b, cm in sorted(report["costs"].items(), key=lambda kv: int(kv[0])):
    rows.append(
      [
        b,
        _fmt(cm["target_step_s"], scale=1e3),
        _fmt(cm.get("target_step_s_after"), scale=1e3),
        _fmt(cm["stock_equivalent_step_s"], scale=1e3),
        _fmt(cm["target_prefill_s"], scale=1e3),
      ]
      + [_fmt(cm["v"].get(str(t)), 2) for t in range(2, t_max + 1)]
    )
    for name, dc in cm.get("drafters", {}).items():
      if dc["kind"] == "model":
        draft_rows.append(
          [
            b,
            name,
            _fmt(dc["draft_step_s"], 3, scale=1e3),
            _fmt(dc["draft_catch_up_s"], 3, scale=1e3),
            _fmt(dc["c"], 3),
            _fmt(dc["draft_prefill_s"], scale=1e3),
          ]
        )
      else:
        per_gamma = ", ".join(f"{k}: {1e3 * s:.3f}" for k, s in dc["propose_s"].items())
        draft_rows.append([b, name, f"propose ms {per_gamma}", "-", "per γ", "-"])
  lines += [_table(header, rows), ""]
  hoist = next(
    (cm.get("loop_matmuls") for cm in report["costs"].values() if cm.get("loop_matmuls")), None
  )
  if hoist and hoist.get("baseline") is not None:
    if hoist["baseline"] == hoist["stock_equivalent"]:
      lines += [
        f"**Stock-equivalent = ours after XLA.** The compiled decode step of "
        f"`stock_equivalent` runs the same {hoist['baseline']} matmuls per step as ours: "
        "XLA's loop-invariant code motion hoists the cross-attention K/V projection of the "
        "fixed encoder output out of the loop, so recomputing it \"every step\" costs "
        "nothing after compilation. T5X's `temperature_sample` closes over the same "
        "loop-invariant encoder output, so the same optimization applies to it; "
        "differences between `baseline` and `stock_equivalent` here are noise. "
        + (
          "`stock_t5x` above is T5X itself."
          if cfg["stock_t5x"]
          else "Timing stock T5X itself needs t5x installed (`stock_t5x='on'`)."
        ),
        "",
      ]
    else:
      lines += [
        f"The compiled decode step of `stock_equivalent` runs {hoist['stock_equivalent']} "
        f"matmuls per step, ours {hoist['baseline']} (the cross-attention K/V are "
        "recomputed every step).",
        "",
      ]
  if draft_rows:
    lines += [
      _table(
        ["batch", "drafter", "draft step ms", "draft 2-token call ms", "c", "draft prefill ms"],
        draft_rows,
      ),
      "",
    ]
  return lines + _noise_lines(report)


def _noise_lines(report: dict[str, Any]) -> list[str]:
  """The noise verdict of every cost estimate (absent from results measured before it existed)."""
  rows, max_spread, min_rounds = [], None, None
  for b, cm in sorted(report["costs"].items(), key=lambda kv: int(kv[0])):
    noise = cm.get("noise")
    if not noise:
      continue
    max_spread, min_rounds = noise["max_spread"], noise["min_rounds"]
    for name, est in noise["estimates"].items():
      rows.append(
        [
          b,
          name,
          _fmt(est["value"], 3),
          _fmt(est["spread"], 2),
          est["rounds"],
          f"**{TOO_NOISY}**" if name in noise["refused"] else "ok",
        ]
      )
  if not rows:
    return []
  return [
    f"Noise: every quantity is the median over interleaved timing rounds (all timers once "
    f"per round, the order rotating); a ratio is taken per round. spread = interquartile "
    f"range / median over the rounds. An estimate is refused, and the predictions (EXP) and "
    f"overheads that use it are reported as \"{TOO_NOISY}\", when its spread exceeds "
    f"{max_spread:.2f}, when fewer than {min_rounds} rounds were timed, when a round did not "
    "resolve it above timer jitter, or when v(T) < 1 (impossible).",
    "",
    _table(["batch", "estimate", "value", "spread", "rounds", "verdict"], rows),
    "",
  ]


def _speedup_section(report: dict[str, Any]) -> list[str]:
  """Speedups in the layout of the paper's Table 2."""
  cfg = report["config"]
  lines = ["## Speedup (layout of the paper's Table 2)", ""]
  rows = []
  for r in _rows(report, "speculative"):
    rows.append(
      [
        cfg["task_label"],
        r["drafter"],
        _fmt(r["temperature"], 0),
        r["batch_size"],
        r["gamma"],
        _fmt(r["alpha_used"]),
        _fmt(r["measured_speedup"], 2, "X"),
        _fmt(r["speedup_per_token"], 2, "X"),
        _fmt(r["speedup_vs_stock"], 2, "X"),
      ]
    )
  lines += [
    _table(
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
  for r in _rows(report, "speculative"):
    rows.append(
      [
        r["drafter"],
        _fmt(r["temperature"], 0),
        r["batch_size"],
        r["gamma"],
        _fmt(r["alpha_used"], 3),
        _fmt(r["drafted_per_call"]),
        _fmt(r["acceptance_rate"], 3),
        _fmt(r["block_efficiency"]),
        _fmt(r["expected_tokens"]),
        _fmt(r["c"], 3),
        _fmt(r["v"]),
        _refusable(r, r["predicted_speedup"], 2, "X"),
        _fmt(r["measured_speedup"], 2, "X"),
        _refusable(r, r["measured_over_predicted"]),
        _fmt(r["tokens_per_s"], 1),
        _fmt(r["compile_s"], 1),
        _fmt(r.get("identical_to_baseline")),
      ]
    )
  lines += [
    _table(
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
  for r in _rows(report, "baselines"):
    rows.append(
      [
        r["batch_size"],
        _fmt(r["temperature"], 0),
        r["name"],
        _fmt(r["walltime_s"], 3),
        r["generated_tokens"],
        _fmt(r["tokens_per_s"], 1),
        _fmt(r["ms_per_token"]),
        _fmt(r["speedup_vs_baseline"], 2, "X"),
        _fmt(r["compile_s"], 1),
        _fmt(r.get("identical_to_baseline")),
      ]
    )
  lines += [
    _table(
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
    f"that is below {report['config']['fallback_threshold']:.2f}X, plain decoding. The "
    "best "
    "measured gamma is shown for comparison (picking it is optimistic: it is the maximum "
    "of noisy measurements).",
    "",
  ]
  rows = [
    [
      c["batch_size"],
      _fmt(c["temperature"], 0),
      c["drafter"],
      c["decision"],
      _fmt(c["gamma"]),
      _fmt(c["predicted_speedup"], 2, "X"),
      _fmt(c["measured_speedup"], 2, "X"),
      _fmt(c["best_measured_gamma"]),
      _fmt(c["best_measured_speedup"], 2, "X"),
    ]
    for c in report["choices"]
  ]
  lines += [
    _table(
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
      _fmt(t["value"], 2),
      _fmt(t["threshold"], 2),
      "met"
      if t["met"]
      else TOO_NOISY
      if t["met"] is None
      else f"**missed by {t['shortfall']:.2f} ({100 * (1 - t['relative']):.0f}%)**",
      t["note"],
    ]
    for t in report["targets"]
  ]
  lines += [
    _table(["target", "value", "threshold", "result", "note"], rows)
    if rows
    else "(no target applies to this sweep)",
    "",
  ]
  if report.get("analysis"):
    lines += report["analysis"] + [""]
  return lines


def _profile_section(report: dict[str, Any]) -> list[str]:
  """Time per loop step, split."""
  lines = [
    "## Profile (time per loop step)",
    "",
    "step = (decode walltime - prefill) / loop steps (a loop step is one target call; at "
    "batch > 1 the loop runs until the slowest row is done). draft = gamma x draft step, "
    "verify = target (gamma+1)-token call, both from the cost model; overhead = the rest "
    "(sampling and acceptance over the vocabulary, the draft's catch-up token, "
    "bookkeeping).",
    "",
  ]
  rows = []
  for r in _rows(report, "baselines", "speculative"):
    p = r.get("profile")
    if not p:
      continue
    rows.append(
      [
        r["batch_size"],
        _fmt(r["temperature"], 0),
        r["name"],
        _fmt(p["step_s"], scale=1e3),
        _fmt(p.get("draft_s", 0.0), scale=1e3),
        _fmt(p.get("verify_s", p.get("target_step_s")), scale=1e3),
        _refusable(p, p["overhead_s"], scale=1e3),
        _refusable(p, p["overhead_fraction"], 0, "%", scale=100),
        _fmt(p["prefill_s_per_decode"], scale=1e3),
        _fmt(p["prefill_fraction"], 0, "%", scale=100),
      ]
    )
  lines += [
    _table(
      [
        "batch",
        "TEMP",
        "method",
        "step ms",
        "draft ms",
        "verify/target ms",
        "overhead ms",
        "overhead %",
        "prefill ms",
        "prefill % of walltime",
      ],
      rows,
    ),
    "",
  ]
  return lines


def _overhead_range(rows: Sequence[dict[str, Any]]) -> str:
  """The loop overhead fractions of `rows` ('-' where refused or absent), as 'a%' or 'a%..b%'."""
  values = sorted(
    r["profile"]["overhead_fraction"]
    for r in rows
    if r.get("profile") and r["profile"].get("overhead_fraction") is not None
  )
  if not values:
    return "-"
  low, high = _fmt(values[0], 0, "%", scale=100), _fmt(values[-1], 0, "%", scale=100)
  return low if low == high else f"{low}..{high}"


def _roofline_section(report: dict[str, Any]) -> list[str]:
  """The memory-bandwidth floor, the bare matmul stack's v(T) and the loop overhead."""
  rows, v_rows = [], []
  for b, cm in sorted(report["costs"].items(), key=lambda kv: int(kv[0])):
    roof = cm.get("roofline")
    if not roof:
      continue
    greedy = [
      g
      for g in report["groups"]
      if g["group"]["batch_size"] == int(b) and g["group"]["temperature"] == 0
    ]
    base = [r for g in greedy for r in g["baselines"] if r["method"] == "baseline"]
    floor_ms = 1e3 * roof["floor_step_s"] / int(b)
    step_ms = (
      1e3 * base[0]["profile"]["step_s"] / int(b) if base and base[0].get("profile") else None
    )
    rows.append(
      [
        b,
        _fmt(roof["weight_bytes"] / 1e6, 1),
        _fmt(roof["bandwidth_gb_s"], 1),
        _fmt(floor_ms, 3),
        _fmt(step_ms, 3),
        _fmt(None if step_ms is None else step_ms / floor_ms, 1, "x"),
        _overhead_range(base),
        _overhead_range([r for g in greedy for r in g["speculative"]]),
      ]
    )
    refused = roof.get("noise", {}).get("refused", {})
    for t, bare in roof["bare_v"].items():
      if t != "1":
        v_rows.append(
          [b, t, _fmt(cm["v"].get(t)), _fmt(bare), TOO_NOISY if f"bare v({t})" in refused else "ok"]
        )
  if not rows:
    return []
  return [
    "## Roofline",
    "",
    "A decode step reads at least the decoder's weights (the cached cross-attention K/V "
    "projections excluded); at the stream bandwidth of a bare jitted matvec over as many "
    "bytes, that takes the floor below. baseline ms/token = the baseline's greedy decode "
    "step (profile) / batch; loop overhead = (decode walltime - prefill - the model calls of "
    "the cost model) / (decode walltime - prefill), greedy, as in the profile.",
    "",
    _table(
      [
        "batch",
        "weights MB / step",
        "bandwidth GB/s",
        "floor ms/token",
        "baseline ms/token",
        "baseline / floor",
        "loop overhead baseline",
        "loop overhead speculative",
      ],
      rows,
    ),
    "",
    "v(T) of the target beside v(T) of a bare jitted stack of its decoder matmuls at the "
    "same B x T rows (no attention, norms or cache): where they differ, the gap is in "
    "what the model adds around the matmuls.",
    "",
    _table(["batch", "T", "target v(T)", "bare matmul v(T)", "bare verdict"], v_rows),
    "",
  ]


def _plots_section(report: dict[str, Any]) -> list[str]:
  """The plots written."""
  lines = ["## Plots", ""]
  for name, caption in report.get("plots", {}).items():
    lines += [f"![{caption}]({name})", "", f"*{caption}*", ""]
  return lines


# Pages written by the other measurement scripts into subfolders of the output dir; the results
# page includes them (each keeps its own command, date and machine line).
RELATED_PAGES = (
  ("spectr/results.md", "SpecTr: K drafts (scripts/bench_spectr.py)"),
  ("drafters/drafters.md", "Draft sources, lenience, adaptive gamma (scripts/bench_drafters.py)"),
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
  infer.write_atomic(
    os.path.join(output_dir, "results.json"),
    json.dumps(report, indent=1, ensure_ascii=False) + "\n",
  )
  infer.write_atomic(os.path.join(output_dir, "results.md"), markdown + "\n")
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
