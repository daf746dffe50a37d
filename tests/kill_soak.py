"""Kill soak for the batch jobs: SIGKILL `python -m speculative.infer` or `python -m
speculative.train` at random moments, resume, and check that the outputs end byte-identical to an
uninterrupted run and that no temporaries are left (docs/batch_jobs.md, "Kill soak").

  .venv/bin/python tests/kill_soak.py --job infer --trials 10 --compile_cache /tmp/xla_cache_infer
  .venv/bin/python tests/kill_soak.py --job train --trials 10 --compile_cache /tmp/xla_cache_train

Options: --seed 0 (the kill moments), --max_kills 3 (a trial), --after_output (kill only once a run
has written new output), --compile_cache DIR (a JAX persistent compilation cache for every run,
emptied first and filled by an extra uninterrupted run whose outputs must equal the reference's;
without it each run compiles, about twice the CPU time), --workdir (default /tmp/kill_soak_<job>,
deleted first).

The jobs are tiny and run on CPU: infer decodes 24 lines with the correlated tiny pair of
tests/model_utils.py (a 2-layer target, a 1-layer draft; baseline and speculative); train runs 24
steps of a 134k-parameter T5 (dropout on, so the per-step rngs matter) on 32 pairs of the shipped
validation split with the shipped 8k SentencePiece model, checkpointing every 3 steps, evaluating
every 6, and exporting float32 weights. A run takes seconds to a minute, mostly start-up and
compilation.

First an uninterrupted reference run, polled for its progress (infer: predictions written; train:
checkpoints written, then the export) to get its timeline. Then every trial runs the real CLI into
a fresh output directory and kills it (SIGKILL) at random moments until a run completes: each kill
moment is a uniformly random time of the reference run's timeline that the run still has ahead (its
start-up, then the stretch past the progress it resumed from), re-anchored to the progress the run
has reached, so kills land in start-up, compilation, decoding or training steps, checkpoint and
output writes, and the final export whatever the machine's load. The first run of a trial is
always killed; after `--max_kills` kills the run is left to finish. Prints one line a trial and a
summary (train, with --compile_cache):

  reference: 14.5 s (with the compile cache; the run that filled it: 32.4 s), 122 files compared,
  progress@seconds: 1@9.7 2@10.0 3@10.2 4@10.6 5@11.0 6@11.4 7@11.7 8@12.2 9@12.5
  trial 0: 3 kills (at progress 8/9, 9/9, 9/9; 1 mid-write), identical, no temporaries
  ...
  train: 10 trials, 28 kills (6 mid-write), all byte-identical to the reference run, no temporaries left

Progress is what the killed run had written: infer, prediction lines (2 modes x 24) then
metrics.json and report.md; train, checkpoints (every 3 of 24 steps) then the export (after it, the
process still takes seconds to exit). "mid-write": kills that left a temporary (`*.tmp-*` of an
atomic write, `checkpoint_<n>.old-*` of a checkpoint being pruned) for the next run to remove. infer
compares `predictions-*.jsonl`; train compares every file of the output directory (the last two
checkpoints with their optimizer states and metadata, `best.msgpack`, the exported weights, and
their `.json` sidecars) except `train_log.jsonl` and `best.json`, which hold wall times and running
averages. Both fail if any `*.tmp-*` or `checkpoint_<n>.old-*` is left in the output directory.
Exits non-zero with `FAILED: <why>` at the first mismatch, temporary or failed run (its log is
`<workdir>/trial_<i>.log`). The test suite runs short versions with the kills at seeded write
events instead of moments (`soak_at_writes`, `kill_at_write`; tests/jobs/test_job_safety.py), so
where they land does not depend on the machine's speed.
"""

from __future__ import annotations

import argparse
import bisect
import dataclasses
import os
from pathlib import Path
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the job subprocesses run with cwd=REPO: the same package
POLL_S = 0.01


class SoakError(RuntimeError):
  """A resumed run did not end byte-identical, left temporaries, or failed."""


