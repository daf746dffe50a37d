"""A newcomer's commands (issue 37): each runner, `speculative-infer`, `speculative-train` and
`speculative-benchmark` (run here as `python -m`), either works or says in one line why not, with
exit status 2 and no traceback: a binding gin cannot parse, a required macro left unset, a missing
results file, an export onto the shipped weights; the program is named after its console script,
and `--help` lists the knobs of a run file for all three.

The subprocess tests start a runner (imports only: every error comes before a model loads) and are
marked slow; `tracked_by_git` and the training settings' guard are also tested in process.
"""

import hashlib
import os
from pathlib import Path
import re
import subprocess
import sys

import gin
import pytest

from speculative.jobs import checks
from speculative.jobs import gin_utils

REPO = Path(__file__).resolve().parents[2]
SHIPPED_TARGET = REPO / "models" / "embedded" / "target.msgpack"
RUNNERS = {
  "infer": "speculative.infer",
  "train": "speculative.train",
  "benchmark": "speculative.benchmark",
}


@pytest.fixture
def clean_gin():
  gin.clear_config()
  gin_utils.register_configurables()
  yield
  gin.clear_config()


def _run(module: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
  env = {k: v for k, v in os.environ.items() if k != gin_utils.DEBUG_ENV}
  return subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=REPO,
    capture_output=True,
    text=True,
    env=env,
    timeout=timeout,
  )


def _one_error_line(proc: subprocess.CompletedProcess, prog: str) -> str:
  """The refusal's only stderr line, after checking exit status 2 and that it is one line of
  `<prog>: error: ...` without a traceback."""
  assert proc.returncode == 2, proc.stderr[-3000:]
  lines = proc.stderr.strip().splitlines()
  assert len(lines) == 1, proc.stderr[-3000:]
  assert "Traceback" not in proc.stderr
  assert lines[0].startswith(f"{prog}: error: "), lines[0]
  return lines[0]


# ----------------------------------------------------------------------------------------------
# Item 2: a binding gin cannot parse, a missing results file.
# ----------------------------------------------------------------------------------------------
SYNTAX_ERRORS = [
  (
    "infer",
    "configs/local/run.gin",
    "INFER_OUTPUT_DIR = /tmp/x",
    """--gin_bindings "INFER_OUTPUT_DIR = /tmp/x": gin cannot parse the value (strings need """
    """quotes: INFER_OUTPUT_DIR = '/tmp/x')""",
  ),
  (
    "infer",
    "configs/local/run.gin",
    "GAMMA = ",
    '--gin_bindings "GAMMA =": gin cannot parse the value (no value after =; the run file has '
    "GAMMA = 'auto')",
  ),
  (
    "benchmark",
    "configs/benchmark/embedded.gin",
    "benchmark.output_dir = /tmp/x",
    """--gin_bindings "benchmark.output_dir = /tmp/x": gin cannot parse the value (strings need """
    """quotes: benchmark.output_dir = '/tmp/x')""",
  ),
]


@pytest.mark.slow
@pytest.mark.parametrize(
  "runner,gin_file,binding,message", SYNTAX_ERRORS, ids=["unquoted", "no_value", "benchmark"]
)
def test_a_binding_gin_cannot_parse_is_one_line(runner, gin_file, binding, message):
  proc = _run(RUNNERS[runner], f"--gin_file={gin_file}", f"--gin_bindings={binding}")
  assert _one_error_line(proc, f"speculative-{runner}") == f"speculative-{runner}: error: {message}"


@pytest.mark.slow
def test_render_of_a_missing_results_file_is_one_line(tmp_path):
  proc = _run(RUNNERS["benchmark"], "--render", str(tmp_path / "missing.json"))
  line = _one_error_line(proc, "speculative-benchmark")
  assert f"does not exist: {tmp_path / 'missing.json'}" in line
  (tmp_path / "bad.json").write_text("not json")
  proc = _run(RUNNERS["benchmark"], "--render", str(tmp_path / "bad.json"))
  assert "bad.json is not a results.json" in _one_error_line(proc, "speculative-benchmark")
  (tmp_path / "list.json").write_text("[1, 2]")  # JSON, but not the benchmark's
  proc = _run(RUNNERS["benchmark"], "--render", str(tmp_path / "list.json"))
  line = _one_error_line(proc, "speculative-benchmark")
  assert "list.json is not the benchmark's results.json" in line


