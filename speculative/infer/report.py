"""The summary of a batch inference job: totals per mode (docs/design.md section 7 definitions),
metrics against the references, and the Markdown report."""

from __future__ import annotations

import os
from typing import Any
from typing import Sequence

from speculative.data import metrics
from speculative.data import tasks
from speculative.decode import audit
from speculative.infer import settings
from speculative.jobs import runtime


def hit_length_cap(record: dict, max_new_tokens: int) -> bool:
  """The decode stopped at the length cap, not at EOS (a runaway output)."""
  return record["num_tokens"] >= max_new_tokens and (
    not record["tokens"] or record["tokens"][-1] != tasks.EOS_ID
  )


def summarize(
  records: Sequence[dict], metric_fns: Sequence[Any] = (), max_new_tokens: int | None = None
) -> dict[str, float]:
  """Totals over a mode's records (docs/design.md section 7 definitions): the loop and length-cap
  rates of the outputs always, `metric_fns`' scores where every record has its reference."""
  tokens = sum(r["num_tokens"] for r in records)
  calls = sum(r["target_calls"] for r in records)
  drafted = sum(r["drafted"] for r in records)
  seconds = sum(r["decode_s"] for r in records)
  out = {
    "examples": len(records),
    "generated_tokens": tokens,
    "target_calls": calls,
    "block_efficiency": tokens / max(calls, 1),
    "decode_s": seconds,
    "tokens_per_s": tokens / seconds if seconds > 0 else float("nan"),
    "sentences_per_s": len(records) / seconds if seconds > 0 else float("nan"),
  }
  if max_new_tokens is not None and records:
    out["cap_pct"] = 100.0 * sum(hit_length_cap(r, max_new_tokens) for r in records) / len(records)
  out["block_efficiency_ci95"] = block_efficiency_interval(records)
  out["drafted"], out["accepted"] = drafted, sum(r.get("accepted", 0) for r in records)
  selections = sum(r.get("selections", 0) for r in records)
  if selections:  # SpecTr: acceptance per selection, with K drafts and with one at the same p, q
    out["alpha"] = sum(r["alpha_sum"] for r in records) / selections
    out["alpha_one_draft"] = sum(r["single_alpha_sum"] for r in records) / selections
    out["selections"] = selections
  elif drafted:
    out["alpha"] = sum(r["alpha_sum"] for r in records) / drafted
  if drafted:
    out["acceptance_rate"] = out["accepted"] / drafted
  ordered = sorted(records, key=lambda r: r["index"])
  # The loop rate reads the outputs only: it is reported with or without references.
  out.update(metrics.loop_rate([], [r["prediction"] for r in ordered]))
  if metric_fns and all(r["reference"] is not None for r in records):
    for metric_fn in metric_fns:  # seqio-style: (targets, predictions) -> {name: value}
      out.update(metric_fn([r["reference"] for r in ordered], [r["prediction"] for r in ordered]))
  return out


def block_efficiency_interval(records: Sequence[dict], z: float = 1.96) -> list[float] | None:
  """The 95% interval of block efficiency, sum(tokens) / sum(target calls) over the examples: the
  ratio estimator's normal interval, BE +- z * sqrt(sum_i (t_i - BE c_i)^2 / (n (n-1))) / mean(c)
  (the delta method; examples independent). None below 2 examples or without target calls."""
  n = len(records)
  calls = [r["target_calls"] for r in records]
  if n < 2 or not sum(calls):
    return None
  tokens = [r["num_tokens"] for r in records]
  ratio = sum(tokens) / sum(calls)
  residual = sum((t - ratio * c) ** 2 for t, c in zip(tokens, calls)) / (n * (n - 1))
  half = z * residual**0.5 / (sum(calls) / n)
  return [ratio - half, ratio + half]


def machine() -> str:
  """The machine in one line: accelerator, CPU (features, L3), cores, jax, the runtime settings."""
  m = runtime.machine()
  accelerator = f"{m['accelerator']}, " if m["accelerator"] else ""
  arch = "" if m["cpu"] == m["arch"] else f", {m['arch']}"  # no CPU model name: the arch once
  return (
    f"{accelerator}{runtime.cpu_line(m)}{arch}, {m['usable_cores']} usable of "
    f"{m['cpu_count']} CPU cores, jax {m['jax']} ({m['backend']}); {runtime.describe(m['runtime'])}"
  )


def load_average() -> list[float]:
  """The 1-, 5- and 15-minute load averages: above the usable cores, other work shared the CPU and
  the job's timings are noisy (recorded when the process starts and ends decoding, metrics.json)."""
  return [round(x, 2) for x in os.getloadavg()]


