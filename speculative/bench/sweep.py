"""The sweep: every method of a (batch size, temperature) group timed, interleaved, on the same
inputs, into one row per method; its settings and a batch size's parts are paper_shape's too."""

from __future__ import annotations

import dataclasses
import functools
import gc
import statistics
from typing import Any
from typing import Callable
from typing import Mapping
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from speculative import analysis
from speculative import kernels
from speculative import sampling as sampling_lib
from speculative import timing
from speculative.bench import costs as costs_lib
from speculative.bench import methods as bench_methods
from speculative.decode import audit
from speculative.decode import batching
from speculative.jobs import checks
from speculative.jobs import resources
from speculative.t5x_adapter import stock as t5x_stock


@dataclasses.dataclass(frozen=True, kw_only=True)
class TimingSettings:
  """The timing fields of the benchmark and the paper-shape benchmark, with their checks.

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
    """ValueError on a field out of range, or 'on' kernels a batch size cannot take."""
    for name in ("repeats", "num_examples", "inputs_length", "max_new_tokens", "cost_repeats"):
      checks.check_int(name, getattr(self, name), 1)
    checks.check_int("cost_position", self.cost_position, 1, self.max_new_tokens - 1)
    if not self.temperatures or any(float(t) < 0 for t in self.temperatures):
      raise ValueError(f"temperatures must be >= 0; got {self.temperatures!r}")
    checks.check_choice("stock_t5x", self.stock_t5x, ("auto", "on", "off"))
    if self.stock_t5x == "on" and not t5x_stock.t5x_available():
      raise ValueError("stock_t5x='on' but t5x is not importable (pip install t5x, or use 'auto')")
    for batch_size in batch_sizes:
      kernels.policy.choose(self.kernels, int(batch_size))

  @property
  def use_t5x(self) -> bool:
    return self.stock_t5x == "on" or (self.stock_t5x == "auto" and t5x_stock.t5x_available())


def gammas_for(
  gammas: Sequence[int] | Mapping[Any, Sequence[int]],
  batch_size: int,
  allow_empty: bool = False,
  what: str = "gammas",
) -> list[int]:
  """The gammas of one batch size from a list (every batch size) or a {batch size: list} dict."""
  if isinstance(gammas, Mapping):
    key = batch_size if batch_size in gammas else str(batch_size)
    if key not in gammas:
      raise ValueError(f"{what} has no entry for batch size {batch_size}: {dict(gammas)}")
    values = list(gammas[key])
  else:
    values = list(gammas)
  for g in values:
    if not isinstance(g, (int, np.integer)) or isinstance(g, bool) or g < 1:
      raise ValueError(f"gammas must be integers >= 1; got {g!r}")
  if not values and not allow_empty:
    raise ValueError(f"no {what} for batch size {batch_size}")
  return sorted(set(int(g) for g in values))


def gamma_plan(
  gammas: Sequence[int] | Mapping[Any, Sequence[int]],
  drafter_gammas: Mapping[str, Any],
  drafters: Sequence[str],
  batch_sizes: Sequence[int],
) -> dict[int, dict[str, list[int]]]:
  """{batch size: {drafter: gammas}}: `drafter_gammas[name]` where given, else `gammas`."""
  unknown = sorted(set(drafter_gammas) - set(drafters))
  if unknown:
    raise ValueError(f"drafter_gammas names drafters not in drafters={list(drafters)}: {unknown}")

  def of(name: str, b: int) -> list[int]:
    if name not in drafter_gammas:
      return gammas_for(gammas, b)
    return gammas_for(drafter_gammas[name], b, allow_empty=True, what=f"drafter_gammas[{name!r}]")

  plan = {int(b): {name: of(name, int(b)) for name in drafters} for b in batch_sizes}
  for b, per in plan.items():
    if not per[drafters[0]]:
      raise ValueError(f"the primary drafter {drafters[0]!r} has no gammas at batch size {b}")
  return plan


def sum_rows(method: bench_methods.Method, batches, key: str) -> float:
  """A per-row counter summed over the real (non-padding) rows of every input batch."""
  outputs = zip(batches, method.outputs)
  return sum((float(np.sum(out[key][: len(c)])) for (c, _), out in outputs), 0.0)


def method_row(method: bench_methods.Method, batches, group: dict[str, Any]) -> dict[str, Any]:
  """Walltime, tokens and counters of one method in one group."""
  medians = [float(statistics.median(t)) for t in method.times]
  walltime = float(sum(medians))
  tokens = sum_rows(method, batches, "lengths")
  steps = float(sum(int(np.max(out["target_calls"])) for out in method.outputs))
  row = {
    "name": method.name,
    "method": method.kind,
    "drafter": method.drafter,
    "gamma": method.gamma,
    "batch_size": group["batch_size"],
    "temperature": group["temperature"],
    "examples": group["examples"],
    "walltime_s": walltime,
    "walltime_per_batch_s": medians,
    # Sum of per-batch minima: on a shared, loaded machine the minimum is the less noisy estimate.
    "walltime_min_s": float(sum(min(t) for t in method.times)),
    "repeat_spread": float(
      np.mean([(max(t) - min(t)) / max(statistics.median(t), 1e-12) for t in method.times])
    ),
    # Compile time = the first call minus a steady-state decode of the same input batch.
    "compile_s": method.first_call_s - medians[0],
    "first_call_s": method.first_call_s,
    "generated_tokens": int(tokens),
    "tokens_per_s": tokens / walltime if walltime > 0 else float("nan"),
    "ms_per_token": 1e3 * walltime / tokens if tokens else float("nan"),
    "target_calls": int(sum_rows(method, batches, "target_calls")),
    "loop_steps": int(steps),
  }
  if method.kind == bench_methods.SPECULATIVE:
    row["drafted_tokens"] = int(sum_rows(method, batches, "drafted"))
    # gamma for a drafter that always drafts gamma tokens; less for prompt lookup without a match
    # (EXP assumes gamma drafted tokens per call, so it overestimates such drafters).
    row["drafted_per_call"] = row["drafted_tokens"] / max(row["target_calls"], 1)
    row["accepted_tokens"] = int(sum_rows(method, batches, "accepted"))
    alpha_sum = sum_rows(method, batches, "alpha_sum")
    row["alpha"] = (
      min(1.0, max(0.0, alpha_sum / row["drafted_tokens"])) if row["drafted_tokens"] else None
    )
  return row


def identical_rows(method: bench_methods.Method, reference: bench_methods.Method, batches) -> int:
  same = 0
  for (chunk, _), out, ref in zip(batches, method.outputs, reference.outputs):
    for r in range(len(chunk)):
      n, m = int(out["lengths"][r]), int(ref["lengths"][r])
      same += int(n == m and np.array_equal(out["tokens"][r, :n], ref["tokens"][r, :m]))
  return same


def time_methods(
  methods: Sequence[bench_methods.Method],
  batches,
  *,
  repeats: int,
  seed: int,
  log: Callable[[str], None],
) -> dict[str, Any]:
  """Fills each method's first_call_s, times and outputs: compiled on the first input batch, then
  every batch decoded `repeats` times by every method, interleaved, garbage collection off. Returns
  the XLA compiles of the first calls and of the timed calls (none expected)."""
  first = jnp.asarray(batches[0][1])
  with resources.CompileCounter() as first_calls:  # compile + one decode of the first batch
    for method in methods:
      method.first_call_s, _ = timing.timed(
        lambda: method.decode(first, jax.random.fold_in(jax.random.PRNGKey(seed), 0))
      )  # pylint: disable=cell-var-from-loop
      log(f"  compiled {method.name}: {method.first_call_s:.1f}s")
  gc.collect()
  gc_was_enabled = gc.isenabled()
  gc.disable()
  try:
    with resources.CompileCounter() as timed:
      for index, (_, encoder_tokens) in enumerate(batches):
        # Every method `repeats` times, the order rotating so each takes each slot.
        enc, rng = jnp.asarray(encoder_tokens), jax.random.fold_in(jax.random.PRNGKey(seed), index)
        times = {m.name: [] for m in methods}
        for repeat in range(repeats):
          shift = (index + repeat) % len(methods)
          for method in list(methods[shift:]) + list(methods[:shift]):
            seconds, result = timing.timed(lambda: method.decode(enc, rng))  # pylint: disable=cell-var-from-loop
            times[method.name].append(seconds)
            if repeat == 0:
              method.outputs.append(bench_methods.decode_outputs(method.kind, result))
        for method in methods:
          method.times.append(times[method.name])
  finally:
    if gc_was_enabled:
      gc.enable()
  for method in methods:
    for (chunk, _), out in zip(batches, method.outputs):
      if np.any(out["invalid"][: len(chunk)]):
        raise FloatingPointError(f"{method.name}: NaN/inf logits (no valid distribution)")
  return {
    "first_calls": first_calls.count,
    "first_calls_compile_s": first_calls.seconds,
    "timed_calls": timed.count,
  }


def time_rows(
  methods: Sequence[bench_methods.Method], examples: Sequence[Any], args: Any, temperature: float
) -> tuple[list[Any], dict[str, dict[str, Any]]]:
  """Times a page's `methods` at batch 1 as the sweep does (`args`: its inputs_length, repeats and
  seed): (batches, {name: method_row})."""
  batches = batching.batches(examples, 1, args.inputs_length)
  time_methods(methods, batches, repeats=args.repeats, seed=args.seed, log=print)
  group = dict(batch_size=1, temperature=temperature, examples=len(examples))
  return batches, {m.name: method_row(m, batches, group) for m in methods}


@dataclasses.dataclass(frozen=True)
class Batch:
  """What every group of one batch size shares: TimingSettings, its models (`methods.for_batch`),
  cost model and timers, stock T5X's decode factory (temperature -> decode; None: not timed), log."""

  settings: Any
  batch_size: int
  models: Mapping[str, Any]
  costs: dict[str, Any]
  timers: Mapping[str, timing.Timer]
  stock_t5x_decode: Callable | None
  log: Callable[[str], None]


