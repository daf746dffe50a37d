"""The LibreOffice En-De parallel corpus: cleaning, the deterministic splits and TSV I/O.

The pairs come from the help pages (speculative.data.html) and the UI message catalogues (.mo,
`read_mo_pairs`).

Cleaning (`clean_pairs`): drop pairs with an empty side or two equal sides, then (optionally) exact
duplicate pairs, keeping the first occurrence. Files are visited in sorted order and paragraphs in
document order, so the result is deterministic.

Splits (`split_pairs`): unique English sources are ordered by a salted SHA-256 of the source text; test
takes the smallest prefix of that order holding at least `test_size` pairs, validation the next prefix
holding at least `validation_size`, train the rest. All pairs that share an English source therefore land
in the same split, and no English sentence of test or validation occurs in train.

This module has no dependency beyond the standard library.
"""

from __future__ import annotations

import gettext
import gzip
import hashlib
import io
import os
from pathlib import Path
import re
from typing import Callable
from typing import Iterable
from typing import Iterator
from typing import Sequence
from typing import TypeVar

Pair = tuple[str, str]
Row = TypeVar("Row")

DEFAULT_SPLIT_SALT = "libreoffice_ende/v1"
SPLITS = ("train", "validation", "test")


def normalize_whitespace(text: str) -> str:
  """Collapses every run of Unicode whitespace (incl. no-break space) to one space; strips the ends."""
  return " ".join(text.split())


def clean_pairs(pairs: Iterable[Pair], deduplicate: bool = True) -> list[Pair]:
  """Drops pairs with an empty side or equal sides (untranslated), then exact duplicates (first kept)."""
  cleaned: list[Pair] = []
  seen: set[Pair] = set()
  for source, target in pairs:
    source, target = normalize_whitespace(source), normalize_whitespace(target)
    if not source or not target or source == target:
      continue
    if deduplicate:
      if (source, target) in seen:
        continue
      seen.add((source, target))
    cleaned.append((source, target))
  return cleaned


# UI message catalogues (.mo): `~` (VCL) and `_` (GTK) mark the mnemonic letter of a label.
_MNEMONIC = re.compile(r"[~_](?=\w)")
# Placeholders the UI fills in at run time (%1, %s, $(ARG1), %FILENAME, {name}, ...). The help text
# has them resolved, so a pair holding one is dropped; %PRODUCTNAME is resolved the way the help
# pages resolve it.
_PLACEHOLDER = re.compile(r"%[0-9A-Za-z]|\$\(|\{\w*\}|\$[A-Z]")
PRODUCT_NAME = "LibreOffice"


def strip_mnemonic(text: str) -> str:
  """'C_onnect' / '~Connect' -> 'Connect'. Only a label with exactly one marker character is
  touched, so identifiers such as 'CELL_ADDRESS' keep their underscores."""
  for marker in "~_":
    if text.count(marker) == 1:
      text = _MNEMONIC.sub(lambda m: "" if m.group(0) == marker else m.group(0), text)
  return text


def read_mo_pairs(mo_path: str | os.PathLike) -> list[Pair]:
  """(English msgid, German msgstr) pairs of one compiled gettext catalogue (.mo), in the catalogue's
  order: context stripped, plural entries and the header skipped, untranslated entries skipped.
  Raises OSError with the file named when it is not a .mo file."""
  try:
    with open(mo_path, "rb") as f:
      catalog = gettext.GNUTranslations(f)._catalog
  except (OSError, UnicodeDecodeError) as e:
    raise OSError(f"{mo_path}: not a readable gettext .mo catalogue ({e})") from e
  pairs: list[Pair] = []
  for key, value in catalog.items():
    if not isinstance(key, str) or not key or not isinstance(value, str) or not value:
      continue  # header, plural forms ((msgid, n) keys), untranslated
    pairs.append((key.split("\x04")[-1], value))  # "context\x04msgid" -> msgid
  return pairs


def clean_ui_pairs(pairs: Iterable[Pair]) -> tuple[list[Pair], dict[str, int]]:
  """Catalogue pairs made comparable with help text: mnemonics stripped, %PRODUCTNAME resolved,
  pairs with another run-time placeholder dropped, then `clean_pairs` (empty, equal, duplicate).
  Returns the pairs and the counts of each step."""
  resolved: list[Pair] = []
  placeholders = 0
  for source, target in pairs:
    source, target = (
      strip_mnemonic(t).replace("%PRODUCTNAME", PRODUCT_NAME) for t in (source, target)
    )
    if _PLACEHOLDER.search(source) or _PLACEHOLDER.search(target):
      placeholders += 1
      continue
    resolved.append((source, target))
  cleaned = clean_pairs(resolved)
  counts = {
    "catalogue_entries": placeholders + len(resolved),
    "dropped_placeholder": placeholders,
    "after_cleaning": len(cleaned),
  }
  return cleaned, counts


