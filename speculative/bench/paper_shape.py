"""The paper-shape benchmark: what speculative decoding gives at T5 1.1 XXL's shape on this device.

  python -m speculative.bench.paper_shape --gin_file=configs/benchmark/paper_shape.gin
  python -m speculative.bench.paper_shape --gin_file=configs/benchmark/paper_shape_small.gin  # CPU

Part 1 times a random-init pair of the shapes at batch 1 (costs, loop overhead, bandwidth share,
Theorem 3.8 at the paper's alphas); part 2 decodes with a trained target grown to the shape and the
shipped draft, every greedy divergence audited. Settings that cannot run are refused before any
compute. How to read it: docs/paper_shape.md.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import time
from typing import Any
from typing import Callable
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import analysis
from speculative import checkpoints
from speculative import kernels as kernels_lib
from speculative.bench import costs as costs_lib
from speculative.bench import markdown
from speculative.bench import methods as methods_lib
from speculative.bench import sweep
from speculative.decode import state as decode_state
from speculative.jobs import checks
from speculative.jobs import runtime
from speculative.models import grow
from speculative.models import memory
from speculative.models import t5 as t5_lib
from speculative.t5x_adapter import stock as t5x_stock

DEFAULT_GIN = "configs/benchmark/paper_shape.gin"
PAPER_ALPHAS = (("greedy", 0.75), ("temperature 1", 0.62))  # the paper's Table 3, T5-XXL / small
MAX_VERIFY = 8  # v(T) for T = 2..8, Theorem 3.8 for gamma = 1..MAX_VERIFY (its verify is gamma+1)
CACHES_HELD = 16  # decode caches of the target alive at once: one per cost timer, decode, audit


@dataclasses.dataclass(frozen=True, kw_only=True)
class PaperShapeSettings(sweep.TimingSettings):
  """The benchmark's arguments (gin: `paper_shape.<name>`), checked on construction.

  Attributes (the timing fields: `sweep.TimingSettings`, at batch 1; the inputs are the
  LibreOffice En-De test split's sentences, the pair's vocabulary):
    target_config, draft_config: the shapes measured (random init); the configs' dtype is the
      compute dtype.
    storage_dtype: the weights' dtype in memory ('bfloat16').
    source_config, source_checkpoint: the trained smaller target grown to `target_config` for the
      real walltime (None: costs only).
    shipped_draft_config, shipped_draft_checkpoint: the draft of the real walltime.
    gammas: the real walltime's speculative rows.
    read_rate_bytes: size of the array whose read rate the bandwidth share divides by.
    output_dir: where results.json goes (None: printed only).
  """

  target_config: t5_lib.T5Config
  draft_config: t5_lib.T5Config
  storage_dtype: str = "bfloat16"
  source_config: t5_lib.T5Config | None = None
  source_checkpoint: str | None = None
  shipped_draft_config: t5_lib.T5Config | None = None
  shipped_draft_checkpoint: str | None = None
  gammas: Sequence[int] = (3, 5, 7)
  repeats: int = 2
  read_rate_bytes: int = 2**30
  output_dir: str | None = None

  def __post_init__(self):
    self.check_timing([1])  # 'on' kernels off CPU: refused here
    checks.check_int("read_rate_bytes", self.read_rate_bytes, 1)
    sweep.gammas_for(list(self.gammas), 1)
    jnp.dtype(self.storage_dtype)
    self._check_vocabulary("draft_config")
    if self.real_walltime:
      self._check_real_walltime()
    memory.check_fits("target_config's shape", self.memory_need(), memory.device_memory(), FIT_HINT)

  @property
  def real_walltime(self) -> bool:
    return self.source_checkpoint is not None

  def _check_vocabulary(self, name: str) -> None:
    """ValueError unless the draft config `name` has target_config's vocabulary."""
    vocab, target_vocab = getattr(self, name).vocab_size, self.target_config.vocab_size
    if vocab != target_vocab:
      raise ValueError(
        f"{name}'s vocabulary ({vocab}) differs from target_config's ({target_vocab})"
      )

  def _check_real_walltime(self) -> None:
    if self.source_config is None or self.shipped_draft_config is None:
      raise ValueError("source_checkpoint needs source_config and shipped_draft_config")
    try:
      grow.check_growable(self.source_config, self.target_config)
    except ValueError as e:  # the grown target's vocabulary or head size is not the source's
      raise ValueError(f"source_config -> target_config: {e}") from None
    self._check_vocabulary("shipped_draft_config")
    checks.resolve_input_fields(self, ("source_checkpoint", "shipped_draft_checkpoint"))
    checkpoints.check_weights("source_checkpoint", self.source_checkpoint, self.source_config)
    checkpoints.check_weights(
      "shipped_draft_checkpoint", self.shipped_draft_checkpoint, self.shipped_draft_config
    )

  def memory_need(self) -> memory.Need:
    """The larger of the two parts' needs (they run one after the other); each part's pair is
    also held packed where batch 1 decodes on the CPU kernels (`methods.bench_models`)."""
    shape = dict(
      storage_dtype=self.storage_dtype,
      batch=1,
      inputs_length=self.inputs_length,
      max_length=self.max_new_tokens + MAX_VERIFY + 2,
      caches=CACHES_HELD,
    )
    kernels = kernels_lib.policy.choose(self.kernels, 1).kernels
    packed = lambda pair: [(c, self.storage_dtype) for c in pair] if kernels else ()  # noqa: E731
    pair = [self.target_config, self.draft_config]
    costs = memory.estimate(pair, extra_bytes=self.read_rate_bytes, packed=packed(pair), **shape)
    if not self.real_walltime:
      return costs
    itemsize = jnp.dtype(self.storage_dtype).itemsize
    growth = 2 * itemsize * memory.largest_leaf(self.target_config)  # a leaf being grown
    source = 4 * memory.num_params(self.source_config)  # float32, on the host (CPU: the same)
    pair = [self.target_config, self.shipped_draft_config]
    real = memory.estimate(pair, extra_bytes=growth + source, packed=packed(pair), **shape)
    return max(costs, real, key=lambda need: need.total)