# ----------------------------------------------------------------------------------------------
# The infer job: the correlated tiny target/draft pair, six input lines (24 with their variants).
# ----------------------------------------------------------------------------------------------
SOURCES = [
  "Click OK.",
  "Open the file menu and choose Save.",
  "Hello",
  "Select a cell range.",
  "Press Enter to perform the search.",
  "Choose Format - Cells.",
]
SIZES = dict(vocab_size=8000, emb_dim=16, num_heads=2, num_encoder_layers=1, head_dim=8, mlp_dim=32)


def prepare_infer(workdir: Path) -> None:
  """The correlated tiny pair of tests/model_utils.py (its configs are SIZES with 2 and 1 decoder
  layers), so the resumed decodes accept and reject drafts and stop at EOS, and the inputs."""
  from model_utils import correlated_tiny_pair  # beside this file

  from speculative import checkpoints
  from speculative.models.t5 import T5Config

  workdir.mkdir(parents=True, exist_ok=True)
  _, target_params, _, draft_params = correlated_tiny_pair()
  for name, layers, params in (("t", 2, target_params), ("d", 1, draft_params)):
    config = T5Config(num_decoder_layers=layers, **SIZES)
    checkpoints.save_params(params, workdir / f"{name}.msgpack", dtype=None, config=config)
  lines = [f"{s} {n}" if n else s for n in range(4) for s in SOURCES]  # 24
  (workdir / "in.tsv").write_text("".join(f"{s}\tRef {i}\n" for i, s in enumerate(lines)))


def infer_command(workdir: Path, out: Path) -> list[str]:
  bindings = [
    "infer.target_config = @target/t5.T5Config()",
    "infer.draft_config = @draft/t5.T5Config()",
    f"infer.target_checkpoint = '{workdir / 't.msgpack'}'",
    f"infer.draft_checkpoint = '{workdir / 'd.msgpack'}'",
    f"infer.input_file = '{workdir / 'in.tsv'}'",
    f"infer.output_dir = '{out}'",
    "infer.task_feature_lengths = {'inputs': 24, 'targets': 12}",
    "infer.batch_size = 2",
    "infer.gamma = 3",
    "infer.progress = False",
  ]
  for scope, layers in (("target", 2), ("draft", 1)):
    bindings += [
      f"{scope}/t5.T5Config.{k} = {v}" for k, v in dict(SIZES, num_decoder_layers=layers).items()
    ]
  gin_file = workdir / "infer.gin"
  gin_file.write_text("\n".join(bindings) + "\n")
  return [sys.executable, "-m", "speculative.infer", f"--gin_file={gin_file}"]


def infer_outputs(out: Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in sorted(out.glob("predictions-*.jsonl"))}


def infer_progress(out: Path) -> int:
  """Predictions written (each file is replaced atomically after every batch), then one each for
  metrics.json and report.md."""
  total = sum((out / name).exists() for name in ("metrics.json", "report.md"))
  for p in out.glob("predictions-*.jsonl"):
    try:
      total += p.read_bytes().count(b"\n")
    except FileNotFoundError:
      pass
  return total


# ----------------------------------------------------------------------------------------------
# The train job: a ~140k-parameter T5 (dropout on, so the per-step rngs matter), 32 training pairs.
# ----------------------------------------------------------------------------------------------
TRAIN = dict(num_steps=24, checkpoint_every=3, eval_every=6)
TRAIN_MODEL = dict(
  vocab_size=8000,
  dtype="'float32'",
  emb_dim=16,
  num_heads=2,
  num_encoder_layers=1,
  num_decoder_layers=1,
  head_dim=8,
  mlp_dim=32,
  dropout_rate=0.1,
  logits_via_embedding=True,
)
UNCOMPARED_TRAIN_FILES = ("train_log.jsonl", "best.json", ".lock")


def prepare_train(workdir: Path) -> None:
  from speculative.data import corpus

  workdir.mkdir(parents=True, exist_ok=True)
  pairs = corpus.read_tsv_gz(REPO / "data" / "libreoffice_ende" / "validation.tsv.gz")[:40]
  for name, chunk in (("train.tsv", pairs[:32]), ("val.tsv", pairs[32:])):
    (workdir / name).write_text("".join(f"{s}\t{t}\n" for s, t in chunk), encoding="utf-8")


