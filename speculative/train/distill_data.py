"""Sequence-level distillation data: the target's own translations of the training sources as a
training TSV for the draft (Kim & Rush 2016; docs/training.md, "On a CPU").

Commands (from the repo root). First translate the training sources with the target, greedy
(an `infer` job over a file; resumable like any job):
  python -m speculative.infer --gin_file=configs/local/run.gin \
      --gin_bindings="MIXTURE_OR_TASK_NAME = None" \
      --gin_bindings="INPUT_FILE = 'data/libreoffice_ende/train.tsv.gz'" \
      --gin_bindings="infer.input_prefix = 'translate English to German: '" \
      --gin_bindings="NUM_EXAMPLES = None" --gin_bindings="BATCH_SIZE = 32" \
      --gin_bindings="infer.modes = ('baseline',)" \
      --gin_bindings="INFER_OUTPUT_DIR = '../runs/distill_translations'"
then turn its predictions into the draft's training file:
  python -m speculative.train.distill_data ../runs/distill_translations/predictions-baseline.jsonl \
      ../runs/distill_train.tsv.gz
and train the draft with `--gin_bindings="train.train_tsv = '../runs/distill_train.tsv.gz'"` (keep
`train.exclude_heldout` on: the held-out check applies to the sources as before).

Prints how many translations it kept and why it dropped the others: outputs that loop
(`metrics.is_looping`) or stopped at the length cap without EOS teach the draft the target's failures
rather than its translations, and empty outputs are not a training pair. The file is written
atomically (never half-written); a malformed predictions line is an error naming file and line.
"""

from __future__ import annotations

import argparse
import json
from typing import Iterable

import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib
from speculative.data import corpus
from speculative.data import metrics
from speculative.data import tasks
from speculative.decode import loops
from speculative.infer import outputs


def _source(record: dict, prefix: str) -> str:
  """The record's input without the task prefix."""
  inputs = record["inputs"]
  return inputs[len(prefix) :] if inputs.startswith(prefix) else inputs


def drop_reason(record: dict, prefix: str) -> str | None:
  """Why an output is not a training pair ('empty', 'no_eos', 'looping'), or None to keep it."""
  if not record["prediction"].strip() or not _source(record, prefix).strip():
    return "empty"
  if not record["tokens"] or record["tokens"][-1] != tasks.EOS_ID:
    return "no_eos"
  if metrics.is_looping(record["prediction"].strip()):
    return "looping"
  return None


def distill_pairs(records: Iterable[dict], prefix: str) -> tuple[list[tuple[str, str]], dict]:
  """(source, target translation) pairs in input order, and the counts of what was dropped."""
  kept: list[tuple[int, str, str]] = []
  counts = {"records": 0, "kept": 0, "looping": 0, "no_eos": 0, "empty": 0}
  for r in records:
    counts["records"] += 1
    reason = drop_reason(r, prefix)
    if reason is not None:
      counts[reason] += 1
    else:
      kept.append((r["index"], _source(r, prefix), r["prediction"].strip()))
  counts["kept"] = len(kept)
  return [(s, t) for _, s, t in sorted(kept)], counts


def greedy_fn(model, new_tokens: int):
  """A jitted greedy decode of `model`: (params, encoder tokens [B, S] int32) -> DecodeResult with
  at most `new_tokens` tokens per row (the device recipe's decoder of training inputs)."""
  options = dict(
    max_new_tokens=new_tokens,
    sampling=sampling_lib.SamplingConfig(greedy=True),
    eos_id=tasks.EOS_ID,
  )

  def decode(params, encoder_tokens):
    return loops.autoregressive_decode(
      model, params, None, encoder_tokens=encoder_tokens, check_finite=False, **options
    )

  return decode


def greedy_outputs(decode, params, inputs: list, batch_size: int, inputs_length: int) -> list:
  """The greedy output tokens (EOS included when reached) of every input (EOS-terminated int32
  tokens, cut to `inputs_length` with EOS last), in input order; batches of similar lengths, all of
  one shape [batch_size, inputs_length] so that `decode` compiles once."""
  from speculative.infer import inputs as infer_inputs

  order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
  out: list = [None] * len(inputs)
  for start in range(0, len(order), batch_size):
    idx = order[start : start + batch_size]
    enc = np.zeros((batch_size, inputs_length), np.int32)  # [B, S]
    enc[:, 0] = tasks.EOS_ID  # padding rows: EOS only
    for row, i in enumerate(idx):
      src, _ = infer_inputs.truncate(inputs[i], inputs_length)
      enc[row] = 0
      enc[row, : len(src)] = src
    result = decode(params, jnp.asarray(enc))
    tokens, lengths = np.asarray(result.tokens), np.asarray(result.lengths)  # [B, N], [B]
    for row, i in enumerate(idx):
      out[i] = tokens[row, : lengths[row]].astype(np.int32)
  return out


def detokenize(token_lists: list, spm_model: str) -> list[str]:
  """Each token list as text (EOS left out), with the SentencePiece model at `spm_model`."""
  import sentencepiece as spm

  sp = spm.SentencePieceProcessor(model_file=spm_model)
  return [sp.decode([int(t) for t in tokens if t != tasks.EOS_ID]) for tokens in token_lists]


def main() -> None:
  parser = argparse.ArgumentParser(
    prog="python -m speculative.train.distill_data", description=__doc__.splitlines()[0]
  )
  parser.add_argument("predictions", help="predictions-<mode>.jsonl of an infer job")
  parser.add_argument("output", help="training TSV to write (.tsv.gz)")
  parser.add_argument("--prefix", default=tasks.TRANSLATE_EN_DE_PREFIX)
  args = parser.parse_args()
  try:  # a missing or malformed predictions file, an output that cannot be written: one line
    pairs, counts = distill_pairs(outputs.load_predictions(args.predictions), args.prefix)
    corpus.write_tsv_gz(args.output, pairs)
  except (OSError, ValueError, KeyError) as e:
    parser.exit(2, f"{parser.prog}: error: {e}\n")
  print(json.dumps(counts))


if __name__ == "__main__":
  main()
