"""The Debian descriptions corpus builder (speculative/data/summ_corpus.py): parsing, filtering, splits."""

import pytest

from speculative.data import summ_corpus

INDEX = """\
Package: alpha
Description-md5: 0
Description-en: Alpha   tool for testing
 First paragraph of the alpha description, long enough to be kept by the filter.
 .
 Second   paragraph.

Package: alpha-doc
Description-md5: 1
Description-en: Alpha documentation
 First paragraph of the alpha description, long enough to be kept by the filter.
 .
 Second   paragraph.

Package: beta
Description-md5: 2
Description-en: Beta
 Too short.
"""


def test_parse_joins_lines_and_drops_paragraph_breaks():
  entries = summ_corpus.parse_translation(INDEX.splitlines(keepends=True))
  assert [e[0] for e in entries] == ["alpha", "alpha-doc", "beta"]
  package, synopsis, description = entries[0]
  assert synopsis == "Alpha tool for testing"
  assert description == (
    "First paragraph of the alpha description, long enough to be kept by the filter. "
    "Second paragraph."
  )


def test_build_drops_short_and_repeated_descriptions():
  rows, counts = summ_corpus.build_pairs(summ_corpus.parse_translation(INDEX.splitlines()))
  assert [r[0] for r in rows] == ["alpha"]
  assert counts == {
    "stanzas": 3,
    "dropped_short": 1,
    "dropped_duplicate_description": 1,
    "pairs": 1,
  }


def test_malformed_index_names_file_and_line():
  with pytest.raises(summ_corpus.FormatError, match=r"idx:2: continuation line outside"):
    summ_corpus.parse_translation(["Package: a\n", " stray\n"], name="idx")
  with pytest.raises(summ_corpus.FormatError, match=r"idx:1: stanza without Description-en"):
    summ_corpus.parse_translation(["Package: a\n", "\n"], name="idx")


def test_families_stay_in_one_split():
  rows = [
    (f"p{i}-{j}", f"family {i} " + "word " * 40 + f"variant {j}", f"s{i}{j}")
    for i in range(60)
    for j in range(3)
  ]
  splits = summ_corpus.split_pairs(rows, test_size=20, validation_size=10)
  family = {name: {r[1][:200] for r in part} for name, part in splits.items()}
  assert not family["train"] & family["test"] and not family["train"] & family["validation"]
  assert len(splits["test"]) >= 20 and len(splits["validation"]) >= 10
