"""The benchmark's settings (`benchmark.benchmark`'s arguments), checked before any work, and the
timing fields it shares with the paper-shape benchmark."""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Mapping
from typing import Sequence

from speculative import kernels
from speculative.bench import methods as methods_lib
from speculative.drafters import registry as drafter_registry
from speculative.infer import inputs as infer_inputs
from speculative.jobs import checks
from speculative.models import t5 as t5_lib


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimingSettings:
  """The timing fields the benchmark and the paper-shape benchmark share, with their checks.

  Attributes:
    num_examples: how many inputs; inputs_length: the encoder length; max_new_tokens: decode cap.
    temperatures: the groups' temperatures (0: greedy).
    repeats: timed decodes per input batch and method; cost_repeats/cost_min_seconds: cost model
      (timing rounds, at least costs.MIN_ROUNDS for a noise verdict; least seconds per timing).
    cost_position: decoder position at which c and v(T) are measured.
    stock_t5x: 'auto' (time stock T5X when importable), 'on' (require it), 'off'.
    kernels: our models' decode path per batch size ('auto', 'on', 'off'; `kernels.policy`); the
      stock-equivalent twin and stock T5X always run on XLA.
  """

  num_examples: int = 40
  inputs_length: int = 64
  max_new_tokens: int = 64
  temperatures: Sequence[float] = (0.0, 1.0)
  repeats: int = 3
  cost_repeats: int = 5
  cost_min_seconds: float = 0.2
  cost_position: int = 16
  stock_t5x: str = "auto"
  kernels: str = "auto"
  seed: int = 0

  def check_timing(self, batch_sizes: Sequence[int]) -> None:
    """ValueError on a timing field out of range; 'on' kernels where some batch size cannot take
    them (unavailable, or the job computes off CPU)."""
    for name in ("repeats", "num_examples", "inputs_length", "max_new_tokens", "cost_repeats"):
      checks.check_int(name, getattr(self, name), 1)
    checks.check_int("cost_position", self.cost_position, 1, self.max_new_tokens - 1)
    if not self.temperatures or any(float(t) < 0 for t in self.temperatures):
      raise ValueError(f"temperatures must be >= 0; got {self.temperatures!r}")
    checks.check_choice("stock_t5x", self.stock_t5x, ("auto", "on", "off"))
    if self.stock_t5x == "on" and not methods_lib.t5x_available():
      raise ValueError("stock_t5x='on' but t5x is not importable (pip install t5x, or use 'auto')")
    for batch_size in batch_sizes:
      kernels.policy.choose(self.kernels, int(batch_size))

  @property
  def use_t5x(self) -> bool:
    """Time stock T5X itself ('on', or 'auto' where t5x is importable)."""
    return self.stock_t5x == "on" or (self.stock_t5x == "auto" and methods_lib.t5x_available())


@dataclasses.dataclass(frozen=True)
class BenchmarkSettings(TimingSettings):
  """Every argument of `benchmark`, same names and defaults, checked on construction.

  Attributes (see the module docstring for the method; the timing fields: TimingSettings):
    target_config, target_checkpoint: the target (T5X checkpoint dir or .msgpack params file).
    draft_config, draft_checkpoint: the draft model (needed by the 'model' drafter).
    task/split or input_file(+input_prefix): the inputs; or `examples` directly (e.g. synthetic).
    skip_truncated: skip inputs longer than inputs_length (every batch is padded to it).
    batch_sizes (with temperatures): the groups; gammas: a list, or {batch size: list}.
    drafters: drafter names (`drafters.registry.spec`); the first is the primary one
      (targets, policy).
    drafter_gammas: optional {drafter: gammas} overriding `gammas` for that drafter, again a list
      or {batch size: list}; an empty list skips the drafter at that batch size.
    fallback_threshold: the gamma policy falls back to plain decoding below this predicted speedup.
    allow_random_init: time random weights when a checkpoint is missing (smoke runs only).
    roofline_section: also measure the memory-bandwidth floor and the bare matmul stack's v(T)
      (costs.measure_roofline) for the report's roofline section.
    stock_hlo_check: count the matmuls per step in the compiled baseline and stock-equivalent
      loops (costs.decode_step_matmuls; two extra compiles) for the report's stock-equivalent check.
    whole_job_examples: 0 (off), or decode this many inputs of the split (all of it, if fewer)
      at the best batch size as the "whole job" row (main.whole_job).
  """

  target_config: t5_lib.T5Config
  target_checkpoint: str | None
  draft_config: t5_lib.T5Config | None = None
  draft_checkpoint: str | None = None
  target_name: str = "target"
  draft_name: str = "draft"
  task: str | None = "libreoffice_ende"
  split: str = "test"
  input_file: str | None = None
  input_prefix: str = ""
  examples: Sequence[infer_inputs.Example] | None = None
  skip_truncated: bool = True
  batch_sizes: Sequence[int] = (1, 8)
  gammas: Sequence[int] | Mapping[Any, Sequence[int]] = (1, 2, 3, 4, 5, 6, 7)
  drafters: Sequence[str] = ("model",)
  drafter_gammas: Mapping[str, Any] | None = None
  fallback_threshold: float = 1.0
  allow_random_init: bool = False
  output_dir: str | None = "docs"
  title: str = "Results: speculative decoding walltime on this machine"
  command: str = "python -m speculative.benchmark --gin_file=configs/benchmark/embedded.gin"
  plots: bool = True
  roofline_section: bool = True
  stock_hlo_check: bool = True
  whole_job_examples: int = 0
  verbose: bool = True

  def __post_init__(self):
    # Relative input paths missing here are the repository's (`checks.resolve_input_path`), so the
    # shipped run files work from any working directory; output_dir stays relative to it.
    checks.resolve_input_fields(self, ("target_checkpoint", "draft_checkpoint", "input_file"))
    if not self.batch_sizes or any(int(b) < 1 for b in self.batch_sizes):
      raise ValueError(f"batch_sizes must be integers >= 1; got {self.batch_sizes!r}")
    self.check_timing(self.batch_sizes)
    checks.check_int("whole_job_examples", self.whole_job_examples, 0)
    if not self.drafters:
      raise ValueError("drafters is empty")
    for name in self.drafters:
      drafter_registry.spec(name)
    if self.whole_job_examples and 0 not in [float(t) for t in self.temperatures]:
      raise ValueError("whole_job_examples needs temperature 0 in temperatures (greedy groups)")
    # Last: it reads (hashes) the weights. A missing one is refused unless allow_random_init.
    for what, config, path in (
      ("target", self.target_config, self.target_checkpoint),
      ("draft", self.draft_config, self.draft_checkpoint),
    ):
      if config is not None:
        methods_lib.check_checkpoint(
          config, path, allow_random_init=self.allow_random_init, what=what
        )
