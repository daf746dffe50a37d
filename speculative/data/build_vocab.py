"""Trains the shared En+De SentencePiece vocabulary of the LibreOffice corpus and reports token lengths.

Command (from the repo root, after speculative/data/build_corpus.py; ~1 minute on one core):

  .venv/bin/python -m speculative.data.build_vocab

Trains a unigram SentencePiece model (8000 pieces, T5 conventions: pad=0, eos=1, unk=2, no bos) on the
English and German sides of `data/libreoffice_ende/train.tsv.gz` only, and writes

  data/libreoffice_ende/spm8k.model    the model, used through seqio.SentencePieceVocabulary(extra_ids=0)
  data/libreoffice_ende/spm8k.vocab    its pieces and scores (for reading)
  data/libreoffice_ende/spm8k.json     the training options, sha256 of the model and the token lengths
                                       (mean, p95, p99, max of inputs and targets per split, incl. EOS)

and prints the length table. Choices:
  * normalization "identity" (no NFKC) and byte_fallback: every string round-trips exactly (quotes,
    dashes, ellipses, umlauts, ß, and characters never seen in training, which become byte pieces);
  * determinism: input order fixed (train split order, English then German side), no input sampling
    or shuffling, one thread, a fixed random seed; rerunning reproduces the model byte for byte.
Use --lengths_only to print the length table for the shipped model without retraining.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

REPO_ROOT = Path(__file__).resolve().parents[2]

from speculative.data import corpus
from speculative.data import tasks

TRAINER_OPTIONS = dict(
  model_type="unigram",
  vocab_size=8000,
  pad_id=0,
  eos_id=1,
  unk_id=2,
  bos_id=-1,  # T5 / seqio conventions
  pad_piece="<pad>",
  eos_piece="</s>",
  unk_piece="<unk>",
  byte_fallback=True,
  character_coverage=0.9995,
  normalization_rule_name="identity",
  split_digits=False,
  max_sentence_length=1 << 16,  # some help paragraphs are long; never drop one silently
  input_sentence_size=0,  # use every sentence, no sampling
  shuffle_input_sentence=False,
  num_threads=1,
  minloglevel=2,
)
RANDOM_SEED = 20230518


def training_sentences(train_path: Path) -> list[str]:
  """English then German side of the training split, in file order."""
  pairs = corpus.read_tsv_gz(train_path)
  return [en for en, _ in pairs] + [de for _, de in pairs]


def train(train_path: Path, model_prefix: Path) -> None:
  sentences = training_sentences(train_path)
  spm.set_random_generator_seed(RANDOM_SEED)
  spm.SentencePieceTrainer.train(
    sentence_iterator=iter(sentences), model_prefix=str(model_prefix), **TRAINER_OPTIONS
  )
  # The model proto records `model_prefix`; store the bare name, not this machine's absolute path,
  # so the model bytes do not depend on where the repo is checked out.
  model_path = model_prefix.with_suffix(".model")
  model = sentencepiece_model_pb2.ModelProto()
  model.ParseFromString(model_path.read_bytes())
  model.trainer_spec.model_prefix = model_prefix.name
  model_path.write_bytes(model.SerializeToString(deterministic=True))


def _summary(lengths: list[int]) -> dict:
  values = np.asarray(lengths)
  return {
    "mean": round(float(values.mean()), 2),
    "p50": int(np.percentile(values, 50)),
    "p95": int(np.percentile(values, 95)),
    "p99": int(np.percentile(values, 99)),
    "max": int(values.max()),
  }


def length_stats(data_dir: Path, model_path: Path) -> dict:
  """Token lengths (with EOS) of the task's inputs ("translate English to German: " + en) and targets."""
  vocab = tasks.get_vocabulary(str(model_path))
  stats = {}
  for split in corpus.SPLITS:
    pairs = corpus.read_tsv_gz(data_dir / f"{split}.tsv.gz")
    inputs = [len(vocab.encode(tasks.make_inputs(en))) + 1 for en, _ in pairs]
    targets = [len(vocab.encode(de)) + 1 for _, de in pairs]
    stats[split] = {"pairs": len(pairs), "inputs": _summary(inputs), "targets": _summary(targets)}
  return stats


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--data_dir", type=Path, default=tasks.DATA_DIR)
  parser.add_argument("--model_prefix", default="spm8k")
  parser.add_argument("--lengths_only", action="store_true")
  args = parser.parse_args(argv)
  model_prefix = args.data_dir / args.model_prefix
  model_path = model_prefix.with_suffix(".model")
  if not args.lengths_only:
    train(args.data_dir / "train.tsv.gz", model_prefix)
  lengths = length_stats(args.data_dir, model_path)
  vocab = tasks.get_vocabulary(str(model_path))
  info = {
    "trained_on": "train.tsv.gz (English then German side)",
    "train_sha256": corpus.sha256_file(args.data_dir / "train.tsv.gz"),
    "trainer_options": TRAINER_OPTIONS,
    "random_seed": RANDOM_SEED,
    "sentencepiece_version": spm.__version__,
    "model_sha256": corpus.sha256_file(model_path),
    "vocab_size": vocab.vocab_size,
    "pad_id": vocab.pad_id,
    "eos_id": vocab.eos_id,
    "unk_id": vocab.unk_id,
    "token_lengths_with_eos": lengths,
  }
  if not args.lengths_only:
    (model_prefix.with_suffix(".json")).write_text(
      json.dumps(info, indent=2) + "\n", encoding="utf-8"
    )
  print(f"model {model_path} sha256 {info['model_sha256']} vocab_size {vocab.vocab_size}")
  print(f"{'split':<11}{'side':<8}{'mean':>7}{'p50':>6}{'p95':>6}{'p99':>6}{'max':>6}")
  for split, split_stats in lengths.items():
    for side in ("inputs", "targets"):
      s = split_stats[side]
      print(
        f"{split:<11}{side:<8}{s['mean']:>7}{s['p50']:>6}{s['p95']:>6}{s['p99']:>6}{s['max']:>6}"
      )


if __name__ == "__main__":
  main()