# ----------------------------------------------------------------------------------------------
# Item 3: a required macro left unset is named, not gin's sentinel object.
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_required_macro_left_unset_is_named():
  proc = _run(
    RUNNERS["infer"],
    "--gin_file=configs/local/experiments/ende_small_t0.gin",
    "--gin_bindings=DRAFT_CHECKPOINT_PATH = '/ckpt/draft'",
    "--gin_bindings=INFER_OUTPUT_DIR = '/tmp/out'",
  )
  line = _one_error_line(proc, "speculative-infer")
  assert "CHECKPOINT_PATH is required" in line and "%gin.REQUIRED" in line
  assert '--gin_bindings="CHECKPOINT_PATH = ..."' in line
  assert "<object object" not in line


# ----------------------------------------------------------------------------------------------
# Item 9: the console script's name, `--help` for all three runners.
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_python_m_names_the_console_script(runner):
  proc = _run(RUNNERS[runner], "--no_such_option")
  assert proc.returncode == 2
  assert f"speculative-{runner}: error: unrecognized arguments: --no_such_option" in proc.stderr
  assert f"usage: speculative-{runner}" in proc.stderr
  assert "__main__.py" not in proc.stderr


HELP_KNOBS = {
  "infer": [
    "GAMMA = 'auto'",
    "INPUT_FILE = None",
    "INPUT_PREFIX = 'translate English to German: '",
  ],
  "train": ["train.num_steps = ", "train.export_path = '../runs/"],
  "benchmark": ["benchmark.gammas = {", "benchmark.output_dir = 'docs'"],
}


@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_help_lists_the_knobs_of_a_run_file(runner):
  proc = _run(RUNNERS[runner], "--help")
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"usage: speculative-{runner}" in proc.stdout
  for line in HELP_KNOBS[runner]:
    assert f"\n  {line}" in proc.stdout, (line, proc.stdout[-3000:])
  assert "cudart" not in proc.stderr and "oneDNN" not in proc.stderr


@pytest.mark.slow
def test_the_quick_help_says_how_many_gammas_quick_gin_has(clean_gin):
  """`speculative-benchmark --help` says what configs/benchmark/quick.gin runs: its gammas."""
  from speculative.bench import main as bench_main

  gin.external_configurable(bench_main.benchmark, "benchmark")
  gin_utils.parse(["configs/benchmark/embedded.gin", bench_main.DEFAULT_QUICK_GIN], [])
  gammas = {g for batch in gin.query_parameter("benchmark.gammas").values() for g in batch}
  help_text = " ".join(_run(RUNNERS["benchmark"], "--help").stdout.split())
  assert {1: "one gamma,", 2: "two gammas,"}[len(gammas)] in help_text, help_text


# ----------------------------------------------------------------------------------------------
# Item 8: training refuses to export onto a file git tracks (the shipped weights).
# ----------------------------------------------------------------------------------------------
def test_tracked_by_git_knows_the_shipped_weights_and_nothing_outside(tmp_path):
  assert checks.tracked_by_git(SHIPPED_TARGET)
  assert checks.tracked_by_git(os.path.relpath(SHIPPED_TARGET))  # relative to the working dir
  assert not checks.tracked_by_git(REPO / "models" / "embedded" / "new.msgpack")
  assert not checks.tracked_by_git(tmp_path / "x.msgpack")  # outside the repository
  assert not checks.tracked_by_git(SHIPPED_TARGET, repo_root=tmp_path)  # not a repository


def _train_kwargs(tmp_path, **changes):
  from model_utils import tiny_t5_config

  data = REPO / "data" / "libreoffice_ende"
  return dict(
    model_config=tiny_t5_config(1),
    train_tsv=str(data / "validation.tsv.gz"),
    validation_tsv=str(data / "validation.tsv.gz"),
    spm_model=str(data / "spm8k.model"),
    output_dir=str(tmp_path / "run"),
    num_steps=1,
    **changes,
  )


