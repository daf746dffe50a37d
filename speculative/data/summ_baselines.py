"""Two simple ROUGE references for the summarization corpus (data/debian_descriptions), scored with
the same ROUGE as the summarization job (`metrics.rouge`: rouge1/rouge2/rougeLsum F-measure x 100,
the mean over documents):

  lead       the first sentence of the input (`first_sentence`)
  retrieval  the summary of the most similar training input (`Retriever`): TF-IDF vectors of word
             unigrams (lowercased alphanumeric runs, the tokens ROUGE itself compares), cosine
             similarity, ties to the earliest training pair

Command (from the repo root; numpy, scipy and rouge-score, no model):

  .venv/bin/python -m speculative.data.summ_baselines

scores both on the whole test split against the training split and prints a Markdown table, the
command and the load average. `--split validation`, `--num_examples N` (the first N documents) and
`--data_dir DIR` (a directory of {train,<split>}.tsv.gz) change what is scored. Inputs are the
descriptions without the task prefix; a malformed TSV line is refused naming its file and line.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
import re
import sys
import time
from typing import Sequence

import numpy as np
from scipy import sparse

from speculative.data import corpus
from speculative.data import metrics

DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "debian_descriptions"
BASELINES = ("lead", "retrieval")
SCORE_KEYS = ("rouge1", "rouge2", "rougeLsum")
# A sentence ends at '.', '!' or '?' followed by whitespace and an upper-case letter, a digit or a
# quote, so version numbers ("1.2"), file names and "such as foo. bar" do not end one; nor does an
# initial ("David A. Wheeler") or "e.g." / "i.e." / "vs.".
_SENTENCE_END = re.compile(
  r"(?<=[.!?])(?<![\s(][A-Z]\.)(?<!e\.g\.)(?<!i\.e\.)(?<!vs\.)\s+(?=[A-Z0-9\"'])"
)
_WORD = re.compile(r"[a-z0-9]+")
# Test documents scored per sparse product: bounds the dense [rows, training pairs] similarity block.
_CHUNK = 256


def first_sentence(text: str) -> str:
  """The text up to its first sentence end (`_SENTENCE_END`), or the whole text without one."""
  return _SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def words(text: str) -> list[str]:
  """Lower-cased alphanumeric runs: the word unigrams of the retrieval vectors."""
  return _WORD.findall(text.lower())


class Retriever:
  """TF-IDF nearest neighbour over the training inputs: `predict` returns, for each query, the
  summary of the training input with the highest cosine similarity (ties: the earliest pair).

  Term frequency: raw counts; inverse document frequency: ln((1 + N) / (1 + df)) + 1 (smoothed, so a
  word in every document still counts); rows L2-normalized. Query words unseen in training are
  ignored; a query with none matches every training input equally and gets the first summary.
  """

  def __init__(self, pairs: Sequence[tuple[str, str]]):
    if not pairs:
      raise ValueError("retrieval needs at least one training pair")
    self.summaries = [summary for _, summary in pairs]
    self.vocabulary: dict[str, int] = {}
    for text, _ in pairs:
      for word in words(text):
        self.vocabulary.setdefault(word, len(self.vocabulary))
    counts = self._counts([text for text, _ in pairs])
    df = np.bincount(counts.indices, minlength=len(self.vocabulary))
    self.idf = np.log((1.0 + len(pairs)) / (1.0 + df)) + 1.0
    self.matrix = self._weigh(counts)  # [N, V] csr

  def _counts(self, texts: Sequence[str]) -> sparse.csr_matrix:
    """[len(texts), V] word counts over the training vocabulary."""
    rows, cols = [], []
    for i, text in enumerate(texts):
      ids = [self.vocabulary[w] for w in words(text) if w in self.vocabulary]
      rows += [i] * len(ids)
      cols += ids
    data = np.ones(len(rows), np.float64)
    shape = (len(texts), len(self.vocabulary))
    matrix = sparse.csr_matrix((data, (rows, cols)), shape=shape)
    matrix.sum_duplicates()
    return matrix

  def _weigh(self, counts: sparse.csr_matrix) -> sparse.csr_matrix:
    """TF-IDF rows, L2-normalized (an all-zero row stays zero)."""
    weighted = sparse.csr_matrix(counts.multiply(self.idf[None, :]))
    norms = np.sqrt(np.asarray(weighted.multiply(weighted).sum(axis=1)).ravel())
    norms[norms == 0] = 1.0
    return sparse.csr_matrix(sparse.diags(1.0 / norms) @ weighted)

  def nearest(self, texts: Sequence[str]) -> np.ndarray:
    """[len(texts)] index of each text's most similar training input."""
    found = []
    for start in range(0, len(texts), _CHUNK):
      queries = self._weigh(self._counts(texts[start : start + _CHUNK]))
      similarity = (queries @ self.matrix.T).toarray()
      found.append(np.argmax(similarity, axis=1))  # the first maximum: ties to the earliest pair
    return np.concatenate(found) if found else np.zeros(0, np.int64)

  def predict(self, texts: Sequence[str]) -> list[str]:
    return [self.summaries[i] for i in self.nearest(texts)]


