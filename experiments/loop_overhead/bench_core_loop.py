"""Overhead of the speculative decode loop itself, and c / v(T) for the paper's lm1b shapes.

Command (from the repo root):
  .venv/bin/python experiments/loop_overhead/bench_core_loop.py [--gamma 4] [--steps 4 16] [--repeats 9]

Models: configs/models/lm1b_target.gin (d=768, 12 layers, ~97M params) and lm1b_draft.gin (d=256,
2 layers, ~6M), vocab 8192, random weights, float32, batch 1, a 16-token prompt, greedy.

1. Loop overhead. With draft == target every draft is accepted, so each speculative step is exactly
   one T=2 catch-up draft call, gamma-1 T=1 draft calls and one T=gamma+1 verify call, all of the
   target. The time per step is measured as the difference of two warm `speculative_decode` calls
   that run --steps[0] and --steps[1] steps (prefill and fixed costs cancel), divided by the step
   difference. The components are timed separately inside a jitted `lax.fori_loop` that repeats the
   same `extend` call (no Python dispatch per call), at the same cache length and position.
   Prints step time, the sum of its components and the ratio (the loop should add < 10%); also the
   brief's coarser reference gamma x t(1) + t(gamma+1), and the baseline's per-token time vs t(1).
2. c = draft T=1 call / target T=1 call, and v(T) = target T-token call / target T=1 call, T=1..8:
   medians of per-round ratios, judged by speculative/bench/costs.py (refused when too noisy).

All timings: warm (compiled before timing), `block_until_ready`; the functions are timed in
interleaved rounds so background load affects them alike; prints medians over rounds of wall time
and of process CPU time (the steadier measure on a shared, loaded machine); compile times
separately.
"""

from __future__ import annotations

import argparse
import functools
import os
from pathlib import Path
import statistics
import time

import gin
import jax
import jax.numpy as jnp

from speculative import drafters
from speculative import sampling as sampling_lib
from speculative.bench import noise
from speculative.decode import loops as decoding

REPO = Path(__file__).resolve().parents[2]
PROMPT_LEN = 16


@gin.configurable
def _lm1b_models(target=gin.REQUIRED, draft=gin.REQUIRED):
  return target, draft


def load_models():
  gin.parse_config_files_and_bindings(
    [str(REPO / 'configs/models/lm1b_target.gin'), str(REPO / 'configs/models/lm1b_draft.gin')],
    ['_lm1b_models.target = %TARGET_MODEL', '_lm1b_models.draft = %DRAFT_MODEL'],
  )
  return _lm1b_models()


class Timer:
  """Times several warm functions in interleaved rounds (background load hits all of them alike).

  `add(name, make_args, fn)`: fn(*make_args()) is compiled and run once (compile time recorded);
  `run(rounds)` then times one call of each function per round, args made outside the timing.
  Records wall time and process CPU time (all threads); on a loaded machine the CPU time is the
  steadier measure of the work done.
  """

  def __init__(self):
    self.fns, self.compile_s, self.times = {}, {}, {}

  def add(self, name, make_args, fn):
    start = time.perf_counter()
    jax.block_until_ready(fn(*make_args()))
    self.compile_s[name] = time.perf_counter() - start
    self.fns[name] = (make_args, fn)
    self.times[name] = {'wall': [], 'cpu': []}

  def run(self, rounds):
    for _ in range(rounds):
      for name, (make_args, fn) in self.fns.items():
        args = jax.block_until_ready(make_args())
        start, start_cpu = time.perf_counter(), time.process_time()
        jax.block_until_ready(fn(*args))
        self.times[name]['wall'].append(time.perf_counter() - start)
        self.times[name]['cpu'].append(time.process_time() - start_cpu)

  def median(self, name, clock):
    return statistics.median(self.times[name][clock])


def repeated_extend(model, length, position, calls):
  """Jitted fn(params, cache) running `calls` extend calls over `length` tokens (cache donated)."""

  @functools.partial(jax.jit, donate_argnums=1)
  def repeated(params, cache):
    tokens = jnp.ones((1, length), jnp.int32)
    start = jnp.full((1,), position, jnp.int32)

    def body(_, carry):
      cache, total = carry
      logits, cache = model.extend(params, cache, tokens, start)
      return cache, total + logits[0, -1, 0]  # keep the logits alive

    return jax.lax.fori_loop(0, calls, body, (cache, jnp.zeros((), jnp.float32)))

  return repeated


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--gamma', type=int, default=4)
  parser.add_argument('--steps', type=int, nargs=2, default=(4, 16))
  parser.add_argument('--repeats', type=int, default=9, help='timing rounds')
  parser.add_argument('--calls', type=int, default=8, help='extend calls per timed fori_loop')
  args = parser.parse_args()
  gamma, (steps_lo, steps_hi) = args.gamma, args.steps

  target, draft = load_models()
  target_params = jax.jit(target.init_params)(jax.random.key(0))
  draft_params = jax.jit(draft.init_params)(jax.random.key(1))
  prompt = jax.random.randint(jax.random.key(2), (1, PROMPT_LEN), 0, target.vocab_size)
  print(
    f'jax {jax.__version__}, {os.cpu_count()} cpus, load average {os.getloadavg()[0]:.1f}; '
    f'batch 1, prompt {PROMPT_LEN}, gamma {gamma}, {args.repeats} interleaved rounds'
  )

  timer = Timer()
  for steps in (steps_lo, steps_hi):
    _add_decode_timers(timer, target, target_params, prompt, gamma, steps)
  cache_length = PROMPT_LEN + steps_hi * (gamma + 1) + gamma + 1
  position = PROMPT_LEN + (steps_hi * (gamma + 1)) // 2  # a typical mid-decode position
  lengths = sorted({2, gamma + 1, *range(1, 9)})
  for name, model, params, length in [('target', target, target_params, n) for n in lengths] + [
    ('draft', draft, draft_params, 1)
  ]:
    fn = repeated_extend(model, length, position, args.calls)
    timer.add(
      f'{name}{length}', lambda m=model, p=params: (p, m.init_cache(p, 1, cache_length)), fn
    )
  timer.run(args.repeats)

  report('wall', timer, args, lengths)
  report('cpu', timer, args, lengths)
  print(
    '\ncompile + first run (s): ' + ', '.join(f'{k} {v:.1f}' for k, v in timer.compile_s.items())
  )
  print(f'load average now {os.getloadavg()[0]:.1f}')