def train_command(workdir: Path, out: Path) -> list[str]:
  bindings = [
    "train.model_config = @t5.T5Config()",
    f"train.train_tsv = '{workdir / 'train.tsv'}'",
    f"train.validation_tsv = '{workdir / 'val.tsv'}'",
    f"train.spm_model = '{REPO / 'data' / 'libreoffice_ende' / 'spm8k.model'}'",
    f"train.output_dir = '{out}'",
    f"train.export_path = '{out / 'export.msgpack'}'",
    "train.export_dtype = 'float32'",
    "train.tokens_per_batch = 256",
    "train.bucket_lengths = (32,)",
    "train.learning_rate = 3e-3",
    "train.warmup_steps = 4",
    "train.seed = 0",
  ]
  bindings += [f"train.{k} = {v}" for k, v in TRAIN.items()]
  bindings += [f"t5.T5Config.{k} = {v}" for k, v in TRAIN_MODEL.items()]
  gin_file = workdir / "train.gin"
  gin_file.write_text("\n".join(bindings) + "\n")
  return [sys.executable, "-m", "speculative.train", f"--gin_file={gin_file}"]


def train_outputs(out: Path) -> dict[str, bytes]:
  return {
    str(p.relative_to(out)): p.read_bytes()
    for p in sorted(out.rglob("*"))
    if p.is_file() and p.name not in UNCOMPARED_TRAIN_FILES
  }


def train_progress(out: Path) -> int:
  """Checkpoints written (each appears by an atomic rename), plus one for the export."""
  try:
    names = os.listdir(out)
  except FileNotFoundError:
    return 0
  steps = [int(n.split("_")[1]) for n in names if re.fullmatch(r"checkpoint_\d+", n)]
  return max(steps, default=0) // TRAIN["checkpoint_every"] + ("export.msgpack" in names)


@dataclasses.dataclass(frozen=True)
class Job:
  prepare: Callable[[Path], None]
  command: Callable[[Path, Path], list[str]]
  outputs: Callable[[Path], dict[str, bytes]]
  progress: Callable[[Path], int]


JOBS = {
  "infer": Job(prepare_infer, infer_command, infer_outputs, infer_progress),
  "train": Job(prepare_train, train_command, train_outputs, train_progress),
}


# ----------------------------------------------------------------------------------------------
# Runs, kills and checks.
# ----------------------------------------------------------------------------------------------
def leftovers(out: Path) -> list[str]:
  """Temporaries of an interrupted atomic write anywhere under `out` (none may survive a run)."""
  return sorted(
    str(p.relative_to(out))
    for p in out.rglob("*")
    if ".tmp-" in p.name or re.fullmatch(r"checkpoint_\d+\.old-.*", p.name)
  )


@dataclasses.dataclass
class Reference:
  outputs: dict[str, bytes]
  timeline: list[tuple[float, int]]  # (seconds since start, progress) at each change, from (0, 0)
  duration: float

  @property
  def total(self) -> int:
    return self.timeline[-1][1]


@dataclasses.dataclass
class Trial:
  kills: list[int]  # the progress each killed run had reached
  identical: bool
  differing: list[str]
  left: list[str]  # temporaries left at the end (must be none)
  kills_leaving_temporaries: int = 0  # kills mid-write: the next run had temporaries to remove


def _popen(
  cmd: list[str], log: Path, env: dict[str, str] | None = None, stderr: Path | None = None
) -> subprocess.Popen:
  """`cmd` started in the repository, its output appended to `log` (its stderr to `stderr` where
  given)."""
  env = dict(
    os.environ,
    PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    **(env or {}),
  )
  with open(log, "ab") as f, open(stderr or os.devnull, "wb") as e:
    return subprocess.Popen(
      cmd, cwd=REPO, env=env, stdout=f, stderr=e if stderr else subprocess.STDOUT
    )


def _failed(proc: subprocess.Popen, log: Path, what: str) -> SoakError:
  tail = log.read_text(errors="replace")[-3000:]
  return SoakError(f"{what}: the run exited {proc.returncode}; end of {log}:\n{tail}")


