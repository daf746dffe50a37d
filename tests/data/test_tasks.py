"""Tests of speculative/data/tasks.py: the shipped vocabulary, the four seqio tasks and helpers."""

from __future__ import annotations

import json
import re

import pytest
import seqio
import tensorflow as tf
import tensorflow_datasets as tfds  # seqio depends on it

from speculative.data import corpus
from speculative.data import tasks

ROUND_TRIP_TEXTS = [
  "Wählen Sie Extras – Optionen… – LibreOffice – Allgemein, um Größe und Maße zu ändern.",
  "Drücken Sie „Strg+Umschalt+F9“, um 12.345,67 € zu berechnen: ÄÖÜ äöü ß ẞ.",
  "Use the shortcut Ctrl + F9 (12.5 cm) to \"recalculate\" the sheet's 'formulas'.",
  "Rare characters fall back to bytes: é ñ ø 中文 🙂 ½ ≤ ≠ → ©.",
]


@pytest.fixture(scope="module")
def registered():
  # Registration must touch neither TFDS nor the network: make any TFDS dataset access fail loudly.
  def fail(*args, **kwargs):
    raise AssertionError("register_tasks() touched TFDS")

  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(tfds, "builder", fail)
    patch.setattr(tfds, "load", fail)
    names = tasks.register_tasks()
    assert tasks.register_tasks() == names  # idempotent: re-registering replaces, does not raise
  return names


def test_vocabulary_ids_follow_t5_conventions():
  vocab = tasks.get_vocabulary()
  assert vocab is tasks.get_vocabulary()  # one instance per model
  assert vocab.vocab_size == 8000
  assert (vocab.pad_id, vocab.eos_id, vocab.unk_id) == (0, 1, 2)
  assert vocab.bos_id == -1  # no BOS
  assert vocab.tokenizer.IdToPiece(1) == "</s>"


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_vocabulary_round_trips_text(text):
  vocab = tasks.get_vocabulary()
  ids = vocab.encode(text)
  assert vocab.unk_id not in ids  # byte fallback: nothing is unknown
  assert vocab.decode(ids) == text
  assert vocab.encode_tf(tf.constant(text)).numpy().tolist() == ids  # TF tokenizer agrees
  assert vocab.decode(ids + [vocab.eos_id, 0, 0]) == text  # decoding stops at EOS


def test_registration_is_lazy_and_idempotent(registered):
  assert registered == [
    tasks.LIBREOFFICE_TASK,
    tasks.DEBIAN_SUMMARIZE_TASK,
    tasks.WMT_ENDE_TASK,
    tasks.CNN_DAILYMAIL_TASK,
  ]
  for name in registered:
    assert name in seqio.TaskRegistry.names()
  wmt = seqio.get_mixture_or_task(tasks.WMT_ENDE_TASK)
  vocab = wmt.output_features["targets"].vocabulary
  assert vocab.sentencepiece_model_file == tasks.T5_PUBLIC_VOCAB_PATH
  assert vocab._model is None  # pylint: disable=protected-access  # the gs:// model was not opened
  assert isinstance(wmt.source, seqio.TfdsDataSource)
  assert wmt.source.tfds_dataset.name == tasks.WMT_ENDE_TFDS
  cnn = seqio.get_mixture_or_task(tasks.CNN_DAILYMAIL_TASK)
  assert cnn.source.tfds_dataset.name == tasks.CNN_DAILYMAIL_TFDS
  assert [fn.__name__ for fn in cnn.metric_fns] == ["rouge"]
  assert [fn.__name__ for fn in wmt.metric_fns] == ["bleu"]


def test_libreoffice_task_tokenizes_prefix_and_appends_eos(registered):
  del registered
  task = seqio.get_mixture_or_task(tasks.LIBREOFFICE_TASK)
  vocab = tasks.get_vocabulary()
  prefix_ids = vocab.encode(tasks.TRANSLATE_EN_DE_PREFIX.strip())
  assert task.num_input_examples("validation") == len(tasks.load_split("validation"))
  expected = tasks.load_split("validation")[:3]
  dataset = task.get_dataset({"inputs": 512, "targets": 512}, split="validation", shuffle=False)
  examples = list(dataset.take(3).as_numpy_iterator())
  assert len(examples) == len(expected) == 3
  for example, (en, de) in zip(examples, expected):
    assert example["inputs_pretokenized"].decode() == tasks.make_inputs(en)
    assert example["targets_pretokenized"].decode() == de
    inputs, targets = example["inputs"].tolist(), example["targets"].tolist()
    assert inputs[: len(prefix_ids)] == prefix_ids
    assert inputs[-1] == vocab.eos_id and targets[-1] == vocab.eos_id
    assert vocab.decode(inputs) == tasks.make_inputs(en)
    assert task.postprocess_fn(vocab.decode(targets), example=example) == de


