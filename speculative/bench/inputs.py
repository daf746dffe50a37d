"""Benchmark inputs (a seqio task, a TSV file, or synthetic tokens) and model weights."""

from __future__ import annotations

import logging
import os
from typing import Any
from typing import Sequence

import jax
import numpy as np

from speculative import checkpoints
from speculative.data import tasks
from speculative.infer import inputs as infer_inputs
from speculative.models import t5 as t5_lib


def synthetic_examples(
  num_examples: int, inputs_length: int, vocab_size: int, seed: int = 0
) -> list[infer_inputs.Example]:
  """Random token inputs (EOS-terminated, lengths in [inputs_length/2, inputs_length]); for smoke
  tests only: they exercise the timing code, not translation."""
  rng = np.random.default_rng(seed)
  examples = []
  for i in range(num_examples):
    length = int(rng.integers(max(2, inputs_length // 2), inputs_length + 1))
    tokens = np.concatenate([rng.integers(2, vocab_size, length - 1), [tasks.EOS_ID]]).astype(
      np.int32
    )
    examples.append(infer_inputs.Example(i, f"<synthetic {i}>", None, tokens, False))
  return examples


def load_examples(
  *,
  task: str | None,
  split: str,
  input_file: str | None,
  input_prefix: str,
  inputs_length: int,
  num_examples: int,
  skip_truncated: bool,
) -> tuple[list[infer_inputs.Example], int]:
  """The first `num_examples` inputs (skipping those longer than inputs_length if asked).

  Returns (examples, number skipped)."""
  if (task is None) == (input_file is None):
    raise ValueError("give exactly one of task and input_file")
  limit = None if skip_truncated else num_examples
  if task is not None:
    examples = infer_inputs.examples_from_task(task, split, inputs_length, limit)
  else:
    from speculative.data import tasks

    examples = infer_inputs.examples_from_file(
      input_file, tasks.get_vocabulary(), inputs_length, input_prefix, limit
    )
  skipped = 0
  if skip_truncated:
    kept = [e for e in examples if not e.truncated][:num_examples]
    last = kept[-1].index if kept else -1
    skipped = sum(e.truncated for e in examples if e.index <= last)
    examples = kept
  else:
    examples = examples[:num_examples]
  if len(examples) < num_examples:
    logging.warning("only %d examples available (asked for %d)", len(examples), num_examples)
  if not examples:
    raise ValueError("no benchmark inputs")
  return examples, skipped


def build_model(
  config: t5_lib.T5Config, checkpoint: str | None, *, allow_random_init: bool, seed: int, what: str
) -> tuple[t5_lib.T5, Any, str]:
  """(model, f32 params, description). A missing checkpoint is an error unless allow_random_init."""
  if checkpoint and os.path.exists(checkpoint):
    model, params = checkpoints.load_model(config, checkpoint)
    source = checkpoint
  elif allow_random_init:
    if checkpoint:
      logging.warning(
        "%s checkpoint %s does not exist: using RANDOM-INIT weights", what, checkpoint
      )
    model = t5_lib.T5(config)
    params = jax.jit(model.init_params)(jax.random.PRNGKey(seed))
    source = f"random init (seed {seed})"
  else:
    raise FileNotFoundError(
      f"{what} checkpoint does not exist: {checkpoint!r} (set "
      "allow_random_init=True, e.g. --quick, to time random weights)"
    )
  n_params = int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))
  return model, params, f"{source}, {n_params / 1e6:.1f}M params"


def benchmark_inputs(
  *,
  examples: Sequence[infer_inputs.Example] | None,
  task: str | None,
  split: str,
  input_file: str | None,
  input_prefix: str,
  inputs_length: int,
  num_examples: int,
  skip_truncated: bool,
) -> tuple[list[infer_inputs.Example], str, str]:
  """(examples, a description of their source, the task label of the tables): the given
  `examples`, else those of the task or file; every one must fit inputs_length."""
  if examples is None:
    examples, skipped = load_examples(
      task=task,
      split=split,
      input_file=input_file,
      input_prefix=input_prefix,
      inputs_length=inputs_length,
      num_examples=num_examples,
      skip_truncated=skip_truncated,
    )
    source = (
      f"the first {len(examples)} examples of `{task}` / {split}"
      if task
      else f"the first {len(examples)} lines of `{input_file}`"
    )
    if skipped:
      source += f" ({skipped} longer than {inputs_length} tokens skipped)"
    task_label = task or os.path.basename(input_file)
  else:
    examples = list(examples)[:num_examples]
    source = f"{len(examples)} given examples ({examples[0].inputs.split()[0]}...)"
    task_label = "given inputs"
  for e in examples:
    if len(e.input_tokens) > inputs_length:
      raise ValueError(
        f"example {e.index} has {len(e.input_tokens)} input tokens > inputs_length={inputs_length}"
      )
  return examples, source, task_label


def settings_inputs(s, *, num_examples: int, skip_truncated: bool):
  """`benchmark_inputs` from a BenchmarkSettings' input options (its examples, task/split or
  file, inputs_length), with this `num_examples` and `skip_truncated`."""
  return benchmark_inputs(
    examples=s.examples,
    task=s.task,
    split=s.split,
    input_file=s.input_file,
    input_prefix=s.input_prefix,
    inputs_length=s.inputs_length,
    num_examples=num_examples,
    skip_truncated=skip_truncated,
  )
