"""Cells and tables of the results page's Markdown (shared by its sections)."""

from __future__ import annotations

import math
from typing import Any
from typing import Callable
from typing import Iterable
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


# A table column: its header and the function that turns a record (a row of the report) into the
# column's cell.
Column = tuple[str, Callable[[Any], Any]]


def column(header: str, key: str, *args: Any, refused: bool = False, **kwargs: Any) -> Column:
  """The column showing fmt(record[key], *args, **kwargs); with `refused`, refusable(record, ...):
  TOO_NOISY where the record's costs were refused."""
  if refused:
    return header, lambda record: refusable(record, record[key], *args, **kwargs)
  return header, lambda record: fmt(record[key], *args, **kwargs)


def columns_table(columns: Sequence[Column], records: Iterable[Any]) -> str:
  """The table with one row per record, its cells from the columns' functions."""
  return table(
    [header for header, _ in columns], [[cell(r) for _, cell in columns] for r in records]
  )


def section(title: str, *paragraphs: str) -> list[str]:
  """A section: its heading and its paragraphs (text or tables), each followed by a blank line."""
  lines = [f"## {title}", ""]
  for paragraph in paragraphs:
    lines += [paragraph, ""]
  return lines


# Columns that several tables of the results page show, under the same header.
BATCH = column("batch", "batch_size")
TEMP = column("TEMP", "temperature", 0)
TOKENS_PER_S = column("tokens/s", "tokens_per_s", 1)
MS_PER_TOKEN = column("ms/token", "ms_per_token")
COMPILE_S = column("compile s", "compile_s", 1)
IDENTICAL = ("identical", lambda record: fmt(record.get("identical_to_baseline")))


def loads(values: Sequence[float]) -> str:
  return ", ".join(f"{x:.2f}" for x in values)
