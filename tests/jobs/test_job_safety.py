"""Batch jobs never silently lie: every bad input of docs/batch_jobs.md fails with its documented
error before a model loads; a re-run resumes only outputs of identical settings; one writer per
output directory; weights are verified; training resumes past a corrupt newest checkpoint; infer and
train killed (-9) at random moments end byte-identical to uninterrupted runs (tests/kill_soak.py)."""

import dataclasses
import gzip
import json
import logging
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys

import gin
import jax
from model_utils import random_params
from model_utils import save_tiny_pair
from model_utils import tiny_t5_config
import numpy as np
import pytest

from speculative import checkpoints
from speculative import infer
from speculative.infer import inputs as infer_inputs
from speculative.jobs import checks
from speculative.jobs import gin_utils
from speculative.jobs import lock
from speculative.models.t5 import T5

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["Click OK.", "Open the file menu.", "Hello", "Select a cell range."]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  root = tmp_path_factory.mktemp("jobs")
  kwargs = dict(
    **save_tiny_pair(root, SOURCES, record_config=True),
    task_feature_lengths={"inputs": 24, "targets": 6},
    batch_size=2,
    gamma=3,
    progress=False,
  )
  return root, kwargs


@pytest.fixture
def no_model_load(monkeypatch):
  """Fails the test if a model would be loaded: the errors must come before that."""

  def refuse(*args, **kwargs):
    raise AssertionError("a model was loaded before the error")

  monkeypatch.setattr(checkpoints, "load_model", refuse)


