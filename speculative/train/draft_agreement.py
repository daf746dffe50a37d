"""Greedy alpha of a draft against the target, teacher-forced on the target's own greedy output.

Command (from the repo root; the predictions come from a baseline `infer` job of the target on the
full test split, the command in docs/training.md, "The shipped pair's numbers", with INFER_OUTPUT_DIR = <dir>):
  .venv/bin/python -m speculative.train.draft_agreement models/embedded/draft.msgpack \
      --predictions <dir>/predictions-baseline.jsonl [--gamma 3 5 7] [--check_target] \
      [--target_gin_file configs/models/embedded_target.gin --target_macro EMBEDDED_TARGET \
       --target_checkpoint models/embedded/target.msgpack]
Any target loads (its gin file and macro, its weights); the predictions must be its own greedy
outputs (checked against their manifest), of either task (translation or summarization).
The shipped pair's figures: docs/training.md ("The shipped pair's numbers").

In greedy speculative decoding the draft's proposal at position t is accepted exactly when its
argmax given the target's prefix y_<t equals y_t, the target's own argmax there. So one batched
teacher-forced forward of the draft over the target's greedy translations gives, exactly:
  * alpha: the share of positions t at which the draft's argmax equals y_t (the paper's
    alpha = E[beta] along the target's outputs);
  * the greedy speculative run itself: a block starting at t accepts the run of consecutive
    agreements (at most gamma) and emits one more token, so target calls and block efficiency per
    gamma follow without decoding (the `infer` job's `target_calls` for the same draft and gamma).
The `infer` report's alpha differs in one respect: it also counts drafted positions after a
block's first rejection, whose prefixes are the draft's own (wrong) tokens.
`--check_target` runs the target through the same code: it must agree with its own greedy output
at ~100% of positions (only float near-ties differ), which checks the method and the inputs.
Prints alpha, target calls and block efficiency per gamma, and the load average.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp
import numpy as np

from speculative import checkpoints
from speculative.data import vocabulary as vocabulary_lib
from speculative.infer import inputs
from speculative.infer import outputs
from speculative.jobs import gin_utils
from speculative.models import t5 as t5_lib


def agreement(model: t5_lib.T5, params, examples, batch_size: int = 32) -> list[np.ndarray]:
  """Per example, a bool [len(tokens)]: the model's argmax equals the token at each position."""
  order = sorted(range(len(examples)), key=lambda i: len(examples[i][1]))
  forward = jax.jit(model.forward)
  out: list[np.ndarray | None] = [None] * len(examples)
  for start in range(0, len(order), batch_size):
    idx = order[start : start + batch_size]
    src_len = 1 << max(len(examples[i][0]) for i in idx).bit_length()  # few padded shapes
    tgt_len = 1 << max(len(examples[i][1]) for i in idx).bit_length()
    enc = np.zeros((len(idx), src_len), np.int32)  # [B, S]
    tgt = np.zeros((len(idx), tgt_len), np.int32)  # [B, T]
    for row, i in enumerate(idx):
      enc[row, : len(examples[i][0])] = examples[i][0]
      tgt[row, : len(examples[i][1])] = examples[i][1]
    dec_in = np.concatenate([np.zeros_like(tgt[:, :1]), tgt[:, :-1]], axis=1)  # shifted right
    logits = forward(params, jnp.asarray(enc), jnp.asarray(dec_in), decoder_target_tokens=tgt)
    argmax = np.asarray(jnp.argmax(logits, -1))  # [B, T]
    for row, i in enumerate(idx):
      n = len(examples[i][1])
      out[i] = argmax[row, :n] == tgt[row, :n]
  return out  # type: ignore[return-value]


def greedy_target_calls(agree: np.ndarray, gamma: int) -> int:
  """Target calls of greedy speculative decoding with `gamma` drafted tokens per block, given the
  per-position agreement along the target's output: each block accepts the run of agreements
  (<= gamma) from its start and emits one more token."""
  t, calls = 0, 0
  while t < len(agree):
    run = 0
    while run < gamma and t + run < len(agree) and agree[t + run]:
      run += 1
    t += run + 1
    calls += 1
  return calls


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('checkpoint', help='draft params (.msgpack or T5X checkpoint directory)')
  parser.add_argument('--predictions', required=True, help="the target's predictions-*.jsonl")
  parser.add_argument('--gin_file', default='configs/models/embedded_draft.gin')
  parser.add_argument('--macro', default='EMBEDDED_DRAFT')
  parser.add_argument('--target_gin_file', default='configs/models/embedded_target.gin')
  parser.add_argument('--target_macro', default='EMBEDDED_TARGET')
  parser.add_argument('--target_checkpoint', default='models/embedded/target.msgpack')
  parser.add_argument('--gamma', type=int, nargs='+', default=[3, 5, 7])
  parser.add_argument('--check_target', action='store_true')
  args = parser.parse_args()

  manifest = outputs.load_job_manifest(args.predictions)
  target_config = gin_utils.load_macro(args.target_gin_file, args.target_macro, t5_lib.T5Config)
  target_sha256 = checkpoints.check_weights(
    "--target_checkpoint", args.target_checkpoint, target_config
  )
  if manifest['target_checkpoint_sha256'] != target_sha256 or manifest['temperature'] != 0.0:
    raise ValueError(
      f'{args.predictions}: not greedy outputs of {args.target_checkpoint} (its manifest: target '
      f"sha256 {manifest['target_checkpoint_sha256'][:12]}, temperature {manifest['temperature']})"
    )
  records = outputs.load_predictions(args.predictions)
  vocabulary = vocabulary_lib.load()
  inputs_length = manifest['task_feature_lengths']['inputs']  # as the job truncated its inputs
  examples = [
    (
      inputs.tokenize_inputs(vocabulary, r['inputs'], inputs_length)[0],
      np.asarray(r['tokens'], np.int32),
    )
    for r in records
  ]
  models = {
    'draft': (gin_utils.load_macro(args.gin_file, args.macro, t5_lib.T5Config), args.checkpoint)
  }
  if args.check_target:
    models['target (self-check)'] = (target_config, args.target_checkpoint)
  tokens = sum(len(t) for _, t in examples)
  for name, (config, path) in models.items():
    model, params = checkpoints.load_model(config, path)
    agree = agreement(model, params, examples)
    alpha = float(np.concatenate(agree).mean())
    print(
      f'{name} {path}: greedy alpha {alpha:.4f} over {tokens} positions of {len(examples)} outputs'
    )
    for gamma in args.gamma:
      calls = sum(greedy_target_calls(a, gamma) for a in agree)
      print(f'  gamma {gamma}: {calls} target calls, block efficiency {tokens / calls:.3f}')
  print(f'load average {os.getloadavg()}')


if __name__ == '__main__':
  main()
