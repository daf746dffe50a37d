"""The settings of a batch inference job (`infer.infer`'s arguments), checked in one place before
anything loads: every knob's type and range, the input source, the model configs and every path.
Stats paths and hashes the weights files (`_check_weights`, last); reads no inputs."""

from __future__ import annotations

import dataclasses
import os
from typing import Any
from typing import Sequence

from speculative import checkpoints
from speculative import drafters as drafters_lib
from speculative import kernels
from speculative import sampling as sampling_lib
from speculative.autogamma import costs
from speculative.data import tasks
from speculative.decode import options as decode_options
from speculative.jobs import checks
from speculative.jobs import runtime
from speculative.models import grow
from speculative.models import t5 as t5_lib

MODES = ("baseline", "speculative")
# The speculative method: one draft a step (Leviathan et al.), or SpecTr's K drafts (Sun et al.),
# decoded beside the baseline and one-draft speculative decoding as a third mode.
METHODS = ("speculative", "spectr")
SPECTR = "spectr"
# Every mode a job may decode (the files an output directory may hold), in report order.
ALL_MODES = MODES + (SPECTR,)
# K, SpecTr's drafts a step. 8 is the largest measured (docs/spectr); the verify call grows K-fold.
NUM_DRAFTS_RANGE = (1, 8)
# Draft sources of the speculative mode (names of the drafter registry, speculative.drafters.registry):
# the draft model, copying n-grams from the source sentence or the generated prefix, or copying with
# the draft model as the fallback for rows without a match.
DRAFTERS = tuple(name for name in drafters_lib.DRAFTERS if not drafters_lib.needs_corpus(name))
# The n-gram table drafters (unigram, bigram) are the drafter benchmark's only: a job refuses them,
# saying why (NGRAM_REFUSAL).
NGRAM_REFUSAL = (
  "drafter {name!r} is benchmark-only (python -m speculative.bench.drafters_page): its table is "
  "estimated from a training corpus, and on the shipped pair it gave 1.10-1.19 tokens per target "
  "call at gamma 4 (docs/drafters/drafters.md) while the gamma+1 verify costs 1.5-2x a step, so "
  "a job would run slower than the baseline; use DRAFTER = 'model'"
)
# SpecTr's drafts must be i.i.d. samples: the draft model's. A deterministic drafter gives K
# identical drafts (exact, but K-fold work for nothing).
SPECTR_DRAFTERS = ("model",)
# gamma: draft tokens per target call. Past ~32 the verify call costs more than drafting saves.
GAMMA_RANGE = (1, 32)
# gamma = 'auto': the job chooses gamma in 0..gamma_max per batch from measured costs and the
# acceptance it observes (speculative/infer/auto_gamma.py); gamma_max None = DEFAULT_GAMMA_MAX.
AUTO = "auto"
DEFAULT_GAMMA_MAX = 7


