"""The benchmark's plots: speedup_vs_gamma.png and alpha.png."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from speculative import analysis
from speculative.bench import conclude


def make_plots(report: dict[str, Any], output_dir: str) -> dict[str, str]:
  """speedup_vs_gamma.png and alpha.png; returns {file name: caption}."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  _speedup_plot(plt, report, os.path.join(output_dir, "speedup_vs_gamma.png"))
  _alpha_plot(plt, report, os.path.join(output_dir, "alpha.png"))
  return {
    "speedup_vs_gamma.png": "Walltime speedup over our baseline vs γ; lines: predicted "
    "(Thm 3.8 with measured v(γ+1), dotted: v=1)",
    "alpha.png": "α per drafter and temperature",
  }


def _predicted_curves(ax, rows, cm: dict[str, Any], color, label: str) -> None:
  """Theorem 3.8 with the rows' mean alpha and c and the measured v, and with v = 1; nothing where
  a row's prediction was refused as too noisy (its costs would draw a made-up curve)."""
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


def _save(plt, fig, path: str) -> None:
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def _speedup_plot(plt, report: dict[str, Any], path: str) -> None:
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
  _save(plt, fig, path)


def _alpha_plot(plt, report: dict[str, Any], path: str) -> None:
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
  _save(plt, fig, path)