def test_train_settings_refuse_an_export_onto_a_tracked_file(tmp_path):
  from speculative.train import settings as train_settings

  with pytest.raises(ValueError, match="train.export_overwrites_tracked = True") as info:
    train_settings.TrainSettings(**_train_kwargs(tmp_path, export_path=str(SHIPPED_TARGET)))
  assert f"export_path {SHIPPED_TARGET} is a file tracked by git" in str(info.value)
  train_settings.TrainSettings(
    **_train_kwargs(tmp_path, export_path=str(SHIPPED_TARGET), export_overwrites_tracked=True)
  )
  train_settings.TrainSettings(**_train_kwargs(tmp_path, export_path=str(tmp_path / "w.msgpack")))


@pytest.mark.slow
def test_train_refuses_to_export_onto_the_shipped_weights_before_any_compute(tmp_path):
  # export_only with no checkpoint: should the guard fail, the run stops at "no checkpoint" (a
  # traceback, exit 1) without writing the shipped weights.
  before = hashlib.sha256(SHIPPED_TARGET.read_bytes()).hexdigest()
  data = REPO / "data" / "libreoffice_ende"
  bindings = [
    "train.model_config = @t5.T5Config()",
    f"train.train_tsv = '{data / 'validation.tsv.gz'}'",
    f"train.validation_tsv = '{data / 'validation.tsv.gz'}'",
    f"train.spm_model = '{data / 'spm8k.model'}'",
    f"train.output_dir = '{tmp_path / 'run'}'",
    "train.num_steps = 1",
    "train.export_only = True",
    f"train.export_path = '{os.path.relpath(SHIPPED_TARGET, REPO)}'",
  ]
  (tmp_path / "train.gin").write_text("\n".join(bindings) + "\n")
  proc = _run(RUNNERS["train"], f"--gin_file={tmp_path / 'train.gin'}")
  line = _one_error_line(proc, "speculative-train")
  assert re.search(r"export_path \S*models/embedded/target.msgpack is a file tracked by git", line)
  assert "train.export_overwrites_tracked = True" in line
  assert not (tmp_path / "run").exists()  # refused before the run directory is made
  assert hashlib.sha256(SHIPPED_TARGET.read_bytes()).hexdigest() == before


def test_the_shipped_run_file_works_from_another_directory(
  clean_gin, tmp_path, monkeypatch, caplog
):
  """From outside the repository, `--gin_file=<repo>/configs/local/run.gin` finds its includes
  without gin's 'Path not found' lines, and the run file's relative checkpoint paths resolve into
  the repository (checks.resolve_input_path); the output directory stays relative to the working
  directory. Stops with the settings, before any weights load."""
  from speculative.infer import run as infer_run

  seen = {}

  def settings_only(settings, claim):
    seen["settings"] = settings
    return {}

  monkeypatch.setattr(infer_run, "_run", settings_only)
  monkeypatch.chdir(tmp_path)
  caplog.set_level("INFO")
  infer_run.main(
    [f"--gin_file={REPO / 'configs' / 'local' / 'run.gin'}", "--gin_bindings=NUM_EXAMPLES = 1"]
  )
  assert not [r for r in caplog.records if "Path not found" in r.getMessage()]
  settings = seen["settings"]
  assert settings.target_checkpoint == str(REPO / "models" / "embedded" / "target.msgpack")
  assert settings.draft_checkpoint == str(REPO / "models" / "embedded" / "draft.msgpack")
  assert settings.output_dir == "outputs/embedded_run"  # here, in the working directory
  assert (tmp_path / "outputs" / "embedded_run").is_dir()


def test_resolve_input_path_prefers_the_working_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert checks.resolve_input_path("models/embedded/target.msgpack") == str(SHIPPED_TARGET)
  (tmp_path / "models" / "embedded").mkdir(parents=True)
  (tmp_path / "models" / "embedded" / "target.msgpack").write_bytes(b"mine")
  assert checks.resolve_input_path("models/embedded/target.msgpack") == (
    "models/embedded/target.msgpack"
  )
  assert checks.resolve_input_path("nowhere.msgpack") == "nowhere.msgpack"  # refused later
  assert checks.resolve_input_path("/abs/nowhere") == "/abs/nowhere"
  assert checks.resolve_input_path(None) is None