def format_report(summary: dict[str, Any]) -> str:
  """The Markdown report of a job's summary (metrics.json)."""
  lines = (
    _header_lines(summary)
    + _mode_table(summary)
    + _resource_lines(summary)
    + _sample_lines(summary)
  )
  if "speedup" in summary:
    lines += _comparison_lines(summary)
  if summary.get("method") == "spectr" and "spectr" in summary:
    lines += _spectr_lines(summary)
  if "gamma_policy" in summary:
    lines += _gamma_policy_lines(summary)
  return "\n".join(lines) + "\n"


def _header_lines(summary: dict[str, Any]) -> list[str]:
  """What ran on what: examples, batch, drafter and gamma, temperature, machine; every setting that
  can change an output (`settings_line`); truncated inputs; the speculative options that are on."""
  lines = [
    "# Batch inference report",
    "",
    f"{summary['examples']} examples, batch size {summary['batch_size']}, "
    + (
      f"drafter {summary.get('drafter', 'model')}, gamma {summary['gamma']}"
      + (f" (0..{summary['gamma_max']})" if summary.get("gamma_max") else "")
      + ", "
      if "speculative" in summary
      else ""
    )
    + (
      f"method spectr (K = {summary['num_drafts']} drafts of L = {summary['gamma']} tokens), "
      if summary.get("method") == "spectr"
      else ""
    )
    + f"temperature {summary['temperature']}; "
    f"machine: {summary['machine']}" + _load_text(summary.get("load_average")),
    "",
    *(
      [
        f"Resumed: {summary['resumed_examples']} of {summary['examples']} examples were decoded "
        "and timed by an earlier process; the load average, memory and compiles in this report "
        "are this one's.",
        "",
      ]
      if summary.get("resumed_examples")
      else []
    ),
    f"Decode path: {summary.get('decode_path', 'XLA dot')}",
    "",
    *(
      [f"Target: {summary['grown_target']} (function-preserving growth)", ""]
      if "grown_target" in summary
      else []
    ),
  ]
  if summary.get("settings"):
    lines += [settings_line(summary["settings"]), ""]
  if summary.get("inputs_truncated"):
    lines += [
      f"Inputs truncated: {summary['inputs_truncated']} of {summary['examples']} were "
      f"longer than {summary.get('inputs_length', '?')} tokens and were cut to fit "
      "(raise TASK_FEATURE_LENGTHS['inputs'] to keep them whole).",
      "",
    ]
  knobs = [
    f"adaptive gamma (draft stops below confidence {summary['draft_stop_below']})"
    if summary.get("draft_stop_below")
    else "",
    "adaptive verify width" if summary.get("adaptive_verify") else "",
    f"lenience {summary['lenience']} (APPROXIMATE: changes the output)"
    if summary.get("lenience", 1.0) != 1.0
    else "",
  ]
  if any(knobs):
    lines += ["Speculative options: " + "; ".join(k for k in knobs if k), ""]
  return lines


def settings_line(output_settings: dict[str, Any]) -> str:
  """The report's line of every setting that can change an output (`InferSettings.output_settings`,
  as the manifest records them), each as its gin binding reads: `temperature = 0.0`."""
  return "Settings that change the outputs: " + ", ".join(
    f"{name} = {value!r}" for name, value in output_settings.items()
  )


# The quality columns of the mode table: ROUGE for a summarization job (its metrics carry
# 'rouge1'), BLEU and chrF otherwise; (header, metrics key).
TRANSLATION_COLUMNS = (("BLEU", "bleu"), ("chrF", "chrf"))
SUMMARIZATION_COLUMNS = (("ROUGE-1", "rouge1"), ("ROUGE-2", "rouge2"), ("ROUGE-Lsum", "rougeLsum"))


def _quality_columns(summary: dict[str, Any]) -> tuple[tuple[str, str], ...]:
  modes = [summary[mode] for mode in settings.ALL_MODES if mode in summary]
  if any("rouge1" in m for m in modes):
    return SUMMARIZATION_COLUMNS
  return TRANSLATION_COLUMNS


