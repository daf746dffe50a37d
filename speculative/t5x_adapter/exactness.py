"""The T5X adapter's optional exactness check: `SpeculativeEncoderDecoderModel(check_exactness=True)`.

Greedy speculative decoding emits the target's greedy tokens, up to reduced-precision near-ties
(docs/exactness.md). With the check on, each greedy `predict_batch_with_aux` call also decodes the
same rows with the baseline (`decode/loops.py`'s `autoregressive_decode`, one target step per token, same
target parameters) and audits every row whose output differs with `speculative.decode.audit.audit_arrays`
(first differing position, the target's float32 logits there after the shared prefix, top-2 gap,
verdict near-tie or mismatch). A near-tie is logged (absl, INFO); a mismatch raises
`ExactnessError`. Everything runs inside the caller's jit / pjit (T5X's partitioned infer step):
the report goes through `jax.debug.callback`, so under jit the error surfaces as the runtime
error of the call, with this module's message in it.

The verdicts go to aux, one value per example like T5X's 'scores' (`AUX_KEYS`):

  exactness_verdict    int32: -1 not checked (a sampled decode), 0 identical, 1 near-tie, 2 mismatch
  exactness_position   int32: first differing generated token (0 = the first), -1 if identical
  exactness_gap        float32: the float32 top-2 logit gap there (0 if identical)
  exactness_deficit    float32: how far the farther candidate token lies below the float32 top
                       logit (the quantity compared with the bound; 0 if identical)
  exactness_bound      float32: the rounding bound there (0 if identical)

Cost: one baseline decode per call, plus one float32 teacher-forced target forward (a float32
copy of the target's parameters) when some row differs. A debugging and acceptance tool, off by
default. This module does not import t5x (the model class in `models` calls it).
"""

from __future__ import annotations

import functools
from typing import Any
from typing import Mapping

from absl import logging
import jax
import jax.numpy as jnp
import numpy as np

from speculative.decode import audit

NOT_CHECKED = -1
IDENTICAL = audit.VERDICT_CODES[audit.IDENTICAL]
NEAR_TIE = audit.VERDICT_CODES[audit.NEAR_TIE]
MISMATCH = audit.VERDICT_CODES[audit.MISMATCH]
# aux key -> audit_arrays key.
AUX_KEYS = {
  'exactness_verdict': 'verdict',
  'exactness_position': 'position',
  'exactness_gap': 'gap',
  'exactness_deficit': 'deficit',
  'exactness_bound': 'bound',
}
# Reported with each divergence, not returned in aux.
_TOKEN_KEYS = ('baseline_token', 'speculative_token')


class ExactnessError(AssertionError):
  """A greedy speculative output differs from the baseline beyond rounding (verdict mismatch)."""


def exactness_aux(
  target: Any,
  target_params: Any,
  encoder_tokens: jax.Array,
  baseline: jax.Array,
  baseline_lengths: jax.Array,
  decodes: jax.Array,
  lengths: jax.Array,
  *,
  offsets: jax.Array | None = None,
  bound_factor: float = audit.DEFAULT_BOUND_FACTOR,
) -> dict[str, jax.Array]:
  """The audit of greedy speculative decodes against the baseline's, as aux entries (traceable).

  Args:
    target, target_params: the target model (`speculative.models.t5.T5`) and its parameters.
    encoder_tokens: [R, S] int32.
    baseline, decodes: [R, L] int32 baseline and speculative decodes in T5X's layout (the prompt,
      if any, then the generated tokens).
    baseline_lengths, lengths: [R] int32 generated tokens per row.
    offsets: [R] int32 prompt tokens per row (default 0).
    bound_factor: C of the rounding bound (`speculative.decode.audit`).

  Returns:
    {aux key: [R]} for the `AUX_KEYS`, plus the two candidate tokens (for `enforce`'s message;
    `enforce` removes them).
  """
  found = audit.audit_arrays(
    target,
    target_params,
    encoder_tokens,
    baseline,
    baseline_lengths,
    decodes,
    lengths,
    offsets=offsets,
    bound_factor=bound_factor,
  )
  aux = {name: found[key] for name, key in AUX_KEYS.items()}
  aux.update({key: found[key] for key in _TOKEN_KEYS})
  return aux


def not_checked_aux(rows: int) -> dict[str, jax.Array]:
  """The aux entries of a call the check does not apply to (sampling): verdict NOT_CHECKED."""
  zeros = jnp.zeros((rows,), jnp.float32)
  return {
    'exactness_verdict': jnp.full((rows,), NOT_CHECKED, jnp.int32),
    'exactness_position': jnp.full((rows,), -1, jnp.int32),
    'exactness_gap': zeros,
    'exactness_deficit': zeros,
    'exactness_bound': zeros,
  }


def enforce(aux: Mapping[str, jax.Array], num_decodes: int = 1) -> dict[str, jax.Array]:
  """Logs near-ties and raises `ExactnessError` on a mismatch; returns aux without the tokens.

  Eagerly the report runs at once; under jit / pjit it runs on the host through
  `jax.debug.callback` when the computation executes.

  Args:
    aux: `exactness_aux`'s entries, [R] each (rows = examples * num_decodes, example-major).
    num_decodes: decodes per example (to name a row by example and decode).
  """
  aux = dict(aux)
  if all(key in aux for key in _TOKEN_KEYS):
    values = [aux[name] for name in AUX_KEYS] + [aux.pop(key) for key in _TOKEN_KEYS]
    report = functools.partial(_report, num_decodes=num_decodes)
    if any(isinstance(v, jax.core.Tracer) for v in values):
      jax.debug.callback(report, *values)
    else:
      report(*values)
  return aux


def _report(
  verdict: Any,
  position: Any,
  gap: Any,
  deficit: Any,
  bound: Any,
  baseline_token: Any,
  speculative_token: Any,
  *,
  num_decodes: int,
) -> None:
  """Host side of `enforce` (numpy inputs, [R] each)."""
  verdict, position, baseline_token, speculative_token = (
    np.asarray(x).reshape(-1) for x in (verdict, position, baseline_token, speculative_token)
  )
  gap, deficit, bound = (np.asarray(x, np.float64).reshape(-1) for x in (gap, deficit, bound))

  def describe(r: int) -> str:
    row = (
      f'batch row {r}'
      if num_decodes == 1
      else f'example {r // num_decodes} (decode {r % num_decodes})'
    )
    token = lambda t: 'stopped' if t < 0 else f'token {t}'
    return (
      f'{row}: first difference at generated position {position[r]} (baseline '
      f'{token(baseline_token[r])}, speculative {token(speculative_token[r])}), float32 top-2 '
      f'gap {gap[r]:.4g}, deficit {deficit[r]:.4g}, bound {bound[r]:.4g}'
    )

  near_ties = np.flatnonzero(verdict == NEAR_TIE)
  if near_ties.size:
    logging.info(
      'exactness check: %d of %d rows differ from the greedy baseline at a near-tie (within '
      'rounding, docs/exactness.md): %s',
      near_ties.size,
      verdict.size,
      '; '.join(describe(r) for r in near_ties[:5]),
    )
  mismatches = np.flatnonzero(verdict == MISMATCH)
  if mismatches.size:
    raise ExactnessError(
      f'exactness check: greedy speculative output differs from the greedy baseline beyond '
      f'rounding (audit verdict mismatch, docs/exactness.md) in {mismatches.size} of '
      f'{verdict.size} rows; ' + '; '.join(describe(r) for r in mismatches[:5])
    )
