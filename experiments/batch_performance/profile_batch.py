"""`.venv/bin/python experiments/batch_performance/profile_batch.py [--batches 1 8 32]` prints ms per T=1 decode step per variant.

Where the batch-B time of one cached T=1 decoder step of the embedded target goes (issue 17,
docs/batch_performance.md). Every variant runs `--steps` chained `T5.extend(T=1)` calls (greedy
feedback, all rows at the same position, the baseline's situation) inside one jitted
`lax.fori_loop`, so one call times `--steps` decode steps. Rounds are interleaved: each round times
every (batch, variant) once in a shuffled order; the script prints per-variant medians (ms/step) and
the median over rounds of the per-round ratio to the `scatter` variant of the same batch, with
`os.getloadavg()`. The machine is shared, so only same-process, same-round ratios are meaningful.

Variants (`--variants`):
  scatter      the ragged path: `cache.at[rows, positions].set(mode='drop')`, per-row masks.
  lockstep     `T5.extend` with a scalar `start` (all rows at one position):
               `lax.dynamic_update_slice` writes and a batch-shared mask/relative-position bias.
  onehot       the ragged path with the write replaced by a one-hot select over the cache (the
               T5X examples' write, generalised to per-row positions).
  stock        stock-equivalent: scatter path, cross-attention K/V recomputed every step
               (`cache_cross_kv=False`, as stock T5X).
  nowrite      scatter path minus the cache write (the new K/V are dropped): the write's cost.
  old          the scatter path of another version of speculative/models/t5.py, loaded from
               `--old_module` (e.g. `git show <rev>:speculative/models/t5.py > /tmp/t5_old.py`),
               to compare versions inside one process.
Random weights of the embedded target config (`--weights` loads models/embedded/target.msgpack);
outputs of `scatter`, `lockstep` and `onehot` are checked to be identical.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import random
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from speculative.jobs import gin_utils
from speculative.models import t5 as t5_lib
from speculative.models import t5_network

CONFIG = 'configs/models/embedded_target.gin'


def _onehot_write(cache, new, positions):
  """The T5X-examples style write, per row: select the new K/V where position == slot.

  cache [B, H, dh, K]; new [B, T, H, dh]; positions [B, T].
  """
  slots = jnp.arange(cache.shape[3], dtype=jnp.int32)
  for t in range(new.shape[1]):
    hit = (slots[None, :] == positions[:, t : t + 1])[:, None, None, :]  # [B, 1, 1, K]
    cache = jnp.where(hit, new[:, t, :, :, None].astype(cache.dtype), cache)
  return cache


def _no_write(cache, new, positions):
  del new, positions
  return cache


def make_steps(model: t5_lib.T5, write=None, scalar_start=False):
  """Jitted (params, cache, token [B], position []) -> tokens after `steps` greedy T=1 steps."""

  def run(params, cache, token, position, steps):
    batch = token.shape[0]

    def body(i, carry):
      cache, token = carry
      start = position + i
      if not scalar_start:
        start = jnp.full((batch,), start, jnp.int32)
      logits, cache = model.extend(params, cache, token[:, None], start)  # [B, 1, V]
      return cache, jnp.argmax(logits[:, 0], -1).astype(jnp.int32)

    _, token = jax.lax.fori_loop(0, steps, body, (cache, token))
    return token

  jitted = jax.jit(run, static_argnums=4)
  if write is None:
    return jitted

  def patched(*args):
    # The patch is active while tracing (first call); later calls reuse the compiled function.
    saved = t5_network.write_rows  # the cache write the decoder layers call
    t5_network.write_rows = write
    try:
      return jitted(*args)
    finally:
      t5_network.write_rows = saved

  return patched


@functools.partial(jax.jit, static_argnames=('model', 'max_length'))
def _prefilled_cache(params, encoder_tokens, prefix, *, model, max_length):
  """A cache with `prefix` [B, P] written at positions 0..P-1 (one compile per model and shape)."""
  batch = encoder_tokens.shape[0]
  cache = model.init_cache(params, batch, max_length, encoder_tokens)
  _, cache = model.extend(params, cache, prefix, jnp.zeros((batch,), jnp.int32))
  return cache


def main() -> None:
  args = _parser().parse_args()
  config = gin_utils.load_macro(CONFIG, 'EMBEDDED_TARGET')
  if args.weights:
    from speculative import checkpoints

    params = checkpoints.load_params('models/embedded/target.msgpack', config=config)
  else:
    params = t5_lib.T5(config).init_params(jax.random.PRNGKey(0))
  variants = _variants(args, config)
  rng = np.random.default_rng(0)
  work = {}
  for batch in args.batches:
    work.update(_compiled_batch(args, config, params, variants, batch, rng))
  print(f'compiled; loadavg {os.getloadavg()}', flush=True)
  times, ratios = _time_rounds(work, args.rounds, args.steps)
  print(
    f'\nbatch variant   ms/step(median)  ratio_to_scatter(median of per-round)  '
    f'loadavg {os.getloadavg()}'
  )
  for batch, name in work:
    ratio = statistics.median(ratios[batch, name]) if ratios[batch, name] else float('nan')
    print(
      f'{batch:5d} {name:9s} {1e3 * statistics.median(times[batch, name]):8.2f}'
      f'         {ratio:6.3f}'
    )


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--batches', nargs='+', type=int, default=[1, 8, 32])
  parser.add_argument(
    '--variants', nargs='+', default=['scatter', 'lockstep', 'onehot', 'stock', 'nowrite']
  )
  parser.add_argument('--steps', type=int, default=16)
  parser.add_argument('--max_length', type=int, default=66)  # 1 + 64 new tokens + 1 (baseline)
  parser.add_argument('--position', type=int, default=24)
  parser.add_argument('--encoder_length', type=int, default=40)
  parser.add_argument('--rounds', type=int, default=9)
  parser.add_argument('--weights', action='store_true')
  parser.add_argument('--old_module', default=None, help='t5.py of another version (variant old)')
  return parser


def _variants(args, config) -> dict[str, tuple[Any, Any]]:
  """{variant: (model, jitted steps)} of the variants asked for (module docstring)."""
  ours = t5_lib.T5(config)
  stock = t5_lib.T5(config, cache_cross_kv=False)
  variants = {
    'scatter': (ours, make_steps(ours)),
    'lockstep': (ours, make_steps(ours, scalar_start=True)),
    'onehot': (ours, make_steps(ours, write=_onehot_write)),
    'stock': (stock, make_steps(stock)),
    'nowrite': (ours, make_steps(ours, write=_no_write)),
  }
  if args.old_module:
    spec = importlib.util.spec_from_file_location('t5_old', args.old_module)
    old = importlib.util.module_from_spec(spec)
    sys.modules['t5_old'] = old
    spec.loader.exec_module(old)
    fields = old.T5Config.__dataclass_fields__
    old_model = old.T5(old.T5Config(**{f: getattr(config, f) for f in fields}))
    variants['old'] = (old_model, make_steps(old_model))
  return {k: variants[k] for k in args.variants}


def _compiled_batch(args, config, params, variants, batch: int, rng) -> dict:
  """{(batch, variant): (fn, call)} compiled and warmed on random inputs of this batch size;
  warns where a variant's tokens differ from the scatter path's."""
  enc = rng.integers(2, config.vocab_size, (batch, args.encoder_length)).astype(np.int32)
  enc[:, -5:] = 0  # some padding
  enc = jnp.asarray(enc)
  token = jnp.asarray(rng.integers(2, config.vocab_size, (batch,)), jnp.int32)
  # Fill the prefix so attention sees realistic (non-zero) keys.
  prefix = jnp.asarray(rng.integers(2, config.vocab_size, (batch, args.position)), jnp.int32)
  outs, work = {}, {}
  for name, (model, fn) in variants.items():
    cache = _prefilled_cache(params, enc, prefix, model=model, max_length=args.max_length)
    call = (params, cache, token, jnp.asarray(args.position, jnp.int32), args.steps)
    outs[name] = np.asarray(fn(*call))  # compile + warm up
    work[batch, name] = (fn, call)
  ref = outs.get('scatter')
  for name in ('lockstep', 'onehot', 'stock', 'old'):
    if ref is not None and name in outs and not np.array_equal(outs[name], ref):
      print(f'WARNING batch {batch}: {name} tokens differ from scatter')
  return work


def _time_rounds(work: dict, rounds: int, steps: int) -> tuple[dict, dict]:
  """Seconds per step of every (batch, variant) in shuffled rounds, and per-round ratios to the
  scatter path of the same batch."""
  times = {key: [] for key in work}
  ratios = {key: [] for key in work}
  for r in range(rounds):
    keys = list(work)
    random.Random(r).shuffle(keys)
    this = {}
    for key in keys:
      fn, call = work[key]
      t0 = time.perf_counter()
      jax.block_until_ready(fn(*call))
      this[key] = (time.perf_counter() - t0) / steps
    for key, t in this.items():
      times[key].append(t)
      if (key[0], 'scatter') in this:
        ratios[key].append(t / this[key[0], 'scatter'])
    print(f'round {r} loadavg {os.getloadavg()}', flush=True)
  return times, ratios


if __name__ == '__main__':
  main()