def _mode_table(summary: dict[str, Any]) -> list[str]:
  """One row of totals per mode."""
  quality = _quality_columns(summary)
  lines = [
    "| mode | "
    + "".join(f"{header} | " for header, _ in quality)
    + "loop % | length cap % | tokens | target calls | "
    "block efficiency | 95% interval | alpha | acceptance | decode s | sentences/s | tokens/s | "
    "compile s |",
    "|---|" + "---|" * (len(quality) + 12),
  ]
  for mode in settings.ALL_MODES:
    if mode not in summary:
      continue
    m = summary[mode]
    fmt = lambda k, f="{:.3f}": f.format(m[k]) if m.get(k) is not None else "-"  # noqa: E731
    lines.append(
      f"| {mode} | "
      + "".join(f"{fmt(key, '{:.2f}')} | " for _, key in quality)
      + f"{fmt('loop_pct', '{:.1f}')} | {fmt('cap_pct', '{:.1f}')} | "
      f"{m['generated_tokens']} | "
      f"{m['target_calls']} | {m['block_efficiency']:.3f} | {_interval(m)} | {fmt('alpha')} | "
      f"{fmt('acceptance_rate')} | {m['decode_s']:.2f} | "
      f"{fmt('sentences_per_s', '{:.2f}')} | {m['tokens_per_s']:.1f} | "
      f"{fmt('compile_s', '{:.1f}')} |"
    )
  return lines


def _interval(m: dict[str, Any]) -> str:
  ci = m.get("block_efficiency_ci95")
  return f"{ci[0]:.3f}-{ci[1]:.3f}" if ci else "-"


def _spectr_lines(summary: dict[str, Any]) -> list[str]:
  """SpecTr's K, L, acceptance with K drafts against one draft at the same conditionals, tokens
  drafted and accepted, block efficiency and walltime against the baseline and speculative."""
  m = summary["spectr"]
  k, length = summary["num_drafts"], summary["gamma"]
  lines = [
    "",
    f"SpecTr, K = {k} drafts of L = {length} tokens a step, one target call over K x (L+1) = "
    f"{k * (length + 1)} positions: block efficiency {m['block_efficiency']:.3f}"
    + (f" (speculative, one draft: {summary['speculative']['block_efficiency']:.3f})"),
    f"Acceptance per selection (alpha_sum / selections, {m.get('selections', 0)} selections): "
    f"{m.get('alpha', float('nan')):.3f} with K drafts against "
    f"{m.get('alpha_one_draft', float('nan')):.3f} with one draft at the same conditionals "
    "(single_alpha_sum / selections); the table's alpha column for spectr is the former.",
    f"Tokens drafted {m['drafted']} (L per step; the draft model drew K x that), accepted "
    f"{m['accepted']}.",
  ]
  speed = [
    f"{m[f'speedup_per_token_vs_{other}']:.2f}x against {other}"
    for other in ("baseline", "speculative")
    if f"speedup_per_token_vs_{other}" in m
  ]
  if speed:
    lines.append(
      "Walltime per generated token (warm, same process; the modes sample different outputs): "
      + ", ".join(speed)
      + "."
    )
  lines.append(
    f"Outputs identical to speculative decoding (same seed): {m['identical_to_speculative']} / "
    f"{summary['examples']}"
    + (" (K = 1: SpecTr is speculative decoding, so all)" if k == 1 else "")
  )
  return lines


def _resource_lines(summary: dict[str, Any]) -> list[str]:
  """XLA compiles per mode (the first call at each input length, then the warm calls: 0 means one
  program per input length) and the process's peak RSS."""
  parts = [
    f"{mode} {summary[mode]['compiles_first_call']} in the first call at each input length, "
    f"{summary[mode]['compiles_warm']} after"
    for mode in settings.ALL_MODES
    if mode in summary and "compiles_first_call" in summary[mode]
  ]
  if not parts:
    return []
  rss = summary.get("peak_rss_mib")
  return [
    "",
    "XLA compiles: " + "; ".join(parts) + (f". Peak RSS {rss:.0f} MiB." if rss else "."),
  ]


def _sample_lines(summary: dict[str, Any]) -> list[str]:
  """The first three inputs with their references and outputs."""
  if not summary.get("samples"):
    return []
  lines = ["", "Examples (the first three inputs):", ""]
  for sample in summary["samples"]:
    lines += [
      f"- source:     {sample['inputs']}",
      f"  reference:  {sample['reference'] if sample['reference'] is not None else '-'}",
      f"  output:     {sample['prediction']}",
    ]
  return lines


def _load_text(load: dict[str, list[float]] | None) -> str:
  if not load:
    return ""
  return (
    f" (load average {load['start'][0]:.2f} when this process started decoding, "
    f"{load['end'][0]:.2f} at its end)"
  )