FIT_HINT = (
  "use a smaller target_config (configs/benchmark/paper_shape_small.gin runs the same on CPU) or a "
  "device with more memory"
)


def _measure(s, pair, examples, log, gammas=(), temperatures=(0.0,), stock_t5x_decode=None):
  """(decode path, cost model, groups) of `pair` at batch 1 (baseline only without gammas); both
  parts use one cache length, so the second reuses the first's compiled target programs."""
  models = methods_lib.bench_models(pair, ["model"], s.kernels, [1], [])
  models = methods_lib.for_batch(models, 1, s.kernels)
  if not gammas:
    log(f"costs: random init, {models['decode_path']['line']}")
  timers: dict = {}
  max_length = decode_state.buffer_length(1, s.max_new_tokens, MAX_VERIFY)  # the loop's, at most
  max_gamma = max(gammas, default=MAX_VERIFY - 1)
  costs = costs_lib.measure_costs(s, models, examples, 1, max_gamma, timers, max_length=max_length)
  batch = sweep.Batch(s, 1, models, costs, timers, stock_t5x_decode, log)
  only = None if gammas else frozenset()
  groups = [
    sweep.run_group(batch, float(t), examples, {"model": list(gammas)}, only=only)
    for t in temperatures
  ]
  return models["decode_path"], costs, groups