# The bad-input table of docs/batch_jobs.md: (row id, how to break the job, error, message).
def _zeros(root, tmp):  # the target without its sidecar, 8 KiB of its arrays' bytes zeroed
  data = bytearray((root / "t.msgpack").read_bytes())
  data[len(data) // 2 : len(data) // 2 + 8192] = bytes(8192)
  (tmp / "zeros.msgpack").write_bytes(bytes(data))
  return {"target_checkpoint": str(tmp / "zeros.msgpack")}


def _flipped(root, tmp):
  data = bytearray((root / "t.msgpack").read_bytes())
  data[len(data) // 2] ^= 0xFF
  (tmp / "flipped.msgpack").write_bytes(bytes(data))
  shutil.copy(root / "t.msgpack.json", tmp / "flipped.msgpack.json")
  return {"target_checkpoint": str(tmp / "flipped.msgpack")}


def _text(name, data):
  def make(root, tmp):
    (tmp / name).write_bytes(data)
    return {"input_file": str(tmp / name)}

  return make


def _blocked_output(root, tmp):
  (tmp / "a_file").write_text("x")
  return {"output_dir": str(tmp / "a_file" / "out")}


def _file_output(root, tmp):
  (tmp / "a_file").write_text("x")
  return {"output_dir": str(tmp / "a_file")}


def _weights(role, make):
  """A `role` ('target' or 'draft') weights path made by `make(root, tmp)`."""

  def change(root, tmp):
    return {f"{role}_checkpoint": str(make(root, tmp))}

  return change


def _empty_file(root, tmp):
  (tmp / "e.msgpack").write_bytes(b"")
  return tmp / "e.msgpack"


def _empty_dir(root, tmp):
  (tmp / "empty").mkdir()
  return tmp / "empty"


def _truncated(root, tmp):  # the first half of the draft, no sidecar
  data = (root / "d.msgpack").read_bytes()
  (tmp / "half.msgpack").write_bytes(data[: len(data) // 2])
  return tmp / "half.msgpack"


def _not_msgpack(root, tmp):
  (tmp / "notes.msgpack").write_text("these are not weights\n")
  return tmp / "notes.msgpack"


def _t5x_without_array(root, tmp):  # a T5X checkpoint directory whose first zarr array is gone
  params = checkpoints.load_params(root / "d.msgpack")
  directory = checkpoints.save_t5x_checkpoint(params, tmp / "model", 1)
  first = sorted(p for p in directory.iterdir() if p.name.startswith("target."))[0]
  shutil.rmtree(first)
  return tmp / "model"


def _pair_of_vocab_size(tmp, vocab_size):
  """The tiny pair's configs and weights for `vocab_size` rows of the vocabulary (the shipped
  pair's rows repeated or cut), the weights without a config sidecar: the settings' shape check
  passes them, only the vocabulary check can refuse them."""
  paths = save_tiny_pair(tmp, SOURCES, record_config=False)
  pair = {}
  for role, layers in (("target", 2), ("draft", 1)):
    path = paths[f"{role}_checkpoint"]
    params = checkpoints.load_params(path)
    embedding = params["token_embedder"]["embedding"]  # [vocab, d]
    params["token_embedder"]["embedding"] = np.resize(embedding, (vocab_size, embedding.shape[1]))
    logits = params["decoder"]["logits_dense"]["kernel"]  # [d, vocab]
    params["decoder"]["logits_dense"]["kernel"] = np.resize(logits.T, (vocab_size, len(logits))).T
    checkpoints.save_params(params, path, dtype=None)
    os.remove(checkpoints.metadata_path(path))
    pair[f"{role}_config"] = dataclasses.replace(tiny_t5_config(layers), vocab_size=vocab_size)
    pair[f"{role}_checkpoint"] = path
  return pair


def _unrecorded_vocabulary(root, tmp):
  """Target and draft configs of vocab_size 4000 on weights of that size without a config sidecar
  (so only the vocabulary check can refuse them)."""
  return _pair_of_vocab_size(tmp, 4000)


BAD_INPUTS = [
  ("gamma_fraction", {"gamma": 2.5}, ValueError, r"gamma \(or 'auto'\) must be an integer"),
  ("gamma_zero", {"gamma": 0}, ValueError, r"gamma \(or 'auto'\) must be in \[1, 32\]"),
  ("gamma_huge", {"gamma": 1000}, ValueError, r"gamma \(or 'auto'\) must be in \[1, 32\]"),
  ("temperature_negative", {"temperature": -1.0}, ValueError, "temperature must be in"),
  ("top_k_negative", {"top_k": -1}, ValueError, "top_k must be in"),
  ("top_p_zero", {"top_p": 0.0}, ValueError, r"top_p must be in \(0.0, 1.0\]"),
  ("top_p_above_one", {"top_p": 1.5}, ValueError, "top_p must be in"),
  ("lenience_zero", {"lenience": 0.0}, ValueError, "lenience must be in"),
  ("batch_size_zero", {"batch_size": 0}, ValueError, "batch_size must be in"),
  ("num_examples_zero", {"num_examples": 0}, ValueError, r"num_examples \(None = all\)"),
  ("num_examples_negative", {"num_examples": -1}, ValueError, r"num_examples \(None = all\)"),
  ("unknown_drafter", {"drafter": "trigram"}, ValueError, "unknown drafter"),
  (
    "task_and_file",
    {"mixture_or_task_name": "libreoffice_ende"},
    ValueError,
    "exactly one of mixture_or_task_name",
  ),
  (
    "missing_target",
    {"target_checkpoint": "/nope/t.msgpack"},
    FileNotFoundError,
    "target_checkpoint does not exist: /nope/t.msgpack",
  ),
  (
    "missing_draft",
    {"draft_checkpoint": "/nope/d.msgpack"},
    FileNotFoundError,
    "draft_checkpoint does not exist: /nope/d.msgpack",
  ),
  ("missing_input", {"input_file": "/nope/in.txt"}, FileNotFoundError, "input_file does not exist"),
  (
    "unknown_split",
    {"mixture_or_task_name": "libreoffice_ende", "input_file": None, "split": "dev"},
    ValueError,
    r"unknown split 'dev' of libreoffice_ende; it has \('train', 'validation', 'test'\)",
  ),
  (
    "input_is_a_directory",
    lambda root, tmp: {"input_file": str(tmp)},
    IsADirectoryError,
    "input_file is a directory, not a file",
  ),
  (
    "truncated_gzip",
    _text("in.tsv.gz", gzip.compress(b"Click OK.\tRef\nHello\tRef\n")[:20]),
    ValueError,
    r"in.tsv.gz: not a complete gzip file",
  ),
  (
    "not_gzip",
    _text("plain.tsv.gz", b"Click OK.\tRef\n"),
    ValueError,
    r"plain.tsv.gz: not a complete gzip file",
  ),
  (
    "draft_vocab",
    {"draft_config": dataclasses.replace(tiny_t5_config(1), vocab_size=4000)},
    ValueError,
    "draft and target vocabularies differ",
  ),
  (
    "vocabulary_larger_than_target",
    _unrecorded_vocabulary,
    ValueError,
    r"the target's vocab_size 4000 is smaller than the 8000 pieces of its inputs' vocabulary "
    r"\(infer.vocabulary_path = '\S+spm8k.model'\)",
  ),
  (
    "output_under_a_file",
    _blocked_output,
    NotADirectoryError,
    r"output directory \S+a_file/out cannot be created: \S+a_file is a file",
  ),
  ("output_is_a_file", _file_output, NotADirectoryError, r"\S+a_file is a file, not a directory"),
  (
    "not_utf8",
    _text("latin1.txt", b"Click OK.\nCaf\xe9\n"),
    ValueError,
    r"latin1.txt:2: not valid UTF-8",
  ),
  (
    "empty_line",
    _text("gap.txt", b"Click OK.\n\nHello\n"),
    ValueError,
    "gap.txt:2: empty input line",
  ),
  (
    "empty_weights_file",
    _weights("draft", _empty_file),
    checkpoints.CheckpointError,
    r"draft_checkpoint: \S+e.msgpack is empty \(0 bytes\), not a weights file",
  ),
  (
    "empty_weights_dir",
    _weights("target", _empty_dir),
    checkpoints.CheckpointError,
    r"target_checkpoint: no T5X checkpoint in \S+empty",
  ),
  (
    "truncated_weights",
    _weights("draft", _truncated),
    checkpoints.CheckpointError,
    r"draft_checkpoint: \S+half.msgpack is truncated",
  ),
  (
    "not_weights",
    _weights("target", _not_msgpack),
    checkpoints.CheckpointError,
    r"target_checkpoint: \S+notes.msgpack is not a weights file",
  ),
  (
    "t5x_checkpoint_missing_an_array",
    _weights("draft", _t5x_without_array),
    checkpoints.CheckpointError,
    r"draft_checkpoint: missing array target/",
  ),
  ("zeros_weights", _zeros, checkpoints.CheckpointError, "target_checkpoint: \\S+zeros.msgpack"),
  (
    "corrupt_weights",
    _flipped,
    checkpoints.CheckpointError,
    "target_checkpoint: \\S+flipped.msgpack is corrupt or was changed",
  ),
  (
    "wrong_config_same_shapes",
    {"target_config": dataclasses.replace(tiny_t5_config(2), mlp_activations=("relu", "linear"))},
    checkpoints.CheckpointError,
    "different model config:\n  mlp_activations: weights \\['gelu', 'linear'\\]",
  ),
  # SpecTr (METHOD = 'spectr') and the n-gram drafters.
  ("method_unknown", {"method": "medusa"}, ValueError, r"unknown method \(METHOD\) 'medusa'"),
  (
    "num_drafts_zero",
    {"method": "spectr", "num_drafts": 0, "temperature": 1.0},
    ValueError,
    r"num_drafts \(NUM_DRAFTS\) must be in \[1, 8\]",
  ),
  ("num_drafts_huge", {"method": "spectr", "num_drafts": 9, "temperature": 1.0}, ValueError, "8"),
  ("num_drafts_one_draft", {"num_drafts": 2}, ValueError, r"needs method \(METHOD\) = 'spectr'"),
  (
    "spectr_deterministic_drafter",
    {"method": "spectr", "num_drafts": 2, "temperature": 1.0, "drafter": "prompt_lookup+model"},
    ValueError,
    "is deterministic",
  ),
  ("spectr_greedy", {"method": "spectr", "num_drafts": 2}, ValueError, "at temperature 0"),
  (
    "spectr_option",
    {"method": "spectr", "num_drafts": 2, "temperature": 1.0, "adaptive_verify": True},
    ValueError,
    "adaptive_verify is not supported",
  ),
  ("ngram_drafter", {"drafter": "bigram"}, ValueError, "drafter 'bigram' is benchmark-only"),
  # GAMMA = 'auto' (docs/auto_gamma.md).
  ("gamma_word", {"gamma": "fast"}, ValueError, "or 'auto', got 'fast'"),
  ("gamma_max_fixed", {"gamma": 3, "gamma_max": 5}, ValueError, "bounds gamma = 'auto' only"),
  ("gamma_max_range", {"gamma": "auto", "gamma_max": 40}, ValueError, r"gamma_max \(None = 7\)"),
  ("auto_stop_below", {"gamma": "auto", "draft_stop_below": 0.4}, ValueError, "use one of"),
  ("auto_adaptive_verify", {"gamma": "auto", "adaptive_verify": True}, ValueError, "use one of"),
  (
    "auto_cache_unwritable",
    lambda root, tmp: {"gamma": "auto", "calibration_file": str(_a_file(tmp) / "c.json")},
    PermissionError,
    "is a file, not a directory",
  ),
  (
    "spectr_auto",
    {"method": "spectr", "num_drafts": 2, "temperature": 1.0, "gamma": "auto"},
    ValueError,
    "GAMMA must be an integer draft length",
  ),
]


def _a_file(tmp_path):
  path = tmp_path / "a_file"
  path.write_text("")
  return path


def _docs_tables() -> tuple[dict[str, str], list[str]]:
  """docs/batch_jobs.md: the bad-input table ({row id: documented error}) and the tests named in
  the first column of the command-line table."""
  rows, tests, previous = {}, [], None
  for line in (REPO / "docs" / "batch_jobs.md").read_text().splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) != 3 or not cells[0].startswith("`"):
      continue
    name = cells[0].strip("`")
    if name.startswith("test_"):
      tests.append(name)
    else:
      rows[name] = previous if cells[2] == "same" else cells[2]
      previous = rows[name]
  return rows, tests


def _documented_pattern(documented: str) -> str:
  """The documented `<type>: <message>` as a regex: PATH/FILE/DIR a path, N a number, ... anything,
  a space any whitespace (a table cell has no line breaks)."""
  placeholders = {
    "PATH": r"\S+",
    "FILE": r"\S+",
    "DIR": r"\S+",
    "N": r"\d+",
    "...": ".*",
    " ": r"\s+",
  }
  parts = re.split(r"(\.\.\.|\b(?:PATH|FILE|DIR|N)\b| )", documented)
  return "".join(placeholders.get(part, re.escape(part)) for part in parts)


@pytest.mark.parametrize("row_id,change,error,message", BAD_INPUTS, ids=[r[0] for r in BAD_INPUTS])
def test_bad_input_table(setup, tmp_path, no_model_load, row_id, change, error, message):
  root, kwargs = setup
  kwargs = {**kwargs, "output_dir": str(tmp_path / "out")}
  kwargs.update(change(root, tmp_path) if callable(change) else change)
  existed = os.path.exists(kwargs["output_dir"])
  with pytest.raises(error, match=message) as info:
    infer.infer(**kwargs)
  # Refused before anything was written: no output directory made, no lock file left.
  assert os.path.exists(kwargs["output_dir"]) == existed
  # The error reads as docs/batch_jobs.md documents it.
  documented = _docs_tables()[0][row_id]
  raised = f"{type(info.value).__name__}: {info.value}"
  assert re.match(_documented_pattern(documented), raised, re.DOTALL), (documented, raised)


def test_a_target_much_larger_than_the_vocabulary_warns(setup, tmp_path, caplog):
  # T5's 32,128 embedding rows against the shipped 8k SentencePiece model: every id is in range,
  # but the target was trained with another vocabulary; one warning line names both sizes.
  from speculative.infer import settings as infer_settings

  root, kwargs = setup
  t5_sized = {"output_dir": str(tmp_path / "out"), **_pair_of_vocab_size(tmp_path, 32128)}
  settings = infer_settings.InferSettings(**{**kwargs, **t5_sized})
  with caplog.at_level(logging.WARNING):
    infer_inputs.load_inputs(settings)
  (warning,) = [r.getMessage() for r in caplog.records if "vocab_size" in r.getMessage()]
  assert "the target's vocab_size 32128 is 4.0x the 8000 pieces" in warning
  assert "infer.vocabulary_path = " in warning and "\n" not in warning
  # T5's 32,128 rows for its 32,100 pieces, and 8,192 rows for 8,000, pass without a word.
  assert infer_inputs.check_vocabulary_size(32128, 32100, "t5") is None
  assert infer_inputs.check_vocabulary_size(8192, 8000, "8k") is None


def test_weights_of_another_model_without_a_sidecar_are_refused_before_a_model_loads(
  setup, tmp_path, no_model_load
):
  """The draft's weights given as the target's, no sidecar to say whose they are: one line naming
  the setting, the file and the first array the target's config does not match, before a model
  loads or the output directory is made."""
  root, kwargs = setup
  pair = save_tiny_pair(tmp_path, SOURCES, record_config=False)
  out = tmp_path / "out"
  with pytest.raises(checkpoints.CheckpointError) as info:
    infer.infer(**{**kwargs, "target_checkpoint": pair["draft_checkpoint"], "output_dir": str(out)})
  assert str(info.value) == (
    f"target_checkpoint: {pair['draft_checkpoint']} does not match the model config: "
    "decoder/layers_1/encoder_decoder_attention/key/kernel (16, 16) is missing "
    "(14 arrays differ: 14 missing)"
  )
  assert not out.exists()


def test_docs_table_matches_the_tests():
  rows, tests = _docs_tables()
  assert sorted(rows) == sorted(r[0] for r in BAD_INPUTS)
  assert tests, "no command-line table"
  for name in tests:
    function, _, param = name.partition("[")
    assert callable(globals().get(function)), f"docs name a test that does not exist: {name}"
    if param:
      assert param.rstrip("]") in [g[0] for g in GIN_ERRORS], name


def test_a_tsv_with_some_references_left_out_is_named_in_one_warning(setup, caplog):
  """Scores against references need every line's: a file that gives some is warned of, naming a
  line without; a file of sources only, or of full pairs, is not."""
  root, _ = setup
  from speculative.data import tasks

  vocab = tasks.get_vocabulary(None)
  for name, text, warned in [
    ("mixed.tsv", "Click OK.\tKlicken Sie auf OK.\nHello\nBye\tTschuess\n", True),
    ("sources.txt", "Click OK.\nHello\n", False),
    ("pairs.tsv", "Click OK.\tOK.\nHello\tHallo\n", False),
  ]:
    (root / name).write_text(text)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
      infer_inputs.examples_from_file(str(root / name), vocab, 24)
    found = [r.getMessage() for r in caplog.records if "no reference" in r.getMessage()]
    assert found == (
      [
        f"{root / name}: 1 of 3 lines have no reference (no tab), e.g. line 2: no "
        "scores against the references are computed"
      ]
      if warned
      else []
    ), found


def test_a_batch_larger_than_the_inputs_is_warned_of_before_any_model_loads(
  setup, tmp_path, caplog, no_model_load
):
  root, kwargs = setup
  kwargs = {**kwargs, "batch_size": 8, "num_examples": 2, "output_dir": str(tmp_path / "out")}
  with caplog.at_level(logging.WARNING), pytest.raises(AssertionError, match="a model was loaded"):
    infer.infer(**kwargs)
  assert "BATCH_SIZE = 8 for 2 inputs: the batch is padded to 8 rows" in caplog.text


def test_bom_is_not_text(setup):
  root, _ = setup
  from speculative.data import tasks

  vocab = tasks.get_vocabulary(None)
  plain = root / "plain.txt"
  plain.write_bytes(b"Click OK.\nHello\n")
  bom = root / "bom.txt"
  bom.write_bytes("\ufeffClick OK.\r\nHello\r\n".encode())
  a = infer_inputs.examples_from_file(str(plain), vocab, 24)
  b = infer_inputs.examples_from_file(str(bom), vocab, 24)
  assert [e.inputs for e in a] == [e.inputs for e in b] == ["Click OK.", "Hello"]
  assert [e.input_tokens.tolist() for e in a] == [e.input_tokens.tolist() for e in b]


@pytest.mark.slow
def test_changed_settings_are_refused_before_loading(setup, tmp_path, monkeypatch):
  root, kwargs = setup
  out = str(tmp_path / "out")
  first = infer.infer(output_dir=out, num_examples=3, **kwargs)
  assert first["examples"] == 3
  monkeypatch.setattr(checkpoints, "load_model", lambda *a: pytest.fail("loaded a model"))
  other_draft = tmp_path / "d2.msgpack"
  # Other weights of the draft's shapes (the job refuses them by their hash, before loading any).
  checkpoints.save_params(random_params(T5(tiny_t5_config(1)), 9), other_draft, dtype=None)
  other_input = tmp_path / "in2.tsv"
  other_input.write_text("Hello\tRef\nClick OK.\tRef\nBye\tRef\n")
  for change, field in [
    ({"gamma": 5}, "gamma: was 3, now 5"),
    ({"drafter": "prompt_lookup+model"}, 'drafter: was "model"'),
    ({"draft_checkpoint": str(other_draft)}, "draft_checkpoint_sha256: was"),
    ({"input_file": str(other_input)}, "inputs_sha256: was"),
    ({"num_examples": 2}, "num_examples: was 3, now 2"),  # a shrink (a grow resumes)
    ({"temperature": 1.0}, "temperature: was 0.0, now 1.0"),
  ]:
    with pytest.raises(ValueError, match=field) as info:
      infer.infer(output_dir=out, **{**kwargs, "num_examples": 3, **change})
    assert "new output directory" in str(info.value) and "overwrite" in str(info.value)


def test_overwrite_clears_old_outputs(setup, tmp_path):
  root, kwargs = setup
  out = tmp_path / "out"
  infer.infer(output_dir=str(out), num_examples=3, modes=("baseline",), **kwargs)
  # An older job's output of a mode the next job does not decode (written here, not decoded).
  (out / "predictions-speculative.jsonl").write_text('{"index": 0}\n')
  # A shrink is refused without `overwrite` (a grow would resume), so only `overwrite` lets the
  # second job write here; the outputs it does not write itself are gone.
  summary = infer.infer(
    output_dir=str(out), num_examples=2, modes=("baseline",), overwrite=True, **kwargs
  )
  assert summary["examples"] == 2
  assert lock.read_manifest(str(out))["num_examples"] == 2
  records = (out / "predictions-baseline.jsonl").read_text().splitlines()
  assert [json.loads(line)["index"] for line in records] == [0, 1]
  assert not (out / "predictions-speculative.jsonl").exists()


def test_a_run_killed_writing_its_first_manifest_leaves_a_directory_it_can_start_in(tmp_path):
  """A kill before the first manifest's rename leaves its temporary (and maybe a writability
  probe): no output, so the re-run starts there; a real output without a manifest is refused."""
  out = tmp_path / "out"
  out.mkdir()
  (out / "manifest.json.tmp-9g8umk6u").write_text("{")
  (out / ".write-probe-123").write_text("probe")
  assert lock.check_manifest(str(out), {"gamma": 3}, "OVERWRITE = True") is False
  (out / "report.md").write_text("old")
  with pytest.raises(ValueError, match=r"holds outputs \(report.md\) without a manifest.json"):
    lock.check_manifest(str(out), {"gamma": 3}, "OVERWRITE = True")


def test_a_damaged_file_to_resume_is_the_users_error_naming_it(setup, tmp_path, monkeypatch):
  """A predictions or timings file that does not parse is refused before any model loads, as an
  error of the user's (the command line prints its one line), naming the file."""
  root, kwargs = setup
  out = tmp_path / "out"
  infer.infer(output_dir=str(out), num_examples=2, modes=("baseline",), **kwargs)
  monkeypatch.setattr(checkpoints, "load_model", lambda *a: pytest.fail("loaded a model"))
  for name, damage, message in [
    ("predictions-baseline.jsonl", "\n", "predictions-baseline.jsonl:3: not a predictions record"),
    ("timings.json", "", "timings.json is not a timings file"),
  ]:
    kept = (out / name).read_text()
    (out / name).write_text(kept + damage if damage else damage)
    with pytest.raises(ValueError, match=message) as info:
      infer.infer(output_dir=str(out), num_examples=2, modes=("baseline",), **kwargs)
    assert checks.user_message(info.value) == str(info.value)
    (out / name).write_text(kept)


def test_a_finished_job_run_again_is_unchanged_and_a_grow_relabels_nothing(
  setup, tmp_path, monkeypatch
):
  """Run again, a finished job loads no model and leaves its summary as the process that decoded
  it wrote it (no other process's load or memory beside its times). A grow deletes that summary
  when it writes its first record (interrupted, it leaves none), and its report says how many
  examples an earlier process decoded."""
  from speculative.infer import outputs as infer_outputs

  root, kwargs = setup
  out = tmp_path / "out"
  kwargs = {**kwargs, "modes": ("baseline",), "batch_size": 1, "output_dir": str(out)}
  first = infer.infer(num_examples=2, **kwargs)
  written = {name: (out / name).read_bytes() for name in ("metrics.json", "report.md")}
  load_model = checkpoints.load_model
  monkeypatch.setattr(checkpoints, "load_model", lambda *a: pytest.fail("loaded a model"))
  assert infer.infer(num_examples=2, **kwargs) == json.loads(json.dumps(first))
  assert {name: (out / name).read_bytes() for name in written} == written
  monkeypatch.setattr(checkpoints, "load_model", load_model)
  record = infer_outputs.record

  seen = []

  def interrupted(example, *args):
    seen.append(example.index)
    if len(seen) == 2:  # the grow's first record is written; its second batch is not
      raise KeyboardInterrupt
    return record(example, *args)

  monkeypatch.setattr(infer_outputs, "record", interrupted)
  with pytest.raises(KeyboardInterrupt):
    infer.infer(num_examples=4, **kwargs)
  assert len((out / "predictions-baseline.jsonl").read_text().splitlines()) == 3
  assert not (out / "metrics.json").exists() and not (out / "report.md").exists()
  monkeypatch.setattr(infer_outputs, "record", record)
  grown = infer.infer(num_examples=4, **kwargs)
  assert grown["resumed_examples"] == 3
  assert (
    "Resumed: 3 of 4 examples were decoded and timed by an earlier process"
    in (out / "report.md").read_text()
  )


def test_outputs_without_manifest_are_refused(setup, tmp_path, no_model_load):
  root, kwargs = setup
  out = tmp_path / "old"
  out.mkdir()
  (out / "predictions-baseline.jsonl").write_text('{"index": 0}\n')
  with pytest.raises(ValueError, match="without a manifest.json"):
    infer.infer(output_dir=str(out), **kwargs)


def test_one_writer_per_output_dir(setup, tmp_path, no_model_load):
  root, kwargs = setup
  out = tmp_path / "out"
  out.mkdir()
  # Another process holds the lock: the run is refused at once, naming its pid.
  holder = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys, time; from speculative.jobs import lock; "
      f"lock.OutputLock({str(out)!r}).acquire(); print('locked', flush=True); time.sleep(60)",
    ],
    cwd=REPO,
    stdout=subprocess.PIPE,
    text=True,
  )
  try:
    assert holder.stdout.readline().strip() == "locked"
    with pytest.raises(RuntimeError, match=f"in use by another run \\(pid {holder.pid}"):
      infer.infer(output_dir=str(out), **kwargs)
  finally:
    holder.kill()  # kill -9: the OS drops its lock
    holder.wait()
  with lock.OutputLock(str(out)):  # the killed holder's lock file does not block
    with pytest.raises(RuntimeError, match=f"pid {os.getpid()}"):
      lock.OutputLock(str(out)).acquire()


# ----------------------------------------------------------------------------------------------
# kill -9 at random moments: short runs of tests/kill_soak.py (its docstring has the long soak).
# The runs share a JAX compilation cache (the reference run fills it), which halves their time.
# ----------------------------------------------------------------------------------------------
# What the rerun of a killed job prints when it resumes from the outputs the killed run left.
RESUMED = {
  "infer": r"resuming: [1-9]\d* of \d+ examples already done",
  "train": r"resumed from \S+/checkpoint_[1-9]\d*",
}


def _soak_once(kill_soak, job: str, tmp_path) -> None:
  """One seeded trial of `kill_soak.soak_at_writes(job)`: one kill at a write after the run's first
  output (an event: the run stops itself there), checked. Seed 13 kills both jobs mid-write
  (infer: before the 10th rename of predictions-baseline.jsonl; train: before checkpoint_18's
  directory is renamed into place), so the resumed run has a temporary to remove, and finished
  outputs it resumes from instead of starting again (its log says so)."""
  (trial,) = kill_soak.soak_at_writes(
    job, tmp_path / "soak", trials=1, seed=13, compile_cache=tmp_path / "xla_cache"
  )
  assert len(trial.kills) == 1 and trial.kills[0] > 0  # killed after output: the rerun resumes
  assert trial.kills_leaving_temporaries == 1  # mid-write: a temporary for the rerun to remove
  assert trial.identical and not trial.differing and not trial.left
  log = (tmp_path / "soak" / "trial_0.log").read_text()  # the killed run's, then the rerun's
  assert re.search(RESUMED[job], log), log[-2000:]


@pytest.mark.slow
def test_infer_killed_at_a_random_write_ends_byte_identical(kill_soak, tmp_path):
  """The real CLI, SIGKILLed at a seeded random write between its first and last predictions,
  resumes to predictions byte-identical to an uninterrupted run's; no temporaries left."""
  _soak_once(kill_soak, "infer", tmp_path)


@pytest.mark.slow
def test_train_killed_at_a_random_write_ends_byte_identical(kill_soak, tmp_path):
  """`speculative.train`, SIGKILLed at a seeded random write after its first checkpoint, resumes
  to checkpoints (params and optimizer state), best and exported weights byte-identical to an
  uninterrupted run's; no `.tmp` is left."""
  _soak_once(kill_soak, "train", tmp_path)
  out = tmp_path / "soak" / "trial_0"
  assert (out / "export.msgpack").is_file()
  assert (out / "checkpoint_24" / "optax_state.msgpack").is_file()
  assert not [p for p in out.rglob("*") if ".tmp" in p.name]


@pytest.mark.slow
def test_sigint_and_sigterm_end_the_cli_with_one_line(kill_soak, tmp_path):
  """The real CLI, sent SIGINT (Ctrl-C) or SIGTERM just after a batch's speculative records are
  written: one stderr line saying how far it got, exit status 130 / 143, the records of the finished
  batches only and no temporary; the same command then resumes to predictions byte-identical to an
  uninterrupted run's."""
  import signal

  work = tmp_path / "work"
  kill_soak.prepare_infer(work)
  cache = {
    "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "xla_cache"),
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
  }
  path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
  env = dict(os.environ, PYTHONPATH=path, **cache)
  subprocess.run(
    kill_soak.infer_command(work, tmp_path / "reference"), cwd=REPO, env=env, check=True
  )
  reference = kill_soak.infer_outputs(tmp_path / "reference")
  # (signal, the write of predictions-speculative.jsonl it follows, exit status, examples done).
  for signum, count, status, done in ((signal.SIGINT, 2, 130, 4), (signal.SIGTERM, 3, 143, 6)):
    out = tmp_path / signal.Signals(signum).name
    cmd = kill_soak.infer_command(work, out)
    code, stderr = kill_soak.signal_at_write(
      cmd,
      out,
      "predictions-speculative.jsonl",
      count,
      signum,
      log=out.with_suffix(".log"),
      env=cache,
    )
    assert (code, stderr) == (
      status,
      f"speculative-infer: interrupted after {done} of 24 examples; the same command resumes\n",
    )
    lines = {name: data.count(b"\n") for name, data in kill_soak.infer_outputs(out).items()}
    assert lines == {f"predictions-{m}.jsonl": done for m in ("baseline", "speculative")}
    assert not kill_soak.leftovers(out)
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True)
    assert kill_soak.infer_outputs(out) == reference


