"""The results page's measurement sections: the cost model with its noise verdict, the profile of
a loop step, and the roofline (memory-bandwidth floor, bare matmul v(T), loop overhead)."""

from __future__ import annotations

from typing import Any
from typing import Sequence

from speculative.bench import cells
from speculative.bench import conclude


def cost_section(report: dict[str, Any]) -> list[str]:
  """The measured cost model, with its noise."""
  lines = cells.section(
    "Cost model (measured)",
    "Per-call times of warm jitted `extend` calls on a realistic cache (encoder run on the "
    "real inputs, decoder cache prefilled to a mid-sentence position), median of repeats. "
    "c = draft step / target step; v(T) = target T-token call / target 1-token call.",
  )
  lines += [_target_cost_table(report), ""] + _path_lines(report) + _hoisting_lines(report)
  draft_rows = _draft_cost_rows(report)
  if draft_rows:
    lines += [
      cells.table(
        ["batch", "drafter", "draft step ms", "draft 2-token call ms", "c", "draft prefill ms"],
        draft_rows,
      ),
      "",
    ]
  return lines + _noise_lines(report)


def _path_lines(report: dict[str, Any]) -> list[str]:
  """Which decode path our models ran at each batch size (the stock rows always run XLA's)."""
  paths = [(b, cm["decode_path"]["line"]) for b, cm in _by_batch(report) if "decode_path" in cm]
  if not paths:
    return []
  return [
    "Decode path of our baseline and speculative methods (the stock-equivalent loop and stock "
    "T5X run XLA's dot): " + "; ".join(f"batch {b}: {line}" for b, line in paths) + ".",
    "",
  ]


