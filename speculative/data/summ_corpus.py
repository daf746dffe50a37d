"""The Debian package descriptions summarization corpus: long description -> synopsis.

Source: Debian's `Translation-en` index (`dists/<suite>/main/i18n/Translation-en`, fetched by
`apt-get -o Acquire::Languages=en update`), one stanza per package:

    Package: 0ad
    Description-md5: d943033bedada21853d2ae54a2578a7b
    Description-en: Real-time strategy game of ancient warfare      <- the synopsis (target)
     0 A.D. (pronounced "zero ey-dee") is a free, open-source, ...   <- the long description (input)
     .                                                               <- paragraph break

Pairs (`parse_translation`, `build_pairs`): input = the long description's lines joined, paragraph
breaks (` .`) dropped and whitespace normalized; target = the synopsis. Kept when the description
has at least `min_words` words and the synopsis at least one; deduplicated by description (the first
package in file order, i.e. by package name, keeps it), since Debian copies a description across the
binary packages of a source with only the synopsis changed.

Splits (`split_pairs`): pairs are grouped by the first 200 characters of their description, which
the packages of one family share ("0ad-data" and "0ad-data-common" begin with the same paragraph),
and the groups are ordered by a salted SHA-256 of that key: test takes the smallest prefix of
groups holding at least `test_size` pairs, validation the next `validation_size`, train the rest. A
family therefore never straddles train and a held-out split. Then `speculative.data.overlap` drops every
training pair that matches a held-out pair exactly or nearly on either side, and its counts are
recorded in `stats.json`.

Command (from the repo root; after `apt-get -o Acquire::Languages=en update`, which fetches the
index, and with the lz4 command line tool, `apt-get install -y lz4`):

  .venv/bin/python -m speculative.data.summ_corpus --inputs_length 256

decompresses Debian bookworm main's apt index (`INDEX`) to a temporary file and writes
data/debian_descriptions/{train,validation,test}.tsv.gz and stats.json, then prints the stats.
`--translation PATH` reads an already decompressed Translation-en file instead; `--output_dir DIR`
writes somewhere else. The output depends only on the index file (its sha256 is recorded in
stats.json) and the options. Standard library plus `speculative.data.overlap` (numpy, scipy), and
sentencepiece for the token-length statistics.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
import statistics
import subprocess
import sys
import tempfile
from typing import Iterable
from typing import Sequence

from speculative.data import corpus

Pair = tuple[str, str]

DEFAULT_SPLIT_SALT = "debian_descriptions/v1"
SPLITS = ("train", "validation", "test")
# Descriptions shorter than this many words are mostly one-line restatements of the synopsis
# ("This package contains the documentation.") and teach nothing about summarizing.
DEFAULT_MIN_WORDS = 12
# The lz4-compressed index apt keeps after `apt-get -o Acquire::Languages=en update`.
INDEX = "/var/lib/apt/lists/deb.debian.org_debian_dists_bookworm_main_i18n_Translation-en.lz4"


class FormatError(ValueError):
  """A Translation-en file that does not follow the stanza format (names the file and line)."""


def parse_translation(lines: Iterable[str], name: str = "<input>") -> list[tuple[str, str, str]]:
  """(package, synopsis, long description) per stanza, in file order.

  The description is whitespace-normalized with paragraph breaks (a ` .` line) dropped. Raises
  FormatError on a continuation line outside a description or a stanza without `Package:` or
  `Description-en:`.
  """
  entries: list[tuple[str, str, str]] = []
  fields: dict[str, str] = {}
  body: list[str] = []
  start = 0
  in_description = False

  def finish(line_number: int) -> None:
    if not fields:
      return
    for key in ("Package", "Description-en"):
      if key not in fields:
        raise FormatError(f"{name}:{start}: stanza without {key}:")
    text = corpus.normalize_whitespace(" ".join(line for line in body if line.strip() != "."))
    entries.append((fields["Package"], corpus.normalize_whitespace(fields["Description-en"]), text))

  for line_number, raw in enumerate(lines, start=1):
    line = raw.rstrip("\n")
    if not line.strip():
      finish(line_number)
      fields, body, in_description = {}, [], False
      continue
    if not fields:
      start = line_number
    if line[0] in " \t":
      if not in_description:
        raise FormatError(f"{name}:{line_number}: continuation line outside a description")
      body.append(line.strip())
      continue
    key, sep, value = line.partition(":")
    if not sep:
      raise FormatError(f"{name}:{line_number}: expected 'Field: value', got {line[:60]!r}")
    fields[key] = value.strip()
    in_description = key == "Description-en"
  finish(start)
  return entries


def build_pairs(
  entries: Sequence[tuple[str, str, str]], min_words: int = DEFAULT_MIN_WORDS
) -> tuple[list[tuple[str, str, str]], dict[str, int]]:
  """(package, description, synopsis) kept in file order, and the counts of what was dropped."""
  counts = {"stanzas": len(entries), "dropped_short": 0, "dropped_duplicate_description": 0}
  seen: set[str] = set()
  kept = []
  for package, synopsis, description in entries:
    if len(description.split()) < min_words or not synopsis:
      counts["dropped_short"] += 1
      continue
    if description in seen:
      counts["dropped_duplicate_description"] += 1
      continue
    seen.add(description)
    kept.append((package, description, synopsis))
  counts["pairs"] = len(kept)
  return kept, counts


def _family_key(description: str) -> str:
  """The description's first 200 characters: what the packages of one family share."""
  return description[:200]