@pytest.mark.parametrize(
  "script,message",
  [
    ("open(out + '/a', 'w').write(str(os.getpid()))", "a differ from the uninterrupted run"),
    (
      "open(out + '/a', 'w').write('1'); open(out + '/a.tmp-1', 'w')",
      r"temporaries left .*a\.tmp-1",
    ),
  ],
  ids=["mismatch", "temporaries"],
)
def test_kill_soak_fails_on_a_job_that_does_not_resume_cleanly(
  kill_soak, tmp_path, script, message
):
  """The soak can fail: a job whose outputs differ between runs, or that leaves a temporary."""
  code = f"import os, sys, time; out = sys.argv[1]; os.makedirs(out, exist_ok=True); {script}; time.sleep(0.3)"
  job = kill_soak.Job(
    prepare=lambda workdir: workdir.mkdir(parents=True),
    command=lambda workdir, out: [sys.executable, "-c", code, str(out)],
    outputs=lambda out: {p.name: p.read_bytes() for p in out.iterdir() if p.name == "a"},
    progress=lambda out: 0,
  )
  with pytest.raises(kill_soak.SoakError, match=message):
    kill_soak.soak(job, tmp_path / "soak", trials=1, max_kills=1, report=lambda s: None)


@pytest.mark.parametrize(
  "script,message",
  [
    ("write(str(os.getpid()))", "a differ from the uninterrupted run"),
    ("write('1'); open(out + '/a.tmp-1', 'w')", r"temporaries left .*a\.tmp-1"),
  ],
  ids=["mismatch", "temporaries"],
)
def test_the_soak_at_writes_fails_on_a_job_that_does_not_resume_cleanly(
  kill_soak, tmp_path, script, message
):
  """The suite's soak (kills at writes) can fail too: a job whose output differs between runs, or
  that leaves a temporary, killed at its one atomic write of `a` (just before or after it)."""
  code = (
    "import os, sys\n"
    "out = sys.argv[1]\n"
    "os.makedirs(out, exist_ok=True)\n"
    "def write(text):\n"
    "  open(out + '/a.new', 'w').write(text)\n"
    "  os.replace(out + '/a.new', out + '/a')\n"
    f"{script}\n"
  )
  job = kill_soak.Job(
    prepare=lambda workdir: workdir.mkdir(parents=True),
    command=lambda workdir, out: [sys.executable, "-c", code, str(out)],
    outputs=lambda out: {p.name: p.read_bytes() for p in out.iterdir() if p.name == "a"},
    progress=lambda out: 0,
  )
  with pytest.raises(kill_soak.SoakError, match=message):
    kill_soak.soak_at_writes(
      job, tmp_path / "soak", trials=1, report=lambda s: None, writes=[("a", 1)]
    )