def _group_rank(key: str, salt: str) -> bytes:
  return hashlib.sha256((salt + "\x00" + key).encode("utf-8")).digest()


def split_pairs(
  pairs: Sequence[Pair],
  test_size: int = 2000,
  validation_size: int = 1000,
  salt: str = DEFAULT_SPLIT_SALT,
) -> dict[str, list[Pair]]:
  """Splits pairs into train/validation/test, disjoint on the English source (see module docstring).

  Within a split, pairs keep their input order. Raises ValueError when the corpus is too small to leave
  a non-empty train split.
  """
  return split_groups(pairs, lambda pair: pair[0], test_size, validation_size, salt)


def split_groups(
  rows: Sequence[Row],
  group_of: Callable[[Row], str],
  test_size: int,
  validation_size: int,
  salt: str,
) -> dict[str, list[Row]]:
  """Splits rows into train/validation/test with each group (the rows of one `group_of(row)` key)
  whole in one split: the groups, in the order of their salted sha256, fill test until it holds
  `test_size` rows, then validation until `validation_size`; the rest is train.

  Within a split, rows keep their input order. Raises ValueError when a size is < 1 or the corpus is
  too small to leave a non-empty train split.
  """
  if test_size < 1 or validation_size < 1:
    raise ValueError(
      f"test_size and validation_size must be >= 1, got {test_size}, {validation_size}"
    )
  keys = [group_of(row) for row in rows]
  rows_per_group: dict[str, int] = {}
  for key in keys:
    rows_per_group[key] = rows_per_group.get(key, 0) + 1
  ranked = sorted(rows_per_group, key=lambda key: _group_rank(key, salt))
  split_of_group: dict[str, str] = {}
  filled = {"test": 0, "validation": 0}
  targets = (("test", test_size), ("validation", validation_size))
  stage = 0
  for key in ranked:
    while stage < len(targets) and filled[targets[stage][0]] >= targets[stage][1]:
      stage += 1
    name = targets[stage][0] if stage < len(targets) else "train"
    split_of_group[key] = name
    if name != "train":
      filled[name] += rows_per_group[key]
  splits: dict[str, list[Row]] = {name: [] for name in SPLITS}
  for key, row in zip(keys, rows):
    splits[split_of_group[key]].append(row)
  if not splits["train"] or filled["validation"] < validation_size:
    raise ValueError(
      f"corpus too small to split: {len(rows)} pairs for test_size={test_size}, "
      f"validation_size={validation_size} and a non-empty train split"
    )
  return splits


def _check_field(text: str, what: str) -> None:
  if "\t" in text or "\n" in text or "\r" in text:
    raise ValueError(f"{what} contains a tab or newline, cannot be written as TSV: {text[:80]!r}")


def write_tsv_gz(path: str | os.PathLike, pairs: Iterable[Pair]) -> int:
  """Writes `source<TAB>target` lines, gzip-compressed with mtime=0 and no file name (byte-identical
  output for identical pairs). Writes to a temporary file and renames, so no half-written file is left.
  Returns the number of pairs written."""
  path = Path(path)
  lines = []
  for source, target in pairs:
    _check_field(source, "source")
    _check_field(target, "target")
    lines.append(f"{source}\t{target}\n")
  buffer = io.BytesIO()
  with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, compresslevel=9, mtime=0) as gz:
    gz.write("".join(lines).encode("utf-8"))
  tmp_path = path.with_name(path.name + ".tmp")
  tmp_path.write_bytes(buffer.getvalue())
  os.replace(tmp_path, path)
  return len(lines)


def iter_tsv_gz(path: str | os.PathLike) -> Iterator[Pair]:
  """Yields (source, target) from a gzip (or plain, if the name does not end in .gz) TSV file."""
  path = Path(path)
  opener = gzip.open if path.suffix == ".gz" else open
  with opener(path, "rt", encoding="utf-8", newline="\n") as f:
    for line_number, line in enumerate(f, start=1):
      line = line.rstrip("\n").removesuffix("\r")  # a CRLF file's \r is no part of the target
      if not line:
        continue
      fields = line.split("\t")
      if len(fields) != 2:
        raise ValueError(
          f"{path}:{line_number}: expected 2 tab-separated fields, got {len(fields)}"
        )
      yield fields[0], fields[1]


def read_tsv_gz(path: str | os.PathLike) -> list[Pair]:
  """All (source, target) pairs of a TSV file (see `iter_tsv_gz`)."""
  return list(iter_tsv_gz(path))


def sha256_file(path: str | os.PathLike) -> str:
  """Hex SHA-256 of a file's bytes."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()
