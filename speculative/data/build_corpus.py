"""Builds the LibreOffice help En-De corpus and its train/validation/test splits.

Command (from the repo root; needs apt and network access to a Debian mirror, ~5 MB, ~30 s):

  .venv/bin/python -m speculative.data.build_corpus

It runs `apt-get download libreoffice-help-en-us libreoffice-help-de` (and `apt-get update` first if
that fails), unpacks both with `dpkg -x` into a temporary directory, aligns the help pages with
`speculative.data.html` (cleaning and splits: `speculative.data.corpus`) and writes

  data/libreoffice_ende/{train,validation,test}.tsv.gz   en<TAB>de, gzip with mtime=0 (reproducible bytes)
  data/libreoffice_ende/NOTICE                           MPL-2.0 notice with the package versions
  data/libreoffice_ende/stats.json                       counts, versions, options, sha256 of each file
  data/libreoffice_ende/README.md                        what the files are

and prints the counts and, with `--reference PATH` (an independent en<TAB>de extraction of the same
packages), how the extraction compares with that reference (pair counts and overlap of unique pairs).

Variants:
  --debs DIR          use the two .deb files already in DIR instead of `apt-get download`
  --from_tsv PATH     no apt at all: split an existing en<TAB>de TSV (e.g. a reference extraction; it is
                      cleaned and de-duplicated the same way)
  --output_dir DIR    write somewhere else (default data/libreoffice_ende)

The output depends only on the package contents (the versions are recorded), the options and the
split salt, so rerunning with the same packages reproduces the shipped files byte for byte.
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path
import subprocess
import sys
import tempfile

REPO_ROOT = Path(__file__).resolve().parents[2]

from speculative.data import corpus
from speculative.data import html

PACKAGES = ("libreoffice-help-en-us", "libreoffice-help-de")
HELP_SUBDIR = Path("usr/share/libreoffice/help")
DEFAULT_OUTPUT_DIR = REPO_ROOT / "data" / "libreoffice_ende"

NOTICE_TEMPLATE = """\
LibreOffice help En-De parallel corpus
======================================

The English and German texts in this directory ({files})
are extracted from the LibreOffice help pages, as packaged by Debian:

