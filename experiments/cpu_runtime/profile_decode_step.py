"""What one compiled greedy decode step of the embedded target runs: kernels per step by opcode, and
the cache-sized copies XLA inserted, read from the optimized HLO of the baseline loop.

  python experiments/cpu_runtime/profile_decode_step.py --batch_size 1
  python experiments/cpu_runtime/profile_decode_step.py --batch_size 8

Prints the while body's instruction counts ('fusion', 'dot', 'copy', ...) and the shapes of its
copies, e.g. (2026-11-23, jax 0.10.2 CPU) batch 1: 342 fusions, 105 dots, 64 copies of
f32[1,8,64,50] (the self-attention caches, 6.5 MB per step); batch 8: 322 fusions, 32 dots, no cache
copy. Findings: docs/cpu_runtime.md.
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path
import re
import sys

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import jax.numpy as jnp  # noqa: E402

from speculative import sampling  # noqa: E402
from speculative.bench import inputs as inputs_lib  # noqa: E402
from speculative.checkpoints.params_files import load_model  # noqa: E402
from speculative.decode import batching  # noqa: E402
from speculative.decode import inputs as decode_inputs
from speculative.decode import loops as decoding  # noqa: E402
from speculative.decode import options as decode_options  # noqa: E402
from speculative.jobs import gin_utils  # noqa: E402
from speculative.models import t5 as t5_lib  # noqa: E402


def compiled_loop_hlo(batch_size: int, max_new_tokens: int) -> str:
  """The optimized HLO text of the greedy baseline loop on the first test sentences."""
  config = gin_utils.load_macro(
    'configs/models/embedded_target.gin', 'EMBEDDED_TARGET', t5_lib.T5Config
  )
  target, params = load_model(config, 'models/embedded/target.msgpack')
  examples, _ = inputs_lib.load_examples(
    inputs_lib.InputSource(), num_examples=batch_size, skip_truncated=True
  )
  encoder_tokens = jnp.asarray(batching.pad_batch(examples, batch_size, 64))  # [B, 64]
  config, sampling_params = sampling.make_sampling(0.0)
  options = decode_options.DecodeOptions(max_new_tokens=max_new_tokens, sampling=config, eos_id=1)
  inputs = decode_inputs.prepare_inputs(
    target, options, None, None, encoder_tokens, sampling_params, 0, None
  )
  lowered = decoding._autoregressive_jit.lower(  # pylint: disable=protected-access
    params,
    inputs,
    target=target,
    options=options,
    lockstep=decoding._lockstep(target, inputs.prompt_lengths),  # pylint: disable=protected-access
  )
  return lowered.compile().as_text()


def body_instructions(hlo: str) -> list[str]:
  """The instruction lines of the (first) while loop's body computation."""
  body = re.findall(r'body=(%?[\w.\-]+)', hlo)[0]
  start = hlo.index('\n' + body + ' ')
  block = hlo[start : hlo.index('\n}\n', start)]
  return [line for line in block.splitlines()[1:] if ' = ' in line]


def opcode(line: str) -> str:
  match = re.search(r' = (?:\S+|\([^)]*\)) ([\w\-]+)\(', line)
  return match.group(1) if match else '?'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batch_size', type=int, default=1)
  parser.add_argument('--max_new_tokens', type=int, default=48)
  args = parser.parse_args()
  lines = body_instructions(compiled_loop_hlo(args.batch_size, args.max_new_tokens))
  counts = collections.Counter(opcode(line) for line in lines)
  copies = collections.Counter(
    re.search(r' = (\S+) copy\(', line).group(1) for line in lines if opcode(line) == 'copy'
  )
  print(
    f'batch {args.batch_size}: {len(lines)} instructions per step: {dict(counts.most_common())}'
  )
  print(f'copies per step: {dict(copies)}')


if __name__ == '__main__':
  main()