def split_pairs(
  rows: Sequence[tuple[str, str, str]],
  test_size: int = 2000,
  validation_size: int = 1000,
  salt: str = DEFAULT_SPLIT_SALT,
) -> dict[str, list[tuple[str, str, str]]]:
  """train/validation/test by salted hash of the family key (see the module docstring)."""
  return corpus.split_groups(
    rows, lambda row: _family_key(row[1]), test_size, validation_size, salt
  )


def token_lengths(texts: Sequence[str], spm_model: str) -> list[int]:
  """SentencePiece tokens per text plus EOS, as training and inference count them."""
  import sentencepiece as spm

  sp = spm.SentencePieceProcessor(model_file=spm_model)
  return [len(ids) + 1 for ids in sp.encode(list(texts))]


def build(
  translation: str,
  output_dir: str,
  spm_model: str | None = None,
  min_words: int = DEFAULT_MIN_WORDS,
  test_size: int = 2000,
  validation_size: int = 1000,
  inputs_length: int = 192,
  input_prefix: str = "summarize: ",
) -> dict:
  """Parses, splits, drops held-out overlap from train, writes `{split}.tsv.gz` (description<TAB>
  synopsis, `corpus.write_tsv_gz`) and `stats.json` into `output_dir`; returns the stats.

  With `spm_model`: token-length statistics per split (the input counted with `input_prefix`, as
  training and inference see it) and how many inputs exceed `inputs_length` tokens (truncated).
  """
  from speculative.data import overlap

  with open(translation, encoding="utf-8") as f:
    entries = parse_translation(f, name=translation)
  rows, counts = build_pairs(entries, min_words)
  splits = split_pairs(rows, test_size, validation_size)
  heldout = [(d, s) for name in ("validation", "test") for _, d, s in splits[name]]
  train_pairs = [(d, s) for _, d, s in splits["train"]]
  drop, report = overlap.find_overlap(train_pairs, heldout)
  splits["train"] = [row for row, dropped in zip(splits["train"], drop) if not dropped]
  os.makedirs(output_dir, exist_ok=True)
  stats: dict = {
    "source": os.path.basename(translation),
    "source_sha256": corpus.sha256_file(translation),
    "options": {
      "min_words": min_words,
      "test_size": test_size,
      "validation_size": validation_size,
      "salt": DEFAULT_SPLIT_SALT,
    },
    "counts": counts,
    "heldout_overlap": report,
    "splits": {},
  }
  for name in SPLITS:
    pairs = [(d, s) for _, d, s in splits[name]]
    path = Path(output_dir) / f"{name}.tsv.gz"
    corpus.write_tsv_gz(path, pairs)
    entry: dict = {
      "pairs": len(pairs),
      "sha256": corpus.sha256_file(path),
      "median_input_words": statistics.median(len(d.split()) for d, _ in pairs),
      "median_target_words": statistics.median(len(s.split()) for _, s in pairs),
    }
    if spm_model:
      inputs = token_lengths([input_prefix + d for d, _ in pairs], spm_model)
      targets = token_lengths([s for _, s in pairs], spm_model)
      entry.update(
        median_input_tokens=statistics.median(inputs),
        median_target_tokens=statistics.median(targets),
        inputs_over_length=sum(n > inputs_length for n in inputs),
        inputs_length=inputs_length,
      )
    stats["splits"][name] = entry
  with open(Path(output_dir) / "stats.json", "w") as f:
    json.dump(stats, f, indent=1, sort_keys=True)
    f.write("\n")
  return stats


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument(
    "--translation", help="a decompressed Translation-en file (default: decompress INDEX)"
  )
  parser.add_argument("--output_dir", default="data/debian_descriptions")
  parser.add_argument("--spm_model", default="data/libreoffice_ende/spm8k.model")
  parser.add_argument("--min_words", type=int, default=DEFAULT_MIN_WORDS)
  parser.add_argument("--inputs_length", type=int, default=192)
  args = parser.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    translation = args.translation or _decompress_index(tmp)
    stats = build(
      translation,
      args.output_dir,
      args.spm_model,
      args.min_words,
      inputs_length=args.inputs_length,
    )
  print(json.dumps(stats, indent=1, sort_keys=True))


def _decompress_index(tmp: str) -> str:
  """Decompresses apt's lz4 index (`INDEX`) into `tmp`; exits with one line naming what is
  missing."""
  if not os.path.exists(INDEX):
    sys.exit(f"{INDEX} does not exist: run `apt-get -o Acquire::Languages=en update` first")
  path = os.path.join(tmp, "Translation-en")
  with open(path, "wb") as out:
    try:
      subprocess.run(["lz4", "-dc", INDEX], stdout=out, check=True)
    except FileNotFoundError:
      sys.exit("the lz4 command is missing: apt-get install -y lz4")
  return path


if __name__ == "__main__":
  main()
