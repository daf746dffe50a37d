"""Exactness audit: explain every difference between greedy baseline and speculative outputs.

Greedy speculative decoding is token-identical to the target's greedy baseline in exact
arithmetic. In finite precision the verify call (gamma+1 positions in one `extend`) and the
baseline's 1-token steps compute the same function with different shapes, so XLA may accumulate in
a different order and round differently; where the target's two best logits are closer than that
rounding, the argmax can flip and the outputs diverge from there on. `audit_divergences` finds, per
differing example, the first differing position, recomputes the target's logits there in FLOAT32
(float32 copy of the config, params cast to float32, one teacher-forced full forward over the
shared prefix) and classifies the divergence:

  * 'near-tie': both candidate tokens (the baseline's and the speculative one) are within `bound`
    of the float32 maximum logit, i.e. either could be the argmax of a forward pass that rounds
    each logit by up to bound/2. Expected in reduced precision; not a bug.
  * 'mismatch': one of the candidates is further than `bound` below the float32 maximum (or the
    sequences differ in length only, which rounding cannot cause: a stop at EOS or max length is
    decided by a shared token). This is what a broken acceptance rule or cache bug looks like.

The bound. With eps the machine epsilon of the dtype the decode ran in (bfloat16 2^-7, float32
2^-23) and each pass's logits off by |e_v| <= (C/2) eps max(|z_v|, 1), the 1-token step and the
verify call can pick tokens a and b only if both are within 2 max|e| of z_top1:

  bound = C * eps(dtype) * max(|z_top1|, |z_a|, |z_b|, 1),

and a divergence is a near-tie iff z_top1 - z_a <= bound and z_top1 - z_b <= bound (with the
float32 top two as the candidates: `gap` <= bound). The floor at 1 covers logits near 0, whose
absolute error is set by the O(1) activations, not by |z|.

C: 2 at the least (the last hidden state is rounded to the dtype twice), more with the earlier
layers' rounding; DEFAULT_BOUND_FACTOR = 10 covers the largest ratio measured on the embedded
target in bfloat16, 4.4 (`logit_error_ratios`), with a margin. `bound_factor` overrides C
(docs/exactness.md, "Choosing C": the derivation, the measurement, the bound in logit units).

The API takes only the model, its params, the encoder inputs and token id lists, so any runner can
call it; `audit_arrays` is the same audit on padded device arrays, traceable inside jit / pjit (the
T5X adapter's `check_exactness`). Both share `logits_at` (the float32 recompute) and
`classify_logits` (the verdict rule).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

IDENTICAL = 'identical'
NEAR_TIE = 'near-tie'
MISMATCH = 'mismatch'
# Integer verdict codes of the array form (`audit_arrays`; the T5X adapter's aux 'exactness_verdict').
VERDICT_CODES = {IDENTICAL: 0, NEAR_TIE: 1, MISMATCH: 2}
DEFAULT_BOUND_FACTOR = 10.0


@dataclasses.dataclass(frozen=True)
class Divergence:
  """The first difference of one example's baseline and speculative outputs.

  Attributes:
    example: index of the example in the inputs.
    position: index of the first differing generated token (0 = first generated token).
    baseline_token: the baseline's token there (-1 if the baseline had stopped).
    speculative_token: the speculative token there (-1 if the speculative output had stopped).
    baseline_logit: float32 target logit of baseline_token (nan if -1).
    speculative_logit: float32 target logit of speculative_token (nan if -1).
    top_tokens: the float32 top-2 tokens (best first).
    top_logits: their float32 logits.
    gap: top_logits[0] - top_logits[1].
    deficit: largest float32 distance of a candidate token below the top logit (the quantity
      compared with `bound`; equals `gap` when the candidates are the top two).
    bound: the rounding bound at this position (module docstring).
    dtype: the dtype the decode ran in (the bound's eps).
    verdict: NEAR_TIE or MISMATCH.
  """

  example: int
  position: int
  baseline_token: int
  speculative_token: int
  baseline_logit: float
  speculative_logit: float
  top_tokens: tuple[int, int]
  top_logits: tuple[float, float]
  gap: float
  deficit: float
  bound: float
  dtype: str
  verdict: str


def rounding_bound(
  logits: Sequence[float], dtype: Any, factor: float = DEFAULT_BOUND_FACTOR
) -> float:
  """factor * eps(dtype) * max(|z| for z in logits, 1): how far rounding can move a logit gap."""
  magnitude = max([abs(float(z)) for z in logits] + [1.0])
  return float(factor * _eps(dtype, factor) * magnitude)


def _eps(dtype: Any, factor: float) -> float:
  """Machine epsilon of `dtype`, after checking the bound's arguments."""
  dtype = jnp.dtype(dtype)
  if not jnp.issubdtype(dtype, jnp.floating):
    raise ValueError(f'rounding_bound needs a floating dtype, got {dtype}')
  if factor <= 0:
    raise ValueError(f'bound factor must be > 0, got {factor}')
  return float(jnp.finfo(dtype).eps)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
  """Index of the first position where a and b differ (len of the shorter if one is a prefix of
  the other); None if they are equal."""
  a, b = [int(t) for t in a], [int(t) for t in b]
  for i, (x, y) in enumerate(zip(a, b)):
    if x != y:
      return i
  return None if len(a) == len(b) else min(len(a), len(b))


def float32_model(model: Any) -> Any:
  """A copy of `model` whose config computes in float32 (dtype and logits head)."""
  config = getattr(model, 'config', None)
  if (
    not dataclasses.is_dataclass(model)
    or not dataclasses.is_dataclass(config)
    or not hasattr(config, 'dtype')
  ):
    raise TypeError(
      f'the audit needs a dataclass model with a dataclass `config` holding '
      f'`dtype` (e.g. speculative.models.t5.T5), got {type(model).__name__}'
    )
  changes = {'dtype': 'float32'}
  if hasattr(config, 'logits_dtype'):
    changes['logits_dtype'] = None
  return dataclasses.replace(model, config=dataclasses.replace(config, **changes))


def _as_float32(params: Any) -> Any:
  """The float32 reference's parameters: the plain tree (weights packed for the kernels are left
  out, so the reference is XLA's float32 model on the unrounded weights)."""
  params = getattr(params, 'params', params)  # t5.DecodeParams -> its T5X tree
  return jax.tree.map(
    lambda x: (
      jnp.asarray(x, jnp.float32)
      if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)
      else jnp.asarray(x)
    ),
    params,
  )