def _add_decode_timers(timer: Timer, target, target_params, prompt, gamma: int, steps: int):
  """Timers of `steps` speculative steps (draft == target: every draft is accepted, checked) and
  of the baseline over as many tokens."""
  greedy = sampling_lib.SamplingConfig(greedy=True)
  self_drafter = drafters.ModelDrafter(target)  # draft == target: every draft is accepted
  new_tokens = steps * (gamma + 1)

  def speculative(n):
    return decoding.speculative_decode(
      target,
      target_params,
      self_drafter,
      target_params,
      prompt,
      gamma=gamma,
      max_new_tokens=n,
      sampling=greedy,
    )

  def baseline(n):
    return decoding.autoregressive_decode(
      target, target_params, prompt, max_new_tokens=n, sampling=greedy
    )

  no_args = lambda: ()  # noqa: E731
  timer.add(f'spec{steps}', no_args, lambda: speculative(new_tokens).tokens)
  timer.add(f'base{steps}', no_args, lambda: baseline(new_tokens).tokens)
  result = speculative(new_tokens)
  assert int(result.metrics.target_calls[0]) == steps, result.metrics
  assert int(result.metrics.accepted[0]) == steps * gamma, result.metrics


def report(clock: str, timer: Timer, args, lengths) -> None:
  """Part 1 (loop overhead) and part 2 (c, v(T) with the noise verdict) on one clock."""
  gamma, (steps_lo, steps_hi) = args.gamma, args.steps
  get = lambda name: timer.median(name, clock)  # noqa: E731
  t = {n: get(f'target{n}') / args.calls for n in lengths}
  step = (get(f'spec{steps_hi}') - get(f'spec{steps_lo}')) / (steps_hi - steps_lo)
  new_tokens_diff = (steps_hi - steps_lo) * (gamma + 1)
  token = (get(f'base{steps_hi}') - get(f'base{steps_lo}')) / new_tokens_diff
  components = t[2] + (gamma - 1) * t[1] + t[gamma + 1]
  coarse = gamma * t[1] + t[gamma + 1]
  draft_t1 = get('draft1') / args.calls
  print(f'\n[median {clock} time over rounds]')
  print(f'1. speculative step, draft == target (all accepted): {step * 1e3:.1f} ms')
  print(
    f'   components t(2) + {gamma - 1} t(1) + t({gamma + 1}) = {components * 1e3:.1f} ms '
    f'-> loop overhead {100 * (step / components - 1):+.1f}%'
  )
  print(
    f'   coarse reference {gamma} t(1) + t({gamma + 1}) = {coarse * 1e3:.1f} ms '
    f'-> ratio {step / coarse:.3f}'
  )
  print(
    f'   baseline: {token * 1e3:.1f} ms/token vs t(1) = {t[1] * 1e3:.1f} ms '
    f'-> loop overhead {100 * (token / t[1] - 1):+.1f}%'
  )
  # c and v(T): medians of per-round ratios, with the benchmark's noise verdict.
  ratio = lambda name: noise.estimate(  # noqa: E731
    noise.ratio_samples(timer.times[name][clock], timer.times['target1'][clock])
  )
  c = ratio('draft1')
  v = {n: ratio(f'target{n}') for n in range(2, 9)}
  print(
    f'2. target T=1 call {t[1] * 1e3:.2f} ms, draft T=1 call {draft_t1 * 1e3:.2f} ms '
    f'-> c = {c.value:.3f} (spread {c.spread:.2f})'
  )
  print('   v(T) = t(T)/t(1): ' + ', '.join(f'v({n})={v[n].value:.2f}' for n in v))
  verdicts = [noise.judge(c, 'c')] + [
    noise.judge(est, f'v({n})', minimum=1.0) for n, est in v.items()
  ]
  for verdict in filter(None, verdicts):
    print(f'   too noisy to predict from: {verdict}')
  print('   t(T) ms:          ' + ', '.join(f'{n}:{t[n] * 1e3:.1f}' for n in range(1, 9)))


if __name__ == '__main__':
  main()