def predictions(
  baseline: str, documents: Sequence[str], train_pairs: Sequence[tuple[str, str]] = ()
) -> list[str]:
  """The `baseline`'s summary of each document (`train_pairs` for retrieval)."""
  if baseline == "lead":
    return [first_sentence(d) for d in documents]
  if baseline == "retrieval":
    return Retriever(train_pairs).predict(documents)
  raise ValueError(f"unknown baseline {baseline!r}; expected one of {BASELINES}")


def score(
  train_pairs: Sequence[tuple[str, str]], test_pairs: Sequence[tuple[str, str]]
) -> dict[str, dict[str, float]]:
  """{baseline: {rouge1, rouge2, rougeLsum}} of both baselines on `test_pairs`."""
  documents = [d for d, _ in test_pairs]
  references = [s for _, s in test_pairs]
  return {
    name: metrics.rouge(references, predictions(name, documents, train_pairs)) for name in BASELINES
  }


def format_table(scores: dict[str, dict[str, float]], documents: int) -> str:
  lines = [
    f"| reference ({documents:,} documents) | ROUGE-1 | ROUGE-2 | ROUGE-Lsum |",
    "|---|---|---|---|",
  ]
  for name, values in scores.items():
    lines.append(f"| {name} | " + " | ".join(f"{values[k]:.2f}" for k in SCORE_KEYS) + " |")
  return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--data_dir", default=str(DEFAULT_DATA_DIR))
  parser.add_argument("--split", default="test", choices=("validation", "test"))
  parser.add_argument("--num_examples", type=int, default=None, help="the first N (default: all)")
  args = parser.parse_args(argv)
  if args.num_examples is not None and args.num_examples < 1:
    parser.error(f"--num_examples must be >= 1, got {args.num_examples}")
  paths = {name: Path(args.data_dir) / f"{name}.tsv.gz" for name in ("train", args.split)}
  try:
    pairs = {}
    for name, path in paths.items():
      if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
      pairs[name] = corpus.read_tsv_gz(path)
      if not pairs[name]:
        raise ValueError(f"{path}: no examples")
  except (OSError, ValueError) as e:  # a missing file or a malformed line: one message
    parser.exit(2, f"{parser.prog}: error: {e}\n")
  test = pairs[args.split][: args.num_examples]
  start = time.perf_counter()
  scores = score(pairs["train"], test)
  seconds = time.perf_counter() - start
  command = " ".join(
    ["python -m speculative.data.summ_baselines", *(sys.argv[1:] if argv is None else argv)]
  )
  load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
  print(format_table(scores, len(test)))
  print()
  print(
    f"{args.split} split of {os.path.relpath(args.data_dir)} ({len(test):,} documents), retrieval over "
    f"{len(pairs['train']):,} training pairs; `{command.strip()}`; {seconds:.1f} s, load average "
    f"{load} ({os.cpu_count()} CPUs)"
  )


if __name__ == "__main__":
  main()
