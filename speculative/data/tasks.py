"""seqio tasks: the local LibreOffice En-De corpus and the paper's TFDS-backed WMT / CNN-DM tasks.

`register_tasks()` (idempotent, no network, no TFDS access) adds to `seqio.TaskRegistry`:

  libreoffice_ende                   the shipped corpus `data/libreoffice_ende/{train,validation,test}.tsv.gz`
                                     (en<TAB>de), inputs "translate English to German: " + en, targets de,
                                     vocabulary `data/libreoffice_ende/spm8k.model` (8000 pieces), BLEU, chrF, loop rate.
  debian_summarize                   the Debian package descriptions corpus
                                     `data/debian_descriptions/{train,validation,test}.tsv.gz`
                                     (description<TAB>synopsis), inputs "summarize: " + description,
                                     targets synopsis, the same 8k vocabulary, ROUGE + loop rate.
  speculative_wmt_t2t_ende_v003      = t5's `wmt_t2t_ende_v003`: TFDS `wmt_t2t_translate/de-en:1.0.0`,
                                     same prefix, BLEU.
  speculative_cnn_dailymail_v002     = t5's `cnn_dailymail_v002`: TFDS `cnn_dailymail:3.4.0`,
                                     inputs "summarize: " + article, targets highlights, ROUGE.

The two TFDS tasks carry a `speculative_` prefix so they never clash with t5's own registry (a user who
imports `t5.data.tasks` keeps t5's definitions; ours are the same pipelines without the t5 dependency).
Their vocabulary defaults to the public T5 vocabulary path `gs://t5-data/vocabs/cc_all.32000/
sentencepiece.model` with 100 extra ids (T5's default, 32100 ids); it is a path string only, opened on
first use, and TFDS is touched only when a dataset is requested, so registering works offline.
Pass `tfds_vocabulary=` (a path or a `seqio.Vocabulary`) to use another one, e.g. a local copy.

Every task runs the T5 pipeline: text preprocessor -> `seqio.preprocessors.tokenize` (keeps the
`*_pretokenized` strings) -> `CacheDatasetPlaceholder` -> `append_eos_after_trim`; the postprocessor
turns decoded bytes into stripped text; metrics follow t5.evaluation.metrics (BLEU: sacrebleu corpus
BLEU with the "intl" tokenizer; ROUGE: rouge1/rouge2/rougeLsum F-measure, the deterministic mean as in
t5's `rouge_mean`, not the bootstrap).

Helpers for the batch job (no TensorFlow needed): `load_split`, `make_inputs`. `get_vocabulary` is seqio's
vocabulary (the tasks'); a job that reads a file tokenizes with `speculative.data.vocabulary`, the same
ids and text without TensorFlow.
seqio and TensorFlow are imported only by the functions that need them, so importing this module is cheap.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any
from typing import Mapping

from speculative.data import corpus
from speculative.data import metrics

if TYPE_CHECKING:  # imported lazily at run time (TensorFlow is slow to import)
  import numpy as np
  import seqio
  import tensorflow as tf

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "libreoffice_ende"
SUMMARIZATION_DATA_DIR = DATA_DIR.parent / "debian_descriptions"
VOCAB_PATH = DATA_DIR / "spm8k.model"
TRANSLATE_EN_DE_PREFIX = "translate English to German: "
# The ids every vocabulary of the project shares (T5's SentencePiece conventions): the padding and
# the end of a sequence.
PAD_ID = 0
EOS_ID = 1
SUMMARIZE_PREFIX = "summarize: "
T5_PUBLIC_VOCAB_PATH = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"
T5_PUBLIC_VOCAB_EXTRA_IDS = 100

LIBREOFFICE_TASK = "libreoffice_ende"
DEBIAN_SUMMARIZE_TASK = "debian_summarize"
WMT_ENDE_TASK = "speculative_wmt_t2t_ende_v003"
CNN_DAILYMAIL_TASK = "speculative_cnn_dailymail_v002"
WMT_ENDE_TFDS = "wmt_t2t_translate/de-en:1.0.0"
CNN_DAILYMAIL_TFDS = "cnn_dailymail:3.4.0"
SPLITS = corpus.SPLITS


# ------------------------------------------------------------------------------------------------
# Helpers for the batch job.


def make_inputs(source: str) -> str:
  """The model input for an English source sentence: "translate English to German: " + source."""
  if not isinstance(source, str):
    raise TypeError(f"source must be a str, got {type(source).__name__}")
  return TRANSLATE_EN_DE_PREFIX + source


def split_path(split: str, data_dir: str | Path | None = None) -> Path:
  """Path of a split's TSV file; ValueError for an unknown split name."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
  return Path(data_dir or DATA_DIR) / f"{split}.tsv.gz"