def run_group(
  b: Batch,
  temperature: float,
  examples: Sequence[Any],
  gammas: Mapping[str, Sequence[int]],
  repeats: int | None = None,
  only: frozenset[str] | None = None,
) -> dict[str, Any]:
  """The rows of every method of one (batch size, temperature) group ({drafter: gammas}; `only`
  keeps the named methods and the baseline)."""
  s, costs = b.settings, b.costs
  sampling, sampling_params = sampling_lib.make_sampling(temperature)
  batches = batching.batches(examples, b.batch_size, s.inputs_length)
  group = dict(batch_size=b.batch_size, temperature=temperature, examples=len(examples))
  group["input_batches"] = len(batches)
  methods = bench_methods.make_methods(b, temperature, gammas, sampling, sampling_params)
  if only is not None:
    unknown = set(only) - {m.name for m in methods}
    if unknown:
      raise ValueError(f"no such methods in the group: {sorted(unknown)}")
    methods = [m for m in methods if m.kind == bench_methods.BASELINE or m.name in only]
  with resources.PeakRss() as rss:
    repeats = repeats or s.repeats
    group["compiles"] = time_methods(methods, batches, repeats=repeats, seed=s.seed, log=b.log)
  group.update(peak_rss_mib=rss.mib, peak_rss_reset=rss.reset)
  rows = {m.name: method_row(m, batches, group) for m in methods}
  target = (b.models["target"], b.models["target_params"])
  baselines = _baseline_rows(methods, rows, batches, costs, temperature == 0, target)
  propose_cost = functools.partial(
    costs_lib.measure_propose,
    s=s,
    encoder_tokens=batches[0][1],
    max_length=costs["max_length"],
    sampling=sampling,
    sampling_params=sampling_params,
    target_step=b.timers["target_1"],
  )
  speculative_rows = [
    _speculative_row(m, rows, batches, costs, temperature, methods[0], propose_cost, target)
    for m in methods
    if m.kind == bench_methods.SPECULATIVE
  ]
  b.log(_group_summary(group, baselines, speculative_rows))
  return {"group": group, "baselines": baselines, "speculative": speculative_rows}


