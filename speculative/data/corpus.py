"""The LibreOffice help En-De parallel corpus: extraction, alignment, cleaning, splits and TSV I/O.

The Debian packages `libreoffice-help-en-us` and `libreoffice-help-de` (MPL-2.0) ship the same help
pages, rendered to HTML from one set of .xhp sources, under
`usr/share/libreoffice/help/{en-US,de}/text/**.html`. Every paragraph and heading (`<p>`, `<h1>`..`<h6>`)
of a page carries the `id` of its source paragraph, identical in both languages, so the two trees align
by (relative file path, id, occurrence of that id in the file).

Extraction rules (`extract_paragraphs`):
  * only the page body (`<div id="DisplayArea">`) is read; the navigation chrome and the `DEBUG` block
    (`bm_module`, `bm_system`, `bm_HID`) are skipped;
  * the text of a paragraph is all its text nodes, nested markup flattened (image `alt` text is not text);
  * an inline switch (`<span class="switchinline">`, e.g. "Command" on macOS vs "Ctrl" elsewhere) keeps
    only its `default...` variant, so a sentence reads "Ctrl + F", not "CommandCtrl + F"; a switch
    without a default variant (an application-only remark) keeps its first variant
    (`inline_switch="all"` keeps every variant, as the shared reference extraction does);
  * whitespace (any Unicode whitespace, incl. no-break space) is collapsed to single spaces and stripped.
Cleaning (`clean_pairs`): drop pairs with an empty side or two equal sides, then (optionally) exact
duplicate pairs, keeping the first occurrence. Files are visited in sorted order and paragraphs in
document order, so the result is deterministic.

Splits (`split_pairs`): unique English sources are ordered by a salted SHA-256 of the source text; test
takes the smallest prefix of that order holding at least `test_size` pairs, validation the next prefix
holding at least `validation_size`, train the rest. All pairs that share an English source therefore land
in the same split, and no English sentence of test or validation occurs in train.

This module has no dependency beyond the standard library; `scripts/make_corpus.py` downloads and
unpacks the packages and calls it.
"""

from __future__ import annotations

import gettext
import gzip
import hashlib
import html.parser
import io
import os
from pathlib import Path
import re
from typing import Iterable
from typing import Iterator
from typing import Sequence

Pair = tuple[str, str]

SOURCE_LANG_DIR = "en-US"
TARGET_LANG_DIR = "de"
DEFAULT_SPLIT_SALT = "libreoffice_ende/v1"
SPLITS = ("train", "validation", "test")

# Elements that hold one translatable paragraph. `<h>` is emitted by the help generator for a few
# malformed headings (e.g. text/simpress/01/06060000.html).
_PARAGRAPH_TAGS = frozenset({"p", "h", "h1", "h2", "h3", "h4", "h5", "h6"})
# HTML void elements never get an end tag; they must not be pushed on the open-element stack.
_VOID_TAGS = frozenset(
  {
    "area",
    "base",
    "br",
    "col",
    "embed",
    "hr",
    "img",
    "input",
    "link",
    "meta",
    "param",
    "source",
    "track",
    "wbr",
  }
)
_INLINE_SWITCH_MODES = ("default", "all")


def normalize_whitespace(text: str) -> str:
  """Collapses every run of Unicode whitespace (incl. no-break space) to one space; strips the ends."""
  return " ".join(text.split())


class _Node:
  """An element of the parsed page: tag, attributes and children (nested `_Node`s and text strings)."""

  __slots__ = ("tag", "attributes", "children")

  def __init__(self, tag: str, attributes: dict[str, str]):
    self.tag = tag
    self.attributes = attributes
    self.children: list[_Node | str] = []


class _TreeBuilder(html.parser.HTMLParser):
  """Parses a help page into a `_Node` tree (lenient: unmatched end tags are ignored)."""

  def __init__(self):
    super().__init__(convert_charrefs=True)
    self.root = _Node("#document", {})
    self.stack: list[_Node] = [self.root]

  def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    node = _Node(tag, {name: (value or "") for name, value in attrs})
    self.stack[-1].children.append(node)
    if tag not in _VOID_TAGS:
      self.stack.append(node)

  def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
    self.stack[-1].children.append(_Node(tag, {name: (value or "") for name, value in attrs}))

  def handle_endtag(self, tag: str) -> None:
    for depth in range(len(self.stack) - 1, 0, -1):
      if self.stack[depth].tag == tag:
        del self.stack[depth:]
        return

  def handle_data(self, data: str) -> None:
    self.stack[-1].children.append(data)


def _find_by_id(node: _Node, element_id: str) -> _Node | None:
  for child in node.children:
    if isinstance(child, _Node):
      if child.attributes.get("id") == element_id:
        return child
      found = _find_by_id(child, element_id)
      if found is not None:
        return found
  return None


def _switch_variants(node: _Node, inline_switch: str) -> list[_Node | str]:
  """The children of an inline switch that are read: the `default...` variant when there is one, else
  the first variant (an application-only remark); with inline_switch="all", every child."""
  if inline_switch == "all":
    return node.children
  variants = [child for child in node.children if isinstance(child, _Node)]
  defaults = [child for child in variants if child.attributes.get("id", "").startswith("default")]
  return defaults[:1] or variants[:1]