# ----------------------------------------------------------------------------------------------
# Gin: unknown or unused bindings, missing files.
# ----------------------------------------------------------------------------------------------
@pytest.fixture
def gin_infer():
  gin.clear_config()
  gin_utils.register_configurables()
  gin.external_configurable(infer.infer, "infer")
  yield
  gin.clear_config()


GIN_ERRORS = [
  (
    "unused_macro",
    "GAMA = 5",
    r"macro GAMA is not used by the run file \(did you mean GAMMA or GAMMA_MAX\?\)",
  ),
  ("misspelled_macro", "TOP_K = 5", r"macro TOP_K is not .*\(did you mean TOPK or TOPP\?\)"),
  (
    "unknown_parameter",
    "infer.gama = 5",
    r"^infer has no parameter 'gama' \(did you mean gamma or gamma_max\?\); its parameters: "
    r"[a-z_, ]+$",
  ),
  (
    "unquoted_string",
    "INFER_OUTPUT_DIR = /tmp/x",
    r"""--gin_bindings "INFER_OUTPUT_DIR = /tmp/x": gin cannot parse the value \(strings need """
    r"""quotes: INFER_OUTPUT_DIR = '/tmp/x'\)$""",
  ),
  (
    "no_value",
    "GAMMA = ",
    r'--gin_bindings "GAMMA =": gin cannot parse the value \(no value after =; the run file has '
    r"GAMMA = 'auto'\)$",
  ),
]