def _baseline_rows(methods, rows, batches, costs, greedy: bool, target) -> list[dict[str, Any]]:
  """The non-speculative rows with speedups and profiles; a greedy stock T5X row is `audited` too
  (another program over the same weights)."""
  base_row = rows[bench_methods.BASELINE]
  stock = ("stock_equivalent_step_s", "stock_equivalent_prefill_s", costs_lib.STOCK_STEP)
  step_costs = {
    bench_methods.BASELINE: ("target_step_s", "target_prefill_s", costs_lib.TARGET_STEP),
    bench_methods.STOCK_EQUIVALENT: stock,
  }
  out = []
  for method in methods:
    if method.kind == bench_methods.SPECULATIVE:
      continue
    row = rows[method.name]
    row["speedup_vs_baseline"] = base_row["walltime_s"] / row["walltime_s"]
    if greedy:
      row["identical_to_baseline"] = identical_rows(method, methods[0], batches)
      if method.kind == bench_methods.STOCK_T5X:
        row = audited(row, method, methods[0], batches, *target)
    if method.kind in step_costs:
      step, prefill, noise_name = step_costs[method.kind]
      refused = costs_lib.refusal(costs.get("noise"), [noise_name])
      row["profile"] = profile(row, costs[prefill], {"target_step_s": costs[step]}, refused)
    out.append(row)
  return out


