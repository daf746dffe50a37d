"""Two greedy jobs of one target compared row by row, every divergence audited.

Command (from the repo root; each predictions file from a baseline-only `infer` job of the same
target on the same inputs, e.g. one with KERNELS = 'on' and one with KERNELS = 'off'):
  .venv/bin/python -m speculative.infer.compare A/predictions-baseline.jsonl \
      B/predictions-baseline.jsonl [--target_gin_file ... --target_checkpoint ...]

Both jobs must be greedy decodes of the same target weights (their manifests' sha256) over the same
inputs (inputs sha256). Prints the number of identical outputs and, for every differing row, the
audit of its first difference (`speculative.decode.audit`: the float32 top-2 gap there against the
rounding bound of the jobs' dtype, verdict near-tie or mismatch), with the load average. Exits 1 on
a mismatch.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import numpy as np

from speculative import checkpoints
from speculative.data import vocabulary as vocabulary_lib
from speculative.decode import audit
from speculative.infer import inputs as infer_inputs
from speculative.infer import outputs as infer_outputs
from speculative.jobs import gin_utils
from speculative.models import t5 as t5_lib


def main(argv: Sequence[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('a', help='predictions-*.jsonl of the first job')
  parser.add_argument('b', help='predictions-*.jsonl of the second job')
  parser.add_argument('--target_gin_file', default='configs/models/embedded_target.gin')
  parser.add_argument('--macro', default='EMBEDDED_TARGET')
  parser.add_argument('--target_checkpoint', default='models/embedded/target.msgpack')
  args = parser.parse_args(argv)

  try:  # a missing file or a malformed record is one line, like every bad input
    manifests = [infer_outputs.load_job_manifest(path) for path in (args.a, args.b)]
    a, b = infer_outputs.load_predictions(args.a), infer_outputs.load_predictions(args.b)
  except (ValueError, OSError) as e:
    sys.exit(f'error: {e}')
  for key in ('target_checkpoint_sha256', 'inputs_sha256', 'temperature'):
    if manifests[0][key] != manifests[1][key]:
      sys.exit(f'error: the jobs differ in {key}: {manifests[0][key]!r} vs {manifests[1][key]!r}')
  if manifests[0]['temperature'] != 0.0:
    sys.exit('error: the jobs are not greedy (temperature != 0)')
  config = gin_utils.load_macro(args.target_gin_file, args.macro, t5_lib.T5Config)
  if (
    checkpoints.check_weights("--target_checkpoint", args.target_checkpoint, config)
    != manifests[0]['target_checkpoint_sha256']
  ):
    sys.exit(f'error: {args.target_checkpoint} is not the target the jobs decoded with')
  if [r['index'] for r in a] != [r['index'] for r in b]:
    sys.exit('error: the two files hold different examples')
  differ = [i for i, (x, y) in enumerate(zip(a, b)) if x['tokens'] != y['tokens']]
  paths = [m.get('decode_path', 'xla') for m in manifests]
  print(
    f'{len(a) - len(differ)} / {len(a)} identical ({paths[0]} at batch {manifests[0]["batch_size"]}'
    f' vs {paths[1]} at batch {manifests[1]["batch_size"]}); load average {os.getloadavg()}'
  )
  if not differ:
    return
  model, params = checkpoints.load_model(config, args.target_checkpoint)
  vocabulary = vocabulary_lib.load()
  length = manifests[0]['task_feature_lengths']['inputs']
  encoder = np.zeros((len(differ), length), np.int32)
  for row, i in enumerate(differ):
    ids = infer_inputs.tokenize_inputs(vocabulary, a[i]['inputs'], length)[0]
    encoder[row, : len(ids)] = ids
  divergences = audit.audit_divergences(
    model, params, encoder, [a[i]['tokens'] for i in differ], [b[i]['tokens'] for i in differ]
  )
  print('differing examples (in the table, in this order):', [a[i]['index'] for i in differ])
  print(audit.format_table(divergences))
  if any(d.verdict == audit.MISMATCH for d in divergences):
    sys.exit(1)


if __name__ == '__main__':
  main()