def measure_costs(s: PaperShapeSettings, examples, log: Callable[[str], None]) -> dict[str, Any]:
  """Part 1: the random-init pair's costs, loop overhead, bandwidth share and Theorem 3.8."""
  target, draft = t5_lib.T5(s.target_config), t5_lib.T5(s.draft_config)
  target_params = target.init_params(jax.random.PRNGKey(s.seed), s.storage_dtype)
  draft_params = draft.init_params(jax.random.PRNGKey(s.seed + 1), s.storage_dtype)
  pair = methods_lib.Pair(target, target_params, draft, draft_params)
  decode_path, costs, groups = _measure(s, pair, examples, log)
  baseline = groups[0]["baselines"][0]
  step = costs["target_step_s"]
  via_embedding = s.target_config.logits_via_embedding
  kernels = costs_lib.decode_step_kernels(target.param_shapes(), logits_via_embedding=via_embedding)
  step_bytes = costs_lib.weight_bytes(kernels, jnp.dtype(s.storage_dtype).itemsize)
  read = costs_lib.measure_read_rate(s)
  draft_costs, per_token = costs["drafters"]["model"], baseline["ms_per_token"]
  c = draft_costs["c"]
  v = analysis.verify_cost_fn({int(k): x for k, x in costs["v"].items()})
  del target_params, draft_params, pair, groups  # part 2 needs the memory
  gc.collect()
  out = {
    "decode_path": decode_path,
    "target_step_s": step,
    "v": costs["v"],
    "c": c,
    "draft_step_s": draft_costs["draft_step_s"],
    "noise_refused": costs["noise"]["refused"],
    "baseline_ms_per_token": per_token,
    "loop_overhead": per_token / (1e3 * step),
    "baseline_step_over_t1": baseline["profile"]["step_s"] / step,
    "step_bytes": step_bytes,
    "step_read_rate_gb_s": step_bytes / step / 1e9,
    "read_rate": read,
    "bandwidth_share": step_bytes / step / 1e9 / read["read_rate_gb_s"],
  }
  gammas = range(1, MAX_VERIFY + 1)
  speedups = lambda alpha: {  # noqa: E731
    str(g): float(analysis.walltime_improvement(alpha, g, c, v)) for g in gammas
  }
  theorem = {label: dict(alpha=alpha, speedup=speedups(alpha)) for label, alpha in PAPER_ALPHAS}
  return dict(out, theorem_3_8=theorem)


def _load(config: t5_lib.T5Config, path: str) -> Any:
  """Float32 host params of `path`, checked against `config`'s shapes."""
  with checks.user_errors(checkpoints.LOAD_ERRORS):
    params = checkpoints.load_params(path, dtype=np.float32)
    checkpoints.validate_params(params, t5_lib.T5(config).param_shapes(), name=path)
  return params


def real_walltime(s: PaperShapeSettings, examples, log: Callable[[str], None]) -> dict[str, Any]:
  """Part 2: the grown target and the shipped draft, decoded; every greedy divergence audited."""
  start = time.perf_counter()
  target_params = grow.grow_params_in_memory(
    _load(s.source_config, s.source_checkpoint),
    s.source_config,
    s.target_config,
    seed=s.seed,
    dtype=s.storage_dtype,
  )
  jax.block_until_ready(target_params)
  grow_s = time.perf_counter() - start
  log(f"grew {s.source_checkpoint} to the shape in {grow_s:.1f} s")
  draft_params = jax.tree_util.tree_map(
    lambda x: jnp.asarray(x, s.storage_dtype),
    _load(s.shipped_draft_config, s.shipped_draft_checkpoint),
  )
  target, draft = t5_lib.T5(s.target_config), t5_lib.T5(s.shipped_draft_config)
  pair = methods_lib.Pair(target, target_params, draft, draft_params)
  stock_t5x_decode = methods_lib.stock_t5x_decoder(s, target_params)
  _, costs, groups = _measure(s, pair, examples, log, s.gammas, s.temperatures, stock_t5x_decode)
  return {"grow_s": grow_s, "c": costs["drafters"]["model"]["c"], "v": costs["v"], "groups": groups}