@dataclasses.dataclass(frozen=True)
class InferSettings:
  """Every argument of `infer.infer` (same names, same defaults; see its docstring), validated on
  construction: a ValueError/FileNotFoundError/PermissionError names the first bad setting."""

  target_config: t5_lib.T5Config
  target_checkpoint: str
  output_dir: str
  task_feature_lengths: dict[str, int]
  mixture_or_task_name: str | None = None
  split: str = "test"
  input_file: str | None = None
  input_prefix: str = ""
  vocabulary_path: str | None = None
  num_examples: int | None = None
  draft_config: t5_lib.T5Config | None = None
  draft_checkpoint: str | None = None
  grow_target_to: t5_lib.T5Config | None = None
  modes: Sequence[str] = MODES
  method: str = "speculative"
  num_drafts: int = 1
  batch_size: int = 1
  gamma: int | str = 4
  gamma_max: int | None = None
  calibration_file: str | None = None
  drafter: str = "model"
  draft_stop_below: float = 0.0
  adaptive_verify: bool = False
  lenience: float = 1.0
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  seed: int = 0
  kernels: str = "auto"
  require_identical: bool = True
  progress: bool = True
  overwrite: bool = False

  def __post_init__(self):
    # Relative input paths missing here are the repository's (`checks.resolve_input_path`), so the
    # shipped run files work from any working directory; output_dir stays relative to it.
    checks.resolve_input_fields(
      self,
      ("target_checkpoint", "draft_checkpoint", "vocabulary_path")
      + (("input_file",) if self.input_file != "-" else ()),  # input_file '-' is stdin
    )
    # adaptive_verify, require_identical, progress and overwrite: any value is valid.
    _check_modes(self.modes)
    _check_source(self.mixture_or_task_name, self.input_file, self.split, self.input_prefix)
    _check_knobs(self)
    _check_method(self)
    _check_feature_lengths(self.task_feature_lengths)
    _check_models(self)
    _check_paths(self)
    sampling_lib.make_sampling(self.temperature, self.top_k, self.top_p)[1].validate()
    _check_weights(self)  # last: it reads (hashes) the weights files

  @property
  def speculative(self) -> bool:
    return "speculative" in self.modes

  @property
  def spectr(self) -> bool:
    """METHOD = 'spectr': SpecTr decoded as a third mode beside the baseline and speculative."""
    return self.method == SPECTR

  @property
  def job_modes(self) -> tuple[str, ...]:
    """The modes the job decodes, in order: `modes`, then 'spectr' with METHOD = 'spectr'."""
    return tuple(self.modes) + ((SPECTR,) if self.spectr else ())

  @property
  def decode_rows(self) -> int:
    """The most rows a decode call runs: the batch, K x the batch for SpecTr's K drafts."""
    return self.batch_size * (self.num_drafts if self.spectr else 1)

  @property
  def decode_target_config(self) -> t5_lib.T5Config:
    """The target the job decodes with: `grow_target_to` where set (the checkpoint's model grown
    to that shape in memory, `load_models`), else `target_config`."""
    return self.target_config if self.grow_target_to is None else self.grow_target_to

  @property
  def needs_draft_model(self) -> bool:
    return self.speculative and drafters_lib.needs_draft_model(self.drafter)

  @property
  def auto_gamma(self) -> bool:
    """gamma = 'auto': chosen per batch from measured costs (speculative/infer/auto_gamma.py)."""
    return self.gamma == AUTO

  @property
  def max_gamma(self) -> int:
    """The largest gamma a decode may use: gamma itself, or gamma_max under 'auto'."""
    if self.auto_gamma:
      return DEFAULT_GAMMA_MAX if self.gamma_max is None else int(self.gamma_max)
    return int(self.gamma)

  @property
  def calibration_path(self) -> str:
    """Where an 'auto' job's measured costs are cached (`autogamma.costs.default_cache_file`)."""
    return self.calibration_file or costs.default_cache_file()

  @property
  def exact(self) -> bool:
    """lenience 1: the speculative output is the target's (l < 1 changes it)."""
    return float(self.lenience) == 1.0

  @property
  def inputs_length(self) -> int:
    return int(self.task_feature_lengths["inputs"])

  @property
  def max_new_tokens(self) -> int:
    return int(self.task_feature_lengths["targets"])

  def output_settings(self) -> dict[str, Any]:
    """Every setting besides the inputs and the weights that can change an output, one entry each:
    the manifest records them (a resume must match each), metrics.json holds them and the report's
    header names them (`infer.report`). A new such setting is one line here (and one row of
    tests/infer/test_resume_fingerprint.py)."""
    return {
      "batch_size": self.batch_size,
      "drafter": self.drafter if self.speculative else None,
      "gamma": self.gamma,
      **({"gamma_max": self.max_gamma} if self.auto_gamma else {}),
      # SpecTr's method and K only with METHOD = 'spectr' (one-draft manifests stay as they were).
      **({"method": self.method, "num_drafts": self.num_drafts} if self.spectr else {}),
      "draft_stop_below": self.draft_stop_below,
      "adaptive_verify": self.adaptive_verify,
      "lenience": self.lenience,
      "temperature": self.temperature,
      "top_k": self.top_k,
      "top_p": self.top_p,
      "seed": self.seed,
      "decode_path": self.decode_path().name,
      "param_dtype": self.param_dtype(),
      "dtype": self.compute_dtype(),
    }

  def param_dtype(self) -> str:
    """The weights' dtype in memory: runtime.PARAM_DTYPE, but a grown target's are stored in its
    compute dtype (bfloat16 at T5 1.1 XXL's shape: 22 GB where float32 would read 44 GB a step)."""
    if self.grow_target_to is None or str(self.grow_target_to.dtype) == runtime.PARAM_DTYPE:
      return runtime.PARAM_DTYPE
    return f"target {self.grow_target_to.dtype}, draft {runtime.PARAM_DTYPE}"

  def compute_dtype(self) -> str:
    """The models' activation dtype (their configs' `dtype`): 'float32', or 'target bfloat16,
    draft float32' where the two differ."""
    target = str(self.decode_target_config.dtype)
    draft = str(self.draft_config.dtype) if self.needs_draft_model else target
    return target if draft == target else f"target {target}, draft {draft}"

  def decode_path(self) -> kernels.policy.Path:
    """The job's matmul path (the CPU kernels or XLA's dot), chosen once (`kernels.policy`: by
    the setting, the rows a decode call runs (`decode_rows`: K x the batch with SpecTr) and the
    backend the job computes on)."""
    path = kernels.policy.choose(self.kernels, self.decode_rows)
    if not self.spectr:
      return path
    return dataclasses.replace(
      path,
      line=f"{path.line}; the batch counts SpecTr's rows, K x B = {self.num_drafts} x "
      f"{self.batch_size}",
    )

  def sampling(self) -> tuple[sampling_lib.SamplingConfig, sampling_lib.SamplingParams]:
    return sampling_lib.make_sampling(self.temperature, self.top_k, self.top_p)

  def decode_options(self, gamma: int | None = None) -> decode_options.DecodeOptions:
    """The static options of the job's decode loops: both modes at the job's gamma, or (an 'auto'
    job) the baseline with `gamma` None and the speculative mode at each chosen `gamma`."""
    return decode_options.DecodeOptions(
      max_new_tokens=self.max_new_tokens,
      sampling=self.sampling()[0],
      eos_id=tasks.EOS_ID,
      gamma=gamma if self.auto_gamma else self.gamma,
      adaptive_verify=self.adaptive_verify,
    )