def run_reference(
  job: Job, workdir: Path, env: dict[str, str] | None = None, name: str = "reference"
) -> Reference:
  """An uninterrupted run into `workdir/<name>`, polled for its progress timeline."""
  out = workdir / name
  shutil.rmtree(out, ignore_errors=True)
  log = workdir / f"{name}.log"
  log.unlink(missing_ok=True)
  t0 = time.monotonic()
  proc = _popen(job.command(workdir, out), log, env)
  timeline = [(0.0, 0)]
  while proc.poll() is None:
    level = job.progress(out)
    if level > timeline[-1][1]:
      timeline.append((time.monotonic() - t0, level))
    time.sleep(POLL_S)
  duration = time.monotonic() - t0
  if proc.returncode:
    raise _failed(proc, log, name)
  level = job.progress(out)
  if level > timeline[-1][1]:
    timeline.append((duration, level))
  return Reference(job.outputs(out), timeline, duration)


def choose_kill(
  rng: random.Random, reference: Reference, done: int, after_output: bool = False
) -> tuple[int, float] | None:
  """A random kill moment for a run that starts at progress `done`: (progress to wait for, then
  seconds more), uniform over the reference run's time that such a run still goes through: its
  start-up (up to the reference's first output; every run has one) and the stretch from the
  reference's first output past `done` to its end. `after_output`: only that stretch up to the
  last output (not the exit), so the run is killed after it has written something new and before
  it has written everything (None if nothing is left to write)."""
  times = [t for t, _ in reference.timeline]
  levels = [level for _, level in reference.timeline]
  startup_end = times[1] if len(times) > 1 else reference.duration
  resumed = next((t for t, level in reference.timeline if level > done), reference.duration)
  end = times[-1] if after_output else reference.duration
  segments = [(max(resumed, startup_end), end)]
  if not after_output:
    segments.insert(0, (0.0, startup_end))
  segments = [(a, b) for a, b in segments if b > a]
  if not segments:
    return None
  u = rng.uniform(0, sum(b - a for a, b in segments))
  moment = segments[-1][1]
  for a, b in segments:
    if u < b - a:
      moment = a + u
      break
    u -= b - a
  if moment < startup_end:  # start-up: time since the run started
    return done, moment
  i = bisect.bisect_right(times, moment) - 1
  return levels[i], moment - times[i]


def run_until(
  job: Job,
  cmd: list[str],
  out: Path,
  log: Path,
  kill: tuple[int, float] | None,
  env: dict[str, str] | None = None,
) -> tuple[bool, int]:
  """Runs `cmd` and, if `kill` = (level, delay), SIGKILLs it `delay` seconds after its output
  reached progress `level`. Returns (killed, progress at the kill)."""
  proc = _popen(cmd, log, env)
  try:
    if kill is not None:
      level, delay = kill
      while proc.poll() is None and job.progress(out) < level:
        time.sleep(POLL_S)
      try:
        proc.wait(timeout=delay)
      except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True, job.progress(out)
    proc.wait()
  except BaseException:
    proc.kill()
    proc.wait()
    raise
  if proc.returncode:
    raise _failed(proc, log, str(out))
  return False, job.progress(out)


# A kill at a write: an event, not a moment. The run's python is wrapped so that it stops itself
# (SIGSTOP) at the chosen rename of a file into its output directory, the last step of every atomic
# write (`os.replace` or `os.rename`): just before it (mid-write: the temporary is complete, the
# file not yet replaced) or just after it. The parent waits for that stop (waitpid WUNTRACED, no
# timing) and SIGKILLs the stopped run, so the kill lands at the same point however fast or loaded
# the machine is. `setup` is Python run in the wrapped process before the job (a test's fixture).
_STOP_AT_WRITE = r"""
import os, runpy, signal, sys
out, name, count, before, setup, kind, job = sys.argv[1:8]  # kind: "-m" (job: a module) or "-c"
out, count, before = os.path.realpath(out) + os.sep, int(count), before == "before"
sys.argv = [job if kind == "-m" else "-c", *sys.argv[8:]]
seen = [0]
def stopping(move):
  def wrapped(src, dst, *args, **kwargs):
    target = os.path.realpath(os.fspath(dst))
    hit = target.startswith(out) and os.path.basename(target) == name
    seen[0] += hit
    if hit and seen[0] == count and before:
      os.kill(os.getpid(), signal.SIGSTOP)
    result = move(src, dst, *args, **kwargs)
    if hit and seen[0] == count and not before:
      os.kill(os.getpid(), signal.SIGSTOP)
    return result
  return wrapped
os.replace, os.rename = stopping(os.replace), stopping(os.rename)
exec(setup)
if kind == "-m":
  runpy.run_module(job, run_name="__main__", alter_sys=True)
else:
  exec(compile(job, "<string>", "exec"), {"__name__": "__main__"})
"""


