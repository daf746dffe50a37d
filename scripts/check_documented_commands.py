"""Runs every command that README.md and the user-facing docs document, at a small size, in a fresh
clone of this checkout's HEAD: the pre-release check of issue 37 (every documented command works as
written, or says in one line why not).

  .venv/bin/python scripts/check_documented_commands.py [--only NAME,...] [--list] [--keep]
                                                        [--docs_only [--root DIR]]

Prints one line per command, `PASS`, `NEEDS <what>` or `FAIL`, with its seconds, then the counts;
exits 1 if any failed. What it does:

* Clones HEAD into a temporary directory (`git clone --shared`: nothing is copied but the working
  tree; uncommitted changes are not in it, as in a user's clone), links `.venv` there to the
  environment running this script, and runs each command with bash in the clone (or, for the
  "from any directory" command, in a directory outside it), with PYTHONPATH at the clone.
* Each command is the documented one with bindings that make it small (2 examples, 1 training
  step, 1 timing round, ...); `make run` is run as its recipe (make itself would reinstall into
  the linked environment). Outputs stay in the temporary directory, removed at the end.
* A command whose prerequisite is not on this machine (the TFDS WMT data, t5x, a GPU, the outputs
  of an earlier training stage) is `NEEDS <what>`: where the command itself checks it, it is still
  run and must stop with exit status 2 and the one line the docs quote; where it cannot start at
  all (t5x is not installed), it is not run.
* Before any run, each command's documented text must still be in its document (whitespace
  collapsed), and every command in README's "From a fresh clone: the first hour" must be one of
  the list (`--docs_only` checks only this, in a second; tests/test_layout.py runs it).

The whole list takes well over a minute (each decode command compiles its programs: 1-3 minutes
on a 2-core CPU), so it is the pre-release check, not part of `make test` (docs/batch_jobs.md,
"Before a release").
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
from pathlib import Path
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
README = 'README.md'
FIRST_HOUR = '## From a fresh clone: the first hour'

# Bindings that make the documented commands small.
TWO = ' --gin_bindings="NUM_EXAMPLES = 2"'
TRAIN_SMALL = (
  ' --gin_bindings="train.num_steps = 1" --gin_bindings="train.eval_every = 1"'
  ' --gin_bindings="train.checkpoint_every = 1" --gin_bindings="train.max_validation_examples = 4"'
  ' --gin_bindings="train.tokens_per_batch = 256"'
)
BENCH_SMALL = (
  ' --gin_bindings="benchmark.num_examples = 1" --gin_bindings="benchmark.batch_sizes = [1]"'
  ' --gin_bindings="benchmark.temperatures = [0.0]" --gin_bindings="benchmark.gammas = [1]"'
  " --gin_bindings=\"benchmark.drafters = ['model']\" --gin_bindings=\"benchmark.drafter_gammas = {}\""
  ' --gin_bindings="benchmark.max_new_tokens = 4" --gin_bindings="benchmark.cost_position = 2"'
  ' --gin_bindings="benchmark.repeats = 1" --gin_bindings="benchmark.cost_repeats = 3"'
  ' --gin_bindings="benchmark.cost_min_seconds = 0.01" --gin_bindings="benchmark.plots = False"'
)
TINY_CKPT = '{clone}/tests/fixtures/t5x_tiny/ckpt/checkpoint_0'


def _tfds_wmt() -> str | None:
  """'' if the TFDS WMT En-De data is prepared here, else what is missing."""
  data_dir = Path(os.environ.get('TFDS_DATA_DIR', Path.home() / 'tensorflow_datasets'))
  if (data_dir / 'wmt_t2t_translate' / 'de-en' / '1.0.0').is_dir():
    return None
  return f'the TFDS dataset wmt_t2t_translate/de-en prepared in {data_dir} (network access once)'


def _t5x() -> str | None:
  if importlib.util.find_spec('t5x') is not None:
    return None
  return "t5x (not on PyPI; README 'Installing T5X') and T5 checkpoints"


def _gpu() -> str | None:
  return 'an NVIDIA GPU and network access to PyPI (README "GPUs and TPUs")'


@dataclasses.dataclass(frozen=True)
class Command:
  """A documented command.

  name: one word, for --only. doc: the file that documents it. documented: its text there (a
  distinctive part; whitespace collapsed when compared). run: what is run, with bash (the
  documented command at a small size; {clone}, {venv} and {elsewhere} are filled in). cwd: 'clone'
  or 'elsewhere' (a directory outside the clone). expect: a text the output must hold. needs: a
  prerequisite, None when it is here, else what is missing. refusal: with `needs` missing, the
  text of the one error line (exit status 2) the command must stop with; empty: not run then.
  """

  name: str
  doc: str
  documented: str
  run: str
  cwd: str = 'clone'
  expect: str = ''
  needs: Callable[[], str | None] | None = None
  refusal: str = ''
  expect_rc: int = 0
  timeout: int = 900


COMMANDS = [
  Command(
    'kernels_build',
    README,
    'python -m speculative.kernels.build',
    '.venv/bin/python -m speculative.kernels.build',
  ),
  Command(
    'make_run',
    README,
    'make run    # the main job',
    '.venv/bin/python -m speculative.infer --gin_file=configs/local/run.gin' + TWO,
    expect='Identical outputs: 2 / 2',
  ),
  Command(
    'own_text_file',
    README,
    """printf 'Open the Tools menu and choose Options.\\n' > my.txt .venv/bin/speculative-infer """
    """--gin_file=configs/local/run.gin --gin_bindings="MIXTURE_OR_TASK_NAME = None" """
    """--gin_bindings="INPUT_FILE = 'my.txt'" --gin_bindings="INFER_OUTPUT_DIR = 'outputs/mine'\"""",
    """printf 'Open the Tools menu and choose Options.\\n' > my.txt && """
    """.venv/bin/speculative-infer --gin_file=configs/local/run.gin """
    """--gin_bindings="MIXTURE_OR_TASK_NAME = None" --gin_bindings="INPUT_FILE = 'my.txt'" """
    """--gin_bindings="INFER_OUTPUT_DIR = 'outputs/mine'\"""",
    expect='Öffnen Sie das Menü Extras und Optionen.',
  ),
  Command(
    'own_text_stdin',
    README,
    "echo 'Click OK to close the dialog.' | .venv/bin/speculative-infer ...",
    """echo 'Click OK to close the dialog.' | .venv/bin/speculative-infer """
    """--gin_file=configs/local/run.gin --gin_bindings="MIXTURE_OR_TASK_NAME = None" """
    """--gin_bindings="INPUT_FILE = '-'" --gin_bindings="INFER_OUTPUT_DIR = 'outputs/stdin'\"""",
    expect='Klicken Sie auf OK, um den Dialog zu schließen.',
  ),
  Command(
    'summarize',
    README,
    '.venv/bin/speculative-infer --gin_file=configs/local/summarize.gin --gin_bindings="NUM_EXAMPLES'
    ' = 20"',
    '.venv/bin/speculative-infer --gin_file=configs/local/summarize.gin' + TWO,
    expect='Identical outputs: 2 / 2',
  ),
  Command(
    'auto_gamma_bench',
    'docs/auto_gamma.md',
    '.venv/bin/python -m speculative.bench.auto_gamma --gin_file=configs/local/run.gin',
    '.venv/bin/python -m speculative.bench.auto_gamma --gin_file=configs/local/run.gin'
    ' --gammas=3 --rounds=1 --gin_bindings="NUM_EXAMPLES = 2"',
    expect='auto: ',
  ),
  Command(
    'spectr_job',
    'docs/batch_jobs.md',
    """.venv/bin/speculative-infer --gin_file=configs/local/run.gin --gin_bindings="METHOD = """
    """'spectr'" --gin_bindings="NUM_DRAFTS = 4" --gin_bindings="GAMMA = 3" """
    """--gin_bindings="TEMPERATURE = 1.0" """
    """--gin_bindings="INFER_OUTPUT_DIR = 'outputs/spectr_run'\"""",
    """.venv/bin/speculative-infer --gin_file=configs/local/run.gin --gin_bindings="METHOD = """
    """'spectr'" --gin_bindings="NUM_DRAFTS = 4" --gin_bindings="GAMMA = 3" """
    """--gin_bindings="TEMPERATURE = 1.0" """
    """--gin_bindings="INFER_OUTPUT_DIR = 'outputs/spectr_run'\"""" + TWO,
    expect='SpecTr, K = 4 drafts of L = 3 tokens',
  ),
  Command(
    'own_t5x_checkpoint',
    README,
    '`configs/runs/infer.gin` plus a model file (`configs/models/t5_1_1_*.gin`)',
    '.venv/bin/speculative-infer --gin_file=configs/models/t5_1_1_tiny.gin'
    ' --gin_file=configs/runs/infer.gin --gin_bindings="TARGET_CONFIG = %T5_1_1_TINY"'
    ' --gin_bindings="DRAFT_CONFIG = %T5_1_1_TINY"'
    f""" --gin_bindings="CHECKPOINT_PATH = '{TINY_CKPT}'\""""
    f""" --gin_bindings="DRAFT_CHECKPOINT_PATH = '{TINY_CKPT}'\""""
    """ --gin_bindings="MIXTURE_OR_TASK_NAME = 'libreoffice_ende'\""""
    """ --gin_bindings="TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 8}\""""
    """ --gin_bindings="INFER_OUTPUT_DIR = 'outputs/t5x_tiny'" --gin_bindings="GAMMA = 2\"""" + TWO,
    expect='Identical outputs: 2 / 2',
  ),
  Command(
    'table2_local',
    README,
    '.venv/bin/speculative-infer --gin_file=configs/local/experiments/ende_small_t0.gin'
    """ --gin_bindings="CHECKPOINT_PATH='<abs>/tests/fixtures/t5x_tiny/ckpt/checkpoint_0'\"""",
    '.venv/bin/speculative-infer --gin_file=configs/local/experiments/ende_small_t0.gin'
    f""" --gin_bindings="CHECKPOINT_PATH='{TINY_CKPT}'\""""
    f""" --gin_bindings="DRAFT_CHECKPOINT_PATH='{TINY_CKPT}'" --gin_bindings="NUM_EXAMPLES=2\""""
    """ --gin_bindings="INFER_OUTPUT_DIR='outputs/t2'\"""",
    needs=_tfds_wmt,
    refusal='needs the TFDS dataset wmt_t2t_translate/de-en:1.0.0',
  ),
  Command(
    'table2_no_output_dir',
    README,
    'Without `INFER_OUTPUT_DIR` it says that macro is required, in one line.',
    '.venv/bin/speculative-infer --gin_file=configs/local/experiments/ende_small_t0.gin'
    f""" --gin_bindings="CHECKPOINT_PATH='{TINY_CKPT}'\""""
    f""" --gin_bindings="DRAFT_CHECKPOINT_PATH='{TINY_CKPT}'" --gin_bindings="NUM_EXAMPLES=2\"""",
    expect='INFER_OUTPUT_DIR is required',
    expect_rc=2,
  ),
  Command(
    'any_directory',
    README,
    '`speculative-infer --gin_file=<repo>/configs/local/run.gin`',
    '{venv}/bin/speculative-infer --gin_file={clone}/configs/local/run.gin' + TWO,
    cwd='elsewhere',
    expect='Identical outputs: 2 / 2',
  ),
  Command(
    'make_install_gpu',
    README,
    'make install JAX_EXTRA=cuda12',
    'make install JAX_EXTRA=cuda12',
    needs=_gpu,
  ),
  Command(
    't5x_infer',
    README,
    '--gin_file=configs/t5x/infer.gin',
    'python -m t5x.infer --gin_file=configs/t5x/tiny_infer.gin',
    needs=_t5x,
  ),
  Command(
    't5x_table2',
    README,
    'python -m t5x.infer --gin_file=configs/t5x/experiments/ende_small_t0.gin',
    'python -m t5x.infer --gin_file=configs/t5x/experiments/ende_small_t0.gin',
    needs=_t5x,
  ),
  Command(
    'train_small_target',
    'docs/training.md',
    'python -m speculative.train --gin_file=configs/train/small_target.gin',
    '.venv/bin/python -m speculative.train --gin_file=configs/train/small_target.gin' + TRAIN_SMALL,
  ),
  Command(
    'train_export_only',
    'docs/training.md',
    '--gin_bindings="train.export_only = True"',
    '.venv/bin/python -m speculative.train --gin_file=configs/train/small_target.gin'
    + TRAIN_SMALL
    + ' --gin_bindings="train.export_only = True"',
    expect='exported step 1',
  ),
  Command(
    'fetch_small_pair',
    'docs/training.md',
    'python -m speculative.train.pair --fetch_sources',
    '.venv/bin/python -m speculative.train.pair --fetch_sources',
  ),
  Command(
    'train_small_draft',
    'docs/training.md',
    'python -m speculative.train --gin_file=configs/train/small_draft.gin',
    '.venv/bin/python -m speculative.train --gin_file=configs/train/small_draft.gin' + TRAIN_SMALL,
    needs=lambda: 'the distillation set and the draft data run of docs/training.md (../runs/)',
    refusal='does not exist',
  ),
  Command(
    'train_multitask',
    'docs/training.md',
    'python -m speculative.train --gin_file=configs/train/multitask_target.gin',
    '.venv/bin/python -m speculative.train --gin_file=configs/train/multitask_target.gin'
    + TRAIN_SMALL,
    needs=lambda: 'the grown initial target of docs/training.md (python -m speculative.train.grow)',
    refusal='init_checkpoint does not exist',
  ),
  Command(
    'benchmark',
    'docs/benchmark.md',
    'python -m speculative.benchmark --gin_file=configs/benchmark/embedded.gin  #',
    '.venv/bin/python -m speculative.benchmark --gin_file=configs/benchmark/embedded.gin'
    + BENCH_SMALL
    + """ --gin_bindings="benchmark.output_dir = 'outputs/bench_small'\"""",
    expect='wrote the results page outputs/bench_small/results.md',
  ),
  Command(
    'benchmark_quick',
    'docs/benchmark.md',
    'python -m speculative.benchmark --gin_file=configs/benchmark/embedded.gin --quick',
    '.venv/bin/python -m speculative.benchmark --gin_file=configs/benchmark/embedded.gin --quick'
    + BENCH_SMALL,
    expect='wrote the results page outputs/benchmark_quick/results.md',
  ),
  Command(
    'benchmark_render',
    'docs/batch_performance.md',
    'python -m speculative.benchmark --render docs/results.json',
    '.venv/bin/python -m speculative.benchmark --render docs/results.json',
    expect='wrote the results page',
  ),
  Command(
    'benchmark_batch',
    'docs/benchmark.md',
    'python -m speculative.benchmark --gin_file=configs/benchmark/batch.gin',
    '.venv/bin/python -m speculative.benchmark --gin_file=configs/benchmark/batch.gin'
    + BENCH_SMALL,
    needs=_t5x,
    refusal="stock_t5x='on' but t5x is not importable",
  ),
  Command(
    'benchmark_whole_job',
    'docs/benchmark.md',
    'python -m speculative.benchmark --gin_file=configs/benchmark/whole_job.gin',
    '.venv/bin/python -m speculative.benchmark --gin_file=configs/benchmark/whole_job.gin'
    + BENCH_SMALL
    + ' --gin_bindings="benchmark.whole_job_examples = 2"',
    expect='wrote the results page outputs/benchmark_whole_job/results.md',
  ),
  Command(
    'spectr_page',
    'docs/benchmark.md',
    'python -m speculative.bench.spectr_page --num_examples 12 --repeats 2 --output_dir docs/spectr',
    '.venv/bin/python -m speculative.bench.spectr_page --num_examples 1 --repeats 1'
    ' --output_dir outputs/spectr --ks 1 2 --ls 2 --cost_repeats 3',
  ),
  Command(
    'drafters_page',
    'docs/benchmark.md',
    'python -m speculative.bench.drafters_page --output_dir=docs/drafters --num_examples 40',
    '.venv/bin/python -m speculative.bench.drafters_page --output_dir=outputs/drafters'
    ' --num_examples 2 --walltime_examples 1 --gammas 1,2 --max_gamma 2 --stop_below 0.5'
    ' --repeats 1 --batch_size 2',
  ),
  Command(
    'paper_shape_jobs_small',
    'docs/paper_shape.md',
    'GIN=configs/benchmark/paper_shape_job_small.gin PYTHON=.venv/bin/python scripts/paper_shape_jobs.sh',
    # The paper-shape job's small switch, one cell (the shipped target grown, 8 sentences).
    'GIN=configs/benchmark/paper_shape_job_small.gin PYTHON=.venv/bin/python'
    ' OUT=outputs/paper_shape_jobs_small scripts/paper_shape_jobs.sh auto:1',
    expect='Identical outputs: 8 / 8',
  ),
  Command(
    'audit_bf16',
    'docs/exactness.md',
    '.venv/bin/speculative-infer --gin_file=configs/local/run.gin --gin_bindings="NUM_EXAMPLES = 500"'
    """ --gin_bindings="KERNELS = 'off'" --gin_bindings="BATCH_SIZE = 8\"""",
    # docs/exactness.md's audit at 2 sentences: both models in bfloat16 on XLA's dot, every greedy
    # divergence audited (a mismatch fails the job).
    '.venv/bin/speculative-infer --gin_file=configs/local/run.gin'
    + TWO
    + """ --gin_bindings="KERNELS = 'off'" --gin_bindings="BATCH_SIZE = 2\""""
    + """ --gin_bindings="embedded_target/t5.T5Config.dtype = 'bfloat16'\""""
    + """ --gin_bindings="embedded_draft/t5.T5Config.dtype = 'bfloat16'\""""
    + """ --gin_bindings="INFER_OUTPUT_DIR = 'outputs/audit_bf16'\"""",
    expect='Identical outputs: 2 / 2',
  ),
  Command(
    'compare',
    'docs/kernels.md',
    'python -m speculative.infer.compare <a>/predictions-baseline.jsonl',
    # docs/kernels.md's parity check at 2 sentences: the kernels built, a baseline job on them at
    # batch 1, one on XLA's dot at batch 2, then the comparison of the two.
    '.venv/bin/python -m speculative.kernels.build && '
    + ' && '.join(
      '.venv/bin/python -m speculative.infer --gin_file=configs/local/run.gin'
      " --gin_bindings=\"infer.modes = ('baseline',)\" --gin_bindings='NUM_EXAMPLES = 2'"
      f" --gin_bindings=\"KERNELS = '{kernels}'\" --gin_bindings='BATCH_SIZE = {batch}'"
      f" --gin_bindings=\"INFER_OUTPUT_DIR = 'outputs/compare_{name}'\""
      for name, kernels, batch in (('a', 'on', 1), ('b', 'off', 2))
    )
    + ' && .venv/bin/python -m speculative.infer.compare outputs/compare_a/predictions-baseline.jsonl'
    ' outputs/compare_b/predictions-baseline.jsonl',
    expect='2 / 2 identical',
  ),
  Command(
    'pair_dry_run',
    'docs/training.md',
    '.venv/bin/python -m speculative.train.pair --toy --sources .device/small_pair --out_dir'
    ' /tmp/pair_toy --first_dir /tmp/pair_toy/first',
    # docs/training.md's CPU dry run of the device recipe (toy shapes and budgets, ~2 min), then
    # what the two device calls return, joined and verified.
    '.venv/bin/python -m speculative.train.pair --fetch_sources --sources .device/small_pair && '
    '.venv/bin/python -m speculative.train.pair --toy --sources .device/small_pair'
    ' --out_dir outputs/pair_toy --first_dir outputs/pair_toy/first && '
    '.venv/bin/python -m speculative.train.transport collect outputs/pair_toy/first'
    ' outputs/pair_toy/second --dest_dir outputs/pair_toy_here',
    expect='verified outputs/pair_toy_here/embedded_draft.msgpack',
  ),
  Command(
    'pair_upload',
    'docs/training.md',
    '.venv/bin/python -m speculative.train.transport pack_upload models/embedded/target.msgpack'
    ' models/embedded/draft.msgpack --dest_dir .device/upload --parts 2',
    # The shipped pair packed into two parts, then unpacked and verified as the device call does.
    '.venv/bin/python -m speculative.train.transport pack_upload models/embedded/target.msgpack'
    ' models/embedded/draft.msgpack --dest_dir outputs/upload --parts 2 && '
    '.venv/bin/python -m speculative.train.transport unpack_upload outputs/upload'
    ' --dest_dir outputs/uploaded',
    expect='unpacked and verified outputs/uploaded/target.msgpack',
  ),
  Command(
    'tree_size',
    'docs/training.md',
    'python -m speculative.train.transport tree_size',
    '.venv/bin/python -m speculative.train.transport tree_size',
    expect='working tree to send:',
    # A clone holds the 114 MB pair, so it is over the 64 MiB a device call carries: exit 1 says so.
    expect_rc=1,
  ),
  Command(
    'pair_learning_curve',
    'docs/training.md',
    'python -m speculative.train.learning_curve --pair_report docs/pair_device_report_2026-11-28.json'
    ' --png docs/pair_learning_curve_2026-11-28.png',
    '.venv/bin/python -m speculative.train.learning_curve --pair_report'
    ' docs/pair_device_report_2026-11-28.json --png outputs/pair_curve.png',
    expect='wrote outputs/pair_curve.png',
  ),
]


