"""Learning curves of training runs: a markdown table and a PNG from their train_log.jsonl files.

Command (from the repo root; one `label=path` per run, the path a run directory or its log):
  .venv/bin/python -m speculative.train.learning_curve \
      "T5X recipe (Adafactor from scratch)=../runs/embedded_target_t5x_recipe" \
      --png docs/learning_curve.png

Prints, per run, a markdown table with one row per evaluation: step, validation NLL and accuracy,
the training subset's NLL (eval mode, unsmoothed; a run that did not log it has none) and the
normalized attention entropy (encoder / decoder self / cross; 1 = uniform, 0 = one-hot), then the
PNG's path. The PNG has validation NLL (solid) and training-subset NLL (dashed) against step, and
the encoder attention entropy below.

The device recipe's run (speculative/train/pair.py's report.json: target and drafts, both tasks,
against seconds of training):
  .venv/bin/python -m speculative.train.learning_curve --pair_report docs/pair_device_report.json \
      --png docs/pair_learning_curve.png
"""

from __future__ import annotations

import argparse
import json
import os

KINDS = ("encoder", "decoder_self", "cross")


def read_log(path: str) -> list[dict]:
  """The evaluations of a run (its directory or train_log.jsonl), in step order."""
  if os.path.isdir(path):
    path = os.path.join(path, "train_log.jsonl")
  if not os.path.exists(path):
    raise FileNotFoundError(f"no training log at {path}")
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  if not rows:
    raise ValueError(f"{path}: no evaluations logged yet")
  return sorted(rows, key=lambda r: r["step"])


def _cell(row: dict, key: str, fmt: str = "{:.3f}") -> str:
  return fmt.format(row[key]) if key in row else "-"


def markdown_table(rows: list[dict]) -> str:
  lines = [
    "| step | val NLL | val accuracy | train-subset NLL | attention entropy (enc / dec / cross) |",
    "|---|---|---|---|---|",
  ]
  for r in rows:
    entropy = " / ".join(_cell(r, f"val_attention_entropy_{k}", "{:.2f}") for k in KINDS)
    lines.append(
      f"| {r['step']:,} | {_cell(r, 'val_nll')} | {_cell(r, 'val_accuracy')} | "
      f"{_cell(r, 'train_nll')} | {entropy} |"
    )
  return "\n".join(lines)


def _series(ax, rows: list[dict], key: str, **style) -> None:
  """`key` against step, over the evaluations that logged it (none: nothing drawn)."""
  logged = [r for r in rows if key in r]
  if logged:
    ax.plot([r["step"] for r in logged], [r[key] for r in logged], **style)


def plot(runs: dict[str, list[dict]], png: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, (ax_nll, ax_ent) = plt.subplots(
    2, 1, figsize=(7, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
  )
  for i, (label, rows) in enumerate(runs.items()):
    style = dict(color=f"C{i}", marker="o", ms=3)
    _series(ax_nll, rows, "val_nll", label=f"{label}: validation", **style)
    _series(ax_nll, rows, "train_nll", label=f"{label}: training subset", linestyle="--", **style)
    _series(ax_ent, rows, "val_attention_entropy_encoder", **style)
  ax_nll.set_ylabel("token NLL (nats, unsmoothed)")
  ax_nll.legend(fontsize=7)
  ax_nll.grid(alpha=0.3)
  ax_ent.set_ylabel("encoder attention\nentropy (normalized)")
  ax_ent.set_ylim(0, 1)
  ax_ent.set_xlabel("training step (3,072 padded tokens each)")
  ax_ent.grid(alpha=0.3)
  fig.tight_layout()
  tmp = png + ".tmp.png"
  fig.savefig(tmp, dpi=110)
  os.replace(tmp, png)  # never a half-written figure
  plt.close(fig)


PAIR_MODELS = (
  ("target", "target (51.2M)"),
  (
    "draft",
    "small draft shape (3.2M)",
  ),  # the names in docs/pair_device_report.json
  ("wide_draft", "embedded draft (5.7M)"),
  ("small_draft", "small draft shape (3.2M)"),  # the recipe's names since
  ("embedded_draft", "embedded draft (5.7M)"),
)  # a report holds some of these: a continued pair trains its one draft only


def plot_pair(report: dict, png: str) -> None:
  """Validation NLL per task against seconds for each model of a device recipe's report."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for ax, task in zip(axes, ("translate", "summarize")):
    for name, label in PAIR_MODELS:
      if name not in report:
        continue
      rows = report[name]["history"]
      ax.plot(
        [r["seconds"] for r in rows], [r[f"val_{task}_nll"] for r in rows], marker="o", label=label
      )
    ax.set_title(f"validation NLL, {task}")
    ax.set_xlabel(f"seconds of training on the {report['device']} (each phase)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  tmp = png + ".tmp.png"
  fig.savefig(tmp, dpi=90)
  os.replace(tmp, png)
  plt.close(fig)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("runs", nargs="*", help="label=path (a run directory or train_log.jsonl)")
  parser.add_argument("--png", help="where to write the figure (none if omitted)")
  parser.add_argument("--pair_report", help="a device recipe's report.json instead of runs")
  args = parser.parse_args()
  if args.pair_report:
    if not args.png:
      parser.error("--pair_report needs --png")
    with open(args.pair_report) as f:
      plot_pair(json.load(f), args.png)
    print(f"wrote {args.png}")
    return
  if not args.runs:
    parser.error("name at least one run (label=path) or --pair_report")
  runs = {}
  for spec in args.runs:
    if "=" not in spec:
      parser.error(f"expected label=path, got {spec!r}")
    label, path = spec.split("=", 1)
    runs[label] = read_log(path)  # every log read (and checked) before anything is written
  for label, rows in runs.items():
    print(f"{label}\n\n{markdown_table(rows)}\n")
  if args.png:
    plot(runs, args.png)
    print(f"wrote {args.png}")


if __name__ == "__main__":
  main()
