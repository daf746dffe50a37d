"""The LibreOffice help pages' paragraphs, read from their HTML and aligned across two languages.

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
"""

from __future__ import annotations

import html.parser
import os
from pathlib import Path

from speculative.data import corpus

SOURCE_LANG_DIR = "en-US"
TARGET_LANG_DIR = "de"

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
      out.append((element_id, corpus.normalize_whitespace("".join(chunks))))
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
) -> list[corpus.Pair]:
  """Aligns `help_root/<source_lang>` with `help_root/<target_lang>` by (file, id, occurrence).

  Returns the raw aligned pairs (not cleaned: empty and equal sides are still there), in source order
  (files sorted, paragraphs in document order). Paragraphs present on one side only are dropped.
  """
  help_root = Path(help_root)
  source = read_help_tree(help_root / source_lang, inline_switch)
  target = read_help_tree(help_root / target_lang, inline_switch)
  return [(text, target[key]) for key, text in source.items() if key in target]
