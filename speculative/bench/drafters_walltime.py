"""The drafters page's walltime part: adaptive gamma vs the best fixed gamma at batch 1.

Run as part of the drafters page (`--skip alpha,lenience` for this part alone):

  python -m speculative.bench.drafters_page --skip alpha,lenience --output_dir=/tmp/bench_drafters

Methods: the baseline, the draft model at each fixed gamma in `--gammas`, and adaptive gamma with
the static maximum `--max_gamma`: the confidence stop rule (the registry's 'model' drafter with
stop_below=s for s in `--stop_below`) with the static verify width and with adaptive verify, and the
acceptance-predicted rule (AdaptiveGammaDrafter with c and v(T) measured by bench/costs.py). Timed
as the benchmark's sweep times a group (bench/pages.time_rows): compile apart, interleaved repeats,
block_until_ready, the sum over sentences of the median over `--repeats`.
"""

from __future__ import annotations

import argparse
from typing import Any

from speculative import drafters as drafters_lib
from speculative import sampling as sampling_lib
from speculative.bench import costs as costs_lib
from speculative.bench import methods as methods_lib
from speculative.bench import pages
from speculative.data import tasks
from speculative.decode import batching

COST_POSITION = 16  # decoder position at which c and v(T) are measured (mid-sentence)


def measure_costs(
  pair: pages.Pair, encoder_tokens, max_gamma: int, repeats: int, min_seconds: float = 0.1
) -> dict[str, Any]:
  """c and v(T), T = 1..max_gamma+1, at batch 1 (`encoder_tokens` [1, S]): the benchmark's cost
  model (interleaved rounds, per-round ratios), with the estimates it refuses as too noisy in
  'too_noisy'."""
  cm = costs_lib.measure_extend_costs(
    pair.target,
    pair.target_params,
    encoder_tokens,
    max_length=COST_POSITION + max_gamma + 2,
    position=COST_POSITION,
    verify_lengths=range(2, max_gamma + 2),
    drafts={'model': (pair.draft, pair.draft_params)},
    repeats=repeats,
    min_seconds=min_seconds,
  )
  model = cm['drafters']['model']
  return dict(
    target_step_s=cm['target_step_s'],
    draft_step_s=model['draft_step_s'],
    c=model['c'],
    v={int(t): v for t, v in cm['v'].items()},
    too_noisy=cm['noise']['refused'],
  )


def methods(pair: pages.Pair, costs: dict[str, Any], args: argparse.Namespace) -> list[Any]:
  """The timed methods (methods_lib.Method; `drafter_obj` holds each one's description)."""
  sampling, sampling_params = sampling_lib.make_sampling(args.walltime_temperature)
  options = dict(
    max_new_tokens=args.max_new_tokens,
    sampling=sampling,
    sampling_params=sampling_params,
    eos_id=tasks.EOS_ID,
  )

  def method(name, info, drafter=None, gamma=None, adaptive_verify=False):
    decode = pages.decode_fn(pair, drafter, gamma=gamma, adaptive_verify=adaptive_verify, **options)
    kind = methods_lib.BASELINE if drafter is None else methods_lib.SPECULATIVE
    return methods_lib.Method(name, kind, decode, gamma=gamma, drafter_obj=info)

  out = [method('baseline', dict(kind='baseline'))]
  for gamma in pages.values(args.gammas, int):
    out.append(method(f'fixed gamma={gamma}', dict(kind='fixed'), pages.model_drafter(pair), gamma))
  max_gamma = args.max_gamma
  for threshold in pages.values(args.stop_below, float):
    for adaptive in (False, True):
      info = dict(kind='confidence', stop_below=threshold, adaptive_verify=adaptive)
      name = f'stop_below={threshold}, max gamma={max_gamma}' + (
        ', adaptive verify' if adaptive else ''
      )
      out.append(
        method(name, info, pages.model_drafter(pair, stop_below=threshold), max_gamma, adaptive)
      )
  rule = drafters_lib.AdaptiveGammaDrafter(
    pages.model_drafter(pair),
    draft_cost=round(costs['c'], 4),
    verify_costs=tuple(round(costs['v'][t], 3) for t in range(1, max_gamma + 2)),
  )
  info = dict(
    kind='acceptance_rule',
    adaptive_verify=True,
    draft_cost=rule.draft_cost,
    verify_costs=rule.verify_costs,
  )
  name = f'acceptance rule, max gamma={max_gamma}, adaptive verify'
  return out + [method(name, info, rule, max_gamma, True)]


def walltime(pair: pages.Pair, examples, costs: dict[str, Any], args) -> dict[str, Any]:
  """Batch-1 walltime of every method, with the speedups over the baseline and the best fixed
  gamma."""
  timed = methods(pair, costs, args)
  _, measured = pages.time_rows(
    timed,
    examples,
    inputs_length=args.inputs_length,
    temperature=args.walltime_temperature,
    repeats=args.repeats,
    seed=args.seed,
  )
  rows = []
  for m in timed:
    r = measured[m.name]
    calls = max(r['target_calls'], 1)
    rows.append(
      dict(
        method=m.name,
        gamma=m.gamma,
        **m.drafter_obj,
        decode_s=r['walltime_s'],
        compile_s=r['compile_s'],
        ms_per_token=r['ms_per_token'],
        tokens_per_call=r['generated_tokens'] / calls,
        drafted_per_step=r.get('drafted_tokens', 0) / calls,
        generated=r['generated_tokens'],
        target_calls=r['target_calls'],
      )
    )
    print(
      f'  {m.name}: {r["ms_per_token"]:.2f} ms/token, {rows[-1]["tokens_per_call"]:.2f} '
      f'tokens/call, compile {r["compile_s"]:.1f} s',
      flush=True,
    )
  fixed = [r for r in rows if r['kind'] == 'fixed']
  best_fixed = min(fixed, key=lambda r: r['decode_s']) if fixed else None
  for row in rows:
    row['speedup'] = rows[0]['decode_s'] / row['decode_s']
    row['vs_best_fixed'] = best_fixed['decode_s'] / row['decode_s'] if best_fixed else None
  return dict(
    temperature=args.walltime_temperature,
    examples=len(examples),
    rows=rows,
    best_fixed=best_fixed['method'] if best_fixed else None,
  )


def walltime_part(pair: pages.Pair, examples, args) -> tuple[dict[str, Any], dict[str, Any]]:
  """(costs, walltime): c and v(T) at batch 1 on the first sentence, then the batch-1 walltime of
  every method on the first --walltime_examples sentences."""
  print('== costs', flush=True)
  encoder_tokens = batching.pad_batch(examples[:1], 1, args.inputs_length)  # [1, S]
  costs = measure_costs(pair, encoder_tokens, args.max_gamma, repeats=max(3, args.repeats))
  print(
    f'  c = {costs["c"]:.3f}, v = { ({k: round(v, 2) for k, v in costs["v"].items()}) }',
    flush=True,
  )
  print('== walltime (batch 1)', flush=True)
  return costs, walltime(pair, examples[: args.walltime_examples], costs, args)
