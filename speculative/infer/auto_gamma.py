"""`GAMMA = 'auto'` in a batch job: the speculative mode decodes each batch at the gamma the policy
chooses (speculative/autogamma/policy.py) from the loops' steps measured on the job's own batches
(speculative/autogamma/costs.py), or cached by an earlier job with the same key.

Where the choice is made: once per batch, on the host, before the batch is decoded. The batch then
runs the plain loop (gamma 0) or the compiled speculative loop of that gamma, exactly the program a
fixed-gamma job runs, so the chosen width costs what it costs at a fixed gamma. (A choice per step
inside one loop needs the verify call in a `lax.switch` over widths; measured on the embedded
target, the switch adds ~15% to a batch-1 step and ~35% to a batch-8 step on the CPU kernels,
because the cache is copied into and out of the conditional: more than a per-step choice could win
back.) Each gamma the job visits compiles once per input length, like the fixed gammas.

The costs: without a cache entry the job measures them on its own first batches, timed as every
batch is: the plain loop on the baseline mode's batches (or its own first batches at gamma 0 where
the job has no baseline mode), and each gamma the policy visits while measuring; the first of
these batches are also timed with one stepless call of the same compiled program (`max_steps = 0`:
what a call pays once, timed apart as calibration, not decode time; no extra program), until they
cover costs.STEPLESS_TOKENS tokens (`AutoGamma.stepless`). A gamma the policy would decode a batch
at to measure it, whose program has not run at the batch's input length, is first measured on the
warm call that program's compile makes anyway (`AutoGamma.measure`); where the policy then chooses
another gamma, the batch is decoded at that one and the measurement kept as calibration (at batch
32 the first, longest batch measures gamma 1 and is decoded plain). Once the policy chooses a
measured gamma the costs are cached. Every later batch still adds its timing (and the
baseline's beside it) to the loop times the costs come from, so the costs of the gammas the job
decodes at, the runner-up's among them (policy.REFRESH), sharpen over the job; at its end the job
writes them back to the cache, where the next job with the same key starts from them (and adds
its own). A resumed job measures again from its finished records and the loop times its manifest
records, so it reaches the same costs and choices.
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


def start(
  settings, models, recorded: dict[str, Any] | None, plain_beside: bool
) -> costs_lib.Calibration:
  """The calibration a job starts from: a resumed job's manifest record (`recorded`), else the
  cache file's entry for this device, batch, decode path, shapes, models and loop, else one to
  measure on the job's batches (times and costs None). `plain_beside` (`AutoGamma`) is part of
  the loop: a gamma's step is computed from paired batches only where the baseline decodes them,
  so the loop times of jobs with and without it do not add up."""
  if recorded is not None:
    try:
      return costs_lib.Calibration.from_json(recorded)
    except (KeyError, TypeError, ValueError) as e:
      raise ValueError(
        "the output directory's manifest records gamma 'auto' costs this version cannot read "
        f'({e!r}); use a new output directory or OVERWRITE = True'
      ) from None
  s = settings
  fields = costs_lib.key_fields(
    decode_path=s.decode_path().line,
    batch=s.batch_size,
    encoder_length=s.inputs_length,
    max_length=decode_state.buffer_length(1, s.max_new_tokens, s.max_gamma),
    gamma_max=s.max_gamma,
    target_config=checkpoints.config_dict(s.decode_target_config),
    draft_config=checkpoints.config_dict(s.draft_config) if models.draft is not None else None,
    loop=f"drafter {s.drafter}, {s.sampling()[0]}, lenience {'exact' if s.exact else 'on'}"
    + (", the baseline beside" if plain_beside else ""),
  )
  return costs_lib.load(s.calibration_path, fields)


@dataclasses.dataclass(frozen=True)
class BatchChoice:
  """One batch's choice and its rows (for the report)."""

  choice: policy.Choice
  examples: tuple[int, ...]
  steps: int  # loop steps of the batch (its rows' most target calls)
  tokens: int  # its longest row's generated tokens (the plain loop's steps)