@functools.partial(jax.jit, static_argnames=('model', 'float32'))
def _logits_at(
  model: Any,
  params: Any,
  encoder_tokens: jax.Array,
  decoder_inputs: jax.Array,
  positions: jax.Array,
  float32: bool,
) -> jax.Array:
  """Teacher-forced logits of rows at `positions`: [N, V] float32. With `float32` the params are
  cast inside the compiled program, so XLA converts each weight where it is used and the float32
  copy of a large model is never held whole beside its bfloat16 weights."""
  if float32:
    params = _as_float32(params)
  logits = model.forward(params, encoder_tokens, decoder_inputs)  # [N, T, V]
  return jnp.take_along_axis(logits, positions[:, None, None], axis=1)[:, 0].astype(jnp.float32)


def _decoder_inputs(
  prefixes: Sequence[Sequence[int]], start_token: int, length: int | None = None
) -> np.ndarray:
  """[start, prefix..., 0-padding] rows, [N, max(length, 1 + max prefix length)] int32 (causal:
  padding after a position does not change its logits)."""
  length = max(length or 0, 1 + max(len(p) for p in prefixes))
  out = np.zeros((len(prefixes), length), np.int32)
  out[:, 0] = start_token
  for i, prefix in enumerate(prefixes):
    out[i, 1 : 1 + len(prefix)] = prefix
  return out


def teacher_forced_logits(
  model: Any,
  params: Any,
  encoder_tokens: Any,
  prefixes: Sequence[Sequence[int]],
  *,
  float32: bool = True,
) -> np.ndarray:
  """The target's next-token logits after each decoder prefix: [N, V] float32 numpy.

  Args:
    model: an encoder-decoder model with `forward(params, encoder_tokens, decoder_input_tokens)`
      and a dataclass `config` (a `speculative.models.t5.T5`).
    params: its parameters (any float dtype).
    encoder_tokens: [N, S] int32, row i the encoder input of prefixes[i].
    prefixes: N lists of generated token ids (the decoder start token is prepended).
    float32: recompute in a float32 copy of the model with float32 params (False: as given).
  """
  encoder_tokens = np.asarray(encoder_tokens, np.int32)
  if encoder_tokens.ndim != 2 or encoder_tokens.shape[0] != len(prefixes):
    raise ValueError(f'encoder_tokens must be [{len(prefixes)}, S], got {encoder_tokens.shape}')
  start = int(getattr(model.config, 'decoder_start_token_id', 0))
  positions = np.array([len(p) for p in prefixes], np.int32)
  logits = logits_at(
    model,
    params,
    jnp.asarray(encoder_tokens),
    jnp.asarray(_decoder_inputs(prefixes, start)),
    jnp.asarray(positions),
    float32=float32,
  )
  return np.asarray(logits)  # [N, V]


