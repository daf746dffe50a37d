"""The summarization job (configs/local/summarize.gin): the run file end to end on the correlated
tiny pair (drafts accepted and rejected) and a temporary corpus, ROUGE in metrics.json and the
report as computed from the predictions, identical greedy outputs, truncated inputs counted; under
sampling, a run SIGKILLed mid-write resumes to predictions byte-identical to an uninterrupted run;
a malformed TSV line and a missing checkpoint refused."""

import dataclasses
import gzip
import json
import os
from pathlib import Path
import subprocess
import sys

import gin
import model_utils
from model_utils import save_tiny_pair
import pytest
from rouge_score import rouge_scorer

from speculative import infer
from speculative.data import tasks
from speculative.infer import outputs as infer_outputs

REPO = Path(__file__).resolve().parents[2]
ROWS = [
  # This synopsis shares words with what the correlated pair writes for its description ("DB
  # DocInformation Wikipedia ..."), so the ROUGE checks below compare numbers that are not all 0.
  (
    "A tool to convert images between formats. It reads PNG and writes JPEG.",
    "image converter (DocInformation Wikipedia)",
  ),
  ("Library for parsing configuration files, with bindings for Python.", "config parser library"),
  ("Documentation for the foo package. " + "It covers every option in detail. " * 6, "foo docs"),
  ("Fonts for the Latin script, in four weights.", "Latin fonts"),
  ("Command line client for the bar service, written in Go.", "bar client"),
  ("Shared libraries of the baz compression format.", "baz libraries"),
]
# Every input has 17 to 24 tokens with its prefix and EOS (the documentation one is cut to 24): one
# padded length, so each mode compiles one program.
RUN_FILE = "configs/local/summarize.gin"


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
  """A temporary data/debian_descriptions with ROWS as every split; the task reads it (every job
  registers the tasks afresh, so later jobs read the shipped corpus again)."""
  data = tmp_path / "debian_descriptions"
  data.mkdir()
  for split in ("train", "validation", "test"):
    with gzip.open(data / f"{split}.tsv.gz", "wt", encoding="utf-8") as f:
      f.writelines(f"{d}\t{s}\n" for d, s in ROWS)
  monkeypatch.setattr(tasks, "SUMMARIZATION_DATA_DIR", data)
  return data


def _job(tmp_path):
  kwargs = save_tiny_pair(tmp_path, [], record_config=False)
  del kwargs["input_file"]
  return dict(
    **kwargs,
    mixture_or_task_name=tasks.DEBIAN_SUMMARIZE_TASK,
    split="test",
    task_feature_lengths={"inputs": 24, "targets": 8},
    batch_size=1,
    gamma=3,
    progress=False,
  )


def _run_file_argv(tmp_path, out, **macros) -> list[str]:
  """The summarization run file's command line on the correlated tiny pair (model_utils): its
  checkpoints, the embedded configs' scopes bound to the tiny pair's sizes, `out`, and `macros`."""
  pair = save_tiny_pair(tmp_path, [], record_config=True)
  bindings = [
    f"CHECKPOINT_PATH = '{pair['target_checkpoint']}'",
    f"DRAFT_CHECKPOINT_PATH = '{pair['draft_checkpoint']}'",
    f"INFER_OUTPUT_DIR = '{out}'",
    "TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 12}",
    "infer.progress = False",
    *(f"{name} = {value!r}" for name, value in macros.items()),
  ]
  for scope, config in (
    ("embedded_target", pair["target_config"]),
    ("embedded_draft", pair["draft_config"]),
  ):
    bindings += [f"{scope}/t5.T5Config.{k} = {v!r}" for k, v in dataclasses.asdict(config).items()]
  return [f"--gin_file={RUN_FILE}", *(f"--gin_bindings={b}" for b in bindings)]


def _main(argv):
  """`python -m speculative.infer ARGV` in this process (so the corpus fixture applies)."""
  try:
    return infer.main(argv)
  finally:
    gin.clear_config()


def _rouge(records) -> dict[str, float]:
  """ROUGE-1/2/Lsum F x 100, the mean over the records, straight from the rouge-score package (one
  sentence a line for Lsum, as T5 scores it): what the job's metrics must say."""
  scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeLsum"])
  scores = [
    scorer.score(r["reference"].replace(" . ", " .\n"), r["prediction"].replace(" . ", " .\n"))
    for r in records
  ]
  return {k: 100 * sum(s[k].fmeasure for s in scores) / len(scores) for k in scores[0]}


