"""Two greedy jobs compared row by row (speculative/infer/compare.py): identical jobs pass, a changed
row is audited and a real mismatch exits non-zero, jobs of different inputs are refused."""

import json
import shutil

from model_utils import save_tiny_pair
import pytest

from speculative import infer
from speculative.infer import compare

SOURCES = ["Click OK.", "Open the file menu and choose Save.", "Select a cell range."]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
  """A baseline-only greedy job of a tiny target, and the gin file that names its config."""
  root = tmp_path_factory.mktemp("compare")
  kwargs = save_tiny_pair(root, SOURCES, record_config=False)
  out = root / "a"
  infer.infer(
    output_dir=str(out),
    modes=("baseline",),
    input_prefix="translate English to German: ",
    task_feature_lengths={"inputs": 24, "targets": 8},
    batch_size=1,
    progress=False,
    **kwargs,
  )
  config = kwargs["target_config"]
  gin_file = root / "tiny.gin"
  lines = ["TINY = @tiny/t5.T5Config()", "tiny/t5.T5Config:"]
  for name in ("vocab_size", "dtype", "emb_dim", "num_heads", "num_encoder_layers"):
    lines.append(f"  {name} = {getattr(config, name)!r}")
  for name in ("num_decoder_layers", "head_dim", "mlp_dim", "mlp_activations", "dropout_rate"):
    lines.append(f"  {name} = {getattr(config, name)!r}")
  for name in ("logits_via_embedding", "float32_attention_logits"):
    lines.append(f"  {name} = {getattr(config, name)!r}")
  gin_file.write_text("\n".join(lines) + "\n")
  flags = ["--target_gin_file", str(gin_file), "--macro", "TINY"]
  return root, out, flags + ["--target_checkpoint", kwargs["target_checkpoint"]]


def _copy(root, out, name):
  copy = root / name
  shutil.rmtree(copy, ignore_errors=True)
  shutil.copytree(out, copy)
  return copy / "predictions-baseline.jsonl"


def test_identical_jobs_compare_equal(job, capsys):
  root, out, flags = job
  b = _copy(root, out, "same")
  compare.main([str(out / "predictions-baseline.jsonl"), str(b), *flags])
  assert capsys.readouterr().out.startswith(f"{len(SOURCES)} / {len(SOURCES)} identical")


def test_a_changed_row_is_audited_as_a_mismatch(job, capsys):
  root, out, flags = job
  b = _copy(root, out, "changed")
  records = [json.loads(line) for line in b.read_text().splitlines()]
  first = records[1]["tokens"][0]
  records[1]["tokens"][0] = 5 if first != 5 else 6  # a token the greedy target did not pick
  b.write_text("".join(json.dumps(r) + "\n" for r in records))
  with pytest.raises(SystemExit, match="^1$") as exit_info:
    compare.main([str(out / "predictions-baseline.jsonl"), str(b), *flags])
  assert exit_info.value.code == 1
  printed = capsys.readouterr().out
  assert printed.startswith(f"{len(SOURCES) - 1} / {len(SOURCES)} identical")
  assert "differing examples (in the table, in this order): [1]" in printed
  assert "mismatch" in printed


def test_jobs_of_different_inputs_are_refused(job):
  root, out, flags = job
  b = _copy(root, out, "other_inputs")
  manifest_path = b.parent / "manifest.json"
  manifest = json.loads(manifest_path.read_text())
  manifest["inputs_sha256"] = "0" * 64
  manifest_path.write_text(json.dumps(manifest))
  with pytest.raises(SystemExit, match="differ in inputs_sha256"):
    compare.main([str(out / "predictions-baseline.jsonl"), str(b), *flags])


def test_a_missing_predictions_file_is_one_line(job, tmp_path):
  _, out, flags = job
  with pytest.raises(SystemExit, match="^error: .*missing.jsonl does not exist$"):
    compare.main([str(out / "predictions-baseline.jsonl"), str(tmp_path / "missing.jsonl"), *flags])
  # A predictions file that is there, but not in a job's directory (no manifest beside it).
  loose = tmp_path / "loose" / "predictions-baseline.jsonl"
  loose.parent.mkdir()
  shutil.copy(out / "predictions-baseline.jsonl", loose)
  with pytest.raises(SystemExit, match="^error: .*loose/predictions-baseline.jsonl: no manifest"):
    compare.main([str(out / "predictions-baseline.jsonl"), str(loose), *flags])
