"""The job's choice of gamma per batch: Theorem 3.8 with measured costs and the observed acceptance.

A job with `GAMMA = 'auto'` decodes each batch of its speculative mode at one gamma in
{0, 1, ..., gamma_max}; 0 is plain decoding (the baseline loop: no draft call, a 1-token target
step). Before each batch the job calls `choose`, decodes, then `observe`s what the batch drafted and
accepted. Everything here is host-side arithmetic on numbers the job already has (the measured
`costs.Costs` and the records' `drafted`, `target_calls` and `num_tokens`), deterministic, so a
resumed job replays the same choices from its finished records
(`infer.auto_gamma.AutoGamma.replay`).

The rule, in the order `choose` applies it:
  1. alpha: the acceptance estimate: each batch's alpha as its loop felt it (`batch_alpha`: the
     alpha whose expected tokens per step, Eq. 1, equal the batch's longest row's tokens over its
     loop steps; one width serves every row per step and the loop runs until the slowest row is
     done, so this is how the rows' acceptances combine), weighted by drafted positions, older
     batches' counts decayed by half every HALF_LIFE drafted tokens (long: a pair's acceptance is
     a property of the pair and the task, and one sentence's acceptance swings it by more than the
     predictions of neighbouring gammas differ), plus PRIOR_WEIGHT pseudo-drafts at PRIOR_ALPHA
     (T5 pairs measure 0.5-0.8): a job that has drafted nothing yet speculates where the costs
     let a fair pair pay, and so measures its acceptance first.
  2. The predicted speedup of each gamma: Theorem 3.8 with the measured costs, the plain loop's
     time per generated token over the gamma loop's: its step (`costs.Costs.step`: the compiled
     loops' steps measured on the job's own batches, interpolated between the measured gammas)
     over the expected tokens per step (Eq. 1), plus the fixed share per token of what a call
     pays once (`Costs.fixed_per_token`: the encoders, the draft's among them); gamma 0 is 1.
  3. The choice: plain decoding, or the gamma >= 1 of the largest prediction among those whose
     score, its prediction over 1 + its margin (`margin`: MARGIN over MIN_STEPS measured loop
     steps, the error of predictions from a job's first batches, shrinking as one over the square
     root of the steps measured), beats plain decoding's 1. The margin guards the one decision
     that can make a job slower than plain decoding; the width goes by the predictions (ranked by
     their scores, the gamma measured first stayed ahead of longer, better-paying ones: at batch
     1 a fifth of a 100-sentence job ran at gamma 1 where gamma 3 was 12% faster). Hysteresis:
     the previous batch's gamma is kept while it scores within HYSTERESIS of the choice when the
     choice switches between speculating and plain decoding, and while its prediction is within
     HYSTERESIS of the choice's when the choice is a measured gamma the job has not decoded yet
     (its loop would compile).
  4. Gamma 0 does not lock in (alpha only moves on batches that draft). The probe rule: when gamma 0
     is chosen but some measured gamma >= 1 would pay at alpha = 1 (the measured costs' ceiling) by
     its margin, or within its margin while its step rests on fewer than THIN * MIN_STEPS loop
     steps, every PROBE_EVERY-th consecutive plain batch is decoded at the best such gamma instead;
     its acceptance (and its step) enter the estimates like any other batch's. When not even
     alpha = 1 pays by the margin on a step measured over THIN * MIN_STEPS, the job probes only
     every RECHECK_EVERY-th consecutive plain batch, and only where a perfect draft would pay at all
     (at batch 8 on the CPU kernels gamma 1's step is twice the plain step: a perfect draft only
     breaks even, and each probe batch cost 15%); where not even that pays it never probes. One
     batch is too little to rule drafting out: at batch 1 a first gamma-1 batch of 33 steps measured
     1.81 plain steps where the job's later batches measured 1.49, and two (33 steps in all) 1.96,
     where a perfect draft breaks even (judged on them, that job decoded its other 98 batches
     plain). Twelve are not final either: on a loaded machine (load average 3.5) an uncached batch-1
     job measured gamma 1 at 1.82 plain steps over 12 batches, where the fixed jobs of the same
     round ran gamma 1 at 1.10x, and decoded its other 88 batches plain; the cache keeps a job's
     costs for the next jobs, which add only the gammas they decode, so without the recheck that
     measurement would hold for every later job.
  5. Refresh: where the choice is a gamma >= 1 and another gamma >= 1 could be faster within the
     margins (its prediction times 1 + its margin reaches the choice's score), or is the choice's
     neighbour (gamma +- 1) within the measured range with a thin step (`_thin`), every
     REFRESH_EVERY-th batch is decoded at the least measured such runner-up (the fewest loop
     steps; ties: the best prediction), so that close gammas stay measured (the job adds every
     batch's timing to its costs: speculative/infer/auto_gamma.py) until their margins tell them
     apart. A thin neighbour is a runner-up whatever it predicts: a few short batches' noise
     cannot rule it out (at batch 1 a filling job measured gamma 3's step over 56 loop steps at
     2.36 plain steps, gamma 2's at 1.50, and no job starting from the cached costs decoded 3
     again, where the fixed jobs of the same rounds ran 3 at 1.243x and 2 at 1.203x).

The choice stays within the measured gammas, 0..`Costs.top`, and one past them where a measured
gamma >= 1 predicts at least EXPLORE_FROM (its step extrapolated; decoding it measures it). While
the costs are being measured (`choose_while_measuring`, a job without cached costs), the same rules
run on the gammas measured so far and one past them, its step extrapolated (`Costs.step`: the slope
of the two largest measured gammas, flat with one), and a chosen gamma not yet measured is decoded
to measure it (CALIBRATE): first the plain loop (from the baseline mode's batches where the job has
one, else its own first batches at gamma 0) and gamma 1, then wherever the rules point, one gamma
further at a time, until they choose a measured gamma whose next gamma is measured too or is not
its runner-up within the margins (rule 5's test); the measuring then ends. Where they choose plain
decoding while a gamma that a perfect draft would pay at within its margin is measured over fewer
than THIN * MIN_STEPS loop steps, that gamma is decoded again first (rule 4's probe, without the
wait). The job looks one gamma past the measured range only while some measured gamma >= 1
predicts at least plain decoding's speed (EXPLORE_FROM): where the drafts lose at every measured
width, a longer draft is not decoded on the job's own batches just to confirm it (at batch 8 and 32
that measurement was most of what measuring cost).
"""