@pytest.mark.parametrize(
  "binding,message", [g[1:] for g in GIN_ERRORS], ids=[g[0] for g in GIN_ERRORS]
)
def test_bad_bindings_are_refused(gin_infer, binding, message):
  with pytest.raises(ValueError, match=message):
    gin_utils.parse(["configs/local/run.gin"], [binding])


def test_a_run_file_line_gin_cannot_parse_is_named(gin_infer, tmp_path):
  (tmp_path / "bad.gin").write_text("include 'configs/local/run.gin'\nGAMMA = 3\nSPLIT = test\n")
  with pytest.raises(
    ValueError,
    match=r"bad.gin:3: gin cannot parse 'SPLIT = test' \(strings need quotes: SPLIT = 'test'\)$",
  ):
    gin_utils.parse([str(tmp_path / "bad.gin")], [])


def test_required_macros_left_unset_are_named(gin_infer):
  experiment = ["configs/local/experiments/ende_small_t0.gin"]
  with pytest.raises(
    ValueError,
    match=r"^CHECKPOINT_PATH, DRAFT_CHECKPOINT_PATH and INFER_OUTPUT_DIR are required: the run "
    r"files leave them %gin.REQUIRED; set each with --gin_bindings=\"CHECKPOINT_PATH = \.\.\.\"",
  ):
    gin_utils.parse(experiment, [])
  given = ["CHECKPOINT_PATH = '/t'", "DRAFT_CHECKPOINT_PATH = '/d'", "INFER_OUTPUT_DIR = '/o'"]
  with pytest.raises(ValueError, match=r"^INFER_OUTPUT_DIR is required: the run files leave it"):
    gin_utils.parse(experiment, given[:2])
  gin_utils.parse(experiment, given)
  gin_utils.parse(experiment, [], required=False)  # --help lists them instead
  assert "CHECKPOINT_PATH = %gin.REQUIRED  (required: set it)" in gin_utils.format_knobs(
    experiment, "infer"
  )