def load_split(split: str, data_dir: str | Path | None = None) -> list[tuple[str, str]]:
  """All (en, de) pairs of a split of the LibreOffice corpus, in file order."""
  path = split_path(split, data_dir)
  if not path.exists():
    raise FileNotFoundError(f"{path} is missing; build it with speculative/data/build_corpus.py")
  return corpus.read_tsv_gz(path)


def target_token_sequences(
  split: str = "train",
  vocabulary_path: str | Path | None = None,
  data_dir: str | Path | None = None,
  limit: int | None = None,
) -> list["np.ndarray"]:
  """Decoder streams [0 (start), ids of the German target..., 1 (eos)] of a LibreOffice split.

  Tokenized with the shipped SentencePiece model (`VOCAB_PATH`, no extra ids), read directly with
  sentencepiece so TensorFlow is not imported. What the n-gram drafters' tables are estimated from.
  """
  import numpy as np  # pylint: disable=g-import-not-at-top
  import sentencepiece  # pylint: disable=g-import-not-at-top

  pairs = load_split(split, data_dir)
  if limit is not None:
    pairs = pairs[:limit]
  processor = sentencepiece.SentencePieceProcessor(model_file=str(vocabulary_path or VOCAB_PATH))
  ids = processor.encode([target for _, target in pairs])
  return [np.asarray([0] + seq + [1], np.int32) for seq in ids]


@functools.cache
def _sentencepiece_vocabulary(path: str, extra_ids: int) -> "seqio.SentencePieceVocabulary":
  import seqio  # pylint: disable=g-import-not-at-top

  return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)


def get_vocabulary(
  path: str | Path | None = None,
  extra_ids: int = 0,
) -> "seqio.SentencePieceVocabulary":
  """The seqio vocabulary of a SentencePiece model (default: the shipped `spm8k.model`, no extra ids:
  pad=0, eos=1, unk=2, vocab_size 8000). One instance per (path, extra_ids); the model file is read on
  first use, so a remote path (gs://...) is not opened here."""
  path = str(path if path is not None else VOCAB_PATH)
  if extra_ids < 0:
    raise ValueError(f"extra_ids must be >= 0, got {extra_ids}")
  return _sentencepiece_vocabulary(path, int(extra_ids))


# ------------------------------------------------------------------------------------------------
# Postprocessing.


def postprocess_text(
  output: Any, example: Mapping[str, Any] | None = None, is_target: bool = False
) -> str:
  """seqio postprocess_fn: decoded model output (or a `*_pretokenized` target) -> stripped str."""
  del example, is_target
  if isinstance(output, bytes):
    output = output.decode("utf-8")
  elif hasattr(output, "numpy"):  # a scalar tf.Tensor
    output = output.numpy().decode("utf-8")
  return str(output).strip()


# ------------------------------------------------------------------------------------------------
# Preprocessors (tf.data).


def parse_tsv_line(
  dataset: "tf.data.Dataset",
  source_key: str = "en",
  target_key: str = "de",
) -> "tf.data.Dataset":
  """A dataset of "en<TAB>de" line strings -> {source_key: en, target_key: de}."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def parse(line):
    fields = tf.strings.split(line, "\t", maxsplit=1)
    # A malformed line (no tab) must fail loudly, not shift the fields.
    tf.debugging.assert_equal(tf.size(fields), 2, message="TSV line without exactly one tab")
    return {source_key: fields[0], target_key: fields[1]}

  return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def translate(
  dataset: "tf.data.Dataset", source_key: str, target_key: str, prefix: str = TRANSLATE_EN_DE_PREFIX
) -> "tf.data.Dataset":
  """{source_key, target_key} -> {'inputs': prefix + source, 'targets': target} (t5 `translate`)."""
  return _prefixed_pairs(dataset, source_key, target_key, prefix)


def summarize(
  dataset: "tf.data.Dataset",
  article_key: str = "article",
  summary_key: str = "highlights",
  prefix: str = SUMMARIZE_PREFIX,
) -> "tf.data.Dataset":
  """{article_key, summary_key} -> {'inputs': prefix + article, 'targets': summary} (t5 `summarize`)."""
  return _prefixed_pairs(dataset, article_key, summary_key, prefix)


def _prefixed_pairs(
  dataset: "tf.data.Dataset", input_key: str, target_key: str, prefix: str
) -> "tf.data.Dataset":
  """{input_key, target_key} -> {'inputs': prefix + input, 'targets': target}."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def convert(example):
    return {
      "inputs": tf.strings.join([prefix, example[input_key]]),
      "targets": example[target_key],
    }

  return dataset.map(convert, num_parallel_calls=tf.data.AUTOTUNE)


