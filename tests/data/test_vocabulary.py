"""The jobs' vocabulary (speculative/data/vocabulary.py): seqio's ids and text on SentencePiece alone,
and jobs that read files never import TensorFlow."""

import subprocess
import sys

import pytest

from speculative.data import corpus
from speculative.data import tasks
from speculative.data import vocabulary as vocabulary_lib

REPO = tasks.DATA_DIR.parents[1]


def test_ids_and_text_equal_seqios_on_the_test_split():
  seqio_vocabulary = tasks.get_vocabulary()  # seqio.SentencePieceVocabulary (imports TensorFlow)
  ours = vocabulary_lib.load()
  assert ours is vocabulary_lib.load(tasks.VOCAB_PATH)  # one instance per model file
  for name in ("vocab_size", "pad_id", "eos_id", "unk_id"):
    assert getattr(ours, name) == getattr(seqio_vocabulary, name), name
  pairs = corpus.read_tsv_gz(tasks.split_path("test"))
  assert len(pairs) == 2000
  for en, de in pairs:
    for text in (tasks.make_inputs(en), de):
      ids = ours.encode(text)
      assert ids == list(seqio_vocabulary.encode(text)), text
      assert ours.decode(ids) == seqio_vocabulary.decode(ids), text
  # seqio's decode rule: up to and including the first EOS; ids past the vocabulary read as UNK.
  ids = ours.encode("Klicken Sie auf OK.")
  eos, past = tasks.EOS_ID, ours.vocab_size
  for case in ([], [eos], ids + [eos] + ids, ids[:2] + [past, past + 7] + ids[2:], [0, 0] + ids):
    assert ours.decode(case) == seqio_vocabulary.decode(case), case
  assert ours.decode(ids + [eos] + ids) == ours.decode(ids)
  assert ours.decode([past]) == ours.decode([ours.unk_id]) != ""


def test_a_missing_model_file_is_named(tmp_path):
  with pytest.raises(
    FileNotFoundError, match=r"^vocabulary \(SentencePiece model\) does not exist: .*nope\.model$"
  ):
    vocabulary_lib.load(tmp_path / "nope.model")


def _imported(code: str) -> set[str]:
  """The top-level modules among tensorflow and seqio that `code`, run in a fresh interpreter,
  imported (`python -X importtime` names every module it imports on stderr)."""
  out = subprocess.run(
    [sys.executable, "-X", "importtime", "-c", code],
    cwd=REPO,
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  names = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line}
  return names & {"tensorflow", "seqio"}


def test_a_job_that_reads_a_file_never_imports_tensorflow(tmp_path):
  """Reading and tokenizing an input file (the infer job's path for `input_file`) and the runners'
  `--help` import neither seqio nor TensorFlow; reading a seqio task does (the check can fail)."""
  tsv = tmp_path / "in.tsv"
  tsv.write_text("Click OK.\tKlicken Sie auf OK.\nOpen the file.\tÖffnen Sie die Datei.\n")
  read_file = (
    "from speculative.jobs import gin_utils; gin_utils.quiet_native_logs();"
    "from speculative.infer import inputs; from speculative.data import vocabulary;"
    f"examples = inputs.examples_from_file({str(tsv)!r}, vocabulary.load(), 16, 'p: ');"
    "assert [e.reference for e in examples] == ['Klicken Sie auf OK.', 'Öffnen Sie die Datei.']"
  )
  assert _imported(read_file) == set()
  run_help = (
    "from speculative.infer import run\ntry:\n  run.main(['--help'])\nexcept SystemExit:\n  pass"
  )
  assert _imported(run_help) == set()
  read_task = (
    "from speculative.infer import inputs;"
    "assert len(inputs.examples_from_task('libreoffice_ende', 'test', 64, 2)) == 2"
  )
  assert _imported(read_task) == {"tensorflow", "seqio"}