from __future__ import annotations

import dataclasses
from typing import Iterable
from typing import Sequence

from speculative import analysis
from speculative.autogamma import costs as costs_lib

PRIOR_ALPHA = 0.7
PRIOR_WEIGHT = 4.0  # pseudo-drafted tokens at PRIOR_ALPHA
HALF_LIFE = 1024.0  # drafted tokens after which older batches count half
HYSTERESIS = 0.05  # keep the previous gamma while within 5% of the choice (rule 3)
PROBE_EVERY = 8  # the probe rule: every 8th consecutive plain batch drafts
RECHECK_EVERY = 64  # ... every 64th, where a perfect draft pays, but not by the margin (rule 4)
REFRESH_EVERY = 4  # every 4th batch decodes at the runner-up, where there is one (`choose`)
MARGIN = 0.10  # a gamma measured over MIN_STEPS loop steps must predict 1 + MARGIN to speculate
EXPLORE_FROM = 1.0  # look past the measured gammas only where one of them predicts this
THIN = 2  # a step measured over fewer than THIN * MIN_STEPS loop steps cannot rule a gamma out

# Why a batch got its gamma (the report counts batches per reason).
BEST = 'best'
KEPT = 'kept'
PROBE = 'probe'
REFRESH = 'refresh'  # the runner-up, so that the costs of close gammas stay measured
NEVER_PAYS = 'never pays'
CALIBRATE = 'calibrate'  # decoded at a gamma whose step is not measured yet, to measure it


@dataclasses.dataclass(frozen=True)
class PolicyState:
  """What the choice remembers between batches.

  Attributes:
    alpha_sum: decayed sum of the batches' alphas (`batch_alpha`), each times its drafted positions.
    drafted: decayed count of drafted positions (same decay).
    plain_streak: consecutive batches decoded at gamma 0 (reset by any batch that drafts).
    gamma: the previous batch's gamma but a REFRESH batch's (None before the first).
    since_refresh: batches since the last REFRESH batch (or the first).
    decoded: the gammas the job has decoded batches at (their loops are compiled).
  """

  alpha_sum: float = 0.0
  drafted: float = 0.0
  plain_streak: int = 0
  gamma: int | None = None
  since_refresh: int = 0
  decoded: frozenset[int] = frozenset()

  def alpha(self) -> float:
    """The acceptance estimate (rule 1)."""
    return (self.alpha_sum + PRIOR_ALPHA * PRIOR_WEIGHT) / (self.drafted + PRIOR_WEIGHT)