def _draft_cost(method, costs: dict[str, Any], temperature: float, propose_cost) -> dict[str, Any]:
  """c, the drafting time per step, the draft prefill and the noise key of c of a method."""
  gamma = method.gamma
  drafter_costs = costs["drafters"].get(method.drafter, {})
  if drafter_costs.get("kind") == "model":
    # The draft loop's calls per step (drafters/model.py): one 2-token catch-up call (x_gamma and
    # the bonus token), then gamma - 1 one-token calls.
    return {
      "c": drafter_costs["c"],
      "draft_s": drafter_costs["draft_catch_up_s"] + (gamma - 1) * drafter_costs["draft_step_s"],
      "draft_prefill_s": drafter_costs["draft_prefill_s"],
      "c_source": "draft extend(T=1) / target extend(T=1)",
      "c_noise": costs_lib.c_key(method.drafter),
    }
  # Not a model: time its whole propose(gamma) call (it depends on the sampling strategy).
  drafter, draft_params = method.drafter_obj
  key = f"gamma={gamma},T={temperature:g}"
  noise_name = costs_lib.c_key(method.drafter, key)
  noise = costs_lib.NoiseLog(costs["noise"])
  draft_s, c = propose_cost(drafter, draft_params, gamma, noise, noise_name)
  entry = costs["drafters"].setdefault(
    method.drafter, {"kind": "propose", "propose_s": {}, "c": {}}
  )
  entry["propose_s"][key], entry["c"][key] = draft_s, c
  return {
    "c": entry["c"][key],
    "draft_s": draft_s,
    "draft_prefill_s": 0.0,
    "c_source": "propose(gamma) / gamma / target extend(T=1)",
    "c_noise": noise_name,
  }


def audited(row, method, reference, batches, target, target_params) -> dict[str, Any]:
  """Adds the divergence audit (decode/audit.py) to a greedy row not identical to the baseline."""
  same = row.get("identical_to_baseline")
  if same is None or same >= sum(len(chunk) for chunk, _ in batches):
    return row
  row["divergences"] = []
  for (chunk, encoder_tokens), out, ref in zip(batches, method.outputs, reference.outputs):
    rows = range(len(chunk))
    divergences = audit.audit_divergences(
      target,
      target_params,
      np.asarray(encoder_tokens)[: len(chunk)],  # [rows, S]
      [ref["tokens"][r, : int(ref["lengths"][r])] for r in rows],
      [out["tokens"][r, : int(out["lengths"][r])] for r in rows],
    )
    row["divergences"] += [
      dict(dataclasses.asdict(d), example=int(chunk[d.example].index)) for d in divergences
    ]
  row["audit_mismatch"] = sum(d["verdict"] == audit.MISMATCH for d in row["divergences"])
  row["audit_near_tie"] = len(row["divergences"]) - row["audit_mismatch"]
  return row