def _by_batch(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
  """(batch size, cost model) in batch order."""
  return sorted(report["costs"].items(), key=lambda kv: int(kv[0]))


def _target_cost_table(report: dict[str, Any]) -> str:
  """Per batch size: the target's step (before and after the sweep), the stock-equivalent step,
  the prefill and v(T)."""
  header = [
    "batch",
    "target step ms",
    "(after the sweep)",
    "stock-equiv. step ms",
    "target prefill ms",
  ]
  t_max = max(max(int(k) for k in cm["v"]) for cm in report["costs"].values())
  header += [f"v({t})" for t in range(2, t_max + 1)]
  rows = [
    [
      b,
      cells.fmt(cm["target_step_s"], scale=1e3),
      cells.fmt(cm.get("target_step_s_after"), scale=1e3),
      cells.fmt(cm["stock_equivalent_step_s"], scale=1e3),
      cells.fmt(cm["target_prefill_s"], scale=1e3),
    ]
    + [cells.fmt(cm["v"].get(str(t)), 2) for t in range(2, t_max + 1)]
    for b, cm in _by_batch(report)
  ]
  return cells.table(header, rows)


def _draft_cost_rows(report: dict[str, Any]) -> list[list[Any]]:
  """Per batch size and drafter: a draft model's step, catch-up call, c and prefill, or another
  drafter's propose time per gamma."""
  rows = []
  for b, cm in _by_batch(report):
    for name, dc in cm.get("drafters", {}).items():
      if dc["kind"] == "model":
        rows.append(
          [
            b,
            name,
            cells.fmt(dc["draft_step_s"], 3, scale=1e3),
            cells.fmt(dc["draft_catch_up_s"], 3, scale=1e3),
            cells.fmt(dc["c"], 3),
            cells.fmt(dc["draft_prefill_s"], scale=1e3),
          ]
        )
      else:
        per_gamma = ", ".join(f"{k}: {1e3 * s:.3f}" for k, s in dc["propose_s"].items())
        rows.append([b, name, f"propose ms {per_gamma}", "-", "per γ", "-"])
  return rows


def _hoisting_lines(report: dict[str, Any]) -> list[str]:
  """Whether the compiled stock-equivalent step runs more matmuls than ours (XLA hoisting)."""
  hoist = next(
    (cm.get("loop_matmuls") for cm in report["costs"].values() if cm.get("loop_matmuls")), None
  )
  if not hoist or hoist.get("baseline") is None:
    return []
  if hoist["baseline"] != hoist["stock_equivalent"]:
    return [
      f"The compiled decode step of `stock_equivalent` runs {hoist['stock_equivalent']} "
      f"matmuls per step, ours {hoist['baseline']} (the cross-attention K/V are "
      "recomputed every step).",
      "",
    ]
  return [
    f"**Stock-equivalent = ours after XLA.** The compiled decode step of "
    f"`stock_equivalent` runs the same {hoist['baseline']} matmuls per step as ours: "
    "XLA's loop-invariant code motion hoists the cross-attention K/V projection of the "
    "fixed encoder output out of the loop, so recomputing it \"every step\" costs "
    "nothing after compilation. T5X's `temperature_sample` closes over the same "
    "loop-invariant encoder output, so the same optimization applies to it; "
    "differences between `baseline` and `stock_equivalent` here are noise. "
    + (
      "`stock_t5x` above is T5X itself."
      if report["config"]["stock_t5x"]
      else "Timing stock T5X itself needs t5x installed (`stock_t5x='on'`)."
    ),
    "",
  ]


def _noise_lines(report: dict[str, Any]) -> list[str]:
  """The noise verdict of every cost estimate (absent from results measured before it existed)."""
  rows, max_spread, min_rounds = [], None, None
  for b, cm in _by_batch(report):
    noise = cm.get("noise")
    if not noise:
      continue
    max_spread, min_rounds = noise["max_spread"], noise["min_rounds"]
    for name, est in noise["estimates"].items():
      rows.append(
        [
          b,
          name,
          cells.fmt(est["value"], 3),
          cells.fmt(est["spread"], 2),
          est["rounds"],
          f"**{conclude.TOO_NOISY}**" if name in noise["refused"] else "ok",
        ]
      )
  if not rows:
    return []
  return [
    f"Noise: every quantity is the median over interleaved timing rounds (all timers once "
    f"per round, the order rotating); a ratio is taken per round. spread = interquartile "
    f"range / median over the rounds. An estimate is refused, and the predictions (EXP) and "
    f"overheads that use it are reported as \"{conclude.TOO_NOISY}\", when its spread exceeds "
    f"{max_spread:.2f}, when fewer than {min_rounds} rounds were timed, when a round did not "
    "resolve it above timer jitter, or when v(T) < 1 (impossible).",
    "",
    cells.table(["batch", "estimate", "value", "spread", "rounds", "verdict"], rows),
    "",
  ]


# The profile table: a row's time per loop step split into its parts (a record is the row's
# profile with the row's batch size, temperature and name).
_PROFILE_COLUMNS = [
  cells.BATCH,
  cells.TEMP,
  cells.column("method", "name"),
  cells.column("step ms", "step_s", scale=1e3),
  ("draft ms", lambda p: cells.fmt(p.get("draft_s", 0.0), scale=1e3)),
  ("verify/target ms", lambda p: cells.fmt(p.get("verify_s", p.get("target_step_s")), scale=1e3)),
  cells.column("overhead ms", "overhead_s", scale=1e3, refused=True),
  cells.column("overhead %", "overhead_fraction", 0, "%", scale=100, refused=True),
  cells.column("prefill ms", "prefill_s_per_decode", scale=1e3),
  cells.column("prefill % of walltime", "prefill_fraction", 0, "%", scale=100),
]


def profile_section(report: dict[str, Any]) -> list[str]:
  """Time per loop step, split."""
  profiles = [
    dict(r["profile"], batch_size=r["batch_size"], temperature=r["temperature"], name=r["name"])
    for r in cells.rows_of(report, "baselines", "speculative")
    if r.get("profile")
  ]
  return cells.section(
    "Profile (time per loop step)",
    "step = (decode walltime - prefill) / loop steps (a loop step is one target call; at "
    "batch > 1 the loop runs until the slowest row is done). draft = the draft model's calls "
    "of a step (a 2-token catch-up call + gamma-1 one-token calls) or a drafter's propose "
    "call, verify = target (gamma+1)-token call, both from the cost model; overhead = the "
    "rest (sampling and acceptance over the vocabulary, the draft loop's control flow, "
    "bookkeeping). A negative overhead is impossible (the calls were timed under another load "
    f"than the decode), so it is reported as \"{conclude.TOO_NOISY}\" too.",
    cells.columns_table(_PROFILE_COLUMNS, profiles),
  )


def _overhead_range(rows: Sequence[dict[str, Any]]) -> str:
  """The loop overhead fractions of `rows` ('-' where refused or absent), as 'a%' or 'a%..b%'."""
  values = sorted(
    r["profile"]["overhead_fraction"]
    for r in rows
    if r.get("profile") and r["profile"].get("overhead_fraction") is not None
  )
  if not values:
    return "-"
  low, high = cells.fmt(values[0], 0, "%", scale=100), cells.fmt(values[-1], 0, "%", scale=100)
  return low if low == high else f"{low}..{high}"


def roofline_section(report: dict[str, Any]) -> list[str]:
  """The memory-bandwidth floor, the bare matmul stack's v(T) and the loop overhead."""
  rows, v_rows = _roofline_rows(report)
  if not rows:
    return []
  return cells.section(
    "Roofline",
    "A decode step reads at least the decoder's weights (the cached cross-attention K/V "
    "projections excluded); at the stream bandwidth of a bare jitted matvec over as many "
    "bytes, that takes the floor below. baseline ms/token = the baseline's greedy decode "
    "step (profile) / batch; loop overhead = (decode walltime - prefill - the model calls of "
    "the cost model) / (decode walltime - prefill), greedy, as in the profile.",
    cells.table(
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
    "v(T) of the target beside v(T) of a bare jitted stack of its decoder matmuls at the "
    "same B x T rows (no attention, norms or cache): where they differ, the gap is in "
    "what the model adds around the matmuls.",
    cells.table(["batch", "T", "target v(T)", "bare matmul v(T)", "bare verdict"], v_rows),
  )


def _roofline_rows(report: dict[str, Any]) -> tuple[list[list[Any]], list[list[Any]]]:
  """(floor rows, bare v(T) rows) of the batch sizes whose costs carry a roofline."""
  rows, v_rows = [], []
  for b, cm in _by_batch(report):
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
        cells.fmt(roof["weight_bytes"] / 1e6, 1),
        cells.fmt(roof["bandwidth_gb_s"], 1),
        cells.fmt(floor_ms, 3),
        cells.fmt(step_ms, 3),
        cells.fmt(None if step_ms is None else step_ms / floor_ms, 1, "x"),
        _overhead_range(base),
        _overhead_range([r for g in greedy for r in g["speculative"]]),
      ]
    )
    refused = roof.get("noise", {}).get("refused", {})
    for t, bare in roof["bare_v"].items():
      if t != "1":
        v_rows.append(
          [
            b,
            t,
            cells.fmt(cm["v"].get(t)),
            cells.fmt(bare),
            conclude.TOO_NOISY if f"bare v({t})" in refused else "ok",
          ]
        )
  return rows, v_rows