def _collect_text(node: _Node, inline_switch: str, out: list[str]) -> None:
  children = node.children
  if "switchinline" in node.attributes.get("class", "").split():
    children = _switch_variants(node, inline_switch)
  for child in children:
    if isinstance(child, str):
      out.append(child)
    else:
      _collect_text(child, inline_switch, out)


def _collect_paragraphs(node: _Node, inline_switch: str, out: list[tuple[str, str]]) -> None:
  for child in node.children:
    if not isinstance(child, _Node):
      continue
    element_id = child.attributes.get("id", "")
    if child.tag == "div" and element_id == "DEBUG":
      continue  # the per-page debug block (bm_module, bm_system, bm_HID) is not help text
    if child.tag in _PARAGRAPH_TAGS and element_id:
      chunks: list[str] = []
      _collect_text(child, inline_switch, chunks)
      out.append((element_id, normalize_whitespace("".join(chunks))))
    else:
      _collect_paragraphs(child, inline_switch, out)


def extract_paragraphs(page_html: str, inline_switch: str = "default") -> list[tuple[str, str]]:
  """Returns [(id, normalized text)] of a help page's paragraphs, in document order.

  Args:
    page_html: one rendered help page (`usr/share/libreoffice/help/<lang>/text/**.html`).
    inline_switch: "default" keeps only the default variant of an inline switch; "all" keeps every
      variant concatenated.
  """
  if inline_switch not in _INLINE_SWITCH_MODES:
    raise ValueError(f"inline_switch must be one of {_INLINE_SWITCH_MODES}, got {inline_switch!r}")
  builder = _TreeBuilder()
  builder.feed(page_html)
  builder.close()
  body = _find_by_id(builder.root, "DisplayArea")
  if body is None:
    return []
  paragraphs: list[tuple[str, str]] = []
  _collect_paragraphs(body, inline_switch, paragraphs)
  return paragraphs


def _page_paths(lang_dir: Path) -> list[str]:
  """Sorted POSIX paths (relative to `lang_dir`) of the help pages under `lang_dir/text`."""
  text_dir = lang_dir / "text"
  if not text_dir.is_dir():
    raise FileNotFoundError(f"no help pages: {text_dir} is not a directory")
  return sorted(path.relative_to(lang_dir).as_posix() for path in text_dir.rglob("*.html"))


def read_help_tree(
  lang_dir: str | os.PathLike,
  inline_switch: str = "default",
) -> dict[tuple[str, str, int], str]:
  """Reads one language's help tree into {(relative path, id, occurrence): text}, in sorted order.

  `occurrence` numbers repeated ids within a page (embedded snippets can repeat a paragraph), so the
  k-th occurrence of an id aligns with the k-th occurrence on the other side.
  """
  lang_dir = Path(lang_dir)
  paragraphs: dict[tuple[str, str, int], str] = {}
  for relative_path in _page_paths(lang_dir):
    page = (lang_dir / relative_path).read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    for paragraph_id, text in extract_paragraphs(page, inline_switch):
      occurrence = seen.get(paragraph_id, 0)
      seen[paragraph_id] = occurrence + 1
      paragraphs[(relative_path, paragraph_id, occurrence)] = text
  return paragraphs


def align_help_trees(
  help_root: str | os.PathLike,
  source_lang: str = SOURCE_LANG_DIR,
  target_lang: str = TARGET_LANG_DIR,
  inline_switch: str = "default",
) -> list[Pair]:
  """Aligns `help_root/<source_lang>` with `help_root/<target_lang>` by (file, id, occurrence).

  Returns the raw aligned pairs (not cleaned: empty and equal sides are still there), in source order
  (files sorted, paragraphs in document order). Paragraphs present on one side only are dropped.
  """
  help_root = Path(help_root)
  source = read_help_tree(help_root / source_lang, inline_switch)
  target = read_help_tree(help_root / target_lang, inline_switch)
  return [(text, target[key]) for key, text in source.items() if key in target]


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


def _source_rank(source: str, salt: str) -> bytes:
  return hashlib.sha256((salt + "\x00" + source).encode("utf-8")).digest()


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
  if test_size < 1 or validation_size < 1:
    raise ValueError(
      f"test_size and validation_size must be >= 1, got {test_size}, {validation_size}"
    )
  pairs_per_source: dict[str, int] = {}
  for source, _ in pairs:
    pairs_per_source[source] = pairs_per_source.get(source, 0) + 1
  ranked_sources = sorted(pairs_per_source, key=lambda source: _source_rank(source, salt))
  split_of_source: dict[str, str] = {}
  filled = {"test": 0, "validation": 0}
  targets = (("test", test_size), ("validation", validation_size))
  stage = 0
  for source in ranked_sources:
    while stage < len(targets) and filled[targets[stage][0]] >= targets[stage][1]:
      stage += 1
    name = targets[stage][0] if stage < len(targets) else "train"
    split_of_source[source] = name
    if name != "train":
      filled[name] += pairs_per_source[source]
  splits: dict[str, list[Pair]] = {name: [] for name in SPLITS}
  for pair in pairs:
    splits[split_of_source[pair[0]]].append(pair)
  if not splits["train"] or filled["validation"] < validation_size:
    raise ValueError(
      f"corpus too small to split: {len(pairs)} pairs for test_size={test_size}, "
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
      line = line.rstrip("\n")
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
