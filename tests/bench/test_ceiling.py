"""speculative.bench.ceiling on the tiny pair: every method's output equals the baseline's, the
oracles accept every draft, and bad settings are refused before any model loads."""

import json
from pathlib import Path
import subprocess
import sys

from model_utils import save_tiny_pair
import numpy as np
import pytest

from speculative.bench import ceiling
from speculative.infer import inputs as infer_inputs
from speculative.infer import run as infer_run
from speculative.infer import settings as infer_settings

REPO = Path(__file__).resolve().parents[2]
SOURCES = ["Click OK.", "Open the file menu and choose Save.", "Hello", "Select a cell range."]


@pytest.fixture(scope="module")
def settings(tmp_path_factory):
  root = tmp_path_factory.mktemp("ceiling")
  return root, dict(
    **save_tiny_pair(root, SOURCES, record_config=False),
    output_dir=str(root / "unused"),
    input_prefix="translate English to German: ",
    task_feature_lengths={"inputs": 24, "targets": 12},
    progress=False,
  )


def test_oracles_accept_every_draft_and_every_output_is_the_baselines(settings):
  _, kwargs = settings
  s = infer_settings.InferSettings(**kwargs)
  examples = infer_inputs.load_inputs(s).examples
  tallies = ceiling.measure(s, examples, infer_run.load_models(s), (2, 3), log=lambda line: None)
  assert list(tallies) == [
    "baseline",
    "draft 2",
    "oracle+draft 2",
    "oracle 2",
    "draft 3",
    "oracle+draft 3",
    "oracle 3",
    "encoder",
  ]
  lengths = np.asarray(tallies["baseline"].lengths)  # measure checked every output against these
  assert len(lengths) == len(SOURCES) and tallies["baseline"].target_calls == lengths.sum() > 0
  for gamma in (2, 3):
    # The tiny draft is imperfect; an oracle needs exactly ceil(n / (gamma + 1)) calls for n tokens.
    calls = int(np.sum(-(-lengths // (gamma + 1))))
    assert tallies[f"oracle {gamma}"].target_calls == calls
    assert tallies[f"oracle+draft {gamma}"].target_calls == calls
    assert tallies[f"draft {gamma}"].target_calls > calls
    assert tallies[f"oracle {gamma}"].lengths == tallies[f"draft {gamma}"].lengths == list(lengths)
  assert all(t.seconds > 0 for t in tallies.values())


def test_the_table_is_printed_and_written(settings, capsys):
  root, kwargs = settings
  out = root / "ceiling.json"
  result = ceiling.run(infer_settings.InferSettings(**kwargs), (3,), str(out))
  rows = {r["method"]: r for r in result["rows"]}
  assert list(rows) == ["baseline", "draft 3", "oracle+draft 3", "oracle 3", "encoder"]
  assert rows["baseline"]["speedup"] == 1.0 and rows["baseline"]["block_efficiency"] == 1.0
  assert rows["oracle 3"]["block_efficiency"] > rows["draft 3"]["block_efficiency"]
  assert 0 < rows["encoder"]["share_of_baseline"] < 1 and rows["encoder"]["tokens"] is None
  assert json.loads(out.read_text())["rows"] == result["rows"]
  printed = capsys.readouterr().out
  assert "| oracle 3 |" in printed and "load average" in printed


def test_a_differing_output_stops_the_run():
  class Result:
    def __init__(self, tokens):
      self.tokens, self.lengths = np.asarray(tokens), np.asarray([len(tokens[0])])

  class Example:
    index = 7

  ceiling._check_same("oracle 3", Result([[4, 5, 1]]), Result([[4, 5, 1]]), [Example()])
  with pytest.raises(
    RuntimeError, match=r"oracle 3: output differs from the baseline on examples \[7\]"
  ):
    ceiling._check_same("oracle 3", Result([[4, 6, 1]]), Result([[4, 5, 1]]), [Example()])


def test_bad_settings_are_refused(settings):
  _, kwargs = settings
  with pytest.raises(ValueError, match="greedy decoding: TEMPERATURE must be 0"):
    ceiling.run(infer_settings.InferSettings(**kwargs, temperature=0.7), (3,), None)
  with pytest.raises(ValueError, match="exact decodes: LENIENCE must be 1"):
    ceiling.run(infer_settings.InferSettings(**kwargs, lenience=0.5), (3,), None)
  with pytest.raises(ValueError, match="needs the job's speculative mode"):
    ceiling.run(infer_settings.InferSettings(**kwargs, modes=("baseline",)), (3,), None)
  with pytest.raises(ValueError, match=r"--gammas: each must be in \[1, 32\]"):
    ceiling.parse_gammas("3,0")
  with pytest.raises(ValueError, match="comma-separated ints"):
    ceiling.parse_gammas("three")


def test_the_command_line_refuses_in_one_line_before_loading_models():
  for flags, message in (
    (['--gin_bindings=TEMPERATURE = 0.5'], "TEMPERATURE must be 0"),
    (['--gammas=3,x'], "--gammas must be comma-separated ints, got '3,x'"),
  ):
    done = subprocess.run(
      [
        sys.executable,
        "-m",
        "speculative.bench.ceiling",
        "--gin_file=configs/local/run.gin",
        *flags,
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stdout == ""  # nothing decoded, no table