def kill_at_write(
  cmd: list[str],
  out: Path,
  name: str,
  count: int,
  *,
  mid_write: bool,
  log: Path,
  env: dict[str, str] | None = None,
  setup: str = "",
) -> None:
  """Runs `cmd` ([python, "-m" or "-c", job, args...]) and SIGKILLs it at its `count`-th write of the
  file `out/<name>`: just before the rename that completes it (`mid_write`: its temporary is left
  for the next run to remove) or just after (see `_STOP_AT_WRITE`). SoakError if the run exits
  before it gets there."""
  proc = _stopped_at_write(
    cmd, out, name, count, mid_write=mid_write, log=log, env=env, setup=setup
  )
  proc.send_signal(signal.SIGKILL)
  proc.wait()


def signal_at_write(
  cmd: list[str], out: Path, name: str, count: int, signum: int, *, log: Path, env=None
) -> tuple[int, str]:
  """Runs `cmd` as `kill_at_write` does, stopped just after its `count`-th write of `out/<name>`,
  then sends it `signum` (SIGINT, SIGTERM) and lets it go on: (its exit status, its stderr)."""
  # A process started ignoring SIGINT (under `nohup`, or `&` in a script) passes that on to its
  # children; the run takes Python's default handler back, as a terminal's job has.
  setup = "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)"
  proc = _stopped_at_write(
    cmd, out, name, count, mid_write=False, log=log, env=env, setup=setup, stderr=True
  )
  proc.send_signal(signum)
  proc.send_signal(signal.SIGCONT)
  proc.wait()
  return proc.returncode, log.with_suffix(".stderr").read_text(errors="replace")


def _stopped_at_write(
  cmd: list[str],
  out: Path,
  name: str,
  count: int,
  *,
  mid_write: bool,
  log: Path,
  env: dict[str, str] | None = None,
  setup: str = "",
  stderr: bool = False,
) -> subprocess.Popen:
  """`cmd` run until it stops itself at the `count`-th write of `out/<name>` (`_STOP_AT_WRITE`);
  `stderr`: its stderr apart, in `log` with the suffix .stderr. SoakError if it exits first."""
  python, kind, job, *args = cmd
  if kind not in ("-m", "-c"):
    raise ValueError(
      f"kill_at_write runs `python -m module ...` or `python -c code ...`, not {cmd}"
    )
  when = "before" if mid_write else "after"
  wrapped = [python, "-c", _STOP_AT_WRITE, str(out), name, str(count), when, setup, kind, job]
  proc = _popen(wrapped + args, log, env, log.with_suffix(".stderr") if stderr else None)
  try:
    _, status = os.waitpid(proc.pid, os.WUNTRACED)  # returns when the run stops itself, or exits
  except BaseException:
    proc.kill()
    proc.wait()
    raise
  if not os.WIFSTOPPED(status):
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by waitpid: Popen cannot see it
    raise _failed(proc, log, f"{out}: the run ended before its write {count} of {name}")
  return proc


