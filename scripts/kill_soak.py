"""Kill soak for the batch job: SIGKILL `python -m speculative.infer` at random moments, resume, and
check that the predictions end byte-identical to an uninterrupted run (docs/batch_jobs.md).

  .venv/bin/python scripts/kill_soak.py --trials 20 [--seed 0] [--workdir /tmp/kill_soak]

Uses a tiny random target/draft pair and a few input lines, so each trial takes a few CPU-seconds
to a minute (mostly start-up and compilation). Exits non-zero at the first mismatch.
"""

from __future__ import annotations

import argparse
from pathlib import Path
import random
import shutil
import signal
import subprocess
import sys
import time

REPO = Path(__file__).resolve().parents[1]
SOURCES = [
  "Click OK.",
  "Open the file menu and choose Save.",
  "Hello",
  "Select a cell range.",
  "Press Enter to perform the search.",
  "Choose Format - Cells.",
]
SIZES = dict(vocab_size=8000, emb_dim=16, num_heads=2, num_encoder_layers=1, head_dim=8, mlp_dim=32)


def prepare(workdir: Path) -> None:
  import jax

  from speculative import checkpoints
  from speculative.models.t5 import T5
  from speculative.models.t5 import T5Config

  workdir.mkdir(parents=True, exist_ok=True)
  for name, layers, seed in (("t", 2, 0), ("d", 1, 1)):
    config = T5Config(num_decoder_layers=layers, **SIZES)
    checkpoints.save_params(
      T5(config).init_params(jax.random.PRNGKey(seed)),
      workdir / f"{name}.msgpack",
      dtype=None,
      config=config,
    )
  (workdir / "in.tsv").write_text("".join(f"{s}\tRef {i}\n" for i, s in enumerate(SOURCES)))


def command(workdir: Path, out: Path) -> list[str]:
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
  gin_file = workdir / "job.gin"
  gin_file.write_text("\n".join(bindings) + "\n")
  return [sys.executable, "-m", "speculative.infer", f"--gin_file={gin_file}"]


def outputs(out: Path) -> dict[str, bytes]:
  return {p.name: p.read_bytes() for p in sorted(out.glob("predictions-*.jsonl"))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=10)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--workdir", default="/tmp/kill_soak")
  args = parser.parse_args()
  workdir = Path(args.workdir)
  shutil.rmtree(workdir, ignore_errors=True)
  prepare(workdir)
  reference = workdir / "reference"
  t0 = time.time()
  subprocess.run(command(workdir, reference), cwd=REPO, check=True, stdout=subprocess.DEVNULL)
  duration = time.time() - t0
  expected = outputs(reference)
  rng = random.Random(args.seed)
  for trial in range(args.trials):
    out = workdir / f"trial_{trial}"
    kills = 0
    while True:
      proc = subprocess.Popen(
        command(workdir, out), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
      )
      # The first attempt of a trial is always killed part-way (the reference run's duration
      # includes cold start-up, so later runs are faster); resumed attempts may finish.
      share = rng.uniform(0.1, 0.7) if kills == 0 else rng.uniform(0.2, 1.2)
      try:
        proc.wait(timeout=share * duration)
      except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
        continue
      if proc.returncode:
        sys.exit(f"trial {trial}: run exited {proc.returncode}")
      break
    ok = outputs(out) == expected
    print(f"trial {trial}: {kills} kills, {'identical' if ok else 'MISMATCH'}", flush=True)
    if not ok:
      sys.exit(1)


if __name__ == "__main__":
  main()