@checks.settings_entry(PaperShapeSettings)
def paper_shape(s: PaperShapeSettings) -> dict[str, Any]:
  """The benchmark (arguments: `PaperShapeSettings`' fields, checked before any compute)."""
  t0 = time.perf_counter()
  log = lambda msg: print(f"[{time.perf_counter() - t0:6.1f}s] {msg}", flush=True)  # noqa: E731
  machine = runtime.machine()
  need = s.memory_need()
  limit, source = memory.device_memory()
  report: dict[str, Any] = {
    "command": " ".join(["python -m speculative.bench.paper_shape", *sys.argv[1:]]),
    "machine": machine,
    "storage_dtype": s.storage_dtype,
    "target": memory.describe(s.target_config),
    "draft": memory.describe(s.draft_config),
    "memory": dict(need_bytes=need.total, need=need.line(), limit_bytes=limit, source=source),
  }
  log(f"target {report['target']}; draft {report['draft']}")
  log(f"memory: {_memory(report['memory'])}")
  examples, _ = methods_lib.split_examples("test", s.inputs_length, s.num_examples)
  report["costs"] = measure_costs(s, examples, log)
  if s.real_walltime:
    report["source"] = f"{s.source_checkpoint} ({memory.describe(s.source_config)})"
    report["shipped_draft"] = (
      f"{s.shipped_draft_checkpoint} ({memory.describe(s.shipped_draft_config)})"
    )
    report["real"] = real_walltime(s, examples, log)
  report["elapsed_s"] = time.perf_counter() - t0
  print(format_report(report))
  if s.output_dir:
    markdown.write_page(s.output_dir, {"results.json": report}, indent=1)
    log(f"wrote {os.path.join(s.output_dir, 'results.json')}")
  mismatches = [
    row["name"]
    for group in report.get("real", {}).get("groups", [])
    for row in group["baselines"] + group["speculative"]
    if row.get("audit_mismatch")
  ]
  if mismatches:
    raise AssertionError(f"greedy outputs differ from the baseline beyond rounding: {mismatches}")
  return report


def _memory(memory: dict[str, Any]) -> str:
  limit = memory["limit_bytes"]
  has = "an unknown amount" if limit is None else f"{limit / 1e9:.1f} GB ({memory['source']})"
  return f"needs {memory['need']}; the device has {has}"


def _ms(seconds: float) -> str:
  return markdown.fmt(seconds, 3, " ms", scale=1e3)


def _audit_cell(row: dict[str, Any]) -> str:
  if row.get("identical_to_baseline") is None:
    return "-"
  cell = f"{row['identical_to_baseline']}/{row['examples']}"
  if "divergences" in row:
    cell += f" ({row['audit_near_tie']} near-tie, {row['audit_mismatch']} mismatch)"
  return cell


def format_report(report: dict[str, Any]) -> str:
  """The Markdown the benchmark prints (bench/markdown.py's tables and sections)."""
  m, costs, read = report["machine"], report["costs"], report["costs"]["read_rate"]
  cost_rows = [
    ["t(1): the target's 1-token step", _ms(costs["target_step_s"])],
    [
      f"v(T) = t(T) / t(1), T = 2..{MAX_VERIFY}",
      markdown.loads([costs["v"][str(t)] for t in range(2, MAX_VERIFY + 1)]),
    ],
    ["c = draft step / t(1)", f"{costs['c']:.3f} (draft step {_ms(costs['draft_step_s'])})"],
    [
      "loop overhead: baseline ms/token / t(1)",
      f"{costs['loop_overhead']:.2f} ({costs['baseline_ms_per_token']:.3f} ms/token; per loop "
      f"step without the encoder: {costs['baseline_step_over_t1']:.2f})",
    ],
    [
      "decoder bytes read per step / t(1)",
      f"{costs['step_bytes'] / 1e9:.3f} GB / {_ms(costs['target_step_s'])} = "
      f"{costs['step_read_rate_gb_s']:.1f} GB/s",
    ],
    [
      f"read rate of a {read['bytes'] / 2**20:.0f} MiB {read['dtype']} array",
      f"{read['read_rate_gb_s']:.1f} GB/s",
    ],
    ["the step's share of that bandwidth", f"{costs['bandwidth_share']:.2f}"],
  ]
  refused = {**costs["noise_refused"], **read["noise"]["refused"]}
  gammas = range(1, MAX_VERIFY + 1)
  noisy = {
    g: bool(set(costs["noise_refused"]) & {"t(1)", f"v({g + 1})", "c[model]"}) for g in gammas
  }
  theorem_rows = [
    [f"{entry['alpha']} ({label})"]
    + [f"{entry['speedup'][str(g)]:.2f}x{'*' if noisy[g] else ''}" for g in gammas]
    for label, entry in costs["theorem_3_8"].items()
  ]
  lines = markdown.section(
    "Paper-shape benchmark",
    f"Device: {m['backend']} ({', '.join(m['devices'])}), host CPU {runtime.cpu_line(m)}, jax "
    f"{m['jax']}; weights in "
    f"{report['storage_dtype']}; decode path: {costs['decode_path']['line']}.\n"
    f"Target: {report['target']} (random init). Draft: {report['draft']} (random init).\n"
    f"Memory: {_memory(report['memory'])}.",
    level=1,
  )
  too_noisy = "Too noisy (bench/costs.py):\n" + "\n".join(f"- {r}" for r in refused.values())
  lines += markdown.section(
    "Costs (batch 1)",
    markdown.table(["measure", "value"], cost_rows),
    too_noisy if refused else None,
  )
  lines += markdown.section(
    "Theorem 3.8 with these c and v(T), at the paper's alphas (Table 3)",
    markdown.table(["alpha"] + [f"γ={g}" for g in gammas], theorem_rows),
    "\\* from a c or v(T) the noise verdict refused (above): not to be relied on."
    if any(noisy.values())
    else None,
  )
  if "real" in report:
    lines += _real_lines(report)
  lines.append(f"{report['elapsed_s']:.0f} s in all.")
  return "\n".join(lines)


