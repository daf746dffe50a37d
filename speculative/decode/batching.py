"""Fixed-shape input batches, as T5X pads them (shared by inference and the benchmark)."""

from __future__ import annotations

from typing import Any
from typing import Sequence

import numpy as np


def pad_batch(examples: Sequence[Any], batch_size: int, inputs_length: int) -> np.ndarray:
  """[batch_size, inputs_length] int32 encoder tokens of `examples` (each has `input_tokens`).

  Tokens are right-padded with 0; rows past len(examples) repeat row 0 (they are discarded)."""
  if len(examples) > batch_size:
    raise ValueError(f"{len(examples)} examples do not fit a batch of {batch_size}")
  batch = np.zeros((batch_size, inputs_length), np.int32)  # [batch, inputs_length]
  for row, example in enumerate(examples):
    batch[row, : len(example.input_tokens)] = example.input_tokens
  for row in range(len(examples), batch_size):  # pad rows repeat the first example (discarded)
    batch[row] = batch[0]
  return batch


# The shortest input length a batch is padded to: inputs are padded to the smallest power of two
# from here up to the job's inputs length that holds the batch's longest input, so a short sentence
# does not pay the encoder for 128 positions (a few more compiled shapes, each compiled once).
MIN_PADDED_LENGTH = 16


def padded_length(examples: Sequence[Any], inputs_length: int) -> int:
  """The input length a batch of `examples` is padded to: the smallest power of two >=
  MIN_PADDED_LENGTH that holds its longest `input_tokens`, at most `inputs_length`."""
  longest = max((len(e.input_tokens) for e in examples), default=1)
  length = MIN_PADDED_LENGTH
  while length < longest:
    length *= 2
  return min(length, inputs_length)


def batches(
  examples: Sequence[Any], batch_size: int, inputs_length: int
) -> list[tuple[list[Any], np.ndarray]]:
  """(chunk, padded [batch_size, inputs_length]) per consecutive chunk of `batch_size` examples; a
  short last chunk is padded with copies of its row 0 (not counted)."""
  out = []
  for i in range(0, len(examples), batch_size):
    chunk = list(examples[i : i + batch_size])
    out.append((chunk, pad_batch(chunk, batch_size, inputs_length)))
  return out


def length_sorted_batches(examples: Sequence[Any], batch_size: int) -> list[list[Any]]:
  """Batches of examples of similar input length (longest first), so that a batch's rows finish
  at similar times and little compute goes to padding; outputs are written back in input order.
  Batch 1 keeps the input order."""
  if batch_size > 1:
    examples = sorted(examples, key=lambda e: (-len(e.input_tokens), e.index))
  return [list(examples[i : i + batch_size]) for i in range(0, len(examples), batch_size)]