def test_summarization_task_reads_the_shipped_corpus(registered):
  del registered
  task = seqio.get_mixture_or_task(tasks.DEBIAN_SUMMARIZE_TASK)
  vocab = tasks.get_vocabulary()
  assert [fn.__name__ for fn in task.metric_fns] == ["summarization_metrics"]
  expected = corpus.read_tsv_gz(tasks.SUMMARIZATION_DATA_DIR / "validation.tsv.gz")[:3]
  dataset = task.get_dataset({"inputs": 512, "targets": 64}, split="validation", shuffle=False)
  examples = list(dataset.take(3).as_numpy_iterator())
  assert len(examples) == len(expected) == 3
  for example, (description, synopsis) in zip(examples, expected):
    assert example["inputs_pretokenized"].decode() == tasks.SUMMARIZE_PREFIX + description
    assert example["targets_pretokenized"].decode() == synopsis
    assert example["inputs"][-1] == vocab.eos_id and example["targets"][-1] == vocab.eos_id


def _run_registered_pipeline(task_name, records):
  """Runs a registered task's own preprocessors on in-memory records of its TFDS schema, tokenized with
  the local vocabulary (the public T5 vocabulary is not available offline)."""
  registered_task = seqio.get_mixture_or_task(task_name)
  name = f"test_in_memory_{task_name}"
  if name in seqio.TaskRegistry.names():
    seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
    name,
    source=seqio.FunctionDataSource(
      lambda split, shuffle_files, seed=None: tf.data.Dataset.from_tensor_slices(records),
      splits=["validation"],
    ),
    preprocessors=registered_task.preprocessors,
    output_features=tasks.output_features(tasks.get_vocabulary()),
    postprocess_fn=registered_task.postprocess_fn,
    metric_fns=registered_task.metric_fns,
  )
  try:
    task = seqio.get_mixture_or_task(name)
    dataset = task.get_dataset({"inputs": 64, "targets": 64}, split="validation", shuffle=False)
    return list(dataset.as_numpy_iterator())
  finally:
    seqio.TaskRegistry.remove(name)


def test_wmt_task_preprocessing_on_in_memory_records(registered):
  del registered
  records = {"de": ["Das ist gut.", "Größe ändern"], "en": ["That is good.", "Resize"]}
  examples = _run_registered_pipeline(tasks.WMT_ENDE_TASK, records)
  assert [ex["inputs_pretokenized"].decode() for ex in examples] == [
    "translate English to German: That is good.",
    "translate English to German: Resize",
  ]
  assert [ex["targets_pretokenized"].decode() for ex in examples] == records["de"]
  assert all(ex["targets"][-1] == 1 for ex in examples)


def test_cnn_dailymail_task_preprocessing_on_in_memory_records(registered):
  del registered
  records = {
    "article": ["The cat sat on the mat . It was happy ."],
    "highlights": ["Cat sat ."],
    "id": ["0001"],
  }
  examples = _run_registered_pipeline(tasks.CNN_DAILYMAIL_TASK, records)
  assert examples[0]["inputs_pretokenized"].decode() == (
    "summarize: The cat sat on the mat . It was happy ."
  )
  assert examples[0]["targets_pretokenized"].decode() == "Cat sat ."
  assert examples[0]["inputs"][-1] == 1


def test_helpers():
  assert tasks.make_inputs("Find Bar") == "translate English to German: Find Bar"
  stats = json.loads((tasks.DATA_DIR / "stats.json").read_text())
  test_pairs = tasks.load_split("test")
  assert len(test_pairs) == stats["splits"]["test"]["pairs"]
  assert all(isinstance(en, str) and isinstance(de, str) for en, de in test_pairs)
  assert tasks.postprocess_text(b"  Suchleiste \n") == "Suchleiste"
  with pytest.raises(ValueError, match="unknown split"):
    tasks.load_split("dev")
  with pytest.raises(TypeError, match="source must be a str, got bytes"):
    tasks.make_inputs(b"bytes")


@pytest.mark.parametrize("tfds_name", [tasks.WMT_ENDE_TFDS, tasks.CNN_DAILYMAIL_TFDS])
def test_an_unprepared_tfds_dataset_is_one_line_naming_it(tmp_path, monkeypatch, tfds_name):
  """A TFDS task whose dataset is not in its data directory is refused before TFDS would start
  downloading it: one line naming the dataset, the directory and `tfds build`; the shipped corpus
  passes. Nothing is downloaded (a download attempt fails the test)."""

  def no_download(*args, **kwargs):
    raise AssertionError("tried to download")

  monkeypatch.setattr(tfds.core.DatasetBuilder, "download_and_prepare", no_download)
  name = "test_unprepared_" + tfds_name.split("/")[0].split(":")[0]
  seqio.TaskRegistry.remove(name)
  seqio.TaskRegistry.add(
    name,
    source=seqio.TfdsDataSource(tfds_name=tfds_name, tfds_data_dir=str(tmp_path)),
    preprocessors=[],
    output_features={},
  )
  try:
    with pytest.raises(
      FileNotFoundError, match=f"needs the TFDS dataset {re.escape(tfds_name)},"
    ) as error:
      tasks.check_tfds_prepared(name)
  finally:
    seqio.TaskRegistry.remove(name)
  message = str(error.value)
  assert "\n" not in message
  assert f"needs the TFDS dataset {tfds_name}, which is not prepared in {tmp_path};" in message
  assert f"tfds build {tfds_name.split(':')[0]} --data_dir={tmp_path}" in message
  tasks.check_tfds_prepared(tasks.LIBREOFFICE_TASK)  # a local corpus: nothing to check