{sources}
LibreOffice is Copyright 2000, 2010 Oracle and/or its affiliates and Copyright (c) 2000, 2010
LibreOffice contributors and/or their affiliates (The Document Foundation, https://www.libreoffice.org/).
The help content is licensed under the Mozilla Public License, v. 2.0 (MPL-2.0); some files
include Apache-2.0 licensed material (see the packages' /usr/share/doc/*/copyright).

  This Source Code Form is subject to the terms of the Mozilla Public License, v. 2.0.
  If a copy of the MPL was not distributed with this file, You can obtain one at
  https://mozilla.org/MPL/2.0/.

Modifications: the text content of each help paragraph was extracted from the rendered HTML, the
English and German paragraphs were aligned by (page, paragraph id), whitespace was normalized, pairs
with an empty side or two identical sides and duplicate pairs were removed, and the pairs were split
into train/validation/test. The original source code form is the LibreOffice helpcontent2 repository
(https://git.libreoffice.org/help) and the Debian source package `libreoffice`.
"""

README_TEMPLATE = """\
# LibreOffice help En-De corpus

Human-translated English-German paragraph pairs from the LibreOffice help (MPL-2.0, see `NOTICE`),
built by `speculative/data/build_corpus.py` (extraction and alignment: `speculative/data/html.py`).

| split | pairs | unique English sources |
|---|---|---|
{rows}

Format: `en<TAB>de`, one pair per line, UTF-8, gzip. No English sentence of `test` or `validation`
occurs in `train` (the split is by a salted SHA-256 of the English source). `stats.json` holds the
package versions, the options, all counts and the sha256 of each file. The seqio task
`libreoffice_ende` (`speculative/data/tasks.py`) reads these files.

`spm8k.model` (with `spm8k.vocab` and `spm8k.json`: options, sha256, token lengths) is the shared
En+De SentencePiece vocabulary (unigram, 8000 pieces, pad=0, eos=1, unk=2, byte fallback), trained on
`train.tsv.gz` only by `speculative/data/build_vocab.py`.
"""


def _run(command: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
  print("$", " ".join(command), flush=True)
  return subprocess.run(command, cwd=cwd, check=False, capture_output=True, text=True)


def download_packages(download_dir: Path, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
  """`apt-get download`s `packages` into `download_dir` (runs `apt-get update` and retries once if
  the first attempt fails). Returns the .deb paths in `packages` order."""
  result = _run(["apt-get", "download", *packages], cwd=download_dir)
  if result.returncode != 0:
    print(result.stderr.strip(), file=sys.stderr)
    update = _run(["apt-get", "update"])
    if update.returncode != 0:
      raise RuntimeError(f"apt-get update failed:\n{update.stderr}")
    result = _run(["apt-get", "download", *packages], cwd=download_dir)
    if result.returncode != 0:
      raise RuntimeError(f"apt-get download {' '.join(packages)} failed:\n{result.stderr}")
  return find_debs(download_dir, packages)


def find_debs(directory: Path, packages: tuple[str, ...] = PACKAGES) -> list[Path]:
  """The .deb of each of `packages` found in `directory` (exactly one each)."""
  debs = []
  for package in packages:
    matches = sorted(glob.glob(str(directory / f"{package}_*.deb")))
    if len(matches) != 1:
      raise FileNotFoundError(f"expected one {package}_*.deb in {directory}, found {matches}")
    debs.append(Path(matches[0]))
  return debs


def deb_field(deb: Path, field: str) -> str:
  result = subprocess.run(
    ["dpkg-deb", "--field", str(deb), field], check=True, capture_output=True, text=True
  )
  return result.stdout.strip()


def extract_debs(debs: list[Path], extract_dir: Path, check_help: bool = True) -> Path:
  """`dpkg -x`s every .deb into `extract_dir`; returns the help root (holding en-US/ and de/, checked
  unless `check_help` is False)."""
  for deb in debs:
    subprocess.run(["dpkg", "-x", str(deb), str(extract_dir)], check=True)
  help_root = extract_dir / HELP_SUBDIR
  if not check_help:
    return help_root
  for lang in (html.SOURCE_LANG_DIR, html.TARGET_LANG_DIR):
    if not (help_root / lang / "text").is_dir():
      raise FileNotFoundError(f"{help_root / lang / 'text'} missing after dpkg -x of {debs}")
  return help_root


def compare_with_reference(pairs: list[corpus.Pair], raw_clean_count: int, reference: Path) -> dict:
  """Pair counts and overlap of unique pairs between this extraction and the reference TSV."""
  reference_pairs = corpus.read_tsv_gz(reference)
  reference_unique = set(reference_pairs)
  ours = set(pairs)
  return {
    "reference": reference.name,
    "reference_sha256": corpus.sha256_file(reference),
    "reference_pairs": len(reference_pairs),
    "reference_unique_pairs": len(reference_unique),
    "ours_pairs_before_dedup": raw_clean_count,
    "ours_unique_pairs": len(ours),
    "shared_unique_pairs": len(ours & reference_unique),
    "only_ours": len(ours - reference_unique),
    "only_reference": len(reference_unique - ours),
  }


def write_outputs(
  output_dir: Path, splits: dict[str, list[corpus.Pair]], stats: dict, sources_text: str
) -> dict:
  output_dir.mkdir(parents=True, exist_ok=True)
  files = {}
  for name in corpus.SPLITS:
    path = output_dir / f"{name}.tsv.gz"
    corpus.write_tsv_gz(path, splits[name])
    files[path.name] = corpus.sha256_file(path)
  notice = NOTICE_TEMPLATE.format(files=", ".join(files), sources=sources_text)
  (output_dir / "NOTICE").write_text(notice, encoding="utf-8")
  rows = "\n".join(
    f"| {name} | {stats['splits'][name]['pairs']} | {stats['splits'][name]['unique_sources']} |"
    for name in corpus.SPLITS
  )
  (output_dir / "README.md").write_text(README_TEMPLATE.format(rows=rows), encoding="utf-8")
  stats["sha256"] = files
  (output_dir / "stats.json").write_text(
    json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
  )
  return stats


def main(argv: list[str] | None = None) -> None:
  args = _parser().parse_args(argv)
  stats: dict = {
    "options": {
      "test_size": args.test_size,
      "validation_size": args.validation_size,
      "salt": args.salt,
    }
  }
  if args.from_tsv is not None:
    raw, comparisons = corpus.read_tsv_gz(args.from_tsv), None
    stats["source"] = {"from_tsv": args.from_tsv.name, "sha256": corpus.sha256_file(args.from_tsv)}
    sources_text = (
      f"  (rebuilt from {args.from_tsv.name}, sha256 "
      f"{stats['source']['sha256']}: an en<TAB>de extraction of the\n"
      f"  Debian packages {' and '.join(PACKAGES)}; versions not recorded)\n"
    )
  else:
    raw, packages, comparisons = _extract_packages(args)
    stats["source"] = {"debian_packages": packages}
    stats["options"]["inline_switch"] = args.inline_switch
    sources_text = "".join(
      f"  {name} {version} (Debian source package libreoffice)\n"
      for name, version in packages.items()
    )
  cleaned_with_duplicates = corpus.clean_pairs(raw, deduplicate=False)
  pairs = corpus.clean_pairs(raw)
  splits = corpus.split_pairs(pairs, args.test_size, args.validation_size, args.salt)
  stats["counts"] = {
    "aligned_paragraphs": len(raw),
    "after_dropping_empty_and_equal": len(cleaned_with_duplicates),
    "after_deduplication": len(pairs),
  }
  stats["splits"] = {
    name: {"pairs": len(split), "unique_sources": len({en for en, _ in split})}
    for name, split in splits.items()
  }
  if comparisons is not None:
    stats["reference_comparison"] = comparisons
  stats = write_outputs(args.output_dir, splits, stats, sources_text)
  print(json.dumps(stats, indent=2, ensure_ascii=False))


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--output_dir", type=Path, default=DEFAULT_OUTPUT_DIR)
  parser.add_argument(
    "--debs",
    type=Path,
    default=None,
    help="directory holding the two .deb files (skips apt-get download)",
  )
  parser.add_argument(
    "--from_tsv",
    type=Path,
    default=None,
    help="build the splits from this en<TAB>de TSV instead of the packages",
  )
  parser.add_argument(
    "--inline_switch",
    choices=("default", "all"),
    default="default",
    help="inline switches: keep the default variant, or all variants concatenated",
  )
  parser.add_argument("--test_size", type=int, default=2000)
  parser.add_argument("--validation_size", type=int, default=1000)
  parser.add_argument("--salt", default=corpus.DEFAULT_SPLIT_SALT)
  parser.add_argument(
    "--reference",
    type=Path,
    default=None,
    help="reference en<TAB>de TSV to compare the extraction with (optional)",
  )
  return parser


def _extract_packages(args) -> tuple[list, dict[str, str], dict | None]:
  """(aligned pairs, {package: version}, comparisons with --reference or None) from the Debian
  packages (downloaded, or found in --debs)."""
  comparisons = None
  with tempfile.TemporaryDirectory(prefix="libreoffice_help_") as tmp:
    tmp_dir = Path(tmp)
    debs = find_debs(args.debs) if args.debs is not None else download_packages(tmp_dir)
    packages = {deb_field(deb, "Package"): deb_field(deb, "Version") for deb in debs}
    help_root = extract_debs(debs, tmp_dir / "root")
    raw = html.align_help_trees(help_root, inline_switch=args.inline_switch)
    if args.reference is not None and args.reference.exists():
      comparisons = {}
      # Compare both extraction modes with the reference: "all" is how the reference was made.
      for mode in ("default", "all"):
        mode_raw = (
          raw
          if mode == args.inline_switch
          else html.align_help_trees(help_root, inline_switch=mode)
        )
        comparisons[f"inline_switch={mode}"] = compare_with_reference(
          corpus.clean_pairs(mode_raw),
          len(corpus.clean_pairs(mode_raw, deduplicate=False)),
          args.reference,
        )
  return raw, packages, comparisons


if __name__ == "__main__":
  main()