def _check_modes(modes: Any) -> None:  # 'spectr' is METHOD's, not a mode to list
  if isinstance(modes, str) or not modes:
    raise ValueError(f"modes must be a non-empty sequence of {MODES}, got {modes!r}")
  for mode in modes:
    checks.check_choice("mode", mode, MODES)


def _check_source(
  mixture_or_task_name: Any, input_file: Any, split: Any, input_prefix: Any
) -> None:
  if (mixture_or_task_name is None) == (input_file is None):
    raise ValueError(
      "give exactly one of mixture_or_task_name (MIXTURE_OR_TASK_NAME) and "
      "input_file (INPUT_FILE); to decode a file with configs/local/run.gin, bind "
      "INPUT_FILE = 'path' and MIXTURE_OR_TASK_NAME = None"
    )
  if mixture_or_task_name is not None and not isinstance(split, str):
    raise ValueError(f"split must be a string, got {split!r}")
  if not isinstance(input_prefix, str):  # put before each line of input_file ('' = none)
    raise ValueError(f"input_prefix must be a string ('' for none), got {input_prefix!r}")


def _check_method(s: InferSettings) -> None:
  """METHOD and NUM_DRAFTS, and what SpecTr refuses: each a one-line ValueError naming it."""
  checks.check_choice("method (METHOD)", s.method, METHODS)
  checks.check_int("num_drafts (NUM_DRAFTS)", s.num_drafts, *NUM_DRAFTS_RANGE)
  if not s.spectr:
    if s.num_drafts != 1:
      raise ValueError(
        f"num_drafts (NUM_DRAFTS) = {s.num_drafts} needs method (METHOD) = 'spectr'; "
        "one-draft speculative decoding drafts one sequence a step"
      )
    return
  refuse = lambda why: ValueError(f"method (METHOD) = 'spectr': {why}")  # noqa: E731
  if isinstance(s.gamma, str):  # GAMMA = 'auto' (chosen from measured costs) is one-draft only
    raise refuse(
      f"GAMMA must be an integer draft length L, got {s.gamma!r} (e.g. GAMMA = 3; 'auto' "
      "chooses a one-draft gamma from measured costs)"
    )
  if "speculative" not in s.modes:
    raise refuse(
      "SpecTr is decoded beside one-draft speculative decoding; modes must include "
      f"'speculative', got {tuple(s.modes)!r}"
    )
  if s.drafter not in SPECTR_DRAFTERS:
    raise refuse(
      f"drafter {s.drafter!r} is deterministic and would give K identical drafts; SpecTr needs "
      f"i.i.d. drafts: DRAFTER = {SPECTR_DRAFTERS[0]!r}"
    )
  if s.temperature == 0:
    raise refuse(
      "at temperature 0 the draft model's K drafts are the same argmax draft and SpecTr is "
      "speculative decoding; set TEMPERATURE > 0 or METHOD = 'speculative'"
    )
  if s.draft_stop_below:
    raise refuse("draft_stop_below (adaptive gamma) is not supported; SpecTr drafts L tokens")
  if s.adaptive_verify:
    raise refuse("adaptive_verify is not supported; SpecTr verifies K x (L+1) positions")
  if s.lenience != 1.0:
    raise refuse("lenience is not supported; SpecTr is exact (LENIENCE = 1.0)")