@dataclasses.dataclass(frozen=True)
class Choice:
  """One batch's gamma and what it was chosen from.

  Attributes:
    gamma: in [0, gamma_max]; 0 = plain decoding.
    reason: BEST, KEPT, PROBE, REFRESH, NEVER_PAYS or CALIBRATE.
    alpha: the acceptance estimate it used.
    predicted: {gamma: predicted speedup over plain decoding} at that alpha.
  """

  gamma: int
  reason: str
  alpha: float
  predicted: dict[int, float]


def predicted_speedups(costs: costs_lib.Costs, alpha: float) -> dict[int, float]:
  """{gamma: Theorem 3.8's speedup over plain decoding} for gamma in 0..costs.gamma_max: the plain
  loop's time per generated token over the gamma loop's, each its loop step over the expected
  tokens per step (Eq. 1; 1 for the plain loop) plus its fixed share per token (the encoders and
  prefill a call pays once, `Costs.fixed_per_token`; the paper's model leaves it out)."""

  def per_token(g: int) -> float:
    return costs.fixed_per_token(g) + costs.step(g) / float(analysis.expected_tokens(alpha, g))

  return {g: per_token(0) / per_token(g) for g in range(costs.gamma_max + 1)}


def best_gamma(costs: costs_lib.Costs, alpha: float) -> int:
  """The gamma in 0..costs.top (the measured range) chosen at `alpha` (rule 3, without the
  hysteresis; 0: plain decoding); the T5X adapter's one choice per batch size."""
  speedups = predicted_speedups(costs, alpha)
  return _best(speedups, _scores(costs, speedups), range(costs.top + 1))


def _best(speedups: dict[int, float], scores: dict[int, float], gammas: Sequence[int]) -> int:
  """Rule 3: the gamma >= 1 in `gammas` of the largest prediction among those that beat plain
  decoding by their margins (score above 1), else 0."""
  paying = [g for g in gammas if g and scores[g] > 1.0]
  return _argmax(speedups, paying) if paying else 0


def margin(costs: costs_lib.Costs, gamma: int) -> float:
  """What a gamma's prediction must beat plain decoding by: MARGIN where its step was measured
  over MIN_STEPS loop steps (or is extrapolated, or its evidence unknown), shrinking as one over
  the square root of the loop steps measured (a sum of n noisy step times is off by ~1/sqrt(n)
  of one): over a job's first few short batches the steps measured here moved by 10-30% from one
  batch to the next (docs/auto_gamma.md), noise that the job's further batches average away."""
  n = costs.measured_steps(gamma)
  if not n:
    return MARGIN
  return MARGIN * (costs_lib.MIN_STEPS / max(n, costs_lib.MIN_STEPS)) ** 0.5


def _thin(costs: costs_lib.Costs, gamma: int) -> bool:
  """Whether `gamma`'s step was measured over fewer than THIN * MIN_STEPS loop steps (rule 4;
  unknown: not)."""
  n = costs.measured_steps(gamma)
  return n is not None and n < THIN * costs_lib.MIN_STEPS


def _probes(costs: costs_lib.Costs) -> list[int]:
  """Rule 4's candidates: the measured gammas >= 1 a perfect draft (alpha = 1) would pay at by
  their margins, or, where their steps are thin (`_thin`), within them."""
  at_one = predicted_speedups(costs, 1.0)
  scores = _scores(costs, at_one)
  return [
    g
    for g in range(1, costs.top + 1)
    if scores[g] > 1.0 or (at_one[g] * (1.0 + margin(costs, g)) > 1.0 and _thin(costs, g))
  ]


def _rechecks(costs: costs_lib.Costs) -> list[int]:
  """Rule 4's recheck, where no gamma is a probe: the measured gammas >= 1 a perfect draft would
  pay at, though not by their margins."""
  at_one = predicted_speedups(costs, 1.0)
  return [g for g in range(1, costs.top + 1) if at_one[g] > 1.0]