def test_known_bindings_pass_and_missing_gin_file_names_search_path(gin_infer):
  gin_utils.parse(["configs/local/run.gin"], ["GAMMA = 5", "INPUT_FILE = '-'", "TOPP = 0.9"])
  assert gin.query_parameter("infer.gamma") is not None
  with pytest.raises(FileNotFoundError, match="gin file 'configs/nope.gin' not found; searched"):
    gin_utils.parse(["configs/nope.gin"], [])


@pytest.mark.slow
def test_cli_user_errors_are_one_message_and_debug_shows_the_traceback(tmp_path):
  # A refused resume (outputs of other settings in INFER_OUTPUT_DIR) at the command line: the
  # message and exit status 2, no traceback; --debug shows the traceback.
  out = tmp_path / "out"
  out.mkdir()
  (out / "manifest.json").write_text(json.dumps({"gamma": 99}))
  command = [
    sys.executable,
    "-m",
    "speculative.infer",
    "--gin_file=configs/local/run.gin",
    f"--gin_bindings=INFER_OUTPUT_DIR = '{out}'",
    "--gin_bindings=NUM_EXAMPLES = 2",
  ]
  env = {k: v for k, v in os.environ.items() if k != "SPECULATIVE_DEBUG"}
  plain = subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env, timeout=300)
  assert plain.returncode == 2, plain.stderr[-2000:]
  assert "refusing to mix them" in plain.stderr and "gamma: was 99" in plain.stderr
  assert "Traceback" not in plain.stderr and "In call to configurable" not in plain.stderr
  debug = subprocess.run(
    command + ["--debug"], cwd=REPO, capture_output=True, text=True, env=env, timeout=300
  )
  assert debug.returncode != 0 and "Traceback" in debug.stderr