def tokenization_preprocessors() -> list[Any]:
  """The T5 tail of every task: tokenize (keeping `*_pretokenized`), cache placeholder, EOS."""
  import seqio  # pylint: disable=g-import-not-at-top

  return [
    seqio.preprocessors.tokenize,
    seqio.CacheDatasetPlaceholder(),
    seqio.preprocessors.append_eos_after_trim,
  ]


def output_features(vocabulary: "seqio.Vocabulary") -> dict[str, "seqio.Feature"]:
  """T5's output features: `inputs` and `targets`, both with EOS, one shared vocabulary."""
  import seqio  # pylint: disable=g-import-not-at-top

  return {
    "inputs": seqio.Feature(vocabulary=vocabulary, add_eos=True, required=False),
    "targets": seqio.Feature(vocabulary=vocabulary, add_eos=True),
  }


def libreoffice_text_preprocessors() -> list[Any]:
  """TSV line -> {'inputs', 'targets'} text, before tokenization."""
  return [
    functools.partial(parse_tsv_line, source_key="en", target_key="de"),
    functools.partial(translate, source_key="en", target_key="de"),
  ]


def wmt_ende_text_preprocessors() -> list[Any]:
  """TFDS `wmt_t2t_translate/de-en` record {'de', 'en'} -> {'inputs', 'targets'} text."""
  return [functools.partial(translate, source_key="en", target_key="de")]


def cnn_dailymail_text_preprocessors() -> list[Any]:
  """TFDS `cnn_dailymail` record {'article', 'highlights', 'id'} -> {'inputs', 'targets'} text."""
  return [functools.partial(summarize, article_key="article", summary_key="highlights")]


# ------------------------------------------------------------------------------------------------
# Sources and registration.


def _read_gzip_lines(filepattern: str) -> "tf.data.Dataset":
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  return tf.data.TextLineDataset(filepattern, compression_type="GZIP")


def libreoffice_source(data_dir: str | Path | None = None) -> "seqio.DataSource":
  """A seqio source of the corpus' gzip TSV lines, one file per split (yields each line as a
  string)."""
  import seqio  # pylint: disable=g-import-not-at-top

  data_dir = Path(data_dir or DATA_DIR)
  num_examples = None
  stats_path = data_dir / "stats.json"
  if stats_path.exists():
    stats = json.loads(stats_path.read_text(encoding="utf-8"))
    num_examples = {
      split: stats["splits"][split]["pairs"] for split in SPLITS if split in stats.get("splits", {})
    }
  return seqio.FileDataSource(
    read_file_fn=_read_gzip_lines,
    split_to_filepattern={split: str(split_path(split, data_dir)) for split in SPLITS},
    num_input_examples=num_examples,
  )


def summarization_source(data_dir: str | Path | None = None) -> "seqio.DataSource":
  """A seqio source of the summarization corpus' splits ({'description', 'synopsis'} records).

  Each split's TSV is read in Python when its dataset is built (`corpus.read_tsv_gz`), so a
  malformed line fails with one message naming the file and line, before any TensorFlow op."""
  import seqio  # pylint: disable=g-import-not-at-top

  data_dir = Path(data_dir or SUMMARIZATION_DATA_DIR)

  def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> "tf.data.Dataset":
    del shuffle_files, seed  # one file per split, read in file order
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    path = split_path(split, data_dir)
    if not path.exists():
      raise FileNotFoundError(
        f"{path} is missing; build it with python -m speculative.data.summ_corpus"
      )
    pairs = corpus.read_tsv_gz(path)
    if not pairs:
      raise ValueError(f"{path}: no examples")
    return tf.data.Dataset.from_tensor_slices(
      {"description": [d for d, _ in pairs], "synopsis": [s for _, s in pairs]}
    )

  return seqio.FunctionDataSource(dataset_fn, splits=SPLITS)


def summarization_text_preprocessors() -> list[Any]:
  """{'description', 'synopsis'} -> {'inputs': "summarize: " + description, 'targets': synopsis}."""
  return [functools.partial(summarize, article_key="description", summary_key="synopsis")]


def _as_vocabulary(
  vocabulary: "str | Path | seqio.Vocabulary",
  extra_ids: int,
) -> "seqio.Vocabulary":
  if isinstance(vocabulary, (str, Path)):
    return get_vocabulary(vocabulary, extra_ids=extra_ids)
  return vocabulary