def _check_knobs(s: InferSettings) -> None:
  checks.check_int("batch_size", s.batch_size, 1)
  _check_gamma(s)
  checks.check_float("temperature", s.temperature, 0.0)
  checks.check_int("top_k", s.top_k, 0)
  checks.check_float("top_p", s.top_p, 0.0, 1.0, low_inclusive=False)
  sampling_lib.check_lenience(
    checks.check_float("lenience", s.lenience, 0.0, 1.0, low_inclusive=False)
  )
  checks.check_float("draft_stop_below", s.draft_stop_below, 0.0, 1.0, high_inclusive=False)
  checks.check_int("seed", s.seed, 0)
  checks.check_int("num_examples (None = all)", s.num_examples, 1, allow_none=True)
  if s.drafter in drafters_lib.DRAFTERS and drafters_lib.needs_corpus(s.drafter):
    raise ValueError(NGRAM_REFUSAL.format(name=s.drafter))
  checks.check_choice("drafter", s.drafter, DRAFTERS)
  checks.check_choice("kernels", s.kernels, kernels.policy.SETTINGS)
  # 'on' where the kernels are unavailable or the job computes off CPU: refused here, before any
  # weights load.
  kernels.policy.choose(s.kernels, s.batch_size)


def _check_gamma(s: InferSettings) -> None:
  """gamma: an int in GAMMA_RANGE or 'auto'; gamma_max only with 'auto', in GAMMA_RANGE; 'auto'
  replaces the other per-step gamma rules (refused beside them) and needs a writable cache."""
  if s.gamma != AUTO:
    if isinstance(s.gamma, str):
      raise ValueError(f"gamma must be an int in {list(GAMMA_RANGE)} or 'auto', got {s.gamma!r}")
    checks.check_int("gamma (or 'auto')", s.gamma, *GAMMA_RANGE)
    if s.gamma_max is not None:
      raise ValueError(
        f"gamma_max (GAMMA_MAX = {s.gamma_max!r}) bounds gamma = 'auto' only; with gamma "
        f"{s.gamma} leave it None"
      )
    return
  checks.check_int("gamma_max (None = 7)", s.gamma_max, *GAMMA_RANGE, allow_none=True)
  if s.draft_stop_below:
    raise ValueError(
      "gamma = 'auto' chooses each batch's gamma from measured costs; draft_stop_below "
      f"({s.draft_stop_below}) shortens drafts by another rule: use one of the two"
    )
  if s.adaptive_verify:
    raise ValueError(
      "gamma = 'auto' chooses each batch's verify width from measured costs; adaptive_verify "
      "narrows it by another rule: use one of the two"
    )
  if s.calibration_file is not None and not isinstance(s.calibration_file, str):
    raise ValueError(f"calibration_file must be a path or None, got {s.calibration_file!r}")
  if s.speculative:
    costs.check_cache_file(s.calibration_path)


