"""Does a trained target use its source, and does it underfit or overfit? (docs/training.md)

Command (from the repo root; any params file or T5X checkpoint directory of that shape):
  .venv/bin/python experiments/target_diagnosis/diagnose_target.py ../runs/embedded_target/best.msgpack \
      --gin_file configs/train/small_target.gin --macro SMALL_TARGET

Prints the token NLL / accuracy (eval mode, unsmoothed) of the first 500 validation pairs with their
true sources, with the sources shuffled across examples and with empty sources, then of 500
training pairs; then the RMS of the token embedding and of the first layers' query kernels beside
their T5X initial values (1.0 and (d_model * head_dim)^-0.5). On phase 1's step-6,400 weights:
4.029 / 4.870 / 5.419, training pairs 3.674; embedding 0.962, queries 0.054 / 0.051 (initial 0.0078).
"""

from __future__ import annotations

import argparse

import numpy as np

from speculative import checkpoints
from speculative import train
from speculative.jobs import gin_utils
from speculative.models import t5 as t5_lib
from speculative.train import steps as train_steps
from speculative.train.data import DEFAULT_BUCKET_LENGTHS
from speculative.train.data import make_buckets
from speculative.train.data import read_tsv
from speculative.train.data import tokenize_pairs

DATA = 'data/libreoffice_ende'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('checkpoint')
  parser.add_argument('--gin_file', default='configs/train/small_target.gin')
  parser.add_argument('--macro', default='SMALL_TARGET')
  parser.add_argument('--examples', type=int, default=500)
  args = parser.parse_args()

  import gin

  gin.external_configurable(train.train, 'train')  # the run files bind train.*
  config = gin_utils.load_macro(args.gin_file, args.macro, t5_lib.T5Config)
  model = t5_lib.T5(config)
  params = checkpoints.load_params(args.checkpoint, dtype=np.float32)
  checkpoints.validate_params(params, model.param_shapes(), name=args.checkpoint)
  spm = f'{DATA}/spm8k.model'
  val = tokenize_pairs(read_tsv(f'{DATA}/validation.tsv.gz')[: args.examples], spm)
  train_pairs = read_tsv(f'{DATA}/train.tsv.gz')
  step = max(1, len(train_pairs) // args.examples)
  train_examples = tokenize_pairs(train_pairs[::step][: args.examples], spm)
  buckets = make_buckets(DEFAULT_BUCKET_LENGTHS, tokens_per_batch=3072)
  eval_step = train_steps.make_eval_step(model)
  perm = np.random.default_rng(0).permutation(len(val))
  variants = {
    'validation, true sources': val,
    'validation, shuffled sources': [(val[j][0], tgt) for j, (_, tgt) in zip(perm, val)],
    'validation, empty sources': [(np.array([1], np.int32), tgt) for _, tgt in val],
    'training pairs': train_examples,
  }
  for name, examples in variants.items():
    m = train_steps.evaluate(eval_step, params, examples, buckets, prefix='x')
    entropy = '  '.join(
      f'{k} {m[f"x_attention_entropy_{k}"]:.3f}' for k in train_steps.ATTENTION_KINDS
    )
    print(
      f'{name:30s} NLL {m["x_nll"]:.3f}  accuracy {m["x_accuracy"]:.3f}  attention entropy {entropy}'
    )
  rms = lambda x: float(np.sqrt(np.mean(np.square(x))))  # noqa: E731
  print(f'token embedding RMS {rms(params["token_embedder"]["embedding"]):.3f} (initial 1.0)')
  q_init = (config.emb_dim * config.head_dim) ** -0.5
  for side, block in (('encoder', 'attention'), ('decoder', 'self_attention')):
    q = params[side]['layers_0'][block]['query']['kernel']
    print(f'{side} layer 0 query kernel RMS {rms(q):.4f} (initial {q_init:.4f})')


if __name__ == '__main__':
  main()