def logits_at(
  model: Any,
  params: Any,
  encoder_tokens: jax.Array,
  decoder_inputs: jax.Array,
  positions: jax.Array,
  *,
  float32: bool = True,
) -> jax.Array:
  """Teacher-forced logits of each row at one position: [N, V] float32 (traceable).

  Args:
    model, params: as `teacher_forced_logits`.
    encoder_tokens: [N, S] int32.
    decoder_inputs: [N, T] int32 decoder inputs (the start token, then the tokens; causal, so
      whatever follows a row's position does not change its logits).
    positions: [N] int32, the position of each row to read (the logits predict the token there).
    float32: recompute in a float32 copy of the model with float32 params (False: as given).
  """
  if float32:
    model = float32_model(model)
    params = getattr(params, 'params', params)  # t5.DecodeParams -> its T5X tree (`_as_float32`)
  return _logits_at(model, params, encoder_tokens, decoder_inputs, positions, float32)


def classify_logits(
  logits: jax.Array,
  baseline_token: jax.Array,
  speculative_token: jax.Array,
  dtype: Any,
  factor: float = DEFAULT_BOUND_FACTOR,
) -> dict[str, jax.Array]:
  """The verdict rule (module docstring) on arrays, traceable: one row per divergence.

  Args:
    logits: [N, V] float32 target logits at each row's first differing position.
    baseline_token, speculative_token: [N] int32 candidate tokens there (-1: that output had
      stopped; at most one of the two per row).
    dtype: the dtype the decodes ran in (the bound's eps).
    factor: C of the bound.

  Returns:
    {'top_tokens': [N, 2] int32 and 'top_logits': [N, 2] float32 (the float32 top two, best
    first, lower id first on ties), 'baseline_logit', 'speculative_logit' (nan for -1), 'gap',
    'deficit', 'bound': [N] float32, 'near_tie': [N] bool (False: mismatch)}.
  """
  eps = _eps(dtype, factor)
  logits = jnp.asarray(logits, jnp.float32)
  top_logits, top_tokens = jax.lax.top_k(logits, 2)  # [N, 2]; ties: lower index first

  tokens = jnp.stack(
    [jnp.asarray(baseline_token, jnp.int32), jnp.asarray(speculative_token, jnp.int32)], axis=1
  )  # [N, 2]
  valid = tokens >= 0
  candidates = jnp.where(
    valid, jnp.take_along_axis(logits, jnp.maximum(tokens, 0), axis=1), jnp.nan
  )  # [N, 2] float32, nan where the output had stopped
  baseline_logit, speculative_logit = candidates[:, 0], candidates[:, 1]
  magnitude = jnp.max(
    jnp.where(valid, jnp.abs(candidates), 1.0), axis=1, initial=1.0
  )  # max(|z_a|, |z_b|, 1) over the candidates present
  magnitude = jnp.maximum(magnitude, jnp.abs(top_logits[:, 0]))
  bound = factor * eps * magnitude
  deficit = jnp.max(jnp.where(valid, top_logits[:, :1] - candidates, -jnp.inf), axis=1)
  # A length-only difference (a candidate is -1) is never rounding: the stop was decided by a
  # shared token.
  near_tie = jnp.all(valid, axis=1) & (deficit <= bound)
  return {
    'top_tokens': top_tokens.astype(jnp.int32),
    'top_logits': top_logits,
    'baseline_logit': baseline_logit,
    'speculative_logit': speculative_logit,
    'gap': top_logits[:, 0] - top_logits[:, 1],
    'deficit': deficit,
    'bound': bound,
    'near_tie': near_tie,
  }


