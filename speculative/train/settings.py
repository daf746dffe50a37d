"""TrainSettings: the arguments of `speculative.train.train`, checked on construction, before any
compute."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Sequence

from speculative import checkpoints
from speculative.jobs import checks
from speculative.models import t5 as t5_lib
from speculative.train import checkpoints as train_checkpoints
from speculative.train import data as train_data
from speculative.train import steps

# The fields of TrainSettings that name inputs (files or checkpoints the run reads).
INPUT_PATHS = (
  "train_tsv",
  "validation_tsv",
  "spm_model",
  "teacher_checkpoint",
  "init_checkpoint",
  "fork_checkpoint",
  "exclude_heldout",
)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """Every argument of `train` (same names and defaults), checked on construction."""

  model_config: t5_lib.T5Config
  train_tsv: str | Sequence[str]
  validation_tsv: str
  spm_model: str
  output_dir: str
  num_steps: int
  learning_rate: float = 1e-3
  warmup_steps: int = 500
  weight_decay: float = 0.01
  clip_norm: float = 1.0
  tokens_per_batch: int = 3072
  bucket_lengths: Sequence[int | Sequence[int]] = train_data.DEFAULT_BUCKET_LENGTHS
  checkpoint_every: int = 500
  eval_every: int = 1000
  max_validation_examples: int = 500
  seed: int = 0
  teacher_config: t5_lib.T5Config | None = None
  teacher_checkpoint: str | None = None
  distill_weight: float = 0.0
  export_path: str | None = None
  export_dtype: str = "bfloat16"
  max_steps_this_run: int | None = None
  export_only: bool = False
  schedule: str = "cosine"
  label_smoothing: float = 0.0
  exclude_heldout: Sequence[str] = ()
  export_best: bool = False
  optimizer: str = "adamw"
  init_checkpoint: str | None = None
  fork_checkpoint: str | None = None
  export_replaces_better: bool = False
  input_prefixes: Sequence[str] | None = None
  extra_validation: dict[str, tuple[str, str]] | None = None
  export_overwrites_tracked: bool = False

  def __post_init__(self):
    # Relative input paths missing here are the repository's (`checks.resolve_input_path`), so the
    # shipped run files (data/..., models/...) work from any working directory; output_dir and
    # export_path stay relative to it.
    checks.resolve_input_fields(self, INPUT_PATHS)
    if self.extra_validation:
      object.__setattr__(
        self,
        "extra_validation",
        {
          name: (checks.resolve_input_path(entry[0]), *entry[1:])
          if isinstance(entry, (tuple, list))
          else entry
          for name, entry in self.extra_validation.items()
        },
      )
    if not self.export_overwrites_tracked:  # the shipped weights (models/embedded/) are tracked
      checks.check_not_tracked("export_path", self.export_path, "train.export_overwrites_tracked")
    if not self.train_files:
      raise ValueError("train_tsv names no file")
    for name, entry in (self.extra_validation or {}).items():
      if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
        raise ValueError(f"extra_validation[{name!r}] must be (tsv, input prefix), got {entry!r}")
    extra = [path for path, _ in (self.extra_validation or {}).values()]
    for path in (*self.train_files, self.validation_tsv, *self.exclude_heldout, *extra):
      if not os.path.isfile(path):
        raise FileNotFoundError(f"data file does not exist: {path}")
    if self.init_checkpoint is not None and self.fork_checkpoint is not None:
      raise ValueError("set init_checkpoint or fork_checkpoint, not both")
    # The weights the run starts from or distils from, checked before any data loads
    # (`checkpoints.check_weights`; their shapes are checked against the model at load).
    if self.starts_from_init_checkpoint:
      checkpoints.check_weights("init_checkpoint", self.init_checkpoint)
    if self.starts_from_fork:
      train_checkpoints.fork_step(self.fork_checkpoint)  # names the problem before any compute
      checkpoints.check_weights("fork_checkpoint", self.fork_checkpoint, self.model_config)
    if self.has_own_checkpoint:
      train_checkpoints.check_origin(self.output_dir, self.origin)
    if self.optimizer not in steps.OPTIMIZERS:
      raise ValueError(f"optimizer must be one of {steps.OPTIMIZERS}, got {self.optimizer!r}")
    for name in ("num_steps", "eval_every", "checkpoint_every"):
      checks.check_int(name, getattr(self, name), 1)
    if self.optimizer == "adafactor" and self.weight_decay > 0:  # not scaled by the learning rate
      kept = (1 - self.weight_decay) ** self.num_steps
      logging.warning(
        "weight_decay %g under adafactor takes %g of every weight each step, whatever the learning "
        "rate: %.3g of a weight the gradients leave alone is left after %d steps (AdamW scales it "
        "by the learning rate); bind train.weight_decay = 0.0 to turn it off",
        self.weight_decay,
        self.weight_decay,
        kept,
        self.num_steps,
      )
    if not 0.0 <= self.label_smoothing < 1.0:  # 1 leaves no mass on the target: a NaN loss
      raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
    checks.check_readable("spm_model", self.spm_model, file=True)
    for path in (*self.train_files, self.validation_tsv):
      checks.check_readable("train_tsv / validation_tsv", path, file=True)
    if not 0.0 <= self.distill_weight <= 1.0:
      raise ValueError(f"distill_weight must be in [0, 1], got {self.distill_weight}")
    if self.distill_weight > 0 and (self.teacher_config is None or self.teacher_checkpoint is None):
      raise ValueError("distillation needs teacher_config and teacher_checkpoint")
    if self.distill_weight > 0:
      checkpoints.check_weights("teacher_checkpoint", self.teacher_checkpoint)
    train_data.make_buckets(self.bucket_lengths, self.tokens_per_batch)  # names a bad bucket list
    if self.input_prefixes is not None and len(self.input_prefixes) != len(self.train_files):
      raise ValueError(
        f"input_prefixes has {len(self.input_prefixes)} entries for {len(self.train_files)} "
        f"train_tsv files; give one prefix per file, in the same order"
      )

  @property
  def train_prefixes(self) -> tuple[str, ...]:
    """The input prefix of each of `train_files` (default: the translation prefix for every one)."""
    if self.input_prefixes is None:
      return (train_data.INPUT_PREFIX,) * len(self.train_files)
    return tuple(self.input_prefixes)

  @property
  def train_files(self) -> tuple[str, ...]:
    """`train_tsv` as a tuple of paths."""
    if isinstance(self.train_tsv, (str, os.PathLike)):
      return (os.fspath(self.train_tsv),)
    return tuple(os.fspath(path) for path in self.train_tsv)

  def buckets(self) -> tuple[train_data.Bucket, ...]:
    """Batch size per bucket keeps the padded tokens per batch near `tokens_per_batch`."""
    return train_data.make_buckets(self.bucket_lengths, self.tokens_per_batch)

  @property
  def has_own_checkpoint(self) -> bool:
    """`output_dir` holds a checkpoint to resume from."""
    return os.path.isdir(self.output_dir) and bool(checkpoints.checkpoint_steps(self.output_dir))

  @property
  def starts_from_init_checkpoint(self) -> bool:
    """`init_checkpoint` is set and `output_dir` holds no checkpoint to resume from."""
    return self.init_checkpoint is not None and not self.has_own_checkpoint

  @property
  def starts_from_fork(self) -> bool:
    """`fork_checkpoint` is set and `output_dir` holds no checkpoint to resume from."""
    return self.fork_checkpoint is not None and not self.has_own_checkpoint

  @property
  def origin(self) -> dict:
    """The start of this run (weights and seed), recorded in a new run directory and checked on
    resume."""
    return train_checkpoints.run_origin(self.init_checkpoint, self.fork_checkpoint, self.seed)

  @property
  def best_path(self) -> str:
    return os.path.join(self.output_dir, "best.msgpack")

  @property
  def best_info_path(self) -> str:
    return os.path.join(self.output_dir, "best.json")