@pytest.mark.slow
def test_help_from_another_directory_logs_no_missing_includes(tmp_path):
  """The console script from outside the checkout: no 'Path not found' lines on stderr."""
  env = {k: v for k, v in os.environ.items() if k != gin_utils.DEBUG_ENV}
  env["PYTHONPATH"] = str(REPO)  # this checkout's package, whatever is installed
  proc = subprocess.run(
    [sys.executable, "-m", "speculative.infer", "--help"]
    + [f"--gin_file={REPO / 'configs' / 'local' / 'run.gin'}"],
    cwd=tmp_path,
    capture_output=True,
    text=True,
    env=env,
    timeout=300,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Path not found" not in proc.stderr and "Traceback" not in proc.stderr
  assert "CHECKPOINT_PATH = 'models/embedded/target.msgpack'" in proc.stdout


# ----------------------------------------------------------------------------------------------
# Item 4 for train and the benchmark: their shipped run files from another directory.
# ----------------------------------------------------------------------------------------------
def _settings_from_another_directory(module, argv, cwd, monkeypatch, caplog):
  """The settings `module.main(argv)` builds when started in `cwd` (its `_run` replaced: nothing
  is computed), after checking that gin logged no 'Path not found' line."""
  seen = {}
  monkeypatch.setattr(module, "_run", lambda settings: seen.setdefault("settings", settings))
  monkeypatch.chdir(cwd)
  caplog.set_level("INFO")
  module.main(argv)
  assert not [r for r in caplog.records if "Path not found" in r.getMessage()]
  return seen["settings"]


def test_train_and_benchmark_run_files_resolve_from_another_directory(
  clean_gin, tmp_path, monkeypatch, caplog
):
  """`speculative-train` and `speculative-benchmark` follow infer's rule (checks.resolve_input_path
  through checks.resolve_input_fields): the shipped run files' relative data and checkpoint paths
  resolve into the repository, outputs stay relative to the working directory."""
  from speculative.bench import main as bench_main
  from speculative.train import run as train_run

  cwd = tmp_path / "a" / "b"  # the run file's ../runs/... output lands in tmp_path/a/runs
  cwd.mkdir(parents=True)
  data = REPO / "data"
  train = _settings_from_another_directory(
    train_run,
    [f"--gin_file={REPO / 'configs' / 'train' / 'small_target.gin'}"],
    cwd,
    monkeypatch,
    caplog,
  )
  assert train.train_tsv == [
    str(data / "libreoffice_ende" / "train.tsv.gz"),
    str(data / "libreoffice_ui_ende" / "train.tsv.gz"),
  ]
  assert train.validation_tsv == str(data / "libreoffice_ende" / "validation.tsv.gz")
  assert train.spm_model == str(data / "libreoffice_ende" / "spm8k.model")
  assert train.exclude_heldout[1] == str(data / "libreoffice_ende" / "test.tsv.gz")
  assert train.output_dir == "../runs/embedded_target_t5x_recipe"  # relative to the working dir
  assert (tmp_path / "a" / "runs" / "embedded_target_t5x_recipe").is_dir()

  gin.clear_config()
  bench = _settings_from_another_directory(
    bench_main,
    [f"--gin_file={REPO / 'configs' / 'benchmark' / 'embedded.gin'}", "--quick"],
    cwd,
    monkeypatch,
    caplog,
  )
  assert bench.target_checkpoint == str(SHIPPED_TARGET)  # not random weights: quick allows them
  assert bench.draft_checkpoint == str(REPO / "models" / "embedded" / "draft.msgpack")
  assert bench.output_dir == "outputs/benchmark_quick"


# ----------------------------------------------------------------------------------------------
# Item 9, the benchmark's output: no start-up lines, a cost line without a stray ', ;', a summary
# and the page's path on stdout instead of the page.
# ----------------------------------------------------------------------------------------------
TINY_BENCHMARK = """\
# A benchmark of seconds: a random-init tiny target, one input, one model-free drafter (no draft
# model, so the cost line has no draft step), no plots.
benchmark.target_config = @t5.T5Config()
t5.T5Config.vocab_size = 8000
t5.T5Config.emb_dim = 16
t5.T5Config.num_heads = 2
t5.T5Config.num_encoder_layers = 1
t5.T5Config.num_decoder_layers = 1
t5.T5Config.head_dim = 8
t5.T5Config.mlp_dim = 32
benchmark.target_checkpoint = None
benchmark.allow_random_init = True
benchmark.task = None
benchmark.input_file = 'data/libreoffice_ende/test.tsv.gz'  # the repository's, from anywhere
benchmark.input_prefix = 'translate English to German: '
benchmark.drafters = ['prompt_lookup']
benchmark.num_examples = 1
benchmark.batch_sizes = [1]
benchmark.temperatures = [0.0]
benchmark.gammas = [1]
benchmark.max_new_tokens = 4
benchmark.cost_position = 2
benchmark.repeats = 1
benchmark.cost_repeats = 3
benchmark.cost_min_seconds = 0.01
benchmark.stock_t5x = 'off'
benchmark.kernels = 'off'
benchmark.plots = False
benchmark.output_dir = 'out'
"""
STARTUP_LINES = ("cuInit", "cudart", "oneDNN", "absl::InitializeLog", "cpu_feature_guard")


def _run_in(cwd, module: str, *args: str, pythonpath=(), timeout=600):
  env = {k: v for k, v in os.environ.items() if k != gin_utils.DEBUG_ENV}
  env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(REPO)])
  return subprocess.run(
    [sys.executable, "-m", module, *args],
    cwd=cwd,
    capture_output=True,
    text=True,
    env=env,
    timeout=timeout,
  )