def _classify(
  example: int,
  position: int,
  baseline_token: int,
  speculative_token: int,
  logits: np.ndarray,
  dtype: str,
  factor: float,
) -> Divergence:
  """A Divergence from the float32 logits [V] at the first differing position."""
  row = classify_logits(
    np.asarray(logits, np.float32)[None],
    np.array([baseline_token], np.int32),
    np.array([speculative_token], np.int32),
    dtype,
    factor,
  )
  row = {k: np.asarray(v)[0] for k, v in row.items()}
  return Divergence(
    example=example,
    position=position,
    baseline_token=baseline_token,
    speculative_token=speculative_token,
    baseline_logit=float(row['baseline_logit']),
    speculative_logit=float(row['speculative_logit']),
    top_tokens=(int(row['top_tokens'][0]), int(row['top_tokens'][1])),
    top_logits=(float(row['top_logits'][0]), float(row['top_logits'][1])),
    gap=float(row['gap']),
    deficit=float(row['deficit']),
    bound=float(row['bound']),
    dtype=dtype,
    verdict=NEAR_TIE if bool(row['near_tie']) else MISMATCH,
  )


def audit_divergences(
  model: Any,
  params: Any,
  encoder_tokens: Any,
  baseline: Sequence[Sequence[int]],
  speculative: Sequence[Sequence[int]],
  *,
  dtype: Any = None,
  bound_factor: float = DEFAULT_BOUND_FACTOR,
) -> list[Divergence]:
  """Classifies the first difference of every example whose outputs differ.

  Args:
    model: the target (`speculative.models.t5.T5`, or any dataclass encoder-decoder model with a
      `config` and `forward(params, encoder_tokens, decoder_input_tokens)`).
    params: the target's parameters.
    encoder_tokens: [N, S] int32 encoder inputs (0 = padding), row i for example i.
    baseline: N lists of generated token ids of the greedy baseline (EOS included, no padding).
    speculative: N lists of generated token ids of the speculative decode.
    dtype: the dtype the decodes ran in, for the bound (default `model.config.dtype`).
    bound_factor: C of the bound (module docstring).

  Returns:
    One Divergence per differing example, in example order.
  """
  if len(baseline) != len(speculative):
    raise ValueError(f'{len(baseline)} baseline sequences but {len(speculative)} speculative')
  encoder_tokens = np.asarray(encoder_tokens, np.int32)
  if encoder_tokens.ndim != 2 or encoder_tokens.shape[0] != len(baseline):
    raise ValueError(f'encoder_tokens must be [{len(baseline)}, S], got {encoder_tokens.shape}')
  dtype = jnp.dtype(dtype if dtype is not None else model.config.dtype).name
  found = []  # (example, position, baseline token, speculative token)
  for i, (base, spec) in enumerate(zip(baseline, speculative)):
    base, spec = [int(t) for t in base], [int(t) for t in spec]
    position = first_difference(base, spec)
    if position is not None:
      found.append(
        (
          i,
          position,
          base[position] if position < len(base) else -1,
          spec[position] if position < len(spec) else -1,
        )
      )
  if not found:
    return []
  rows = [i for i, *_ in found]
  prefixes = [[int(t) for t in baseline[i][:position]] for i, position, *_ in found]
  logits = teacher_forced_logits(model, params, encoder_tokens[rows], prefixes)  # [D, V]
  return [
    _classify(i, position, b, s, logits[k], dtype, bound_factor)
    for k, (i, position, b, s) in enumerate(found)
  ]


def audit_arrays(
  model: Any,
  params: Any,
  encoder_tokens: jax.Array,
  baseline: jax.Array,
  baseline_lengths: jax.Array,
  speculative: jax.Array,
  speculative_lengths: jax.Array,
  *,
  offsets: jax.Array | None = None,
  dtype: Any = None,
  bound_factor: float = DEFAULT_BOUND_FACTOR,
) -> dict[str, jax.Array]:
  """`audit_divergences` on padded device arrays, traceable (inside jit / pjit): a verdict per row.

  The same audit: the first differing generated position of each row, the target's float32 logits
  there after the shared prefix (`logits_at`), the verdict by `classify_logits`. The float32
  forward runs only when some row differs (`lax.cond`), over all N rows (static shapes).

  Args:
    model, params: as `audit_divergences`.
    encoder_tokens: [N, S] int32.
    baseline, speculative: [N, T] int32 decoder token streams (no start token): row i holds
      offsets[i] prompt tokens, shared by both and not compared, then its generated tokens on
      [offsets[i], offsets[i] + lengths[i]); what follows is ignored.
    baseline_lengths, speculative_lengths: [N] int32 generated tokens per row.
    offsets: [N] int32 prompt tokens before the generated ones (default 0).
    dtype, bound_factor: as `audit_divergences`.

  Returns:
    {'verdict': [N] int32 `VERDICT_CODES` (0 identical, 1 near-tie, 2 mismatch), 'position': [N]
    int32 first differing generated position (0 = first generated token; -1 if identical),
    'baseline_token', 'speculative_token': [N] int32 (-1: stopped, or identical), 'gap',
    'deficit', 'bound': [N] float32 (0 where identical)}.
  """
  baseline = jnp.asarray(baseline, jnp.int32)
  speculative = jnp.asarray(speculative, jnp.int32)
  if baseline.ndim != 2 or baseline.shape != speculative.shape:
    raise ValueError(
      f'baseline and speculative must be [N, T] of one shape, got {baseline.shape} and '
      f'{speculative.shape}'
    )
  rows = baseline.shape[0]
  dtype = jnp.dtype(dtype if dtype is not None else model.config.dtype).name
  offsets = jnp.zeros((rows,), jnp.int32) if offsets is None else jnp.asarray(offsets, jnp.int32)
  first = _first_differences(baseline, baseline_lengths, speculative, speculative_lengths, offsets)
  logits = _logits_where_diverged(model, params, encoder_tokens, baseline, first)
  verdicts = classify_logits(
    logits, first['baseline_token'], first['speculative_token'], dtype, bound_factor
  )
  return _verdict_arrays(verdicts, first, offsets)


