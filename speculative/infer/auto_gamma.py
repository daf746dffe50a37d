"""`GAMMA = 'auto'` in a batch job: the speculative mode decodes each batch at the gamma the policy
chooses (speculative/autogamma/policy.py) from the costs calibrated on the job's own models
(speculative/autogamma/costs.py).

Where the choice is made: once per batch, on the host, before the batch is decoded. The batch then
runs the plain loop (gamma 0) or the compiled speculative loop of that gamma, exactly the program a
fixed-gamma job runs, so the chosen width costs what it costs at a fixed gamma. (A choice per step
inside one loop needs the verify call in a `lax.switch` over widths; measured on the embedded
target, the switch adds ~15% to a batch-1 step and ~35% to a batch-8 step on the CPU kernels,
because the cache is copied into and out of the conditional: more than a per-step choice could win
back.) Each gamma the job visits compiles once per input length, like the fixed gammas.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import Sequence

from speculative import checkpoints
from speculative.autogamma import costs as costs_lib
from speculative.autogamma import policy
from speculative.decode import batching
from speculative.decode import modes
from speculative.decode import state as decode_state


def calibrate(
  settings, models, decode_fn: Callable[[int], modes.DecodeFn], encoder_tokens, rng
) -> costs_lib.Calibration:
  """The job's costs: the cache file's entry for this device, batch, decode path, shapes, models
  and loop, else measured now (`costs.measure`: the model calls; `costs.loop_step_seconds`: the
  plain loop, the gamma-1 loop and the `policy.reference_gamma` loop on the first batch, `encoder_tokens`, with the
  functions the job decodes with, `decode_fn(gamma)`) and written to the cache."""
  s = settings
  max_length = decode_state.buffer_length(1, s.max_new_tokens, s.max_gamma)
  fields = costs_lib.key_fields(
    decode_path=s.decode_path().line,
    batch=s.batch_size,
    encoder_length=s.inputs_length,
    max_length=max_length,
    gamma_max=s.max_gamma,
    target_config=checkpoints.config_dict(s.target_config),
    draft_config=checkpoints.config_dict(s.draft_config) if models.draft is not None else None,
    loop=f"drafter {s.drafter}, {s.sampling()[0]}, lenience {'exact' if s.exact else 'on'}",
  )

  def measure() -> costs_lib.Costs:
    calls = costs_lib.measure(
      models.target,
      models.target_params,
      models.draft,
      models.draft_model_params,
      batch=s.batch_size,
      encoder_length=s.inputs_length,
      max_length=max_length,
      gamma_max=s.max_gamma,
    )
    ref = policy.reference_gamma(calls)
    loops = costs_lib.loop_step_seconds(
      {g: decode_fn(g) for g in sorted({0, 1, ref})}, encoder_tokens, rng
    )
    return dataclasses.replace(
      calls,
      plain_loop_step=loops[0],
      ref_gamma=ref if loops[ref] is not None else None,
      ref_loop_step=loops[ref],
      one_loop_step=loops[1],
    )

  return costs_lib.load_or_measure(s.calibration_path, fields, measure)


@dataclasses.dataclass(frozen=True)
class BatchChoice:
  """One batch's choice and its rows (for the report)."""

  choice: policy.Choice
  examples: tuple[int, ...]
  steps: int  # loop steps of the batch (its rows' most target calls)
  tokens: int  # its longest row's generated tokens (the plain loop's steps)


