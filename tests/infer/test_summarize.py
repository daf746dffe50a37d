"""The summarization job (configs/local/summarize.gin): the `debian_summarize` task end to end on a
tiny random pair and a temporary corpus, ROUGE in metrics.json and the report, identical greedy
outputs, truncated inputs counted, a malformed TSV line and a missing checkpoint refused."""

import gzip
import json
import os
from pathlib import Path
import subprocess
import sys

from model_utils import save_tiny_pair
import pytest

from speculative import infer
from speculative.data import tasks

REPO = Path(__file__).resolve().parents[2]
ROWS = [
  ("A tool to convert images between formats. It reads PNG and writes JPEG.", "image converter"),
  ("Library for parsing configuration files, with bindings for Python.", "config parser library"),
  ("Documentation for the foo package. " + "It covers every option in detail. " * 6, "foo docs"),
  ("Fonts for the Latin script, in four weights.", "Latin fonts"),
]


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


def test_summarization_job_reports_rouge_with_identical_outputs(corpus_dir, tmp_path):
  out = tmp_path / "out"
  summary = infer.infer(output_dir=str(out), **_job(tmp_path))
  metrics = json.loads((out / "metrics.json").read_text())
  assert metrics["examples"] == len(ROWS)
  assert metrics["identical_outputs"] == len(ROWS)
  assert metrics["inputs_truncated"] == 1  # the long documentation description
  for mode in ("baseline", "speculative"):
    assert {"rouge1", "rouge2", "rougeLsum", "loop_pct"} <= set(metrics[mode])
    assert "bleu" not in metrics[mode]
  assert metrics["baseline"]["rouge1"] == metrics["speculative"]["rouge1"]
  records = [json.loads(line) for line in (out / "predictions-baseline.jsonl").open()]
  assert [r["inputs"] for r in records] == [tasks.SUMMARIZE_PREFIX + d for d, _ in ROWS]
  assert [r["reference"] for r in records] == [s for _, s in ROWS]
  report = (out / "report.md").read_text()
  assert "| mode | ROUGE-1 | ROUGE-2 | ROUGE-Lsum |" in report and "BLEU" not in report
  assert summary["speedup"] > 0


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
