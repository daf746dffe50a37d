"""The inputs of a batch inference job: a seqio task or a text/TSV file, tokenized and truncated to
the inputs feature length, with the vocabulary and metrics that go with them."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import sys
from typing import Any
from typing import Sequence

import numpy as np

from speculative.data import tasks
from speculative.data import vocabulary as vocabulary_lib
from speculative.infer import settings as infer_settings
from speculative.jobs import checks
from speculative.jobs import gin_utils


@dataclasses.dataclass(frozen=True)
class Example:
  index: int
  inputs: str  # the model input text (task prefix included)
  reference: str | None
  input_tokens: np.ndarray  # [S] int32, EOS-terminated, truncated to the inputs feature length
  truncated: bool


@dataclasses.dataclass(frozen=True)
class JobInputs:
  """What a job decodes and scores: its examples, the vocabulary that decodes predictions, the
  metric functions (seqio-style) and the source as recorded in the manifest."""

  examples: list[Example]
  vocabulary: Any
  metric_fns: list[Any]
  source: dict[str, Any]

  @property
  def num_truncated(self) -> int:
    return sum(e.truncated for e in self.examples)


def load_inputs(settings: infer_settings.InferSettings) -> JobInputs:
  """The job's inputs: the task's (decoded with the task's own output vocabulary, e.g. 32k for the
  TFDS tasks) or the input file's (tokenized with `vocabulary_path`). Warns about truncated inputs
  and about a target vocabulary much larger than the inputs'; ValueError if it is smaller
  (`check_vocabulary_size`)."""
  from speculative.data import metrics

  s = settings
  examples = load_examples(
    s.mixture_or_task_name,
    s.split,
    s.input_file,
    s.input_prefix,
    s.inputs_length,
    s.num_examples,
    s.vocabulary_path,
  )
  if s.mixture_or_task_name is not None:
    import seqio  # imported (with TensorFlow) and the tasks registered by `examples_from_task`

    task = seqio.get_mixture_or_task(s.mixture_or_task_name)
    inputs = JobInputs(
      examples=examples,
      vocabulary=task.output_features["targets"].vocabulary,
      metric_fns=list(getattr(task, "metric_fns", ())),
      source={"task": s.mixture_or_task_name, "split": s.split},
    )
  else:
    inputs = JobInputs(
      examples=examples,
      vocabulary=vocabulary_lib.load(s.vocabulary_path),  # the model that tokenized them
      metric_fns=[metrics.translation_metrics],
      source={
        "input_file": s.input_file,
        "input_prefix": s.input_prefix,
        "vocabulary_path": s.vocabulary_path,
      },
    )
  if inputs.num_truncated:
    logging.warning(
      "%d of %d inputs were longer than %d tokens and were truncated",
      inputs.num_truncated,
      len(inputs.examples),
      s.inputs_length,
    )
  where = (
    f"task {s.mixture_or_task_name}'s vocabulary"
    if s.mixture_or_task_name is not None
    else f"infer.vocabulary_path = {str(s.vocabulary_path or tasks.VOCAB_PATH)!r}"
  )
  warning = check_vocabulary_size(s.target_config.vocab_size, inputs.vocabulary.vocab_size, where)
  if warning:
    logging.warning(warning)
  return inputs


def load_examples(
  task: str | None,
  split: str,
  input_file: str | None,
  input_prefix: str,
  inputs_length: int,
  num_examples: int | None = None,
  vocabulary_path: str | None = None,
) -> list[Example]:
  """The first `num_examples` (None: all) inputs of a seqio task's split (`examples_from_task`) or,
  without a task, of `input_file` (`examples_from_file`, each line after `input_prefix`, tokenized
  with the SentencePiece model at `vocabulary_path`, default the shipped 8k one), truncated to
  `inputs_length`: the job's (`load_inputs`) and the benchmark's."""
  if task is not None:
    return examples_from_task(task, split, inputs_length, num_examples)
  vocabulary = vocabulary_lib.load(vocabulary_path)  # SentencePiece alone: no TensorFlow
  return examples_from_file(input_file, vocabulary, inputs_length, input_prefix, num_examples)


# A target with more than this many embedding rows per piece of the vocabulary was most likely
# trained with another SentencePiece model (T5's 32,128 rows against the shipped 8k model): its
# output would be garbage, though every id is in range. T5's own 32,100 pieces in 32,128 rows (a
# multiple of 128) and the 8k models padded to 8,192 pass.
VOCAB_SIZE_RATIO_WARNING = 2.0


def check_vocabulary_size(model_vocab_size: int, vocabulary_size: int, where: str) -> str | None:
  """Compares the target's `vocab_size` (its embedding rows) with the inputs' vocabulary
  (`vocabulary_size` pieces, named by `where`). A vocabulary larger than the model is refused
  (ValueError): its ids would index past the embedding. A model more than
  VOCAB_SIZE_RATIO_WARNING times larger gives a warning line (returned), naming both sizes and
  `infer.vocabulary_path`; None otherwise."""
  fix = "give the SentencePiece model the target was trained with (infer.vocabulary_path)"
  if model_vocab_size < vocabulary_size:
    raise ValueError(
      f"the target's vocab_size {model_vocab_size} is smaller than the {vocabulary_size} pieces "
      f"of its inputs' vocabulary ({where}): ids past {model_vocab_size - 1} would be out of its "
      f"range; {fix}"
    )
  if model_vocab_size > VOCAB_SIZE_RATIO_WARNING * vocabulary_size:
    return (
      f"the target's vocab_size {model_vocab_size} is {model_vocab_size / vocabulary_size:.1f}x "
      f"the {vocabulary_size} pieces of its inputs' vocabulary ({where}): was it trained with "
      f"another SentencePiece model? If so, {fix}"
    )
  return None


def truncate(tokens: np.ndarray, inputs_length: int) -> tuple[np.ndarray, bool]:
  """EOS-terminated tokens cut to `inputs_length` (the last kept token replaced by EOS), and
  whether they were cut."""
  truncated = len(tokens) > inputs_length
  if truncated:
    tokens = np.concatenate([tokens[: inputs_length - 1], [tasks.EOS_ID]])
  return np.asarray(tokens, np.int32), truncated


def tokenize_inputs(vocabulary, text: str, inputs_length: int) -> tuple[np.ndarray, bool]:
  """`text` encoded with `vocabulary` plus EOS, truncated to `inputs_length`."""
  return truncate(
    np.asarray(list(vocabulary.encode(text)) + [tasks.EOS_ID], np.int32), inputs_length
  )


def read_lines(path: str) -> list[str]:
  """The lines of a UTF-8 text file (a leading BOM dropped; `.gz` decompressed; '-' = stdin).

  Raises ValueError naming `path:line` at the first line that is not valid UTF-8.
  """
  import gzip

  if path == "-":
    data = sys.stdin.buffer.read()
  else:
    checks.check_readable("input file", path, file=True)  # a pipe (/dev/stdin) is read as a file
    try:
      with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        data = f.read()
    except (EOFError, gzip.BadGzipFile) as e:  # cut short, or not gzip at all
      raise ValueError(f"{path}: not a complete gzip file ({e})") from None
  if data.startswith(b"\xef\xbb\xbf"):
    data = data[3:]
  lines = []
  for line_no, raw in enumerate(data.splitlines(), 1):
    try:
      lines.append(raw.decode("utf-8").rstrip("\r"))
    except UnicodeDecodeError as e:
      raise ValueError(
        f"{path}:{line_no}: not valid UTF-8 (byte {raw[e.start : e.start + 1]!r} at "
        f"column {e.start + 1}); convert the file to UTF-8"
      ) from None
  return lines


def examples_from_file(
  path: str, vocabulary, inputs_length: int, prefix: str = "", num_examples: int | None = None
) -> list[Example]:
  """A TSV (`source<TAB>reference`) or plain text file (one source per line); '-' = stdin."""
  examples = []
  for line_no, line in enumerate(read_lines(path), 1):
    if not line.strip():
      raise ValueError(f"{path}:{line_no}: empty input line")
    source, _, reference = line.partition("\t")
    text = prefix + source
    tokens, truncated = tokenize_inputs(vocabulary, text, inputs_length)
    examples.append(Example(len(examples), text, reference or None, tokens, truncated))
    if num_examples is not None and len(examples) >= num_examples:
      break
  if not examples:
    raise ValueError(f"{path}: no examples")
  missing = [e.index + 1 for e in examples if e.reference is None]
  if missing and len(missing) < len(examples):  # a TSV with some references left out
    logging.warning(
      "%s: %d of %d lines have no reference (no tab), e.g. line %d: no scores against the "
      "references are computed",
      path,
      len(missing),
      len(examples),
      missing[0],
    )
  return examples


def examples_from_task(
  task_name: str, split: str, inputs_length: int, num_examples: int | None = None
) -> list[Example]:
  """Examples of a registered seqio task (e.g. `libreoffice_ende`), in dataset order."""
  gin_utils.import_tensorflow()  # seqio's, with its start-up lines filtered
  import seqio

  tasks.check_tfds_prepared(task_name)  # registers the tasks; a TFDS dataset must be there
  task = seqio.get_mixture_or_task(task_name)
  if split not in task.splits:
    raise ValueError(f"unknown split {split!r} of {task_name}; it has {tuple(task.splits)}")
  # Read once, in order: no in-memory cache (a cache that `take` stops reading early is discarded,
  # with a warning).
  dataset = task.get_dataset(
    sequence_length=None, split=split, shuffle=False, use_cached=False, try_in_mem_cache=False
  )
  if num_examples is not None:
    dataset = dataset.take(num_examples)
  records = dataset.as_numpy_iterator()
  # The first record builds the tokenizer ops, whose SentencePiece copy logs an INFO line per
  # model with identity normalization (ours) to stderr, with no switch of its own (dropped as
  # start-up noise; any other line passes).
  with gin_utils.filtered_stderr():
    first = next(records, None)
  examples = []
  for record in itertools.chain([first] if first is not None else [], records):  # seqio's EOS
    tokens, truncated = truncate(np.asarray(record["inputs"], np.int32), inputs_length)
    if len(tokens) == 0:
      raise ValueError(f"{task_name}/{split} example {len(examples)} has empty inputs")
    text = record.get("inputs_pretokenized", b"")
    reference = record.get("targets_pretokenized")
    examples.append(
      Example(
        len(examples),
        text.decode() if isinstance(text, bytes) else str(text),
        reference.decode() if isinstance(reference, bytes) else reference,
        tokens,
        truncated,
      )
    )
  if not examples:
    raise ValueError(f"task {task_name!r} split {split!r} has no examples")
  return examples


def examples_sha256(examples: Sequence[Example]) -> str:
  """The content hash of the examples (index, text, reference, tokens, truncation) for the
  manifest."""
  digest = hashlib.sha256()
  for e in examples:
    digest.update(
      json.dumps(
        [e.index, e.inputs, e.reference, e.input_tokens.tolist(), e.truncated], ensure_ascii=False
      ).encode()
    )
  return digest.hexdigest()