def run_trial(
  job: Job,
  workdir: Path,
  out: Path,
  reference: Reference,
  rng: random.Random,
  max_kills: int,
  after_output: bool = False,
  env: dict[str, str] | None = None,
) -> Trial:
  """Kills the job in `out` at random moments (at least once, at most `max_kills` times) until a
  run completes, then compares its outputs with the reference run's (see `choose_kill`)."""
  for _ in range(10):  # a first run that completes before its kill moment is redone
    shutil.rmtree(out, ignore_errors=True)
    log = out.with_name(out.name + ".log")
    log.unlink(missing_ok=True)
    cmd = job.command(workdir, out)
    kills: list[int] = []
    mid_write = 0
    done = 0
    while True:
      kill = choose_kill(rng, reference, done, after_output) if len(kills) < max_kills else None
      killed, done = run_until(job, cmd, out, log, kill, env)
      if not killed:
        break
      kills.append(done)
      mid_write += bool(leftovers(out))
    if kills:
      break
  else:
    raise SoakError(f"{out}: ten first runs all completed before their kill moment")
  got = job.outputs(out)
  differing = sorted(
    name
    for name in set(got) | set(reference.outputs)
    if got.get(name) != reference.outputs.get(name)
  )
  return Trial(kills, not differing, differing, leftovers(out), mid_write)


def soak(
  job: str | Job,
  workdir: Path,
  trials: int,
  seed: int = 0,
  max_kills: int = 3,
  report: Callable[[str], None] = print,
  after_output: bool = False,
  compile_cache: Path | None = None,
) -> list[Trial]:
  """The soak (see the module docstring) of a job of JOBS (or a Job); raises SoakError at the first
  failed trial, else returns the trials. `compile_cache`: a JAX persistent compilation cache
  directory for all runs (the reference fills it; later runs load its executables instead of
  compiling, which halves their CPU time; the executables are the same, and so are the outputs)."""
  job_name, job = (job, JOBS[job]) if isinstance(job, str) else ("job", job)
  workdir = Path(workdir)
  shutil.rmtree(workdir, ignore_errors=True)
  job.prepare(workdir)
  env, reference = _reference(job, workdir, report, compile_cache)
  rng = random.Random(seed)
  results = []
  for i in range(trials):
    out = workdir / f"trial_{i}"
    trial = run_trial(job, workdir, out, reference, rng, max_kills, after_output, env)
    results.append(trial)
    _check_trial(i, trial, reference, out, workdir, report)
  kills = sum(len(t.kills) for t in results)
  mid_write = sum(t.kills_leaving_temporaries for t in results)
  report(
    f"{job_name}: {trials} trials, {kills} kills ({mid_write} mid-write), all byte-identical to "
    "the reference run, no temporaries left"
  )
  return results


# The writes where `soak_at_writes` kills each job: (file name in the output directory, its n-th
# write), every one after the run's first output, so the resumed run really resumes. infer: every
# later write of a predictions file (24 lines at batch 2: 12 writes a mode); train: each checkpoint
# after the first (a directory renamed into place) and the export.
WRITES = {
  "infer": [
    (f"predictions-{mode}.jsonl", n) for mode in ("baseline", "speculative") for n in range(2, 13)
  ],
  "train": [
    (f"checkpoint_{step}", 1)
    for step in range(
      2 * TRAIN["checkpoint_every"], TRAIN["num_steps"] + 1, TRAIN["checkpoint_every"]
    )
  ]
  + [("export.msgpack", 1)],
}


def soak_at_writes(
  job: str | Job,
  workdir: Path,
  trials: int,
  seed: int = 0,
  report: Callable[[str], None] = print,
  compile_cache: Path | None = None,
  writes: list[tuple[str, int]] | None = None,
) -> list[Trial]:
  """The soak with its kills at events instead of moments (the test suite's version): each trial
  kills the run once, at a write of `writes` (default `WRITES[job]`) chosen with `seed`, just
  before or just after its rename (`kill_at_write`), lets the next run finish, and compares with
  the reference run as `soak` does (SoakError at the first failed trial). Where the kill lands
  depends on the seed only, not on the machine's speed or load."""
  spec = JOBS[job] if isinstance(job, str) else job
  writes = writes or WRITES[job]
  workdir = Path(workdir)
  shutil.rmtree(workdir, ignore_errors=True)
  spec.prepare(workdir)
  env, reference = _reference(spec, workdir, report, compile_cache)
  rng = random.Random(seed)
  results = []
  for i in range(trials):
    out = workdir / f"trial_{i}"
    log = out.with_name(out.name + ".log")
    name, count = rng.choice(writes)
    mid_write = rng.random() < 0.5
    cmd = spec.command(workdir, out)
    kill_at_write(cmd, out, name, count, mid_write=mid_write, log=log, env=env)
    killed_at, left_by_kill = spec.progress(out), leftovers(out)
    report(f"trial {i}: killed {'before' if mid_write else 'after'} write {count} of {name}")
    run_until(spec, cmd, out, log, None, env)
    got = spec.outputs(out)
    differing = sorted(
      n for n in set(got) | set(reference.outputs) if got.get(n) != reference.outputs.get(n)
    )
    trial = Trial([killed_at], not differing, differing, leftovers(out), int(bool(left_by_kill)))
    results.append(trial)
    _check_trial(i, trial, reference, out, workdir, report)
  return results