def _scores(costs: costs_lib.Costs, speedups: dict[int, float]) -> dict[int, float]:
  """The scores the choice compares: each gamma's prediction over 1 + its margin; plain
  decoding's 1 (its time is the job's own, a gamma's a model's prediction)."""
  return {g: 1.0 if g == 0 else v / (1.0 + margin(costs, g)) for g, v in speedups.items()}


def _rival(
  costs: costs_lib.Costs,
  speedups: dict[int, float],
  scores: dict[int, float],
  gamma: int,
  chosen: int,
) -> bool:
  """Rule 5's runner-up test: `gamma`'s prediction plus its margin reaches `chosen`'s score (its
  prediction less its margin), so the noise of their timings could order them either way."""
  return speedups[gamma] * (1.0 + margin(costs, gamma)) >= scores[chosen]


def _argmax(speedups: dict[int, float], gammas: Iterable[int]) -> int:
  """The gamma of the largest prediction among `gammas` (ties: the smaller gamma)."""
  return max(gammas, key=lambda g: (speedups[g], -g))


def _least_measured(costs: costs_lib.Costs, speedups: dict[int, float], gammas: list[int]) -> int:
  """The gamma among `gammas` whose step rests on the fewest loop steps (not measured: none;
  unknown evidence: all alike), ties by the largest prediction: the refresh sharpens the least
  certain comparison (rule 5)."""
  return min(gammas, key=lambda g: (costs.measured_steps(g) or 0, -speedups[g], g))


def choose(costs: costs_lib.Costs, state: PolicyState) -> Choice:
  """The gamma of the next batch (the module docstring's rules 1-5), in 0..top: the measured
  range, and one gamma past it where a measured gamma >= 1 predicts at least EXPLORE_FROM."""
  alpha = state.alpha()
  speedups = predicted_speedups(costs, alpha)
  explore = max(speedups[g] for g in range(1, costs.top + 1)) >= EXPLORE_FROM if costs.top else 0
  gammas = range(min(costs.top + explore, costs.gamma_max) + 1)
  scores = _scores(costs, speedups)
  best = _best(speedups, scores, gammas)
  chosen, reason = best, BEST
  previous = state.gamma
  if previous is not None and previous in gammas and previous != best:
    if not (previous and best):  # speculating or not: the scores, margins in
      keep = scores[previous] >= (1.0 - HYSTERESIS) * scores[best]
    else:  # another width: kept only against a measured loop not compiled yet
      compiles = best <= costs.top and best not in state.decoded
      keep = compiles and scores[previous] > 1.0
      keep = keep and speedups[previous] >= (1.0 - HYSTERESIS) * speedups[best]
    if keep:
      chosen, reason = previous, KEPT
  # A runner-up of a speculative choice: a gamma >= 1 whose prediction, plus its margin, reaches
  # the choice's score (its prediction less its margin): the noise of their timings could order
  # them either way; or the choice's measured neighbour whose step is thin. The refresh decodes
  # the least measured of them. Plain decoding is left by the probe rule only: a job where drafts
  # lose does not decode at a gamma that merely might break even (at batch 32 that cost 1-3% a
  # job).
  rivals = [
    g
    for g in gammas[1:]
    if chosen
    and g != chosen
    and (
      _rival(costs, speedups, scores, g, chosen)
      or (abs(g - chosen) == 1 and g <= costs.top and _thin(costs, g))
    )
  ]
  if rivals and state.since_refresh + 1 >= REFRESH_EVERY:
    return Choice(_least_measured(costs, speedups, rivals), REFRESH, alpha, speedups)
  if chosen == 0:
    probes = _probes(costs)
    if probes and state.plain_streak + 1 >= PROBE_EVERY:
      return Choice(_argmax(speedups, probes), PROBE, alpha, speedups)
    if not probes:  # the recheck: drafts pay at alpha = 1, not by the margin (rule 4)
      rechecks = _rechecks(costs)
      if rechecks and state.plain_streak + 1 >= RECHECK_EVERY:
        return Choice(_argmax(speedups, rechecks), PROBE, alpha, speedups)
      return Choice(0, NEVER_PAYS, alpha, speedups)
  return Choice(chosen, reason, alpha, speedups)