def _speculative_row(
  method, rows, batches, costs, temperature: float, reference, propose_cost, target
) -> dict[str, Any]:
  """A speculative row: counters, EXP (unless too noisy), EMP, profile and `audited`."""
  base_row = rows[bench_methods.BASELINE]
  stock_name = (
    bench_methods.STOCK_T5X if bench_methods.STOCK_T5X in rows else bench_methods.STOCK_EQUIVALENT
  )
  gamma = method.gamma
  v_fn = analysis.verify_cost_fn({int(k): v for k, v in costs["v"].items()})
  verify_s = costs["target_extend_s"].get(str(gamma + 1), v_fn(gamma + 1) * costs["target_step_s"])
  draft = _draft_cost(method, costs, temperature, propose_cost)
  metrics = dict(rows[method.name])
  metrics.update(
    c=draft["c"],
    v=costs["v"].get(str(gamma + 1), v_fn(gamma + 1)),
    baseline_walltime=base_row["walltime_s"],
    speculative_walltime=rows[method.name]["walltime_s"],
  )
  if metrics["drafted_tokens"] > 0:
    row = analysis.speedup_row(metrics)
  else:
    # Nothing was drafted (e.g. prompt lookup never found a match): every call verified gamma+1
    # positions and emitted one token, which costs what alpha = 0 costs in Theorem 3.8.
    row = dict(metrics)
    row.update(
      block_efficiency=analysis.block_efficiency(metrics),
      acceptance_rate=None,
      alpha=None,
      alpha_used=0.0,
      alpha_source="nothing drafted (costed as alpha = 0)",
      expected_tokens=1.0,
      alpha_from_block_efficiency=None,
      predicted_speedup=float(analysis.walltime_improvement(0.0, gamma, draft["c"], metrics["v"])),
      measured_speedup=metrics["baseline_walltime"] / metrics["speculative_walltime"],
    )
  row["c_source"] = draft["c_source"]
  row["prediction_refused"] = costs_lib.refusal(
    costs.get("noise"), [costs_lib.v_key(gamma + 1), draft["c_noise"]]
  )
  if row["prediction_refused"]:
    row["predicted_speedup"] = None
  row["speedup_vs_stock"] = rows[stock_name]["walltime_s"] / row["walltime_s"]
  # Per generated token: under sampling the methods generate different (equally distributed)
  # outputs, so their lengths differ by chance; this ratio is less sensitive to that.
  row["speedup_per_token"] = base_row["ms_per_token"] / row["ms_per_token"]
  row["measured_speedup_min"] = base_row["walltime_min_s"] / row["walltime_min_s"]
  row["stock_baseline"] = stock_name
  row["measured_over_predicted"] = (
    None if row["predicted_speedup"] is None else row["measured_speedup"] / row["predicted_speedup"]
  )
  if temperature == 0:
    row["identical_to_baseline"] = identical_rows(method, reference, batches)
  overhead_refused = costs_lib.refusal(
    costs.get("noise"), [costs_lib.TARGET_STEP, costs_lib.v_key(gamma + 1), draft["c_noise"]]
  )
  row["profile"] = profile(
    row,
    costs["target_prefill_s"] + draft["draft_prefill_s"],
    {"draft_s": draft["draft_s"], "verify_s": verify_s},
    overhead_refused,
  )
  return audited(row, method, reference, batches, *target)


def profile(
  row: dict[str, Any], prefill_s: float, parts: dict[str, float], refused: str | None = None
) -> dict[str, Any]:
  """Time per loop step, split into the measured `parts` + overhead (None, with the reason in
  'overhead_refused', when the parts are too noisy or sum to more than the step)."""
  steps = max(row["loop_steps"], 1)
  batches = max(len(row["walltime_per_batch_s"]), 1)
  step_s = (row["walltime_s"] - batches * prefill_s) / steps
  out = {"prefill_s_per_decode": prefill_s, "step_s": step_s}
  out.update(parts)
  overhead_s = step_s - sum(parts.values())
  if not refused and overhead_s < 0:
    refused = (
      f"negative overhead: the measured step ({1e3 * step_s:.2f} ms) is shorter than the cost "
      f"model's calls it makes ({1e3 * sum(parts.values()):.2f} ms), so the load changed between "
      "them"
    )
  if refused:
    out.update(overhead_s=None, overhead_fraction=None, overhead_refused=refused)
  else:
    out["overhead_s"] = overhead_s
    out["overhead_fraction"] = overhead_s / step_s if step_s != 0 else None
  out["prefill_fraction"] = batches * prefill_s / row["walltime_s"]
  return out


def _group_summary(group, baselines, speculative_rows) -> str:
  lines = [f"batch {group['batch_size']} temperature {group['temperature']}:"]
  for row in baselines + speculative_rows:
    lines.append(f"  {row['name']:>18}: {row['walltime_s']:.3f}s {row['tokens_per_s']:.1f} tok/s")
    if "alpha_used" in row:
      lines[-1] += (
        f" alpha {row['alpha_used']:.3f} EXP {costs_lib.speedup_cell(row['predicted_speedup'], 'x')}"
        f" EMP {row['measured_speedup']:.2f}x"
      )
  return "\n".join(lines)
