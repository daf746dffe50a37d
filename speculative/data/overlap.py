"""Exact and near-duplicate overlap between a training corpus and held-out sentences.

A held-out (validation or test) sentence "reaches" the training data when a training pair has, on
either side, the same text after normalization (exact) or a text whose word set is nearly the same
(near-duplicate). Normalization: NFKC, lower case, every digit run -> "0", words = `\\w+` runs (so
punctuation, spacing and numbers do not hide a copy). Near-duplicate: Jaccard similarity of the two
sets of word unigrams and bigrams >= `threshold` (default 0.8), computed for all pairs at once as a
sparse product.

    drop, report = overlap.find_overlap(train_pairs, heldout_pairs)
    kept, report = overlap.drop_overlap(train_pairs, heldout_pairs)

`report` counts exact and near matches per side; training code drops the flagged pairs before it
tokenizes (speculative/train/run.py, `exclude_heldout`).
"""

from __future__ import annotations

import re
from typing import Sequence
import unicodedata
import zlib

import numpy as np
from scipy import sparse

_WORD = re.compile(r"\w+")
_DIGITS = re.compile(r"\d+")
_NUM_BUCKETS = 1 << 22


def normalize(text: str) -> str:
  """NFKC, lower case, digit runs -> 0, words joined by one space."""
  text = _DIGITS.sub("0", unicodedata.normalize("NFKC", text).lower())
  return " ".join(_WORD.findall(text))


def _features(text: str) -> set[int]:
  words = normalize(text).split()
  grams = words + [a + " " + b for a, b in zip(words, words[1:])]
  return {zlib.crc32(g.encode()) % _NUM_BUCKETS for g in grams}


def _binary_matrix(texts: Sequence[str]) -> tuple[sparse.csr_matrix, np.ndarray]:
  rows, cols = [], []
  for i, text in enumerate(texts):
    feats = _features(text)
    rows.extend([i] * len(feats))
    cols.extend(feats)
  m = sparse.csr_matrix(
    (np.ones(len(rows), np.float32), (rows, cols)), shape=(len(texts), _NUM_BUCKETS)
  )
  return m, np.asarray(m.sum(axis=1)).ravel()


def near_duplicates(
  candidates: Sequence[str], references: Sequence[str], threshold: float = 0.8
) -> tuple[np.ndarray, np.ndarray]:
  """(exact[N], near[N]) bool masks: candidate i equals / nearly equals some reference."""
  if not 0.0 < threshold <= 1.0:
    raise ValueError(f"threshold must be in (0, 1], got {threshold}")
  ref_norm = {normalize(r) for r in references}
  exact = np.array([normalize(c) in ref_norm for c in candidates], bool)
  a, a_size = _binary_matrix(candidates)
  b, b_size = _binary_matrix(references)
  inter = (a @ b.T).tocoo()  # [N, M] sparse intersection sizes
  union = a_size[inter.row] + b_size[inter.col] - inter.data
  jaccard = inter.data / np.maximum(union, 1.0)
  near = np.zeros(len(candidates), bool)
  near[inter.row[jaccard >= threshold]] = True
  return exact, near & ~exact


def find_overlap(
  train: Sequence[tuple[str, str]], heldout: Sequence[tuple[str, str]], threshold: float = 0.8
) -> tuple[np.ndarray, dict[str, int]]:
  """Mask of training pairs to drop (either side matches a held-out side) and the counts."""
  report: dict[str, int] = {"train_pairs": len(train), "heldout_pairs": len(heldout)}
  drop = np.zeros(len(train), bool)
  for side, name in ((0, "source"), (1, "target")):
    exact, near = near_duplicates([p[side] for p in train], [p[side] for p in heldout], threshold)
    report[f"{name}_exact"] = int(exact.sum())
    report[f"{name}_near"] = int(near.sum())
    drop |= exact | near
  report["dropped"] = int(drop.sum())
  return drop, report


def drop_overlap(
  train: Sequence[tuple[str, str]], heldout: Sequence[tuple[str, str]], threshold: float = 0.8
) -> tuple[list[tuple[str, str]], dict[str, int]]:
  """The training pairs that `find_overlap` keeps (input order) and its report."""
  drop, report = find_overlap(train, heldout, threshold)
  return [pair for pair, dropped in zip(train, drop) if not dropped], report