def _reference(
  job: Job, workdir: Path, report: Callable[[str], None], compile_cache: Path | None
) -> tuple[dict[str, str] | None, Reference]:
  """(env of every run, the uninterrupted reference run), reported. With `compile_cache`, a first
  run fills the cache, so the reference's timeline is that of the trials' runs (which load it)."""
  env, cache_note = None, ""
  if compile_cache is not None:
    shutil.rmtree(compile_cache, ignore_errors=True)
    env = {
      "JAX_COMPILATION_CACHE_DIR": str(compile_cache),
      "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    cold = run_reference(job, workdir, env, name="cold")
    cache_note = f" (with the compile cache; the run that filled it: {cold.duration:.1f} s)"
  reference = run_reference(job, workdir, env)
  if not reference.outputs:
    raise SoakError(f"the reference run wrote no outputs to compare in {workdir / 'reference'}")
  if compile_cache is not None and cold.outputs != reference.outputs:
    raise SoakError(f"{workdir / 'cold'} (compiled) and {workdir / 'reference'} (cached) differ")
  steps = " ".join(f"{level}@{t:.1f}" for t, level in reference.timeline[1:])
  report(
    f"reference: {reference.duration:.1f} s{cache_note}, {len(reference.outputs)} files compared, "
    f"progress@seconds: {steps}"
  )
  return env, reference


def _check_trial(
  i: int,
  trial: Trial,
  reference: Reference,
  out: Path,
  workdir: Path,
  report: Callable[[str], None],
) -> None:
  """Reports trial `i` (run in `out`); SoakError if its outputs differ or temporaries are left."""
  at = ", ".join(f"{k}/{reference.total}" for k in trial.kills)
  if trial.kills_leaving_temporaries:
    at += f"; {trial.kills_leaving_temporaries} mid-write"
  report(
    f"trial {i}: {len(trial.kills)} kills (at progress {at}), "
    f"{'identical' if trial.identical else 'MISMATCH'}, "
    f"{'no temporaries' if not trial.left else 'TEMPORARIES LEFT'}"
  )
  if not trial.identical:
    raise SoakError(
      f"trial {i}: {', '.join(trial.differing)} differ from the uninterrupted run "
      f"({out} vs {workdir / 'reference'})"
    )
  if trial.left:
    raise SoakError(f"trial {i}: temporaries left in {out}: {trial.left}")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--job", choices=sorted(JOBS), default="infer")
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--max_kills", type=int, default=3, help="kills a trial at most")
  parser.add_argument(
    "--after_output",
    action="store_true",
    help="kill only once the run has written new output (not in start-up or compilation)",
  )
  parser.add_argument(
    "--compile_cache", default=None, help="a JAX persistent compilation cache dir for all runs"
  )
  parser.add_argument("--workdir", default=None, help="default: /tmp/kill_soak_<job>")
  args = parser.parse_args()
  workdir = Path(args.workdir or f"/tmp/kill_soak_{args.job}")
  try:
    soak(
      args.job,
      workdir,
      args.trials,
      args.seed,
      args.max_kills,
      lambda line: print(line, flush=True),
      args.after_output,
      Path(args.compile_cache) if args.compile_cache else None,
    )
  except SoakError as e:
    sys.exit(f"FAILED: {e}")


if __name__ == "__main__":
  main()
