"""Tests of speculative/data/corpus.py (extraction, alignment, cleaning, splits, TSV I/O) and the shipped corpus."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
import random

import pytest

from speculative.data import build_corpus
from speculative.data import build_ui_corpus
from speculative.data import corpus
from speculative.data import html

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE_HELP = REPO_ROOT / "tests" / "fixtures" / "help"
DATA_DIR = REPO_ROOT / "data" / "libreoffice_ende"
# Every 100th pair of the reference extraction libreoffice_help_en_de.tsv.gz (53621 pairs, 35916
# unique; sha256 REFERENCE_SHA256), an independent en<TAB>de extraction of the same help packages
# (tests/fixtures/README.md).
REFERENCE_EXCERPT = REPO_ROOT / "tests" / "fixtures" / "libreoffice_reference_excerpt.tsv.gz"
REFERENCE_EXCERPT_SHA256 = "077179c7b0d22d580d3b84b613812e74b13758212299b5a749cc67468b049a20"
REFERENCE_SHA256 = "71ee5b6c75e573ea7d1a279a1545d1036444e40101e2abe6c477c0c408256594"
REFERENCE_UNIQUE_PAIRS = 35916

# Aligned paragraphs of the fixture trees, in order (sorted files, document order), before cleaning.
# Not here: navigation chrome and DEBUG paragraphs, an image-only paragraph's alt text, ids present on
# one side only, and the page that exists only in English.
EXPECTED_RAW = [
  ("Find Bar", "Suchleiste"),
  (
    "The Find toolbar can be used to quickly search the contents of LibreOffice documents.",
    "Die Suchleiste kann zur schnellen Suche von Inhalten in LibreOffice-Dokumenten verwendet werden.",
  ),
  (
    "Use the shortcut Ctrl + F to quickly open the Find toolbar.",
    "Verwenden Sie Strg+F zum schnellen Öffnen der Suchleiste.",
  ),
  ("", ""),  # image-only paragraph
  ("Find Previous Icon", "Symbol für „Vorherigen suchen“"),
  ("LibreOffice Calc", "LibreOffice Calc"),  # untranslated
  (
    "Sorts the selection. In Calc, the database functions are sorted too.",
    "Sortiert die Auswahl. In Calc werden auch die Datenbankfunktionen sortiert.",
  ),
  ("Press Shift + F3 & see <Text>.", "Drücken Sie Umschalt + F3 & sehen Sie <Text>."),
  ("Options", "Optionen"),  # first occurrence of a repeated id
  ("First use of a repeated id.", "Erste Verwendung einer wiederholten ID."),
  ("More options", "Weitere Optionen"),  # second occurrence of the same id
  ("Entrance: Select an entrance effect.", "Eingang: Wählen Sie einen Eingangseffekt."),
  ("", "Kein Text auf Englisch."),  # empty English side
  ("Find Bar", "Suchleiste"),  # duplicate pair, from text/swriter/main0000.html
  ("Welcome to the LibreOffice Writer Help", "Willkommen in der LibreOffice Writer-Hilfe"),
]
EXPECTED_CLEAN = [pair for i, pair in enumerate(EXPECTED_RAW) if i not in (3, 5, 12, 13)]


def test_fixture_alignment_gives_exactly_the_expected_pairs():
  assert html.align_help_trees(FIXTURE_HELP) == EXPECTED_RAW
  assert corpus.clean_pairs(html.align_help_trees(FIXTURE_HELP)) == EXPECTED_CLEAN


def test_inline_switch_all_keeps_every_variant_like_the_reference():
  pairs = corpus.clean_pairs(html.align_help_trees(FIXTURE_HELP, inline_switch="all"))
  assert (
    "Use the shortcut CommandCtrl + F to quickly open the Find toolbar.",
    "Verwenden Sie BefehlStrg+F zum schnellen Öffnen der Suchleiste.",
  ) in pairs
  with pytest.raises(ValueError, match="inline_switch"):
    html.extract_paragraphs("<p id='x'>a</p>", inline_switch="mac")


def test_extract_paragraphs_reads_only_the_page_body():
  page = (
    '<html><body><p id="par_nav">nav</p><div id="DisplayArea"><h2 id="hd_1">A <b>bold</b>\n'
    '  title</h2><p>no id</p><p id="par_2">x<br/>y</p></div><p id="par_after">after</p>'
    '<footer><div id="DEBUG"><p id="bm_module">Module</p></div></footer></body></html>'
  )
  assert html.extract_paragraphs(page) == [("hd_1", "A bold title"), ("par_2", "xy")]
  assert html.extract_paragraphs("<html><p id='a'>no body</p></html>") == []


def test_normalize_whitespace():
  assert corpus.normalize_whitespace("  a\t b\n\u00a0c\u2009 ") == "a b c"
  assert corpus.normalize_whitespace(" \n ") == ""


def test_clean_pairs_drops_empty_equal_and_duplicates():
  pairs = [("a", "b"), ("a ", " b"), ("", "x"), ("x", ""), ("same", "same"), ("a", "c")]
  assert corpus.clean_pairs(pairs) == [("a", "b"), ("a", "c")]
  assert corpus.clean_pairs(pairs, deduplicate=False) == [("a", "b"), ("a", "b"), ("a", "c")]


def _synthetic_pairs(count: int) -> list[corpus.Pair]:
  # Every 7th source gets a second translation: such sources must stay within one split.
  pairs = []
  for i in range(count):
    pairs.append((f"sentence {i}", f"Satz {i}"))
    if i % 7 == 0:
      pairs.append((f"sentence {i}", f"der Satz {i}"))
  return pairs


def test_split_is_deterministic_disjoint_and_complete():
  pairs = _synthetic_pairs(400)
  splits = corpus.split_pairs(pairs, test_size=40, validation_size=20)
  assert splits == corpus.split_pairs(list(pairs), test_size=40, validation_size=20)
  assert 40 <= len(splits["test"]) <= 41 and 20 <= len(splits["validation"]) <= 21
  assert sorted(sum(splits.values(), [])) == sorted(pairs)
  sources = {name: {en for en, _ in split} for name, split in splits.items()}
  assert not sources["train"] & sources["test"]
  assert not sources["train"] & sources["validation"]
  assert not sources["test"] & sources["validation"]
  # Assignment depends on the source text only, not on the input order.
  shuffled = list(pairs)
  random.Random(0).shuffle(shuffled)
  reshuffled = corpus.split_pairs(shuffled, test_size=40, validation_size=20)
  assert {name: sorted(split) for name, split in reshuffled.items()} == {
    name: sorted(split) for name, split in splits.items()
  }
  other_salt = corpus.split_pairs(pairs, test_size=40, validation_size=20, salt="other")
  assert other_salt["test"] != splits["test"]


def test_split_rejects_bad_sizes():
  with pytest.raises(ValueError, match="too small"):
    corpus.split_pairs(_synthetic_pairs(10), test_size=20, validation_size=10)
  with pytest.raises(ValueError, match="test_size"):
    corpus.split_pairs(_synthetic_pairs(10), test_size=0)


def test_tsv_roundtrip_is_byte_deterministic(tmp_path):
  pairs = [("Größe „x“ – 100 %", "Size \"x\" - 100 %"), ("a", "b")]
  first, second = tmp_path / "a.tsv.gz", tmp_path / "b.tsv.gz"
  assert corpus.write_tsv_gz(first, pairs) == 2
  corpus.write_tsv_gz(second, pairs)
  assert first.read_bytes() == second.read_bytes()
  assert first.read_bytes()[4:8] == b"\x00\x00\x00\x00"  # gzip mtime field
  assert corpus.read_tsv_gz(first) == pairs
  with pytest.raises(ValueError, match="tab or newline"):
    corpus.write_tsv_gz(tmp_path / "c.tsv.gz", [("a\tb", "c")])
  bad = tmp_path / "bad.tsv.gz"
  bad.write_bytes(gzip.compress(b"one field only\n"))
  with pytest.raises(ValueError, match="2 tab-separated fields"):
    corpus.read_tsv_gz(bad)
  crlf = tmp_path / "crlf.tsv"  # written on Windows: the \r is no part of the target
  crlf.write_bytes(b"Hello world\tHallo Welt\r\na\tb\r\n")
  assert corpus.read_tsv_gz(crlf) == [("Hello world", "Hallo Welt"), ("a", "b")]


def test_make_corpus_from_tsv(tmp_path):
  source = tmp_path / "in.tsv.gz"
  corpus.write_tsv_gz(source, _synthetic_pairs(30) + [("same", "same"), ("sentence 1", "Satz 1")])
  out = tmp_path / "out"
  build_corpus.main(
    [
      "--from_tsv",
      str(source),
      "--output_dir",
      str(out),
      "--test_size",
      "4",
      "--validation_size",
      "3",
    ]
  )
  stats = json.loads((out / "stats.json").read_text())
  assert stats["counts"]["after_deduplication"] == len(_synthetic_pairs(30))
  for name in corpus.SPLITS:
    path = out / f"{name}.tsv.gz"
    assert stats["sha256"][path.name] == corpus.sha256_file(path)
    assert len(corpus.read_tsv_gz(path)) == stats["splits"][name]["pairs"]
  assert "Mozilla Public License" in (out / "NOTICE").read_text()


def test_shipped_corpus_matches_its_stats_and_is_disjoint():
  stats = json.loads((DATA_DIR / "stats.json").read_text())
  splits = {name: corpus.read_tsv_gz(DATA_DIR / f"{name}.tsv.gz") for name in corpus.SPLITS}
  for name, pairs in splits.items():
    assert len(pairs) == stats["splits"][name]["pairs"]
    assert corpus.sha256_file(DATA_DIR / f"{name}.tsv.gz") == stats["sha256"][f"{name}.tsv.gz"]
  assert len(splits["test"]) >= 2000
  assert 900 <= len(splits["validation"]) <= 1100
  train_sources = {en for en, _ in splits["train"]}
  assert not train_sources & {en for en, _ in splits["test"]}
  assert not train_sources & {en for en, _ in splits["validation"]}
  everything = [pair for pairs in splits.values() for pair in pairs]
  assert len(set(everything)) == len(everything)  # de-duplicated
  assert all(en and de and en != de for en, de in everything)
  assert "libreoffice-help-de" in (DATA_DIR / "NOTICE").read_text()


def test_shipped_corpus_agrees_with_the_reference_excerpt():
  assert corpus.sha256_file(REFERENCE_EXCERPT) == REFERENCE_EXCERPT_SHA256
  excerpt = corpus.read_tsv_gz(REFERENCE_EXCERPT)
  assert len(excerpt) == 537  # ceil(53621 / 100)
  ours = {
    pair for name in corpus.SPLITS for pair in corpus.read_tsv_gz(DATA_DIR / f"{name}.tsv.gz")
  }
  # The reference keeps every inline-switch variant ("CommandCtrl"); ours keeps the default one, so
  # only pairs with an inline switch differ (about 3%).
  assert sum(pair in ours for pair in excerpt) / len(excerpt) > 0.95
  assert abs(len(ours) - REFERENCE_UNIQUE_PAIRS) / REFERENCE_UNIQUE_PAIRS < 0.02
  # The shipped stats record the comparison with the same full reference file.
  stats = json.loads((DATA_DIR / "stats.json").read_text())
  comparison = stats["reference_comparison"]["inline_switch=default"]
  assert comparison["reference_sha256"] == REFERENCE_SHA256
  assert comparison["reference_unique_pairs"] == REFERENCE_UNIQUE_PAIRS


UI_DATA_DIR = REPO_ROOT / "data" / "libreoffice_ui_ende"


def _write_mo(path: Path, messages: dict) -> None:
  """A GNU gettext .mo file (format revision 0) holding `messages` ({msgid: msgstr}) and a UTF-8
  header."""
  import struct

  messages = {"": "Content-Type: text/plain; charset=UTF-8\n", **messages}
  keys = sorted(messages)
  ids = [k.encode() for k in keys]
  strs = [messages[k].encode() for k in keys]
  header_size = 7 * 4
  table_size = 8 * len(keys)
  offset = header_size + 2 * table_size
  id_table, str_table, blob = [], [], b""
  for data, table in [(d, id_table) for d in ids] + [(d, str_table) for d in strs]:
    table.append((len(data), offset + len(blob)))
    blob += data + b"\0"
  out = struct.pack("<7I", 0x950412DE, 0, len(keys), header_size, header_size + table_size, 0, 0)
  out += b"".join(struct.pack("<2I", *entry) for entry in id_table + str_table)
  path.write_bytes(out + blob)


def test_strip_mnemonic():
  assert corpus.strip_mnemonic("C_onnect") == "Connect"
  assert corpus.strip_mnemonic("_Verbinden") == "Verbinden"
  assert corpus.strip_mnemonic("~Format") == "Format"
  assert corpus.strip_mnemonic("CELL_ADDRESS_TYPE") == "CELL_ADDRESS_TYPE"  # identifiers kept
  assert corpus.strip_mnemonic("Plain text") == "Plain text"


def test_read_mo_pairs_and_clean_ui_pairs(tmp_path):
  mo = tmp_path / "sw.mo"
  _write_mo(
    mo,
    {
      "STR_CONNECT\x04C_onnect": "_Verbinden",
      "Left margin": "Linker Rand",
      "About %PRODUCTNAME": "Über %PRODUCTNAME",
      "Page %1 of %2": "Seite %1 von %2",
      "OK": "OK",
      "ctx2\x04Left margin": "Linker Rand",
      "Untranslated": "",
    },
  )
  raw = corpus.read_mo_pairs(mo)
  assert sorted(raw) == sorted(
    [
      ("C_onnect", "_Verbinden"),
      ("Left margin", "Linker Rand"),
      ("About %PRODUCTNAME", "Über %PRODUCTNAME"),
      ("Page %1 of %2", "Seite %1 von %2"),
      ("OK", "OK"),
      ("Left margin", "Linker Rand"),
    ]
  )
  pairs, counts = corpus.clean_ui_pairs(sorted(raw))
  assert sorted(pairs) == [
    ("About LibreOffice", "Über LibreOffice"),
    ("Connect", "Verbinden"),
    ("Left margin", "Linker Rand"),
  ]
  assert counts == {"catalogue_entries": 6, "dropped_placeholder": 1, "after_cleaning": 3}
  not_mo = tmp_path / "bad.mo"
  not_mo.write_bytes(b"not a catalogue")
  with pytest.raises(OSError, match="bad.mo"):
    corpus.read_mo_pairs(not_mo)


def test_make_ui_corpus_drops_heldout_overlap(tmp_path):
  """The build script end to end on a hand-made catalogue: a pair whose English equals a held-out
  source (after normalization) is dropped and counted."""
  mo = tmp_path / "sc.mo"
  _write_mo(
    mo, {"Numeric": "Nummerisch", "Left margin": "Linker Rand", "Insert rows": "Zeilen einfügen"}
  )
  heldout = tmp_path / "test.tsv.gz"
  corpus.write_tsv_gz(
    heldout, [("numeric", "Numerisch (anders)"), ("Some other sentence.", "Satz.")]
  )
  pairs, counts = build_ui_corpus.build([mo], (heldout,))
  assert sorted(pairs) == [("Insert rows", "Zeilen einfügen"), ("Left margin", "Linker Rand")]
  assert counts["heldout_overlap"]["source_exact"] == 1 and counts["pairs"] == 2


def test_shipped_ui_corpus_matches_its_stats_and_has_no_heldout_overlap():
  from speculative.data import overlap

  stats = json.loads((UI_DATA_DIR / "stats.json").read_text())
  path = UI_DATA_DIR / "train.tsv.gz"
  pairs = corpus.read_tsv_gz(path)
  assert corpus.sha256_file(path) == stats["sha256"]["train.tsv.gz"]
  assert len(pairs) == stats["counts"]["pairs"] > 15000
  assert len(set(pairs)) == len(pairs) and all(en and de and en != de for en, de in pairs)
  heldout = [
    p for name in ("validation", "test") for p in corpus.read_tsv_gz(DATA_DIR / f"{name}.tsv.gz")
  ]
  drop, report = overlap.find_overlap(pairs, heldout)
  assert report["dropped"] == 0, report
  assert "libreoffice-l10n-de" in (UI_DATA_DIR / "NOTICE").read_text()
