"""Training checkpoints: `checkpoint_<step>/` in the T5X layout with the optax state beside it,
written in one atomic step; a run resumes from the newest readable one."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from typing import Sequence

from flax import serialization
import jax
import numpy as np

from speculative import checkpoints
from speculative.models import t5 as t5_lib

OPTAX_STATE_FILE = "optax_state.msgpack"


def _latest_step_list(output_dir: str) -> list[int]:
  """Steps of the complete checkpoints (params and optax state both written) in output_dir."""
  if not os.path.isdir(output_dir):
    return []
  return [
    int(n.split("_")[1])
    for n in os.listdir(output_dir)
    if n.startswith("checkpoint_")
    and n.split("_")[1].isdigit()
    and os.path.exists(os.path.join(output_dir, n, OPTAX_STATE_FILE))
  ]


def save_train_state(
  output_dir: str,
  step: int,
  params,
  opt_state,
  keep: int = 2,
  config: t5_lib.T5Config | None = None,
) -> str:
  """Writes checkpoint_<step> (T5X layout) with its optax state in one atomic step (temp dir +
  rename), recording `config` and the content sha256 (checked on resume); keeps the newest `keep`."""
  path = checkpoints.save_t5x_checkpoint(
    jax.device_get(params),
    output_dir,
    step,
    overwrite=True,
    config=config,
    extra_files={OPTAX_STATE_FILE: serialization.to_bytes(jax.device_get(opt_state))},
  )
  prune_checkpoints(output_dir, keep)
  return path


def prune_checkpoints(output_dir: str, keep: int = 2, protect: Sequence[int] = ()) -> None:
  """Deletes all complete checkpoints but the newest `keep` (and the steps in `protect`). Each is
  first renamed to `checkpoint_<n>.old-*`, so a kill mid-delete leaves no partial checkpoint_<n>,
  only a temporary that `checkpoints.remove_stale_temporaries` deletes at the next start."""
  for old in sorted(_latest_step_list(output_dir))[:-keep]:
    if old in protect:
      continue
    trash = tempfile.mkdtemp(prefix=f"checkpoint_{old}.old-", dir=output_dir)
    os.rename(os.path.join(output_dir, f"checkpoint_{old}"), os.path.join(trash, "old"))
    shutil.rmtree(trash, ignore_errors=True)


def fork_step(path: str) -> int:
  """The step of a trainer checkpoint directory `<run>/checkpoint_<step>` holding its optimizer
  state; FileNotFoundError / ValueError naming `path` otherwise."""
  if not os.path.isdir(path):
    raise FileNotFoundError(f"fork_checkpoint does not exist: {path}")
  match = re.fullmatch(r"checkpoint_(\d+)", os.path.basename(os.path.normpath(path)))
  if match is None:
    raise ValueError(f"fork_checkpoint must be a checkpoint_<step> directory, got {path}")
  if not os.path.isfile(os.path.join(path, OPTAX_STATE_FILE)):
    raise ValueError(
      f"fork_checkpoint {path} has no {OPTAX_STATE_FILE} (not written by this trainer)"
    )
  return int(match.group(1))


def copy_fork(path: str, output_dir: str) -> str:
  """Copies checkpoint `path` into `output_dir` under its own name, atomically (a temporary
  directory renamed at the end), and returns the new path."""
  step = fork_step(path)
  os.makedirs(output_dir, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f"checkpoint_{step}.tmp-", dir=output_dir)
  shutil.copytree(path, os.path.join(tmp, "copy"))
  destination = os.path.join(output_dir, f"checkpoint_{step}")
  os.rename(os.path.join(tmp, "copy"), destination)
  os.rmdir(tmp)
  return destination


def restore_train_state(
  output_dir: str,
  step: int,
  params_template,
  opt_state_template,
  config: t5_lib.T5Config | None = None,
):
  """Params and optax state of checkpoint_<step>; CheckpointError naming the file if unreadable,
  corrupt, saved with another config, or not matching this run's model or optimizer."""
  path = os.path.join(output_dir, f"checkpoint_{step}")
  params = checkpoints.load_t5x_checkpoint(path, config=config)
  checkpoints.validate_params(params, params_template, name=path)
  params = jax.tree_util.tree_map(lambda t, x: np.asarray(x, t.dtype), params_template, params)
  state_file = os.path.join(path, OPTAX_STATE_FILE)
  try:
    with open(state_file, "rb") as f:
      opt_state = serialization.from_bytes(opt_state_template, f.read())
  except (OSError, ValueError, TypeError, KeyError) as e:
    raise checkpoints.CheckpointError(
      f"{state_file}: optimizer state does not match this run's optimizer or is corrupt "
      f"({type(e).__name__}: {e})"
    ) from e
  return params, opt_state


def restore_latest(
  output_dir: str, params_template, opt_state_template, config: t5_lib.T5Config | None = None
):
  """(step, params, opt_state) of the newest readable checkpoint, falling back past unreadable
  ones with a warning; (0, templates) if there is none. Raises CheckpointError naming every file if
  checkpoints exist but none is readable (rather than silently starting over)."""
  errors = []
  for step in sorted(_latest_step_list(output_dir), reverse=True):
    try:
      params, opt_state = restore_train_state(
        output_dir, step, params_template, opt_state_template, config
      )
    except (checkpoints.CheckpointError, OSError, ValueError) as e:
      logging.warning(
        "cannot resume from %s/checkpoint_%d, trying the previous one: %s", output_dir, step, e
      )
      errors.append(f"checkpoint_{step}: {e}")
      continue
    return step, params, opt_state
  if errors:
    raise checkpoints.CheckpointError(
      f"no readable checkpoint in {output_dir}:\n  " + "\n  ".join(errors)
    )
  return 0, params_template, opt_state_template


ORIGIN_FILE = "origin.json"


def run_origin(init_checkpoint: str | None, fork_checkpoint: str | None, seed: int) -> dict:
  """What makes a run directory one run: the weights it started from and the data-order seed."""
  return {
    "init_checkpoint": None if init_checkpoint is None else os.path.abspath(init_checkpoint),
    "fork_checkpoint": None if fork_checkpoint is None else os.path.abspath(fork_checkpoint),
    "seed": seed,
  }


def check_origin(output_dir: str, origin: dict) -> None:
  """Refuses to resume `output_dir` when it was started from other weights or with another seed
  than `origin` says (the checkpoints there would otherwise silently continue a different run).
  Run directories written before origins were recorded pass."""
  path = os.path.join(output_dir, ORIGIN_FILE)
  if not os.path.exists(path):
    return
  with open(path) as f:
    recorded = json.load(f)
  diffs = [
    f"{k}: run {recorded.get(k)!r}, given {origin.get(k)!r}"
    for k in sorted(set(recorded) | set(origin))
    if recorded.get(k) != origin.get(k)
  ]
  if diffs:
    raise ValueError(
      f"{output_dir} holds a run started differently (resuming it would relabel it):\n  "
      + "\n  ".join(diffs)
      + "\nuse a new output_dir for the new run"
    )


def write_origin(output_dir: str, origin: dict) -> None:
  """Records `origin` when a run directory is started (atomically)."""
  checkpoints.write_atomic(
    os.path.join(output_dir, ORIGIN_FILE), (json.dumps(origin, indent=2) + "\n").encode()
  )