def collapse(text: str) -> str:
  """`text` with line continuations (a backslash before whitespace) dropped and whitespace runs
  made one space: a command as the docs wrap it compares equal to the same command on one line."""
  return ' '.join(re.sub(r'\\\s', ' ', text).split())


def first_hour_commands(readme: str) -> list[str]:
  """The commands of README's first-hour section: its code spans and fenced lines (continuations
  joined) that start with a command (`.venv/bin/`, `python `, `make `, `echo `, `printf `)."""
  section = readme.split(FIRST_HOUR, 1)[1].split('\n## ', 1)[0]
  fenced = re.findall(r'```\w*\n(.*?)```', section, re.DOTALL)
  spans = re.findall(r'`([^`]+)`', re.sub(r'```.*?```', '', section, flags=re.DOTALL))
  candidates = [collapse(block.replace('\\\n', ' ')) for block in fenced] + [
    collapse(span) for span in spans
  ]
  starts = ('.venv/bin/', 'python ', 'make ', 'echo ', 'printf ')
  return [c for c in candidates if c.startswith(starts) and ' ' in c]  # not a bare program name


def doc_problems(root: Path = REPO) -> list[str]:
  """Documented texts no longer in their documents, and first-hour commands not in the list."""
  problems = []
  texts = {}
  for command in COMMANDS:
    if command.doc not in texts:
      texts[command.doc] = collapse((root / command.doc).read_text(encoding='utf-8'))
    if collapse(command.documented) not in texts[command.doc]:
      problems.append(f'{command.name}: {command.documented!r} is not in {command.doc} any more')
  listed = [collapse(c.documented) for c in COMMANDS]
  for found in first_hour_commands((root / README).read_text(encoding='utf-8')):
    if found.endswith('scripts/check_documented_commands.py'):  # this script
      continue
    if not any(doc in found or found in doc for doc in listed):
      problems.append(f'README first-hour command not in the list: {found!r}')
  return problems


