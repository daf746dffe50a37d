"""Builds the LibreOffice UI En-De corpus: the German message catalogues LibreOffice ships, as
extra training pairs for the embedded target. Training-only: it has no splits; the
help corpus's validation and test splits stay the held-out sets, and every catalogue pair that
matches one of their sides exactly or nearly (speculative/data/overlap.py) is dropped here, before the
file is written (training drops them again with `train.exclude_heldout`).

Command (from the repo root; needs apt and network access to a Debian mirror, ~1 MB, ~10 s):

  .venv/bin/python -m speculative.data.build_ui_corpus

It runs `apt-get download libreoffice-l10n-de` (and `apt-get update` first if that fails), unpacks it
with `dpkg -x` into a temporary directory, reads every catalogue under
`usr/lib/libreoffice/program/resource/de/LC_MESSAGES/*.mo` (msgid = the English UI string, msgstr =
its German translation), cleans the pairs (`speculative.data.corpus.clean_ui_pairs`: mnemonic markers
removed, %PRODUCTNAME -> LibreOffice, pairs with other run-time placeholders, empty, untranslated or
duplicate pairs dropped), drops the held-out overlap and writes

  data/libreoffice_ui_ende/train.tsv.gz   en<TAB>de, gzip with mtime=0 (reproducible bytes)
  data/libreoffice_ui_ende/NOTICE         MPL-2.0 notice with the package version
  data/libreoffice_ui_ende/stats.json     counts, overlap report, version, sha256
  data/libreoffice_ui_ende/README.md      what the files are

and prints stats.json. `--debs DIR` uses a libreoffice-l10n-de_*.deb already in DIR. The output
depends only on the package contents and the held-out files, so a rerun reproduces it byte for byte.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
import tempfile

REPO_ROOT = Path(__file__).resolve().parents[2]

from speculative.data import build_corpus as make_corpus  # the apt download and .deb helpers
from speculative.data import corpus
from speculative.data import overlap

PACKAGES = ("libreoffice-l10n-de",)
CATALOGUE_SUBDIR = Path("usr/lib/libreoffice/program/resource/de/LC_MESSAGES")
DEFAULT_OUTPUT_DIR = REPO_ROOT / "data" / "libreoffice_ui_ende"
DEFAULT_HELDOUT = (
  REPO_ROOT / "data" / "libreoffice_ende" / "validation.tsv.gz",
  REPO_ROOT / "data" / "libreoffice_ende" / "test.tsv.gz",
)

NOTICE_TEMPLATE = """\
LibreOffice UI En-De parallel corpus
====================================

The English and German texts in this directory (train.tsv.gz) are extracted from the German
message catalogues of the LibreOffice user interface, as packaged by Debian:

  {package} {version} (Debian source package libreoffice)