def choose_while_measuring(
  times: costs_lib.LoopTimes, state: PolicyState, plain_beside: bool
) -> Choice:
  """The gamma of the next batch while the costs are measured on the job's batches (the module
  docstring's last paragraph); `plain_beside`: the job's baseline mode times the plain loop on the
  same batches. A choice whose reason is not CALIBRATE is a measured gamma: the caller freezes
  `times.costs()` there."""
  alpha = state.alpha()
  if not times.measured(0) and not plain_beside:
    return Choice(0, CALIBRATE, alpha, {})
  if not (times.measured(0) and times.measured(1)):
    return Choice(1, CALIBRATE, alpha, {})
  costs = times.costs()
  choice = choose(costs, state)
  if choice.gamma == 0:  # not on one batch's word (rule 4): measure the thin gammas again now
    thin = [g for g in _probes(costs) if _thin(costs, g)]
    if thin:
      return Choice(_argmax(choice.predicted, thin), CALIBRATE, choice.alpha, choice.predicted)
  if not times.measured(choice.gamma):
    return dataclasses.replace(choice, reason=CALIBRATE)
  # A measured choice ends the measuring, unless the next gamma, its step extrapolated, is its
  # runner-up within the margins (as for a refresh): decoding it now measures it, where after the
  # measuring only every REFRESH_EVERY-th batch would, too few short batches to reach MIN_STEPS
  # (at batch 1 gamma 3 stayed unmeasured, and 3% slower gamma 2 chosen, over a 100-sentence job).
  after = choice.gamma + 1
  if (
    choice.gamma
    and after <= costs.gamma_max
    and not times.measured(after)
    and _rival(costs, choice.predicted, _scores(costs, choice.predicted), after, choice.gamma)
  ):
    return Choice(after, CALIBRATE, choice.alpha, choice.predicted)
  return choice


def observe(
  state: PolicyState, gamma: int, drafted: int, alpha_sum: float, reason: str = BEST
) -> PolicyState:
  """The state after a batch decoded at `gamma` (chosen for `reason`) drafted `drafted` positions
  (all rows), with `alpha_sum` its alpha times `drafted` (`observe_records`)."""
  refresh = reason == REFRESH
  since_refresh = 0 if refresh else state.since_refresh + 1
  anchor = state.gamma if refresh else gamma
  decoded = state.decoded | {gamma}
  if gamma == 0:
    return dataclasses.replace(
      state,
      plain_streak=state.plain_streak + 1,
      gamma=anchor,
      since_refresh=since_refresh,
      decoded=decoded,
    )
  keep = 0.5 ** (drafted / HALF_LIFE)
  return PolicyState(
    alpha_sum=state.alpha_sum * keep + alpha_sum,
    drafted=state.drafted * keep + drafted,
    plain_streak=0,
    gamma=anchor,
    since_refresh=since_refresh,
    decoded=decoded,
  )


def batch_alpha(gamma: int, records: Iterable[dict]) -> float:
  """The acceptance a batch decoded at `gamma` showed, as the loop felt it: the alpha whose
  expected tokens per step (Eq. 1) equal the batch's block efficiency, its longest row's tokens
  over its loop steps (its rows' most target calls). One width serves every row per step and the
  loop runs until its slowest row is done, so at batch > 1 this is below the rows' mean acceptance
  (rule 1)."""
  records = list(records)
  steps = max(int(r['target_calls']) for r in records)
  tokens = max(int(r['num_tokens']) for r in records)
  return float(analysis.alpha_from_block_efficiency(tokens / max(steps, 1), gamma))


def observe_records(
  state: PolicyState, gamma: int, records: Iterable[dict], reason: str = BEST
) -> PolicyState:
  """`observe` of one batch from its rows' records (`drafted`, `target_calls`, `num_tokens`): the
  batch's alpha (`batch_alpha`) weighted by its drafted positions. The job and its resume both
  observe through here, so a resumed job reaches the same state bit for bit."""
  records = list(records)
  drafted = sum(int(r['drafted']) for r in records)
  if gamma == 0 or drafted == 0:
    return observe(state, gamma, drafted, 0.0, reason)
  return observe(state, gamma, drafted, batch_alpha(gamma, records) * drafted, reason)