def clone(workdir: Path) -> Path:
  """A fresh clone of HEAD in workdir/clone, with .venv linked to this environment."""
  target = workdir / 'clone'
  head = subprocess.run(
    ['git', '-C', str(REPO), 'rev-parse', 'HEAD'], capture_output=True, text=True, check=True
  ).stdout.strip()
  subprocess.run(
    ['git', 'clone', '--quiet', '--shared', '--no-checkout', str(REPO), str(target)], check=True
  )
  subprocess.run(['git', '-C', str(target), 'checkout', '--quiet', head], check=True)
  (target / '.venv').symlink_to(Path(sys.prefix))
  dirty = subprocess.run(
    ['git', '-C', str(REPO), 'status', '--porcelain', '--untracked-files=no'],
    capture_output=True,
    text=True,
  ).stdout.strip()
  print(
    f'fresh clone of HEAD {head[:7]} in {target}'
    + (' (uncommitted changes of the checkout are not in it)' if dirty else '')
  )
  return target


def run(command: Command, clone_dir: Path, elsewhere: Path) -> tuple[str, str]:
  """(status, detail) of one command: PASS, NEEDS <what> or FAIL."""
  missing = command.needs() if command.needs else None
  if missing and not command.refusal:
    return f'NEEDS {missing}', 'not run'
  script = command.run  # placeholders filled by name: gin dicts in commands hold braces too
  for name, value in (
    ('clone', clone_dir),
    ('venv', clone_dir / '.venv'),
    ('elsewhere', elsewhere),
  ):
    script = script.replace('{' + name + '}', str(value))
  env = {k: v for k, v in os.environ.items() if k != 'SPECULATIVE_DEBUG'}
  env['PYTHONPATH'] = str(clone_dir)
  try:
    proc = subprocess.run(
      ['bash', '-c', script],
      cwd=clone_dir if command.cwd == 'clone' else elsewhere,
      capture_output=True,
      text=True,
      env=env,
      timeout=command.timeout,
    )
  except subprocess.TimeoutExpired:
    return 'FAIL', f'still running after {command.timeout} s'
  output = proc.stdout + proc.stderr
  last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [''])[-1]
  if missing:
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 2 and len(lines) == 1 and command.refusal in lines[0]:
      return f'NEEDS {missing}', f'refused in one line, exit 2: {lines[0][:160]}'
    return 'FAIL', f'exit {proc.returncode}, expected one line with {command.refusal!r}: {last}'
  if proc.returncode != command.expect_rc:
    return 'FAIL', f'exit {proc.returncode}: {last[:200]}'
  if command.expect and command.expect not in output:
    return 'FAIL', f'no {command.expect!r} in its output; last line: {last[:200]}'
  return 'PASS', f'printed {command.expect!r}' if command.expect else last[:120]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--only', default='', help='comma list of command names (default: all)')
  parser.add_argument('--list', action='store_true', help='list the commands and exit')
  parser.add_argument('--docs_only', action='store_true', help='check the documents only')
  parser.add_argument('--keep', action='store_true', help='keep the temporary directory')
  parser.add_argument(
    '--root', type=Path, default=REPO, help='with --docs_only: the checkout whose docs to check'
  )
  args = parser.parse_args(argv)
  if args.list:
    for command in COMMANDS:
      print(f'{command.name:22s} {command.doc}: {collapse(command.documented)}')
    return 0
  problems = doc_problems(args.root)
  for problem in problems:
    print(f'FAIL docs: {problem}')
  if args.docs_only:
    print(f'{len(COMMANDS)} documented commands listed; {len(problems)} document problem(s)')
    return 1 if problems else 0
  names = [n for n in args.only.split(',') if n]
  unknown = sorted(set(names) - {c.name for c in COMMANDS})
  if unknown:
    parser.error(f'unknown command names {unknown}; --list shows them')
  selected = [c for c in COMMANDS if not names or c.name in names]
  workdir = Path(tempfile.mkdtemp(prefix='documented-commands-'))
  counts = {'PASS': 0, 'NEEDS': 0, 'FAIL': len(problems)}
  start = time.perf_counter()
  try:
    clone_dir = clone(workdir)
    elsewhere = workdir / 'elsewhere'
    elsewhere.mkdir()
    for command in selected:
      began = time.perf_counter()
      status, detail = run(command, clone_dir, elsewhere)
      counts[status.split()[0]] += 1
      seconds = time.perf_counter() - began
      print(
        f'{status.split()[0]:5s} {command.name} ({seconds:.0f} s) {status[6:]}'.rstrip()
        + f': {detail}',
        flush=True,
      )
  finally:
    if args.keep:
      print(f'kept {workdir}')
    else:
      shutil.rmtree(workdir, ignore_errors=True)
  print(
    f'{counts["PASS"]} passed, {counts["NEEDS"]} need what this machine lacks, '
    f'{counts["FAIL"]} failed, in {time.perf_counter() - start:.0f} s'
  )
  return 1 if counts['FAIL'] else 0


if __name__ == '__main__':
  sys.exit(main())