LibreOffice is Copyright 2000, 2010 Oracle and/or its affiliates and Copyright (c) 2000, 2010
LibreOffice contributors and/or their affiliates (The Document Foundation, https://www.libreoffice.org/).
The translations are licensed under the Mozilla Public License, v. 2.0 (MPL-2.0); some files
include Apache-2.0 licensed material (see the package's /usr/share/doc/{package}/copyright).

  This Source Code Form is subject to the terms of the Mozilla Public License, v. 2.0.
  If a copy of the MPL was not distributed with this file, You can obtain one at
  https://mozilla.org/MPL/2.0/.

Modifications: the (msgid, msgstr) pairs of the compiled catalogues (*.mo) were read, message
contexts and plural entries dropped, mnemonic markers (~, _) removed, %PRODUCTNAME replaced by
LibreOffice, pairs holding another run-time placeholder, pairs with an empty side or two identical
sides, duplicate pairs, and pairs whose English or German side matches a sentence of the help
corpus's validation or test split (exactly or nearly) were removed. The original source code form
is the LibreOffice translations repository (https://git.libreoffice.org/translations) and the Debian
source package `libreoffice`.
"""

README_TEMPLATE = """\
# LibreOffice UI En-De corpus (training only)

{pairs} human-translated English-German pairs of LibreOffice user-interface strings (labels,
tooltips, extended tips, messages; MPL-2.0, see `NOTICE`), built by `speculative/data/build_ui_corpus.py`
(cleaning: `speculative.data.corpus.clean_ui_pairs`). Extra in-domain training data for the embedded
target next to `data/libreoffice_ende/train.tsv.gz`; it has no validation or test split, and no
pair in it matches a side of `data/libreoffice_ende/{{validation,test}}.tsv.gz` exactly or nearly
(counts in `stats.json`, which also holds the package version and the sha256 of the file).

Format: `en<TAB>de`, one pair per line, UTF-8, gzip. Tokenized with `data/libreoffice_ende/spm8k.model`.
"""


def _display(path: Path) -> str:
  """The path relative to the repo root when it lies inside it (reproducible stats.json)."""
  path = path.resolve()
  return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def build(mo_paths: list[Path], heldout_paths: tuple[Path, ...]) -> tuple[list, dict]:
  """Cleaned catalogue pairs without held-out overlap, and the counts of every step."""
  raw = [pair for path in mo_paths for pair in corpus.read_mo_pairs(path)]
  pairs, counts = corpus.clean_ui_pairs(raw)
  heldout = [pair for path in heldout_paths for pair in corpus.read_tsv_gz(path)]
  kept, report = overlap.drop_overlap(pairs, heldout)
  counts.update(catalogues=len(mo_paths), heldout_overlap=report, pairs=len(kept))
  return kept, counts


def write_outputs(output_dir: Path, pairs: list, stats: dict, package: str, version: str) -> dict:
  output_dir.mkdir(parents=True, exist_ok=True)
  path = output_dir / "train.tsv.gz"
  corpus.write_tsv_gz(path, pairs)
  stats["sha256"] = {path.name: corpus.sha256_file(path)}
  (output_dir / "NOTICE").write_text(
    NOTICE_TEMPLATE.format(package=package, version=version), encoding="utf-8"
  )
  (output_dir / "README.md").write_text(README_TEMPLATE.format(pairs=len(pairs)), encoding="utf-8")
  (output_dir / "stats.json").write_text(
    json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
  )
  return stats


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--output_dir", type=Path, default=DEFAULT_OUTPUT_DIR)
  parser.add_argument("--debs", type=Path, default=None, help="directory holding the .deb")
  parser.add_argument("--heldout", type=Path, nargs="+", default=list(DEFAULT_HELDOUT))
  args = parser.parse_args(argv)
  for path in args.heldout:
    if not path.is_file():
      raise FileNotFoundError(f"held-out file {path} not found")
  with tempfile.TemporaryDirectory(prefix="libreoffice_ui_") as tmp:
    tmp_dir = Path(tmp)
    if args.debs is not None:
      (deb,) = make_corpus.find_debs(args.debs, PACKAGES)
    else:
      (deb,) = make_corpus.download_packages(tmp_dir, PACKAGES)
    package, version = make_corpus.deb_field(deb, "Package"), make_corpus.deb_field(deb, "Version")
    make_corpus.extract_debs([deb], tmp_dir / "root", check_help=False)
    mo_paths = sorted((tmp_dir / "root" / CATALOGUE_SUBDIR).glob("*.mo"))
    if not mo_paths:
      raise FileNotFoundError(f"no *.mo under {CATALOGUE_SUBDIR} in {deb}")
    pairs, counts = build(mo_paths, tuple(args.heldout))
  stats = {
    "source": {"debian_packages": {package: version}},
    "heldout_files": [_display(path) for path in args.heldout],
    "counts": counts,
  }
  stats = write_outputs(args.output_dir, pairs, stats, package, version)
  print(json.dumps(stats, indent=2, ensure_ascii=False))


if __name__ == "__main__":
  main()