# ----------------------------------------------------------------------------------------------
# Training checkpoints.
# ----------------------------------------------------------------------------------------------
def test_train_resume_falls_back_past_a_corrupt_newest_checkpoint(tmp_path, caplog):
  import numpy as np
  import optax

  from speculative.train import checkpoints as train_checkpoints

  config = tiny_t5_config(1)
  params = random_params(T5(config), 0)  # the model's shapes, no initializer to compile
  optimizer = optax.adam(1e-3)
  state = jax.jit(optimizer.init)(params)  # one compile, not one per op
  train_checkpoints.save_train_state(str(tmp_path), 1, params, state, config=config)
  later = jax.jit(lambda p: jax.tree_util.tree_map(lambda x: x + 1, p))(params)
  newest = train_checkpoints.save_train_state(str(tmp_path), 2, later, state, config=config)
  assert checkpoints.read_metadata(newest)["config"]["num_decoder_layers"] == 1
  (tmp_path / "checkpoint_3.tmp-1-x").mkdir()  # left by a kill
  step, restored, _ = train_checkpoints.restore_latest(str(tmp_path), params, state, config)
  assert step == 2
  (Path(newest) / "optax_state.msgpack").write_bytes(b"\x00" * 10)  # corrupt the newest
  step, restored, _ = train_checkpoints.restore_latest(str(tmp_path), params, state, config)
  assert step == 1 and "checkpoint_2" in caplog.text
  np.testing.assert_array_equal(
    restored["token_embedder"]["embedding"], params["token_embedder"]["embedding"]
  )
  # An optimizer that does not match: the error names the file.
  shutil.rmtree(newest)
  with pytest.raises(
    checkpoints.CheckpointError,
    match="checkpoint_1/optax_state.msgpack: optimizer state does not match",
  ):
    train_checkpoints.restore_latest(
      str(tmp_path), params, optax.sgd(1e-3).init(params) + ({},), config
    )
  assert checkpoints.remove_stale_temporaries(tmp_path) == ["checkpoint_3.tmp-1-x"]