def _first_differences(
  baseline: jax.Array,
  baseline_lengths: jax.Array,
  speculative: jax.Array,
  speculative_lengths: jax.Array,
  offsets: jax.Array,
) -> dict[str, jax.Array]:
  """The first differing generated position of each row (arguments as `audit_arrays`).

  Returns:
    {'diverged': [N] bool, 'first': [N] int32 stream index of the first difference (0 if
    identical), 'baseline_token', 'speculative_token': [N] int32 there (-1: stopped, or identical)}.
  """
  length = baseline.shape[1]
  generated = jnp.arange(length)[None, :] - offsets[:, None]  # [N, T] generated-token index

  def present(tokens: jax.Array, lengths: jax.Array) -> jax.Array:  # [N, T], -1 where absent
    inside = (generated >= 0) & (generated < jnp.asarray(lengths, jnp.int32)[:, None])
    return jnp.where(inside, tokens, -1)

  base, spec = present(baseline, baseline_lengths), present(speculative, speculative_lengths)
  differs = (base != spec) & (generated >= 0)  # [N, T]
  diverged = jnp.any(differs, axis=1)  # [N]
  first = jnp.argmax(differs, axis=1).astype(jnp.int32)  # [N] stream index (0 if identical)
  at_first = lambda tokens: jnp.where(
    diverged, jnp.take_along_axis(tokens, first[:, None], axis=1)[:, 0], -1
  )
  return {
    'diverged': diverged,
    'first': first,
    'baseline_token': at_first(base),
    'speculative_token': at_first(spec),
  }


def _logits_where_diverged(
  model: Any,
  params: Any,
  encoder_tokens: jax.Array,
  baseline: jax.Array,
  first: dict[str, jax.Array],
) -> jax.Array:
  """[N, V] float32 logits of the target at each row's first difference (`_first_differences`),
  after the shared prefix; the forward runs only when some row differs (`lax.cond`), else zeros."""
  rows = baseline.shape[0]
  start = int(getattr(model.config, 'decoder_start_token_id', 0))
  decoder_inputs = jnp.concatenate(
    [jnp.full((rows, 1), start, jnp.int32), baseline[:, :-1]], axis=1
  )  # [N, T]: position t predicts baseline[:, t] from the shared prefix baseline[:, :t]
  encoder_tokens = jnp.asarray(encoder_tokens, jnp.int32)
  recompute = lambda: logits_at(model, params, encoder_tokens, decoder_inputs, first['first'])
  return jax.lax.cond(
    jnp.any(first['diverged']),
    recompute,
    lambda: jnp.zeros(jax.eval_shape(recompute).shape, jnp.float32),
  )  # [N, V]


def _verdict_arrays(
  verdicts: dict[str, jax.Array], first: dict[str, jax.Array], offsets: jax.Array
) -> dict[str, jax.Array]:
  """`audit_arrays`'s result from the `classify_logits` verdicts at the first differences."""
  diverged = first['diverged']
  code = jnp.where(verdicts['near_tie'], VERDICT_CODES[NEAR_TIE], VERDICT_CODES[MISMATCH]).astype(
    jnp.int32
  )
  zero = lambda x: jnp.where(diverged, x, 0.0).astype(jnp.float32)
  return {
    'verdict': jnp.where(diverged, code, VERDICT_CODES[IDENTICAL]).astype(jnp.int32),
    'position': jnp.where(diverged, first['first'] - offsets, -1).astype(jnp.int32),
    'baseline_token': first['baseline_token'],
    'speculative_token': first['speculative_token'],
    'gap': zero(verdicts['gap']),
    'deficit': zero(verdicts['deficit']),
    'bound': zero(verdicts['bound']),
  }