def test_the_run_file_summarizes_with_accepted_drafts_and_reports_rouge(
  corpus_dir, tmp_path, monkeypatch
):
  """configs/local/summarize.gin, greedy at batch 2 on the correlated pair: the speculative rows
  accept and reject drafts, some end at EOS and some at the length cap, and every output equals the
  baseline's; metrics.json's ROUGE is the rouge-score package's on the written predictions, and the
  report's table shows those numbers."""
  monkeypatch.chdir(REPO)
  out = tmp_path / "out"
  _main(_run_file_argv(tmp_path, out, BATCH_SIZE=2, GAMMA=3))  # a fixed gamma: drafts accepted
  metrics = json.loads((out / "metrics.json").read_text())
  assert (metrics["examples"], metrics["batch_size"], metrics["temperature"]) == (len(ROWS), 2, 0.0)
  assert metrics["identical_outputs"] == len(ROWS)
  assert metrics["inputs_truncated"] == 1  # the long documentation description
  records = {mode: _records(out, mode) for mode in ("baseline", "speculative")}
  assert [r["tokens"] for r in records["speculative"]] == [r["tokens"] for r in records["baseline"]]
  events = model_utils.speculation_events(records["speculative"], 3, 12)
  assert 0 < events["accepted"] < events["drafted"], events
  assert events["partial"] and events["eos"] and events["capped"], events
  assert [r["inputs"] for r in records["baseline"]] == [tasks.SUMMARIZE_PREFIX + d for d, _ in ROWS]
  assert [r["reference"] for r in records["baseline"]] == [s for _, s in ROWS]
  report = (out / "report.md").read_text()
  assert "| mode | ROUGE-1 | ROUGE-2 | ROUGE-Lsum |" in report and "BLEU" not in report
  for mode in ("baseline", "speculative"):
    expected = _rouge(records[mode])
    assert expected["rouge1"] > 0 and expected["rouge2"] > 0  # the first synopsis (ROWS)
    assert {k: metrics[mode][k] for k in expected} == pytest.approx(expected, abs=1e-9)
    assert "bleu" not in metrics[mode]
    cells = " | ".join(f"{expected[k]:.2f}" for k in ("rouge1", "rouge2", "rougeLsum"))
    assert f"| {mode} | {cells} | " in report
  assert metrics["speedup"] > 0


def _records(out, mode):
  return [json.loads(line) for line in (out / f"predictions-{mode}.jsonl").open()]


@pytest.mark.slow  # three runs of the job, one of them a fresh process
def test_a_run_killed_mid_write_resumes_byte_identical_under_sampling(
  corpus_dir, tmp_path, monkeypatch, kill_soak
):
  """TEMPERATURE 1 at batch 2 (3 batches): the real CLI, SIGKILLed while it writes the second
  batch's speculative predictions (its baseline ones written, a temporary left), resumes: the
  temporary is removed, only what is missing is decoded (that batch's speculative rows, the last
  batch's), and the predictions are byte-identical to an uninterrupted run's with the same seed.
  Each batch's sampling key must come from the batch itself, not from how many batches this
  process has decoded."""
  monkeypatch.chdir(REPO)
  out, fresh = tmp_path / "out", tmp_path / "fresh"
  macros = dict(BATCH_SIZE=2, TEMPERATURE=1.0, SEED=3)
  argv = _run_file_argv(tmp_path, out, **macros)
  kill_soak.kill_at_write(
    [sys.executable, "-m", "speculative.infer", *argv],
    out,
    "predictions-speculative.jsonl",
    2,
    mid_write=True,
    log=tmp_path / "killed.log",
    setup=f"from speculative.data import tasks; tasks.SUMMARIZATION_DATA_DIR = {str(corpus_dir)!r}",
  )
  done = {m: {r["index"] for r in _records(out, m)} for m in ("baseline", "speculative")}
  assert [len(done[m]) for m in ("baseline", "speculative")] == [4, 2]
  assert list(out.glob("predictions-speculative.jsonl.tmp-*"))  # killed mid-write
  original = infer_outputs.record
  decoded = []
  monkeypatch.setattr(
    infer_outputs,
    "record",
    lambda example, *a: decoded.append(example.index) or original(example, *a),
  )
  _main(argv)
  # Each mode decoded only its missing rows: the second batch's baseline rows were not redone.
  missing = [i for m in done for i in range(len(ROWS)) if i not in done[m]]
  assert sorted(decoded) == sorted(missing) and len(decoded) == 6
  assert not kill_soak.leftovers(out)
  metrics = json.loads((out / "metrics.json").read_text())
  assert (metrics["examples"], metrics["temperature"]) == (len(ROWS), 1.0)
  monkeypatch.setattr(infer_outputs, "record", original)
  _main(_run_file_argv(tmp_path, fresh, **macros))
  for mode in ("baseline", "speculative"):
    name = f"predictions-{mode}.jsonl"
    assert (out / name).read_bytes() == (fresh / name).read_bytes(), mode


def test_a_malformed_corpus_line_names_the_file_and_line(corpus_dir, tmp_path):
  with gzip.open(corpus_dir / "test.tsv.gz", "wt", encoding="utf-8") as f:
    f.write("a description\ta synopsis\nno tab on this line\n")
  with pytest.raises(ValueError, match=r"test\.tsv\.gz:2: expected 2 tab-separated fields"):
    infer.infer(output_dir=str(tmp_path / "out"), **_job(tmp_path))


def test_the_run_file_refuses_a_missing_checkpoint_in_one_line(tmp_path):
  missing = tmp_path / "target.msgpack"
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "speculative.infer",
      "--gin_file=configs/local/summarize.gin",
      f"--gin_bindings=CHECKPOINT_PATH = '{missing}'",
      f"--gin_bindings=INFER_OUTPUT_DIR = '{tmp_path / 'out'}'",
    ],
    cwd=REPO,
    capture_output=True,
    text=True,
    env={k: v for k, v in os.environ.items() if k != "SPECULATIVE_DEBUG"},
    timeout=300,
  )
  assert result.returncode == 2
  assert f"error: target_checkpoint does not exist: {missing}" in result.stderr
  assert "Traceback" not in result.stderr