def test_train_prunes_the_checkpoints_a_kill_left(tmp_path):
  """A kill after a checkpoint's rename but before the old ones are deleted leaves one too many
  (the next start prunes it); a kill mid-delete leaves only a `.old-` temporary."""
  import optax

  from speculative.train import checkpoints as train_checkpoints

  config = tiny_t5_config(1)
  params = random_params(T5(config), 0)  # the model's shapes, no initializer to compile
  state = jax.jit(optax.adam(1e-3).init)(params)
  for step in (1, 2, 3):  # as if killed before each save's pruning
    train_checkpoints.save_train_state(str(tmp_path), step, params, state, keep=3, config=config)
  train_checkpoints.prune_checkpoints(str(tmp_path), protect=(1,))  # the run resumed from 1
  assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint_{s}" for s in (1, 2, 3)]
  train_checkpoints.prune_checkpoints(str(tmp_path))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_2", "checkpoint_3"]
  (tmp_path / "checkpoint_1.old-x" / "old").mkdir(parents=True)  # a kill mid-delete
  assert train_checkpoints.restore_latest(str(tmp_path), params, state, config)[0] == 3
  assert checkpoints.remove_stale_temporaries(tmp_path) == ["checkpoint_1.old-x"]


@pytest.mark.slow
def test_second_trainer_on_one_output_dir_is_refused(kill_soak, tmp_path):
  """Two trainers on one run directory: the second is refused, naming the holder's pid, before it
  loads data or compiles (so it cannot prune or overwrite the first one's checkpoints): its data
  loading, wrapped to leave a mark, never ran."""
  out = tmp_path / "run"
  out.mkdir()
  kill_soak.prepare_train(tmp_path)
  python, flag, module, *args = kill_soak.train_command(tmp_path, out)
  assert (flag, module) == ("-m", "speculative.train")
  loaded = tmp_path / "loaded_data"
  wrapped = (
    "import runpy, sys\n"
    "from speculative.train import run\n"
    "load = run._load_examples\n"
    f"run._load_examples = lambda s: (open({str(loaded)!r}, 'w').close(), load(s))[1]\n"
    f"sys.argv = [{module!r}, *sys.argv[1:]]\n"
    f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
  )
  with lock.OutputLock(str(out)):
    proc = subprocess.run(
      [python, "-c", wrapped, *args], cwd=REPO, capture_output=True, text=True, timeout=300
    )
  assert proc.returncode == 2, proc.stderr
  assert f"in use by another run (pid {os.getpid()}" in proc.stderr
  assert not loaded.exists()
  assert sorted(p.name for p in out.iterdir()) == [".lock"]
