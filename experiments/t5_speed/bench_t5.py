"""Per-token greedy decoding walltime of our T5 (speculative.models.t5) at T5 1.1 shapes.

Command (from the repo root):
  .venv/bin/python experiments/t5_speed/bench_t5.py [--sizes small base] [--new_tokens 64] [--repeats 3]

Random-init weights (float32; vocab 32128 for the T5 1.1 sizes, 8000 for the embedded candidates of
docs/training.md: `--sizes emb128x2 emb128x2x1 emb192x2x1 emb256x4 emb384x4 emb512x4x8`), batch 1, a 64-token encoder input, 64 greedy tokens
through a jitted `lax.fori_loop` of `init_cache` + `extend(T=1)`. Each configuration is compiled and
warmed up first; the time of a whole decode call (encoder + cache init + 64 steps, with
`block_until_ready`) is divided by the number of new tokens; the median of `--repeats` runs is
reported. Runs twice per size: cross-attention K/V computed once in `init_cache` (ours) and
recomputed at every step (stock T5X behaviour). Prints one line per configuration and a Markdown
table. docs/design.md section 8: stock T5X on this machine, small ~18 ms/token, base ~37 ms/token.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from speculative.models.t5 import T5
from speculative.models.t5 import T5Config

SHAPES = {  # emb_dim, num_heads, encoder layers, decoder layers, head_dim, mlp_dim, vocab
  'tiny': (8, 4, 2, 2, 3, 16, 32128),
  'small': (512, 6, 8, 8, 64, 1024, 32128),
  'base': (768, 12, 12, 12, 64, 2048, 32128),
  'large': (1024, 16, 24, 24, 64, 2816, 32128),
  # Embedded-target candidates (docs/training.md), gated GELU MLP, 8k vocabulary.
  'emb128x2': (128, 2, 2, 2, 64, 512, 8000),
  'emb128x2x1': (128, 2, 2, 1, 64, 512, 8000),  # draft candidates: one decoder layer
  'emb192x2x1': (192, 3, 2, 1, 64, 768, 8000),
  'emb128x4x1': (128, 2, 4, 1, 64, 1024, 8000),
  'emb128x4x2': (128, 2, 4, 2, 64, 1024, 8000),
  'emb256x4': (256, 4, 4, 4, 64, 1024, 8000),
  'emb384x4': (384, 6, 4, 4, 64, 1536, 8000),
  'emb512x4x8': (512, 8, 4, 8, 64, 1024, 8000),  # the shipped (non-translating) target's shape
}


def make_greedy(model: T5, new_tokens: int):
  """Jitted greedy decode: [B, S] encoder tokens -> [B, new_tokens] tokens."""

  @jax.jit
  def greedy(params, encoder_tokens):
    batch = encoder_tokens.shape[0]
    cache = model.init_cache(params, batch, new_tokens, encoder_tokens)
    tokens = jnp.zeros((batch, new_tokens + 1), jnp.int32)  # position 0: start token

    def step(i, carry):
      cache, tokens = carry
      logits, cache = model.extend(
        params, cache, tokens[:, i][:, None], jnp.full((batch,), i, jnp.int32)
      )  # [B, 1, V]
      return cache, tokens.at[:, i + 1].set(jnp.argmax(logits[:, 0], -1).astype(jnp.int32))

    _, tokens = jax.lax.fori_loop(0, new_tokens, step, (cache, tokens))
    return tokens[:, 1:]

  return greedy


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--sizes', nargs='+', default=['small', 'base'], choices=sorted(SHAPES))
  parser.add_argument('--new_tokens', type=int, default=64)
  parser.add_argument('--encoder_length', type=int, default=64)
  parser.add_argument('--repeats', type=int, default=3)
  args = parser.parse_args()

  rows = []
  for size in args.sizes:
    d, h, enc_layers, dec_layers, dh, f, vocab = SHAPES[size]
    config = T5Config(
      vocab_size=vocab,
      emb_dim=d,
      num_heads=h,
      num_encoder_layers=enc_layers,
      num_decoder_layers=dec_layers,
      head_dim=dh,
      mlp_dim=f,
    )
    params = jax.jit(T5(config).init_params)(jax.random.PRNGKey(0))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    rng = np.random.default_rng(0)
    encoder_tokens = jnp.asarray(rng.integers(2, vocab, (1, args.encoder_length)), jnp.int32)
    outputs = {}
    for cache_cross_kv in (True, False):
      greedy = make_greedy(T5(config, cache_cross_kv=cache_cross_kv), args.new_tokens)
      start = time.perf_counter()
      outputs[cache_cross_kv] = np.asarray(greedy(params, encoder_tokens).block_until_ready())
      compile_s = time.perf_counter() - start
      greedy(params, encoder_tokens).block_until_ready()  # warm-up
      times = []
      for _ in range(args.repeats):
        start = time.perf_counter()
        greedy(params, encoder_tokens).block_until_ready()
        times.append(time.perf_counter() - start)
      ms = 1e3 * statistics.median(times) / args.new_tokens
      label = 'once (ours)' if cache_cross_kv else 'every step (T5X)'
      print(
        f'{size:6s} {n_params / 1e6:6.1f}M params  cross-KV {label:17s} '
        f'{ms:7.2f} ms/token  (runs {[round(t, 3) for t in times]} s, first call incl. '
        f'compile {compile_s:.1f} s)',
        flush=True,
      )
      rows.append((size, n_params, label, ms, compile_s))
    assert (outputs[True] == outputs[False]).all(), 'cross-KV caching changed the greedy tokens'
  print(f'\njax {jax.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()}')
  print('| size | params | cross-attention K/V | ms/token | first call (s) |')
  print('|---|---|---|---|---|')
  for size, n_params, label, ms, compile_s in rows:
    print(f'| {size} | {n_params / 1e6:.1f}M | {label} | {ms:.2f} | {compile_s:.1f} |')


if __name__ == '__main__':
  main()