class AutoGamma:
  """The speculative mode of an 'auto' job: `decode_fn(gamma)`, the calibration and the policy's
  state.

  Args:
    calibration: `start`'s.
    fns_for_gamma: gamma -> the decode function of that gamma (0: the baseline's).
    cache_path: where the loop times are cached: once measured, and at the job's end (`finish`).
    plain_beside: the job's baseline mode decodes the same batches (its times measure the plain
      loop: `observe_plain`).
    on_frozen: called with the calibration when this job's measuring ends (`frozen`).
  """

  def __init__(
    self,
    calibration: costs_lib.Calibration,
    fns_for_gamma: Callable[[int], modes.DecodeFn],
    *,
    cache_path: str,
    plain_beside: bool,
    on_frozen: Callable[[costs_lib.Calibration], None] = lambda calibration: None,
  ):
    self.calibration = calibration
    self._fns_for_gamma = fns_for_gamma
    self._cache_path = cache_path
    self.plain_beside = plain_beside
    self._on_frozen = on_frozen
    self._fns: dict[int, modes.DecodeFn] = {}
    gamma_max = int(calibration.fields['gamma_max'])
    self.times = calibration.times or costs_lib.LoopTimes.empty(gamma_max)
    self.state = policy.PolicyState()
    self.batches: list[BatchChoice] = []
    self.calibration_s = 0.0  # the stepless calls (both modes) and measurements: calibration
    self.measured_batches = 0  # batches measured at a gamma they were not decoded at (`measure`)
    self._replaying = False
    self._ran: set[tuple[int, int]] = set()  # (padded input length, gamma) of the batches so far

  def decode_fn(self, gamma: int) -> modes.DecodeFn:
    if gamma not in self._fns:
      self._fns[gamma] = self._fns_for_gamma(gamma)
    return self._fns[gamma]

  @property
  def measuring(self) -> bool:
    return self.calibration.costs is None

  def stepless(self, gamma: int) -> bool:
    """Whether a measuring batch decoded at `gamma` is also timed without its loop steps (and the
    baseline's decode of it, where `plain_beside`): until the stepless calls of the plain loop
    (gamma 0) or of the speculative loops (gammas >= 1, pooled: they run the same encoders) have
    covered costs.STEPLESS_TOKENS generated tokens. Their fixed shares are all the costs take from
    the stepless calls (`costs.LoopTimes.costs`), so more of them only add calibration time."""
    if not self.measuring:
      return False
    own = self.times.own[:1] if gamma == 0 else self.times.own[1:]
    return sum(t.stepless_tokens for t in own) < costs_lib.STEPLESS_TOKENS

  def choose(self) -> policy.Choice:
    """The next batch's choice; while measuring, the first choice of a measured gamma ends the
    measuring (`_freeze`)."""
    if not self.measuring:
      return policy.choose(self.times.costs(), self.state)
    choice = policy.choose_while_measuring(self.times, self.state, self.plain_beside)
    if choice.reason != policy.CALIBRATE:
      self._freeze(len(self.batches))
    return choice

  def _freeze(self, batches: int) -> None:
    """Ends the measuring after `batches` batches: the costs are fixed as the calibration's and
    the loop times written to the cache file (unless replaying: the interrupted run wrote them)."""
    self.calibration = dataclasses.replace(
      self.calibration, costs=self.times.costs(), batches=batches
    )
    if not self._replaying:
      costs_lib.store(self._cache_path, self.times, self.calibration)
      self._on_frozen(self.calibration)

  def measures(self, choice: policy.Choice, batch_examples: Sequence[Any]) -> bool:
    """Whether the batch chosen at `choice` is measured at its gamma before it is decoded
    (`measure`): at batch > 1 while measuring, a CALIBRATE choice of a gamma >= 1 whose program
    has not run at the batch's padded input length in this job (`ran`), so that its compile's
    warm call, made anyway, is the measurement. A function of the job's batches, not of what the
    process has compiled, so that a resumed job measures where the uninterrupted one did.

    Not at batch 1: there a call takes milliseconds and the first one after a compile ran 1.2-1.5x
    slower than the calls after it (one sentence at gamma 3, input length 16: 12 ms against 10 ms;
    the baseline's 18 ms against 12-13 ms), which measured gammas too slow (a fresh `make run`
    decoded 130 of its 200 sentences at gamma 1 and ran 1.10x, the cached job after it 1.01x);
    decoding one sentence at the gamma to measure costs little. At batch 32 the warm call took
    what the calls after it took (2.40 s against 2.38-2.44 s)."""
    return (
      int(self.calibration.fields['batch_size']) > 1
      and self.measuring
      and choice.reason == policy.CALIBRATE
      and choice.gamma >= 1
      and (self._length(batch_examples), choice.gamma) not in self._ran
    )

  def ran(self, batch_examples: Sequence[Any], gamma: int) -> None:
    """The batch was decoded or measured at `gamma`: its program has run at its length."""
    self._ran.add((self._length(batch_examples), gamma))

  def _length(self, batch_examples: Sequence[Any]) -> int:
    return batching.padded_length(batch_examples, int(self.calibration.fields['encoder_length']))

  def measure(
    self, choice: policy.Choice, rows: Sequence[dict], plain: Sequence[dict]
  ) -> policy.Choice:
    """The batch's gamma once `rows` (`measurement_rows`: the batch decoded at `choice.gamma` by
    the warm call that follows its program's compile, which the job runs anyway, timed, and its
    stepless call where `stepless`) and the baseline's records of the batch (`plain`, where
    `plain_beside`) are added to the loop times and the acceptance estimate.

    Where the choice with them is still `choice.gamma`, they are dropped (decoding the batch
    measures the same) and `choice` returned. Else they are kept (the warm call and the stepless
    call count as calibration; the baseline's batch is paired with the measurement, not with the
    batch's decode, so `observe_plain` is not called for it) and the new choice returned: the
    batch is decoded at that gamma, so a job whose first batch shows that drafts lose does not
    pay for decoding its longest batch at a losing gamma (at batch 32 on the CPU kernels that
    batch at gamma 1 cost 10% of a 200-sentence job)."""
    timing = costs_lib.batch_timing(rows)
    times = self.times
    if self.plain_beside and plain:
      times = times.add_plain(choice.gamma, costs_lib.batch_timing(plain))
    times = times.add(choice.gamma, timing)
    seen = policy.observe_records(self.state, choice.gamma, rows, choice.reason)
    state = dataclasses.replace(self.state, alpha_sum=seen.alpha_sum, drafted=seen.drafted)
    new = policy.choose_while_measuring(times, state, self.plain_beside)
    if new.gamma == choice.gamma:
      return choice
    self.times, self.state = times, state
    self.calibration_s += timing.seconds + timing.stepless
    self.measured_batches += 1
    if new.reason != policy.CALIBRATE:
      self._freeze(len(self.batches) + 1)  # (the batch measured on counts)
    return new

  def finish(self) -> None:
    """At the job's end: its loop times, with every batch it decoded, back to the cache file."""
    if not self.measuring and self.batches:
      costs_lib.store(self._cache_path, self.times, self.calibration)

  def observe(self, choice: policy.Choice, records: Sequence[dict]) -> None:
    """The batch decoded at `choice.gamma` produced `records` (one per row)."""
    self.state = policy.observe_records(self.state, choice.gamma, records, choice.reason)
    timing = costs_lib.batch_timing(records)
    self.calibration_s += timing.stepless  # (0 unless timed stepless: `stepless`)
    self.times = self.times.add(choice.gamma, timing)
    self.batches.append(
      BatchChoice(
        choice,
        tuple(r['index'] for r in records),
        max((int(r['target_calls']) for r in records), default=0),
        max((int(r['num_tokens']) for r in records), default=0),
      )
    )

  def observe_plain(self, gamma: int, records: Sequence[dict]) -> None:
    """The baseline mode's records of a batch this mode has decoded at `gamma` (the plain loop,
    timed on the same batch); ignored unless the baseline decodes before this mode
    (`plain_beside`), as the job and its replay both observe it."""
    if self.plain_beside and records:
      timing = costs_lib.batch_timing(records)
      self.calibration_s += timing.stepless
      self.times = self.times.add_plain(gamma, timing)

  def replay(
    self,
    done_batches: Sequence[Sequence[Any]],
    records: dict[int, dict],
    plain_records: dict[int, dict] | None,
  ) -> None:
    """The choices of the batches an interrupted run finished, in its order (`done_batches`:
    `batching.length_sorted_batches` of the finished examples), from their records (and the
    baseline mode's, `plain_records`, observed as the job observed them): the state a resumed job
    continues from is the one the uninterrupted job had."""
    self._replaying = True
    try:
      self._replay(done_batches, records, plain_records)
    finally:
      self._replaying = False

  def _replay(self, done_batches, records, plain_records) -> None:
    for batch_examples in done_batches:
      rows = [records[e.index] for e in batch_examples]
      plain = plain_rows(plain_records, batch_examples)
      choice = self.choose()
      measured = measurement_rows(rows)
      if measured:
        self.ran(batch_examples, measured[0]['gamma'])
        choice = self.measure(choice, measured, plain)
      self.ran(batch_examples, choice.gamma)
      recorded = {int(r['gamma']) for r in rows}
      if recorded != {choice.gamma}:
        raise ValueError(
          f'the finished records of examples {[r["index"] for r in rows][:5]} were decoded at '
          f'gamma {sorted(recorded)}, but replaying the recorded calibration chooses '
          f'{choice.gamma}; the outputs cannot be resumed: use a new output directory or '
          'OVERWRITE = True'
        )
      self.observe(choice, rows)
      if not measured:
        self.observe_plain(choice.gamma, plain)

  def costs(self) -> costs_lib.Costs | None:
    """The costs of the loop times so far, the job's own batches with those it started from
    (None without the plain loop's)."""
    return self.times.costs() if self.times.measured(0) else None

  def summary(self) -> dict[str, Any]:
    """metrics.json's `gamma_policy`: the costs, where they came from, batches and steps per gamma
    and per reason, the final alpha, and the speedup Theorem 3.8 predicts for the choices made."""
    costs = self.costs()
    per_gamma: dict[int, dict[str, int]] = {}
    reasons: dict[str, int] = {}
    for b in self.batches:
      row = per_gamma.setdefault(b.choice.gamma, {'batches': 0, 'steps': 0, 'examples': 0})
      row['batches'] += 1
      row['steps'] += b.steps
      row['examples'] += len(b.examples)
      reasons[b.choice.reason] = reasons.get(b.choice.reason, 0) + 1
    alpha = self.state.alpha()
    predicted = policy.predicted_speedups(costs, alpha) if costs is not None else None
    calibration = {
      'source': self.calibration.source,
      'measuring_batches': self.calibration.batches if not self.measuring else len(self.batches),
      'frozen': not self.measuring,
      'calibration_s': self.calibration_s,
      'measured_batches': self.measured_batches,
      'key': self.calibration.key,
    }
    if costs is not None:
      calibration.update(costs.to_json())
      calibration['step_ms'] = [round(costs.step(g) * 1e3, 6) for g in range(costs.gamma_max + 1)]
    return {
      'gamma_max': int(self.calibration.fields['gamma_max']),
      'calibration': calibration,
      'per_gamma': {str(g): per_gamma[g] for g in sorted(per_gamma)},
      'reasons': reasons,
      'final_alpha': alpha,
      'predicted_speedup_by_gamma': (
        {str(g): v for g, v in predicted.items()} if predicted is not None else None
      ),
      'predicted_speedup': self._predicted_job_speedup(predicted),
    }

  def _predicted_job_speedup(self, predicted: dict[int, float] | None) -> float | None:
    """Theorem 3.8 at the final alpha for the job's choices: the plain loop's steps (each batch's
    longest row) over the predicted speculative time in plain steps, sum_b tokens_b / S(gamma_b)."""
    plain = sum(b.tokens for b in self.batches)
    if not plain or predicted is None:
      return None
    return plain / sum(b.tokens / predicted[b.choice.gamma] for b in self.batches)


def measurement_rows(records: Sequence[dict]) -> list[dict]:
  """A batch's measurement (`AutoGamma.measure`) from its rows' records ([] if it had none): per
  row its `measured` fields (gamma, num_tokens, target_calls, drafted) with the measurement's
  times (`measured_s`, `measured_stepless_s`) as `decode_s` and `stepless_s`, the rows
  `costs.batch_timing` and `policy.observe_records` read."""
  if not records or not all('measured' in r for r in records):
    return []
  return [
    {
      **r['measured'],
      'decode_s': r['measured_s'],
      **({'stepless_s': r['measured_stepless_s']} if 'measured_stepless_s' in r else {}),
    }
    for r in records
  ]


def plain_rows(plain_records: dict[int, dict] | None, batch_examples: Sequence[Any]) -> list[dict]:
  """The baseline mode's records of a batch ([] unless it finished every row)."""
  if plain_records is None or not all(e.index in plain_records for e in batch_examples):
    return []
  return [plain_records[e.index] for e in batch_examples]


def done_batches(examples: Sequence[Any], records: dict[int, dict], batch_size: int):
  """The batches of the examples `records` finished, in the order the job decoded them."""
  done = [e for e in examples if e.index in records]
  return batching.length_sorted_batches(done, batch_size)
