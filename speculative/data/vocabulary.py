"""The jobs' text vocabulary: a SentencePiece model's ids and text, on SentencePiece alone.

`load(path)` gives what a job that reads a file needs of `seqio.SentencePieceVocabulary` (its
`encode`, `decode`, `vocab_size`, `pad_id`, `eos_id`, `unk_id`), with the same ids and the same
text, without importing seqio: seqio imports TensorFlow, which adds seconds to every job's start
and which an accelerator image may not have. The seqio tasks (`speculative.data.tasks`) keep
seqio's vocabulary; tests/data/test_vocabulary.py checks the two against each other.

Extra ids (T5's sentinels) are seqio's: a model that needs them goes through
`tasks.get_vocabulary(path, extra_ids)`.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterable

import sentencepiece

from speculative.data import tasks


class SentencePieceVocabulary:
  """seqio.SentencePieceVocabulary(path) without extra ids, on `sentencepiece` only."""

  def __init__(self, path: str | Path):
    self.path = str(path)
    self.tokenizer = sentencepiece.SentencePieceProcessor(model_file=self.path)

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.GetPieceSize()

  @property
  def pad_id(self) -> int:
    return tasks.PAD_ID

  @property
  def eos_id(self) -> int:
    return self.tokenizer.eos_id()

  @property
  def unk_id(self) -> int:
    return self.tokenizer.unk_id()

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`, no EOS appended."""
    return self.tokenizer.EncodeAsIds(text)

  def decode(self, ids: Iterable[int]) -> str:
    """Text of `ids` up to and including the first EOS; ids outside the vocabulary read as UNK
    (seqio's `Vocabulary.decode` rule)."""
    size, unk = self.vocab_size, self.unk_id
    clean = [unk if int(i) >= size else int(i) for i in ids]
    if self.eos_id in clean:
      clean = clean[: clean.index(self.eos_id) + 1]
    return self.tokenizer.DecodeIds(clean)


@functools.cache
def _load(path: str) -> SentencePieceVocabulary:
  return SentencePieceVocabulary(path)


def load(path: str | Path | None = None) -> SentencePieceVocabulary:
  """The vocabulary of the SentencePiece model file at `path` (default: the shipped 8k model,
  `tasks.VOCAB_PATH`), one instance per path. FileNotFoundError, naming the path, if it is not a
  file."""
  path = Path(path if path is not None else tasks.VOCAB_PATH)
  if not path.is_file():
    raise FileNotFoundError(f"vocabulary (SentencePiece model) does not exist: {path}")
  return _load(str(path.resolve()))