def summarize(divergences: Sequence[Divergence], num_examples: int) -> dict[str, int]:
  """{identical, diverged, near_tie, mismatch} counts over `num_examples` examples."""
  if len(divergences) > num_examples:
    raise ValueError(f'{len(divergences)} divergences among {num_examples} examples')
  near_tie = sum(d.verdict == NEAR_TIE for d in divergences)
  return {
    'identical': num_examples - len(divergences),
    'diverged': len(divergences),
    'near_tie': near_tie,
    'mismatch': len(divergences) - near_tie,
  }


def format_table(
  divergences: Sequence[Divergence], token_text: Callable[[int], str] | None = None
) -> str:
  """A Markdown table of divergences (one row each); `token_text` renders token ids (optional)."""

  def tok(t: int) -> str:
    if t < 0:
      return '(stopped)'
    return f'{t} `{token_text(t)}`' if token_text is not None else str(t)

  lines = [
    '| example | position | baseline token | speculative token | f32 logit (base) | '
    'f32 logit (spec) | f32 top-2 gap | bound | verdict |',
    '|---:|---:|---|---|---:|---:|---:|---:|---|',
  ]
  for d in divergences:
    lines.append(
      f'| {d.example} | {d.position} | {tok(d.baseline_token)} | '
      f'{tok(d.speculative_token)} | {d.baseline_logit:.4f} | '
      f'{d.speculative_logit:.4f} | {d.gap:.4f} | {d.bound:.4f} | {d.verdict} |'
    )
  return '\n'.join(lines)


@functools.partial(jax.jit, static_argnames=('model',))
def forward_logits(
  model: Any, params: Any, encoder_tokens: jax.Array, decoder_inputs: jax.Array
) -> jax.Array:
  """The teacher-forced float32 logits [N, T, V] of `model` (jitted once per model)."""
  return model.forward(params, encoder_tokens, decoder_inputs).astype(jnp.float32)  # [N, T, V]


def logit_error_ratios(
  model: Any,
  params: Any,
  encoder_tokens: Any,
  sequences: Sequence[Sequence[int]],
  pad_to: int | None = None,
) -> np.ndarray:
  """|z_dtype - z_f32| / (eps(dtype) * max(|z_f32|, 1)) of the float32 top-2 logits at every
  position of every sequence (teacher-forced full forwards in the model's dtype and in float32): an
  empirical check of the per-logit error the bound assumes (<= C/2). Flat float64.

  Args: as `audit_divergences`; sequences are N lists of generated token ids (e.g. the baseline's);
  pad_to: a fixed decoder length to pad to (>= the longest sequence), so that repeated calls with
  different sequence lengths compile once.
  """
  encoder_tokens = np.asarray(encoder_tokens, np.int32)
  if encoder_tokens.ndim != 2 or encoder_tokens.shape[0] != len(sequences):
    raise ValueError(f'encoder_tokens must be [{len(sequences)}, S], got {encoder_tokens.shape}')
  eps = float(jnp.finfo(jnp.dtype(model.config.dtype)).eps)
  start = int(getattr(model.config, 'decoder_start_token_id', 0))
  # Position t predicts sequence[t] from [start] + sequence[:t]: feed the sequences shifted right.
  inputs = jnp.asarray(
    _decoder_inputs([[int(t) for t in s][:-1] for s in sequences], start, pad_to)
  )  # [N, T]
  low = np.asarray(forward_logits(model, params, jnp.asarray(encoder_tokens), inputs))  # [N, T, V]
  ref = np.asarray(
    forward_logits(float32_model(model), _as_float32(params), jnp.asarray(encoder_tokens), inputs)
  )  # [N, T, V]
  top2 = np.argsort(-ref, axis=-1)[..., :2]  # [N, T, 2]
  z_ref = np.take_along_axis(ref, top2, -1).astype(np.float64)
  z_low = np.take_along_axis(low, top2, -1).astype(np.float64)
  ratio = np.abs(z_low - z_ref) / (eps * np.maximum(np.abs(z_ref), 1.0))  # [N, T, 2]
  valid = np.arange(inputs.shape[1])[None, :] < np.array([len(s) for s in sequences])[:, None]
  return ratio[valid].reshape(-1)