def _add_task(
  name: str, source: Any, text_preprocessors: list[Any], vocabulary: Any, metric: Any
) -> None:
  """Registers one text-to-text task: its text preprocessors, then tokenization with `vocabulary`;
  outputs post-processed with `postprocess_text` and scored with `metric`."""
  import seqio  # pylint: disable=g-import-not-at-top

  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)  # re-registering replaces: register_tasks() is idempotent
  seqio.TaskRegistry.add(
    name,
    source=source,
    preprocessors=text_preprocessors + tokenization_preprocessors(),
    output_features=output_features(vocabulary),
    postprocess_fn=postprocess_text,
    metric_fns=[metric],
  )


def check_tfds_prepared(task_name: str) -> None:
  """A task whose source is a TFDS dataset (`speculative_wmt_t2t_ende_v003`,
  `speculative_cnn_dailymail_v002`) needs that dataset already prepared in its TFDS data directory
  (`$TFDS_DATA_DIR`, default ~/tensorflow_datasets): FileNotFoundError, one line naming the dataset,
  the directory and how to provide it, if it is not. Without this check TFDS would start downloading
  and preparing it inside the job (gigabytes; offline, minutes of retries and then a traceback).
  Other tasks pass. Registers the tasks."""
  import logging

  import seqio  # pylint: disable=g-import-not-at-top

  register_tasks()
  source = getattr(seqio.get_mixture_or_task(task_name), "source", None)
  if not isinstance(source, seqio.TfdsDataSource):
    return
  absl_logger = logging.getLogger("absl")
  level = absl_logger.level
  absl_logger.setLevel(logging.ERROR)  # TFDS warns about a half-prepared folder: we say more below
  try:
    builder = source.tfds_dataset.builder
    prepared = builder.is_prepared()
  finally:
    absl_logger.setLevel(level)
  if prepared:
    return
  name = source.tfds_dataset.name
  data_dir = builder.data_dir  # <data_dir>/<dataset>[/<config>]/<version>
  for _ in range(len(name.split(":")[0].split("/")) + 1):
    data_dir = os.path.dirname(data_dir)
  raise FileNotFoundError(
    f"task {task_name} needs the TFDS dataset {name}, which is not prepared in {data_dir}; "
    f"download and prepare it once (network access needed): tfds build {name.split(':')[0]} "
    f"--data_dir={data_dir}, or point TFDS_DATA_DIR at a directory that holds it"
  )


def register_tasks(
  vocabulary: "str | Path | seqio.Vocabulary | None" = None,
  tfds_vocabulary: "str | Path | seqio.Vocabulary" = T5_PUBLIC_VOCAB_PATH,
  tfds_extra_ids: int = T5_PUBLIC_VOCAB_EXTRA_IDS,
  data_dir: str | Path | None = None,
) -> list[str]:
  """Registers the four tasks (replacing earlier registrations of the same names); returns the names.

  Args:
    vocabulary: vocabulary of `libreoffice_ende` (default: the shipped spm8k.model, no extra ids).
    tfds_vocabulary: vocabulary of the two TFDS tasks: a SentencePiece model path (not opened here)
      or a `seqio.Vocabulary`. Default: the public T5 vocabulary.
    tfds_extra_ids: extra ids when `tfds_vocabulary` is a path (T5 uses 100).
    data_dir: directory of the LibreOffice split files (default: data/libreoffice_ende).

  `debian_summarize` reads `SUMMARIZATION_DATA_DIR` (data/debian_descriptions) with `vocabulary`.
  """
  import seqio  # pylint: disable=g-import-not-at-top

  local_vocabulary = _as_vocabulary(vocabulary if vocabulary is not None else VOCAB_PATH, 0)
  tfds_vocab = _as_vocabulary(tfds_vocabulary, tfds_extra_ids)
  _add_task(
    LIBREOFFICE_TASK,
    libreoffice_source(data_dir),
    libreoffice_text_preprocessors(),
    local_vocabulary,
    metrics.translation_metrics,
  )
  _add_task(
    DEBIAN_SUMMARIZE_TASK,
    summarization_source(SUMMARIZATION_DATA_DIR),
    summarization_text_preprocessors(),
    local_vocabulary,
    metrics.summarization_metrics,
  )
  wmt_source = seqio.TfdsDataSource(tfds_name=WMT_ENDE_TFDS)
  _add_task(WMT_ENDE_TASK, wmt_source, wmt_ende_text_preprocessors(), tfds_vocab, metrics.bleu)
  cnn_source = seqio.TfdsDataSource(tfds_name=CNN_DAILYMAIL_TFDS)
  _add_task(
    CNN_DAILYMAIL_TASK, cnn_source, cnn_dailymail_text_preprocessors(), tfds_vocab, metrics.rouge
  )
  return [LIBREOFFICE_TASK, DEBIAN_SUMMARIZE_TASK, WMT_ENDE_TASK, CNN_DAILYMAIL_TASK]
