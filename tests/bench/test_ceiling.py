"""speculative.bench.ceiling on the tiny pair: every method's output equals the baseline's, the
oracles accept every draft, and bad settings are refused before any model loads."""

import json
from pathlib import Path
import subprocess
import sys

from model_utils import save_tiny_pair
import numpy as np
import pytest

from speculative import drafters
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
  """End to end at one gamma, 3 (the table test below reuses its compiled programs). That each
  method decodes at its own gamma, not another's or the job's default 4, is the next test's check,
  made without compiling (at these lengths, up to 12 tokens, gamma 3 and 4 need the same number of
  oracle calls)."""
  _, kwargs = settings
  s = infer_settings.InferSettings(**kwargs)
  examples = infer_inputs.load_inputs(s).examples
  gamma = 3
  tallies = ceiling.measure(s, examples, infer_run.load_models(s), (gamma,), log=lambda line: None)
  assert list(tallies) == ["baseline", "draft 3", "oracle+draft 3", "oracle 3", "encoder"]
  lengths = np.asarray(tallies["baseline"].lengths)  # measure checked every output against these
  assert len(lengths) == len(SOURCES) and tallies["baseline"].target_calls == lengths.sum() > 0
  # The tiny draft is imperfect; an oracle needs exactly ceil(n / (gamma + 1)) calls for n tokens.
  calls = int(np.sum(-(-lengths // (gamma + 1))))
  assert tallies[f"oracle {gamma}"].target_calls == calls
  assert tallies[f"oracle+draft {gamma}"].target_calls == calls
  assert tallies[f"draft {gamma}"].target_calls > calls
  assert tallies[f"oracle {gamma}"].lengths == tallies[f"draft {gamma}"].lengths == list(lengths)
  assert all(t.seconds > 0 for t in tallies.values())


def test_each_gamma_gets_its_own_drafters_params_and_gamma(settings, monkeypatch):
  """method_fns for gammas (2, 3): every method decodes with its own gamma (no method bound to
  another's, or to the job's default 4), its drafter (the job's, the oracle around it, the oracle
  alone) and that drafter's params (the baseline's tokens for the oracles). `modes.decode_fns` is
  replaced by a recorder (methods.decode_fn calls it), so nothing compiles: the decodes themselves
  are the test above's."""
  _, kwargs = settings
  s = infer_settings.InferSettings(**kwargs)
  models = infer_run.load_models(s)

  def recorder(target, target_params, drafter=None, draft_params=None, *, options, **unused):
    assert target is models.target and target_params is models.target_params
    spec = lambda encoder_tokens, rng: (drafter, draft_params, options.gamma)  # noqa: E731
    return {"baseline": lambda encoder_tokens, rng: "baseline", "speculative": spec}

  monkeypatch.setattr(ceiling.methods_lib.modes, "decode_fns", recorder)
  fns = ceiling.method_fns(s, models, (2, 3))
  assert list(fns) == ["baseline"] + [
    f"{method} {g}" for g in (2, 3) for method in ("draft", "oracle+draft", "oracle")
  ]
  generated = object()  # what measure passes: the baseline's tokens of the batch
  assert fns["baseline"](None, None, generated) == "baseline"
  for g in (2, 3):
    drafter, params, gamma = fns[f"draft {g}"](None, None, generated)
    assert (drafter, params, gamma) == (models.drafter, models.draft_params, g)
    drafter, params, gamma = fns[f"oracle+draft {g}"](None, None, generated)
    assert isinstance(drafter, drafters.OracleDrafter) and drafter.inner is models.drafter
    assert gamma == g and params["generated"] is generated
    assert params["inner"] is models.draft_params
    drafter, params, gamma = fns[f"oracle {g}"](None, None, generated)
    assert isinstance(drafter, drafters.OracleDrafter) and drafter.inner is None
    assert gamma == g and params == {"generated": generated, "inner": None}


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