@pytest.mark.slow
def test_tiny_benchmark_from_another_directory_prints_a_summary(tmp_path):
  (tmp_path / "tiny.gin").write_text(TINY_BENCHMARK)
  proc = _run_in(tmp_path, RUNNERS["benchmark"], "--gin_file=tiny.gin")
  assert proc.returncode == 0, proc.stderr[-3000:]
  for noise in STARTUP_LINES:
    assert noise not in proc.stderr, proc.stderr[-3000:]
  test_split = REPO / "data" / "libreoffice_ende" / "test.tsv.gz"
  assert f"inputs: the first 1 lines of `{test_split}`" in proc.stdout
  (cost_line,) = [line for line in proc.stdout.splitlines() if "stock-equivalent step" in line]
  assert re.search(r"target step [\d.]+ ms, stock-equivalent step [\d.]+ ms; v=1:", cost_line)
  assert ", ;" not in proc.stdout
  # The summary and the page's path, not the page.
  assert "batch 1, temperature 0.0: prompt_lookup best measured gamma 1 (" in proc.stdout
  assert proc.stdout.rstrip().endswith(
    "wrote the results page out/results.md, and results.json in out"
  )
  page = (tmp_path / "out" / "results.md").read_text()
  assert "## Machine" in page and "## Machine" not in proc.stdout
  assert not [line for line in proc.stdout.splitlines() if line.startswith("|")]


FAKE_TENSORFLOW = """\
# A stand-in for TensorFlow's start-up: the C++ lines it prints on a machine without a GPU, and one
# line that is not start-up noise.
import os

os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written to "
            b"STDERR\\n")
os.write(2, b"I0000 00:00:1.0 1 cudart_stub.cc:31] Could not find cuda drivers on your machine\\n")


class config:
  @staticmethod
  def set_visible_devices(devices, kind):
    os.write(2, b"E0000 00:00:1.0 1 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR\\n")
    os.write(2, b"E0000 00:00:1.0 1 some_op.cc:1] a real error of the native library\\n")
"""


def test_start_up_noise_is_dropped_and_a_real_error_line_kept(tmp_path):
  """TensorFlow is imported only where a job reads a seqio task (`gin_utils.import_tensorflow`), and
  there its known start-up lines (gin_utils.STARTUP_NOISE) are dropped, not all of its stderr: a
  line that is not start-up noise still shows. A runner that reads no task never imports it."""
  (tmp_path / "fake" / "tensorflow").mkdir(parents=True)
  (tmp_path / "fake" / "tensorflow" / "__init__.py").write_text(FAKE_TENSORFLOW)
  proc = _run_in(REPO, RUNNERS["benchmark"], "--help", pythonpath=[tmp_path / "fake"], timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "usage: speculative-benchmark" in proc.stdout
  assert proc.stderr == ""  # the (fake) TensorFlow was never imported
  code = "from speculative.jobs import gin_utils; gin_utils.quiet_native_logs(); "
  code += "gin_utils.import_tensorflow(); print('imported')"
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), str(REPO)])}
  proc = subprocess.run(
    [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=env, timeout=300
  )
  assert proc.returncode == 0 and proc.stdout == "imported\n", proc.stderr[-3000:]
  assert proc.stderr.splitlines() == [
    "E0000 00:00:1.0 1 some_op.cc:1] a real error of the native library"
  ]
