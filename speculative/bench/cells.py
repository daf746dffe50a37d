"""Cells and tables of the results page's Markdown (shared by its sections)."""

from __future__ import annotations

import math
from typing import Any
from typing import Sequence

import numpy as np

from speculative.bench import conclude


def fmt(value: Any, digits: int = 2, suffix: str = "", scale: float = 1.0) -> str:
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


def refusable(record: dict[str, Any], value: Any, *args, **kwargs) -> str:
  """fmt(value, ...), or TOO_NOISY where `record` (a row or a profile) says its costs were
  refused as too noisy."""
  if record.get("prediction_refused") or record.get("overhead_refused"):
    return conclude.TOO_NOISY
  return fmt(value, *args, **kwargs)


def rows_of(report: dict[str, Any], *kinds: str) -> list[dict[str, Any]]:
  """The rows of every group, of the given kinds ('baselines', 'speculative'), group by group."""
  return [r for g in report["groups"] for kind in kinds for r in g[kind]]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
  return "\n".join(lines)


def loads(values: Sequence[float]) -> str:
  return ", ".join(f"{x:.2f}" for x in values)