class AutoGamma:
  """The speculative mode of an 'auto' job: `decode_fn(gamma)`, the calibration (made at the
  first batch by `calibrate_fn(encoder_tokens, rng)`, or given: a resumed job's record) and the
  policy's state."""

  def __init__(
    self,
    calibration: costs_lib.Calibration | None,
    fns_for_gamma: Callable[[int], modes.DecodeFn],
    calibrate_fn: Callable[[Any, Any], costs_lib.Calibration] | None = None,
  ):
    self.calibration = calibration
    self._fns_for_gamma = fns_for_gamma
    self._calibrate_fn = calibrate_fn
    self._fns: dict[int, modes.DecodeFn] = {}
    self.state = policy.PolicyState()
    self.batches: list[BatchChoice] = []

  def decode_fn(self, gamma: int) -> modes.DecodeFn:
    if gamma not in self._fns:
      self._fns[gamma] = self._fns_for_gamma(gamma)
    return self._fns[gamma]

  def calibrate(self, encoder_tokens, rng) -> None:
    """Calibrates on a batch (the job's first) unless calibrated already."""
    if self.calibration is None:
      self.calibration = self._calibrate_fn(encoder_tokens, rng)

  def choose(self) -> policy.Choice:
    return policy.choose(self.calibration.costs, self.state)

  def observe(self, choice: policy.Choice, records: Sequence[dict]) -> None:
    """The batch decoded at `choice.gamma` produced `records` (one per row)."""
    self.state = policy.observe_records(self.state, choice.gamma, records)
    self.batches.append(
      BatchChoice(
        choice,
        tuple(r['index'] for r in records),
        max((int(r['target_calls']) for r in records), default=0),
        max((int(r['num_tokens']) for r in records), default=0),
      )
    )

  def replay(self, done_batches: Sequence[Sequence[Any]], records: dict[int, dict]) -> None:
    """The choices of the batches an interrupted run finished, in its order (`done_batches`:
    `batching.length_sorted_batches` of the finished examples), from their records: the state a
    resumed job continues from is the one the uninterrupted job had. Needs the recorded
    calibration (a job records it before its first batch)."""
    if done_batches and self.calibration is None:
      raise ValueError(
        'the output directory holds records of an auto-gamma job but its manifest has no '
        'calibration; use a new output directory or OVERWRITE = True'
      )
    for batch_examples in done_batches:
      rows = [records[e.index] for e in batch_examples]
      choice = self.choose()
      recorded = {int(r['gamma']) for r in rows}
      if recorded != {choice.gamma}:
        raise ValueError(
          f'the finished records of examples {[r["index"] for r in rows][:5]} were decoded at '
          f'gamma {sorted(recorded)}, but replaying the recorded calibration chooses '
          f'{choice.gamma}; the outputs cannot be resumed: use a new output directory or '
          'OVERWRITE = True'
        )
      self.observe(choice, rows)

  def summary(self) -> dict[str, Any]:
    """metrics.json's `gamma_policy`: the costs, where they came from, batches and steps per gamma
    and per reason, the final alpha, and the speedup Theorem 3.8 predicts for the choices made."""
    costs = self.calibration.costs
    per_gamma: dict[int, dict[str, int]] = {}
    reasons: dict[str, int] = {}
    for b in self.batches:
      row = per_gamma.setdefault(b.choice.gamma, {'batches': 0, 'steps': 0, 'examples': 0})
      row['batches'] += 1
      row['steps'] += b.steps
      row['examples'] += len(b.examples)
      reasons[b.choice.reason] = reasons.get(b.choice.reason, 0) + 1
    alpha = self.state.alpha()
    predicted = policy.predicted_speedups(costs, alpha)
    return {
      'gamma_max': costs.gamma_max,
      'calibration': {
        'source': self.calibration.source,
        'seconds': self.calibration.seconds,
        'measured_seconds': self.calibration.measured_seconds,
        'key': self.calibration.key,
        **costs.to_json(),
        'step_ms': [round(costs.step(g) * 1e3, 6) for g in range(costs.gamma_max + 1)],
      },
      'per_gamma': {str(g): per_gamma[g] for g in sorted(per_gamma)},
      'reasons': reasons,
      'final_alpha': alpha,
      'predicted_speedup_by_gamma': {str(g): v for g, v in predicted.items()},
      'predicted_speedup': self._predicted_job_speedup(alpha),
    }

  def _predicted_job_speedup(self, alpha: float) -> float | None:
    """Theorem 3.8 at the final alpha for the job's choices: the plain loop's steps (each batch's
    longest row) over the predicted speculative time in plain steps, sum_b tokens_b / S(gamma_b)."""
    predicted = policy.predicted_speedups(self.calibration.costs, alpha)
    plain = sum(b.tokens for b in self.batches)
    if not plain:
      return None
    return plain / sum(b.tokens / predicted[b.choice.gamma] for b in self.batches)


def done_batches(examples: Sequence[Any], records: dict[int, dict], batch_size: int):
  """The batches of the examples `records` finished, in the order the job decoded them."""
  done = [e for e in examples if e.index in records]
  return batching.length_sorted_batches(done, batch_size)