def _real_lines(report: dict[str, Any]) -> list[str]:
  real = report["real"]
  rows, divergences = [], []
  for group in real["groups"]:
    base = group["baselines"][0]
    for row in group["baselines"] + group["speculative"]:
      cells = [f"{row['temperature']:g}", row["name"], f"{row['ms_per_token']:.3f}"]
      cells.append(f"{base['ms_per_token'] / row['ms_per_token']:.2f}x")
      if row["method"] == methods_lib.SPECULATIVE:
        cells += [f"{row['speedup_vs_stock']:.2f}x", f"{row['alpha_used']:.3f}"]
        cells.append(costs_lib.speedup_cell(row.get("predicted_speedup"), "x"))
      else:
        cells += ["-", "-", "-"]
      rows.append(cells + [_audit_cell(row)])
      divergences += [
        f"- {row['name']}, example {d['example']}, position {d['position']}: gap "
        f"{d['gap']:.4f}, bound {d['bound']:.4f}: {d['verdict']}"
        for d in row.get("divergences", [])
      ]
  header = ["temperature", "method", "ms/token", "speedup per token", "vs stock", "alpha"]
  header += ["Thm 3.8", "identical to baseline (audit)"]
  return markdown.section(
    "Real walltime: the grown target and the shipped draft (batch 1)",
    f"Target: {report['source']} grown to the shape in {real['grow_s']:.1f} s. Draft: "
    f"{report['shipped_draft']}. c = {real['c']:.3f}; v = "
    + ", ".join(f"{k}: {v:.2f}" for k, v in real["v"].items() if k != "1")
    + ".",
    markdown.table(header, rows),
    "Divergences from the baseline (decode/audit.py: float32 top-2 gap vs bound):\n"
    + "\n".join(divergences)
    if divergences
    else None,
  )


def main(argv: Sequence[str] | None = None) -> None:
  """`python -m speculative.bench.paper_shape`: the runners' command line (gin_utils)."""
  from speculative.jobs import gin_utils  # pylint: disable=g-import-not-at-top

  t5x_stock.register_gin_configurables()  # before the config is parsed
  logging.getLogger("absl").setLevel(logging.WARNING)
  gin_utils.run_gin_main(
    paper_shape,
    "paper_shape",
    __doc__.splitlines()[0],
    argv,
    default_gin_files=(DEFAULT_GIN,),
  )


if __name__ == "__main__":
  main()
