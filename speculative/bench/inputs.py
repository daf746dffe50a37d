"""Benchmark inputs: a seqio task or a TSV file (or examples given, e.g. synthetic ones)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Sequence

from speculative.data import tasks
from speculative.data import vocabulary as vocabulary_lib
from speculative.infer import inputs as infer_inputs


@dataclasses.dataclass(frozen=True)
class InputSource:
  """Where benchmark inputs come from (as `BenchmarkSettings`' fields of the same names): a seqio
  task and split, or a file (a prefix before each line), to at most `inputs_length` tokens."""

  task: str | None = tasks.LIBREOFFICE_TASK
  split: str = "test"
  input_file: str | None = None
  input_prefix: str = ""
  inputs_length: int = 64
  examples: Sequence[infer_inputs.Example] | None = None


def split_file(split: str, inputs_length: int) -> InputSource:
  """A split of the LibreOffice En-De corpus read from its TSV file (no seqio pipeline), with the
  task's input prefix."""
  return InputSource(
    task=None,
    split=split,
    input_file=str(tasks.split_path(split)),
    input_prefix=tasks.TRANSLATE_EN_DE_PREFIX,
    inputs_length=inputs_length,
  )


def load_examples(
  source: InputSource, *, num_examples: int, skip_truncated: bool
) -> tuple[list[infer_inputs.Example], int]:
  """(the first `num_examples` inputs of `source`, an InputSource or a BenchmarkSettings, the number
  of those longer than its inputs_length skipped if `skip_truncated`)."""
  if (source.task is None) == (source.input_file is None):
    raise ValueError("give exactly one of task and input_file")
  limit = None if skip_truncated else num_examples
  if source.task is not None:
    examples = infer_inputs.examples_from_task(
      source.task, source.split, source.inputs_length, limit
    )
  else:
    vocabulary, length = vocabulary_lib.load(), source.inputs_length
    examples = infer_inputs.examples_from_file(
      source.input_file, vocabulary, length, source.input_prefix, limit
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


def benchmark_inputs(
  source: InputSource, *, num_examples: int, skip_truncated: bool
) -> tuple[list[infer_inputs.Example], str, str]:
  """(examples, a description of their source, the task label of the tables): `source.examples`
  if given, else those of its task or file (`load_examples`); every one must fit inputs_length.
  `source` is an InputSource or a BenchmarkSettings."""
  task, input_file, inputs_length = source.task, source.input_file, source.inputs_length
  if source.examples is None:
    examples, skipped = load_examples(
      source, num_examples=num_examples, skip_truncated=skip_truncated
    )
    described = (
      f"the first {len(examples)} examples of `{task}` / {source.split}"
      if task
      else f"the first {len(examples)} lines of `{input_file}`"
    )
    if skipped:
      described += f" ({skipped} longer than {inputs_length} tokens skipped)"
    task_label = task or os.path.basename(input_file)
  else:
    examples = list(source.examples)[:num_examples]
    described = f"{len(examples)} given examples ({examples[0].inputs.split()[0]}...)"
    task_label = "given inputs"
  for e in examples:
    if len(e.input_tokens) > inputs_length:
      raise ValueError(
        f"example {e.index} has {len(e.input_tokens)} input tokens > inputs_length={inputs_length}"
      )
  return examples, described, task_label