def _comparison_lines(summary: dict[str, Any]) -> list[str]:
  """Baseline vs speculative: the speedup, identical outputs, the divergence audit and what to
  expect under sampling or lenience."""
  lines = [
    "",
    f"Walltime speedup (baseline / speculative decode time, warm, each batch's two decodes in one "
    f"process): **{summary['speedup']:.2f}x**" + _load_text(summary.get("load_average")),
    f"Identical outputs: {summary['identical_outputs']} / {summary['examples']}",
  ]
  if summary.get("audit", {}).get("diverged"):
    counts = summary["audit"]
    lines += [
      "",
      f"Divergence audit (docs/exactness.md): {counts['near_tie']} near-tie, "
      f"{counts['mismatch']} mismatch. A near-tie is a position where the target's "
      "float32 top-2 logits are closer than the model dtype's rounding can move them; "
      "a mismatch is a bug.",
      "",
      audit.format_table([audit.Divergence(**d) for d in summary["divergences"]]),
    ]
  if summary["temperature"] > 0:
    lines += [
      "",
      "Under sampling (temperature > 0) identical outputs are NOT expected: the two "
      "modes consume random numbers differently. Speculative sampling is exact in "
      "distribution (every output is distributed as the target alone would sample it), "
      "not token-for-token; compare distributions, not outputs.",
    ]
  elif summary.get("lenience", 1.0) != 1.0:
    lines += ["", "With lenience < 1 the outputs are expected to differ from the baseline."]
  return lines


def _batches(n: int) -> str:
  return f"{n} batch" if n == 1 else f"{n} batches"


def _gamma_policy_lines(summary: dict[str, Any]) -> list[str]:
  """GAMMA = 'auto': the costs and where they came from, the batches and steps at each gamma, and
  the speedup Theorem 3.8 predicts with these costs beside the measured one."""
  policy = summary["gamma_policy"]
  cal = policy["calibration"]
  kept = cal.get("measured_batches", 0)  # batches measured on a warm call, then decoded otherwise
  measured = (
    f"; {_batches(kept)} first measured at a gamma not then decoded, by the warm call of "
    "that gamma's compile"
    if kept
    else ""
  )
  source = {
    "measured": f"measured on this job's first {_batches(cal['measuring_batches'])} (their own "
    f"decodes, timed, and the first ones' calls without their loop steps{measured}: "
    f"{cal.get('calibration_s', 0.0):.2f} s of calibration, not decode time), with every later "
    "batch's times added; cached for the next job",
    "cache": "from the calibration cache (0 s of calibration), with this job's batches' times added "
    "and written back",
    "manifest": "from this output directory's manifest (a resumed job), with the job's batches' "
    "times added",
  }[cal["source"]]
  if not cal["frozen"]:
    source = (
      f"still being measured when the job ended ({_batches(cal['measuring_batches'])}; not cached)"
    )
  lines = ["", f"## Gamma 'auto' (0..{policy['gamma_max']}; 0 = plain decoding)", ""]
  if "loop_step_ms" in cal:
    evidence = cal.get("measured_steps", {})
    measured = ", ".join(
      f"gamma {g} {v:.2f} ms" + (f" ({evidence[g]} steps)" if g in evidence else "")
      for g, v in cal["loop_step_ms"].items()
    )
    steps = ", ".join(f"{v:.2f}" for v in cal["step_ms"])
    fixed = ", ".join(f"gamma {g} {v:.2f} ms" for g, v in cal["fixed_ms_per_token"].items())
    lines.append(
      f"Costs {source}: the compiled loops' steps (a batch's walltime less what a call pays "
      "once, over its loop steps; a gamma's, where the baseline decoded the same batches: the "
      "plain step times their tokens plus the two calls' difference, over its steps) "
      f"{measured}; so a step at gamma 0..{policy['gamma_max']}: {steps} ms. "
      "What a call pays once (the stepless call: encoders, prefill), per generated token: "
      f"{fixed or 'not timed'}."
    )
  else:
    lines.append(f"Costs {source}: the plain loop's step not measured yet.")
  predicted = policy["predicted_speedup_by_gamma"] or {}
  lines += [
    f"Acceptance estimate at the end: alpha {policy['final_alpha']:.3f}. Batches by reason: "
    + ", ".join(f"{k} {v}" for k, v in sorted(policy["reasons"].items()))
    + ".",
    "",
    "| gamma | batches | examples | loop steps | predicted speedup at the final alpha |",
    "|---|---|---|---|---|",
  ]
  for gamma, row in policy["per_gamma"].items():
    lines.append(
      f"| {gamma} | {row['batches']} | {row['examples']} | {row['steps']} | "
      + (f"{predicted[gamma]:.2f}x |" if gamma in predicted else "- |")
    )
  if policy.get("predicted_speedup") and "speedup" in summary:
    lines += [
      "",
      f"Predicted speedup of these choices (Theorem 3.8 with the measured steps at the final "
      f"alpha): {policy['predicted_speedup']:.2f}x; measured: {summary['speedup']:.2f}x.",
    ]
  return lines