def _check_feature_lengths(task_feature_lengths: Any) -> None:
  if not isinstance(task_feature_lengths, dict) or set(task_feature_lengths) != {
    "inputs",
    "targets",
  }:
    raise ValueError(
      f"task_feature_lengths must be {{'inputs': N, 'targets': M}}, got {task_feature_lengths!r}"
    )
  checks.check_int("task_feature_lengths['inputs']", task_feature_lengths["inputs"], 2)
  checks.check_int("task_feature_lengths['targets']", task_feature_lengths["targets"], 1)


def _check_models(s: InferSettings) -> None:
  if not isinstance(s.target_config, t5_lib.T5Config):
    raise ValueError(f"target_config must be a t5.T5Config, got {type(s.target_config).__name__}")
  checks.check_readable("target_checkpoint", s.target_checkpoint)
  if s.grow_target_to is not None:
    if not isinstance(s.grow_target_to, t5_lib.T5Config):
      raise ValueError(
        f"grow_target_to must be None or a t5.T5Config, got {type(s.grow_target_to).__name__}"
      )
    try:
      grow.check_growable(s.target_config, s.grow_target_to)
    except ValueError as e:
      raise ValueError(f"grow_target_to: {e} (from target_config)") from None
  if not s.needs_draft_model:
    return
  if s.draft_config is None or not s.draft_checkpoint:
    raise ValueError(
      f"speculative mode with drafter {s.drafter!r} needs draft_config and draft_checkpoint"
    )
  if not isinstance(s.draft_config, t5_lib.T5Config):
    raise ValueError(f"draft_config must be a t5.T5Config, got {type(s.draft_config).__name__}")
  if s.draft_config.vocab_size != s.target_config.vocab_size:
    raise ValueError(
      f"draft and target vocabularies differ: draft vocab_size "
      f"{s.draft_config.vocab_size} != target vocab_size "
      f"{s.target_config.vocab_size}"
    )
  checks.check_readable("draft_checkpoint", s.draft_checkpoint)


def _check_weights(s: InferSettings) -> None:
  """Each weights path the job loads is weights of its model config (`checkpoints.check_weights`):
  refused here, with one line naming it, before anything loads or compiles."""
  checkpoints.check_weights("target_checkpoint", s.target_checkpoint, s.target_config)
  if s.needs_draft_model:
    checkpoints.check_weights("draft_checkpoint", s.draft_checkpoint, s.draft_config)


def _check_paths(s: InferSettings) -> None:
  if s.input_file is not None and s.input_file != "-":
    checks.check_readable("input_file", s.input_file, file=True)
  if s.vocabulary_path is not None:
    checks.check_readable("vocabulary_path", s.vocabulary_path, file=True)
  if not isinstance(s.output_dir, (str, os.PathLike)) or not str(s.output_dir):
    raise ValueError(f"output_dir must be a path, got {s.output_dir!r}")
