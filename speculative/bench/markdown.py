"""The one writer of the benchmark's pages and of the tables and JSON its commands print and write:
cells, column-declared tables, sections, the record of how a page was made, a page's files; and the
machine a benchmark runs on in a line, with its load (the machine's record: jobs/runtime.machine;
whether a model shape fits its memory: speculative/models/memory.py)."""

from __future__ import annotations

import datetime
import json
import math
import os
import sys
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Sequence

import numpy as np

from speculative.checkpoints import files
from speculative.jobs import runtime

# A table column: its header and the function that turns a record (a row of a report) into a cell.
Column = tuple[str, Callable[[Any], Any]]


def fmt(value: Any, digits: int = 2, suffix: str = "", scale: float = 1.0) -> str:
  """A table cell: floats to `digits` decimals after multiplying by `scale`; None -> '-'."""
  if value is None:
    return "-"
  if isinstance(value, float) and math.isnan(value):
    return "nan"
  if isinstance(value, (float, np.floating)) or (
    scale != 1.0 and isinstance(value, (int, np.integer))
  ):
    return f"{scale * value:.{digits}f}{suffix}"
  return f"{value}{suffix}"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
  return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def column(header: str, key: str | Callable[[Any], Any], *args: Any, **kwargs: Any) -> Column:
  """The column of fmt(record.get(key), *args, **kwargs), or of fmt(key(record), ...)."""
  get = key if callable(key) else lambda record: record.get(key)
  return header, lambda record: fmt(get(record), *args, **kwargs)


def columns_table(columns: Sequence[Column], records: Iterable[Any]) -> str:
  return table([h for h, _ in columns], [[cell(r) for _, cell in columns] for r in records])


def section(title: str, *paragraphs: str | None, level: int = 2) -> list[str]:
  """A section: its heading and its paragraphs (text or tables; None or empty ones left out), each
  followed by a blank line."""
  return [f"{'#' * level} {title}", ""] + [line for p in paragraphs if p for line in (p, "")]


def busy_warnings(machine: dict[str, Any]) -> list[str]:
  """Records the load average at the end; a warning if the machine was busier than its cores."""
  end = machine["load_average_end"] = list(os.getloadavg())
  if max(machine["load_average_start"][0], end[0]) > machine["usable_cores"]:
    return [
      f"The machine was busy (load average above {machine['usable_cores']} cores): "
      "timings are noisy; regenerate on a quiet machine."
    ]
  return []


def load_line(machine: dict[str, Any]) -> str:
  """The load average at the start and at the end (now), with `busy_warnings`' warning."""
  warnings = "".join(f". {warning}" for warning in busy_warnings(machine))
  return (
    f"load average {machine['load_average_start'][0]:.2f} at the start, "
    f"{machine['load_average_end'][0]:.2f} at the end{warnings}"
  )


def record(module: str, argv: Sequence[str] | None) -> dict[str, Any]:
  """How a page was made: its command (as `python -m module ...`), when, and the machine."""
  arguments = list(sys.argv[1:] if argv is None else argv)
  return dict(
    command=" ".join(["python", "-m", module, *arguments]),
    generated_at=datetime.datetime.now().isoformat(timespec="seconds"),
    machine=runtime.machine(),
  )


def loads(values: Sequence[float], sep: str = ", ", digits: int = 2) -> str:
  return sep.join(f"{x:.{digits}f}" for x in values)


def machine_line(machine: dict[str, Any]) -> str:
  """The machine in one line, with the load average at the start and (if recorded) the end."""
  return (
    f"{runtime.cpu_line(machine)}, {machine['usable_cores']} usable of {machine['cpu_count']} "
    f"cores, jax {machine['jax']} ({machine['backend']}), load average "
    + loads([machine["load_average_start"][0]] + machine.get("load_average_end", [])[:1], " -> ", 1)
  )


def write_json(path: str, data: Any, indent: int = 2) -> None:
  """Writes `data` as JSON (str of what JSON has no type for) to `path`, atomically."""
  text = json.dumps(data, indent=indent, ensure_ascii=False, default=str) + "\n"
  files.write_atomic(path, text)


def write_page(output_dir: str, outputs: dict[str, str | dict[str, Any]], indent: int = 2) -> None:
  """Writes each {file name: text, or data as JSON} into output_dir, atomically."""
  os.makedirs(output_dir, exist_ok=True)
  for name, content in outputs.items():
    path = os.path.join(output_dir, name)
    if isinstance(content, str):
      files.write_atomic(path, content)
    else:
      write_json(path, content, indent)
