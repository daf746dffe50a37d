"""Training data: a parallel TSV corpus tokenized with SentencePiece, bucketed by length into a few
fixed (inputs, targets) shapes, each with a batch size chosen to keep tokens per batch roughly
constant, so only a few shapes compile and little compute goes to padding."""

from __future__ import annotations

import dataclasses
from typing import Iterator
from typing import Sequence

import numpy as np

from speculative.data import corpus
from speculative.data import tasks

INPUT_PREFIX = tasks.TRANSLATE_EN_DE_PREFIX


@dataclasses.dataclass(frozen=True)
class Bucket:
  """A fixed batch shape: examples whose inputs/targets fit go here."""

  inputs_length: int
  targets_length: int
  batch_size: int


# Bucket lengths (square: inputs = targets); batch sizes are set from `tokens_per_batch` in `train`.
# Eight buckets keep most padded tokens real (docs/training.md, "Recipe"): more text per step at the
# same step cost, for eight compiled shapes instead of four.
DEFAULT_BUCKET_LENGTHS = (16, 24, 32, 48, 64, 96, 128, 192)


def make_buckets(
  lengths: Sequence[int | Sequence[int]], tokens_per_batch: int
) -> tuple[Bucket, ...]:
  """Buckets whose batch size keeps the padded tokens per batch near `tokens_per_batch`. An entry
  is a length n (a square (n, n) bucket) or an (inputs, targets) pair: summarization's long inputs
  and short targets fill a square bucket mostly with target padding."""
  buckets = []
  for entry in lengths:
    n_in, n_tgt = (entry, entry) if isinstance(entry, int) else tuple(int(n) for n in entry)
    if n_in < 2 or n_tgt < 2:
      raise ValueError(f"bucket lengths must be >= 2, got {entry!r}")
    buckets.append(Bucket(n_in, n_tgt, max(1, tokens_per_batch // (n_in + n_tgt))))
  if not buckets:
    raise ValueError("bucket_lengths must name at least one bucket")
  return tuple(buckets)


def read_tsv(path: str) -> list[tuple[str, str]]:
  """`source<TAB>target` pairs of a (gzipped) TSV file; ValueError when it holds none."""
  pairs = corpus.read_tsv_gz(path)
  if not pairs:
    raise ValueError(f"{path}: no examples")
  return pairs


def tokenize_pairs(
  pairs: Sequence[tuple[str, str]], spm_model: str, prefix: str = INPUT_PREFIX
) -> list[tuple[np.ndarray, np.ndarray]]:
  """Tokenizes with the SentencePiece model, `prefix` (the T5 task prefix) before each input;
  appends EOS to both sides (T5 convention)."""
  import sentencepiece as spm

  sp = spm.SentencePieceProcessor(model_file=spm_model)
  sources = sp.encode([prefix + s for s, _ in pairs])
  targets = sp.encode([t for _, t in pairs])
  return [
    (np.array(s + [tasks.EOS_ID], np.int32), np.array(t + [tasks.EOS_ID], np.int32))
    for s, t in zip(sources, targets)
  ]


def assign_buckets(examples, buckets: Sequence[Bucket]) -> list[list[int]]:
  """Indices of the examples per bucket: the smallest bucket (inputs + targets) that holds both
  sides, ties to the earlier one. An example that fits none goes to the bucket that truncates the
  fewest of its tokens (ties to the smaller; for square buckets, the largest one)."""
  per_bucket: list[list[int]] = [[] for _ in buckets]
  order = sorted(range(len(buckets)), key=lambda b: _area(buckets[b]))
  for i, (src, tgt) in enumerate(examples):
    for b in order:
      if len(src) <= buckets[b].inputs_length and len(tgt) <= buckets[b].targets_length:
        per_bucket[b].append(i)
        break
    else:
      fewest_cut = min(order, key=lambda b: (_cut(buckets[b], src, tgt), _area(buckets[b])))
      per_bucket[fewest_cut].append(i)
  return per_bucket


def _area(bucket: Bucket) -> int:
  return bucket.inputs_length + bucket.targets_length


def _cut(bucket: Bucket, src, tgt) -> int:
  """Tokens of (src, tgt) that `bucket` truncates."""
  return max(0, len(src) - bucket.inputs_length) + max(0, len(tgt) - bucket.targets_length)


def make_batch(examples, indices, bucket: Bucket) -> dict[str, np.ndarray]:
  """Pads (or truncates, keeping EOS last) a batch to the bucket's shape, T5X feature names."""
  n = bucket.batch_size
  enc = np.zeros((n, bucket.inputs_length), np.int32)
  tgt = np.zeros((n, bucket.targets_length), np.int32)
  for row, i in enumerate(indices):
    src, trg = examples[i]
    if len(src) > bucket.inputs_length:
      src = np.concatenate([src[: bucket.inputs_length - 1], [tasks.EOS_ID]])
    if len(trg) > bucket.targets_length:
      trg = np.concatenate([trg[: bucket.targets_length - 1], [tasks.EOS_ID]])
    enc[row, : len(src)] = src
    tgt[row, : len(trg)] = trg
  # Decoder inputs are the targets shifted right, starting with the decoder start token 0.
  dec_in = np.zeros_like(tgt)
  dec_in[:, 1:] = tgt[:, :-1]
  return {
    "encoder_input_tokens": enc,
    "decoder_input_tokens": dec_in,
    "decoder_target_tokens": tgt,
    "decoder_loss_weights": (tgt != tasks.PAD_ID).astype(np.float32),
  }


def batch_stream(
  examples, buckets: Sequence[Bucket], seed: int, epoch: int = 0
) -> Iterator[dict[str, np.ndarray]]:
  """Endless stream of shuffled bucketed batches; deterministic in (seed, epoch)."""
  per_bucket = assign_buckets(examples, buckets)
  while True:
    rng = np.random.default_rng([seed, epoch])
    batches = []
    for bucket, idx in zip(buckets, per_bucket):
      idx = np.array(idx)
      rng.shuffle(idx)
      for start in range(0, len(idx) - bucket.batch_size + 1, bucket.batch_size):
        batches.append((bucket, idx[start : start + bucket.batch_size]))
    if not batches:  # every bucket holds fewer examples than its batch size: nothing to yield
      raise ValueError(
        f"no full batch in {len(examples)} examples: each bucket holds fewer than its batch size "
        f"({', '.join(f'{b.inputs_length}x{b.targets_length}: {b.batch_size}' for b in buckets)})"
      )
    order = rng.permutation(len(batches))
    for j in order:
      bucket, idx = batches[j]
      yield make_batch(examples, idx, bucket)
    epoch += 1
