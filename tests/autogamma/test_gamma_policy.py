"""The per-batch gamma choice (speculative/autogamma/policy.py) on injected costs: exact choices, the
probe rule out of gamma 0, the decayed acceptance estimate, and the choices while the costs are
measured on the job's batches."""

import dataclasses

import pytest

from speculative.autogamma import costs as costs_lib
from speculative.autogamma import policy


def _costs(verify_ratios, draft_ratio, t1=1e-3):
  """Costs whose gamma loop steps v(gamma + 1) + gamma d(1), with v(T) = verify_ratios[T-1] * t1
  and d(1) = draft_ratio * t1: a step that is its model calls."""
  steps = tuple((g, (v + g * draft_ratio) * t1) for g, v in enumerate(verify_ratios))
  return costs_lib.Costs(steps, len(verify_ratios) - 1)


# v(T) proportional to T: a compute-bound verify. With any draft cost, gamma tokens at alpha 1 cost
# (gamma + 1) target steps plus the drafts: speculation can never pay.
ONLY_PLAIN_PAYS = _costs([1, 2, 3, 4, 5, 6, 7, 8], 0.5)
# A flat verify (the paper's TPU assumption) and a draft step 0.12 of the target's: at alpha 0.8,
# Theorem 3.8 gives 1.607, 1.968, 2.171, 2.271, 2.306, 2.297, 2.261 for gamma 1..7: gamma 5.
FIVE_AT_ALPHA_08 = _costs([1] * 8, 0.12)
# A verify that grows by half a step per token and a draft step 0.1: gamma 1 pays iff
# (1 + alpha) / 1.6 > 1, i.e. alpha > 0.6; at alpha 1 it predicts 1.25x.
PAYS_ABOVE_06 = _costs([1 + 0.5 * t for t in range(8)], 0.1)


def _confident(alpha, drafted=100_000):
  """A state that has drafted so much at `alpha` that the prior no longer moves the estimate."""
  return policy.PolicyState(alpha_sum=alpha * drafted, drafted=drafted)


def test_theorem_3_8_with_the_measured_costs():
  speedups = policy.predicted_speedups(FIVE_AT_ALPHA_08, 0.8)
  assert speedups[0] == 1.0
  want = [1.607, 1.968, 2.171, 2.271, 2.306, 2.297, 2.261]
  assert [round(speedups[g], 3) for g in range(1, 8)] == want
  # The verify ratios enter as v(gamma + 1) / t(1), the draft as gamma * d(1) / t(1).
  speedups = policy.predicted_speedups(PAYS_ABOVE_06, 0.6)
  assert speedups[1] == pytest.approx(1.6 / 1.6)
  assert speedups[2] == pytest.approx((1 + 0.6 + 0.36) / (2.0 + 0.2))


def test_what_a_call_pays_once_enters_per_generated_token():
  """Fixed shares per token (the stepless call: encoders, prefill) add to each loop's time per
  token: the plain loop's to c(0), a gamma's to c(gamma) / E(gamma). A draft encoder that costs
  as much per token as the speculative steps save leaves nothing to gain."""
  steps = ((0, 1e-3), (1, 1.2e-3))
  no_fixed = policy.predicted_speedups(costs_lib.Costs(steps, 1), 0.5)
  assert no_fixed[1] == pytest.approx(1.5 * 1.0 / 1.2)  # E(1) = 1.5 at alpha 0.5
  fixed = costs_lib.Costs(steps, 1, ((0, 0.5e-3), (1, 0.6e-3)))
  assert policy.predicted_speedups(fixed, 0.5)[1] == pytest.approx(1.5e-3 / (0.6e-3 + 0.8e-3))
  drafts_cost = costs_lib.Costs(steps, 1, ((0, 0.5e-3), (1, 0.5e-3 + 1e-3 - 0.8e-3)))
  assert policy.predicted_speedups(drafts_cost, 0.5)[1] == pytest.approx(1.0)


def test_where_only_plain_decoding_pays_it_always_chooses_0_and_never_probes():
  state = policy.PolicyState()
  for _ in range(2 * policy.RECHECK_EVERY):
    choice = policy.choose(ONLY_PLAIN_PAYS, state)
    assert (choice.gamma, choice.reason) == (0, policy.NEVER_PAYS)
    state = policy.observe(state, choice.gamma, 0, 0.0)
  assert state.plain_streak == 2 * policy.RECHECK_EVERY


def test_where_gamma_5_pays_at_alpha_08_it_chooses_5():
  choice = policy.choose(FIVE_AT_ALPHA_08, _confident(0.8))
  assert (choice.gamma, choice.reason) == (5, policy.BEST)
  assert choice.alpha == pytest.approx(0.8, abs=1e-5)  # the prior at 0.7 weighs 4 of 100,004
  # Lower acceptance, shorter drafts: at alpha 0.5 the same costs choose gamma 2.
  assert policy.choose(FIVE_AT_ALPHA_08, _confident(0.5)).gamma == 2


def test_a_job_that_has_drafted_nothing_speculates_where_a_fair_pair_pays():
  """The prior: no acceptance seen yet. Costs where gamma 1 predicts (1 + alpha) / 1.6 at alpha
  0.7 (1.06, under plain decoding's 1 + MARGIN): plain; a flat verify: speculate."""
  assert policy.choose(PAYS_ABOVE_06, policy.PolicyState()).gamma == 0
  choice = policy.choose(FIVE_AT_ALPHA_08, policy.PolicyState())
  assert choice.gamma >= 1 and choice.alpha == policy.PRIOR_ALPHA


def test_a_gamma_must_beat_plain_decoding_by_the_margin():
  """At alpha 0.65, gamma 1 predicts 1.65 / 1.6 = 1.03 > 1 but < 1 + MARGIN: plain; at 0.8,
  1.8 / 1.6 = 1.125: gamma 1."""
  assert policy.predicted_speedups(PAYS_ABOVE_06, 0.65)[1] > 1.0
  assert policy.choose(PAYS_ABOVE_06, _confident(0.65)).gamma == 0
  assert policy.choose(PAYS_ABOVE_06, _confident(0.8)).gamma == 1


def test_gamma_0_probes_every_8th_plain_batch_and_returns_when_drafts_pay():
  """Low acceptance: plain decoding, with a probe batch every PROBE_EVERY-th consecutive plain
  batch; once the probes' drafts are accepted (alpha 0.95), speculation returns for good."""
  state = _confident(0.3, drafted=2_000)
  gammas = []
  for _ in range(2 * policy.PROBE_EVERY):  # the drafts keep failing: probes only
    choice = policy.choose(PAYS_ABOVE_06, state)
    gammas.append(choice.gamma)
    if choice.gamma:
      assert choice.reason == policy.PROBE
      state = policy.observe(state, choice.gamma, 40, 0.3 * 40)
    else:
      state = policy.observe(state, 0, 0, 0.0)
  probe = [0] * (policy.PROBE_EVERY - 1) + [1]
  assert gammas == probe * 2
  # The drafts start to pay: each probe's 40 drafts are accepted at 0.95. A probe's gamma is the
  # previous batch's for the hysteresis (rule 3), so the batch after a probe keeps gamma 1 once it
  # scores within HYSTERESIS of plain decoding's 1: (1 + alpha) / 1.6 / (1 + MARGIN) >= 0.95, i.e.
  # alpha >= 0.672. The estimate, the decayed drafts' (2,000 at 0.3, two probes at 0.3, then k
  # probes at 0.95, each decaying the older ones by 0.5 ** (40 / HALF_LIFE)) with the prior's,
  # passes that after `want` probes, computed here without the policy's code.
  threshold = 1.6 * (1 + policy.MARGIN) * (1 - policy.HYSTERESIS) - 1
  decay = 0.5 ** (40 / policy.HALF_LIFE)
  accepted, drafted, want = 0.3 * 2000, 2000.0, 0
  for alpha in [0.3, 0.3] + [0.95] * 1000:
    prior = policy.PRIOR_ALPHA * policy.PRIOR_WEIGHT
    if alpha == 0.95 and (accepted + prior) / (drafted + policy.PRIOR_WEIGHT) >= threshold:
      break
    accepted, drafted = accepted * decay + alpha * 40, drafted * decay + 40
    want += alpha == 0.95
  probes, returned = 0, False
  for _ in range(70 * policy.PROBE_EVERY):
    choice = policy.choose(PAYS_ABOVE_06, state)
    if choice.gamma and choice.reason not in (policy.PROBE, policy.REFRESH):
      returned = True
      break
    probes += choice.reason == policy.PROBE
    drafted = 40 if choice.gamma else 0
    state = policy.observe(state, choice.gamma, drafted, 0.95 * drafted, choice.reason)
  assert returned and choice.reason == policy.KEPT and probes == want == 38, (probes, want)
  # It stays: many more batches at alpha 0.95, all speculative.
  for _ in range(50):
    choice = policy.choose(PAYS_ABOVE_06, state)
    assert choice.gamma >= 1
    state = policy.observe(state, choice.gamma, 40, 0.95 * 40, choice.reason)


def test_the_previous_gamma_is_kept_within_the_hysteresis():
  state = dataclasses.replace(_confident(0.8), gamma=4)
  speedups = policy.predicted_speedups(FIVE_AT_ALPHA_08, 0.8)
  assert speedups[4] >= (1 - policy.HYSTERESIS) * speedups[5]
  assert policy.choose(FIVE_AT_ALPHA_08, state).gamma == 4
  assert policy.choose(FIVE_AT_ALPHA_08, state).reason == policy.KEPT
  state = dataclasses.replace(state, gamma=2)  # 1.968 against 2.306: not kept
  assert policy.choose(FIVE_AT_ALPHA_08, state).gamma == 5
  # Once gamma 5's loop is compiled (the job has decoded at it), 4 is not kept against it.
  state = dataclasses.replace(state, gamma=4, decoded=frozenset({0, 4, 5}))
  assert (policy.choose(FIVE_AT_ALPHA_08, state).gamma, state.gamma) == (5, 4)


def test_between_speculating_and_plain_decoding_the_previous_choice_is_kept_within_the_hysteresis():
  """PAYS_ABOVE_06 with no evidence (margin 10%): gamma 1 scores (1 + alpha) / 1.6 / 1.1, the
  best of the gammas up to alpha 0.8. Plain decoding is kept against gamma 1 while gamma 1 scores
  under 1 / 0.95 (alpha 0.8: 1.023), and gamma 1 against plain decoding while it scores at least
  0.95 (alpha 0.72: 0.977); outside that band the choice goes by the scores."""
  score = lambda alpha: (1 + alpha) / 1.6 / (1 + policy.MARGIN)  # noqa: E731
  for previous, alpha, kept in [(0, 0.8, True), (0, 0.9, False), (1, 0.72, True), (1, 0.6, False)]:
    state = dataclasses.replace(_confident(alpha), gamma=previous)
    best = policy.best_gamma(PAYS_ABOVE_06, alpha)
    assert (best == 0) == (score(alpha) <= 1.0) and best != previous
    choice = policy.choose(PAYS_ABOVE_06, state)
    if kept:
      assert (choice.gamma, choice.reason) == (previous, policy.KEPT)
    else:
      assert (choice.gamma, choice.reason) == (best, policy.BEST)


def test_the_width_goes_by_the_predictions_the_margin_by_plain_decoding():
  """A verify growing 0.3 steps a token and a draft step 0.1: at alpha 0.8 gamma 1 predicts
  1.286x, 2 1.356x, 3 1.342x. Gamma 1 measured over 16 MIN_STEPS (margin 2.5%) scores 1.254, above
  gamma 2's 1.232 over MIN_STEPS (margin 10%), but both beat plain decoding by their margins:
  the choice is gamma 2, the fastest prediction. At alpha 0.42 gamma 1 predicts 1.42 / 1.4 =
  1.014x, under its margin: plain decoding."""
  costs = _costs([1, 1.3, 1.6, 1.9], 0.1)
  n = costs_lib.MIN_STEPS
  costs = dataclasses.replace(costs, evidence=((0, 100 * n), (1, 16 * n), (2, n), (3, n)))
  state = dataclasses.replace(_confident(0.8), gamma=1, decoded=frozenset({0, 1, 2, 3}))
  speedups = policy.predicted_speedups(costs, 0.8)
  assert [round(speedups[g], 3) for g in (1, 2, 3)] == [1.286, 1.356, 1.342]
  assert speedups[1] / (1 + policy.margin(costs, 1)) > speedups[2] / (1 + policy.margin(costs, 2))
  assert (policy.choose(costs, state).gamma, policy.best_gamma(costs, 0.8)) == (2, 2)
  assert policy.predicted_speedups(costs, 0.42)[1] == pytest.approx(1.42 / 1.4)
  assert policy.best_gamma(costs, 0.42) == 0


def test_observe_decays_older_batches_by_half_every_half_life():
  state = policy.observe(policy.PolicyState(), 3, 100, 20.0)
  assert (state.drafted, state.alpha_sum, state.gamma) == (100, 20.0, 3)
  half = int(policy.HALF_LIFE)
  state = policy.observe(state, 3, half, 1.0 * half)
  assert state.drafted == pytest.approx(50 + half)
  assert state.alpha_sum == pytest.approx(10 + half)
  assert policy.observe(state, 0, 0, 0.0).plain_streak == 1
  assert policy.observe(policy.observe(state, 0, 0, 0.0), 2, 1, 1.0).plain_streak == 0


def test_observe_records_takes_the_batch_alpha_the_loop_felt():
  """Two rows at gamma 3: the longest has 10 tokens, the slowest took 4 steps, so the batch's
  block efficiency is 2.5 and its alpha the one with 1 + a + a^2 + a^3 = 2.5 (0.7055...), weighted
  by the 21 drafted positions, whatever the rows' own min-mass says."""
  rows = [
    {'drafted': 12, 'alpha_sum': 11.0, 'target_calls': 4, 'num_tokens': 9},
    {'drafted': 9, 'alpha_sum': 8.5, 'target_calls': 3, 'num_tokens': 10},
  ]
  alpha = policy.batch_alpha(3, rows)
  assert 1 + alpha + alpha**2 + alpha**3 == pytest.approx(2.5, abs=1e-9)
  state = policy.observe_records(policy.PolicyState(), 3, rows)
  assert state == policy.observe(policy.PolicyState(), 3, 21, alpha * 21)
  plain = [{'drafted': 0, 'alpha_sum': 0.0, 'target_calls': 7, 'num_tokens': 7}]
  assert policy.observe_records(state, 0, plain).plain_streak == 1


def _measure(times, costs, gamma, steps=costs_lib.MIN_STEPS):
  """`times` after a batch of `steps` loop steps at `gamma`, each costing what `costs` says."""
  return times.add(gamma, costs_lib.BatchTiming(steps * costs.step(gamma), steps))


@pytest.mark.parametrize('plain_beside', [True, False])
def test_while_measuring_it_visits_gamma_1_then_where_the_measured_steps_point(plain_beside):
  """FIVE_AT_ALPHA_08's steps grow by 0.12 of a plain step per gamma. Once the plain loop and gamma 1
  are measured, gamma 2 (its step assumed flat from gamma 1) predicts best, so it is measured; then
  each further gamma (the slope of the last two) up to 5, whose successor predicts less at alpha
  0.8 (2.297 against 2.306), but within the margins: gamma 6, the runner-up, is measured too;
  choosing the measured gamma 5 then freezes the costs. Without a baseline mode beside it, the
  job's own first batches measure the plain loop."""
  state = _confident(0.8)
  times = costs_lib.LoopTimes.empty(7)
  visited = []
  for _ in range(10):
    choice = policy.choose_while_measuring(times, state, plain_beside)
    visited.append((choice.gamma, choice.reason))
    if choice.reason != policy.CALIBRATE:
      break
    times = _measure(times, FIVE_AT_ALPHA_08, choice.gamma)
    if plain_beside:
      times = _measure(times, FIVE_AT_ALPHA_08, 0)  # the baseline's batch
  first = [] if plain_beside else [(0, policy.CALIBRATE)]
  assert visited == first + [(g, policy.CALIBRATE) for g in range(1, 7)] + [(5, policy.BEST)]
  assert dict(times.costs().loop_steps) == pytest.approx(
    {g: FIVE_AT_ALPHA_08.step(g) for g in range(7)}
  )
  # Measured up to 6: at alpha 0.999 gamma 7 (one past them, its step the slope of the last two)
  # predicts best, so the job goes on to decode, and measure, gamma 7.
  assert policy.choose(times.costs(), _confident(0.999)).gamma == 7
  assert FIVE_AT_ALPHA_08.step(7) == pytest.approx(times.costs().step(7))


def test_while_measuring_the_measured_choice_s_next_gamma_is_measured_where_it_is_the_runner_up():
  """Steps 1.2, 1.4, 1.6 plain steps at gammas 1-3: at alpha 0.6 gamma 2 predicts best (1.400x),
  and gamma 3 (its step extrapolated, the slope of gammas 1 and 2) 1.360x, within the margins
  (1.360 * 1.1 >= 1.400 / 1.1): it is decoded to measure it before the measuring ends (the batch-1
  job's gamma 3 otherwise stayed unmeasured). Measured, gamma 2 stays best and the measuring ends;
  likewise at once where the next gamma is measured already, or the choice is gamma_max."""
  state = _confident(0.6)
  costs = costs_lib.Costs(((0, 1e-3), (1, 1.2e-3), (2, 1.4e-3), (3, 1.6e-3)), 3)
  times = costs_lib.LoopTimes.empty(3)
  for g in range(3):
    times = _measure(times, costs, g)
  speedups = policy.predicted_speedups(times.costs(), 0.6)
  assert [round(speedups[g], 3) for g in range(4)] == [1.0, 1.333, 1.4, 1.36]
  choice = policy.choose_while_measuring(times, state, True)
  assert (choice.gamma, choice.reason) == (3, policy.CALIBRATE)
  times = _measure(times, costs, 3)
  choice = policy.choose_while_measuring(times, state, True)
  assert (choice.gamma, choice.reason) == (2, policy.BEST)
  capped = costs_lib.LoopTimes.empty(2)
  for g in range(3):
    capped = _measure(capped, costs, g)
  assert policy.choose_while_measuring(capped, state, True).reason == policy.BEST
  apart = costs_lib.Costs(((0, 1e-3), (1, 1e-3), (2, 2e-3)), 7)
  times = costs_lib.LoopTimes.empty(7)
  for g in range(3):
    times = _measure(times, apart, g)
  choice = policy.choose_while_measuring(times, _confident(0.8), True)
  assert (choice.gamma, choice.reason) == (1, policy.BEST)


def _evidence(costs, steps):
  """`costs` measured over `steps` loop steps at each gamma."""
  return dataclasses.replace(costs, evidence=tuple((g, steps) for g, _ in costs.loop_steps))


def test_the_margin_over_plain_decoding_shrinks_with_the_steps_measured():
  """PAYS_ABOVE_06's gamma 1 predicts 1.7 / 1.6 = 1.0625x at alpha 0.7: not enough over a job's
  first MIN_STEPS loop steps (margin 10%) nor twice as many (7.1%), enough over four times as many
  (5%)."""
  state = _confident(0.7)
  n = costs_lib.MIN_STEPS
  assert policy.predicted_speedups(PAYS_ABOVE_06, 0.7)[1] == pytest.approx(1.0625, abs=1e-4)
  assert policy.margin(_evidence(PAYS_ABOVE_06, n), 1) == policy.MARGIN
  assert policy.margin(_evidence(PAYS_ABOVE_06, 16 * n), 1) == pytest.approx(policy.MARGIN / 4)
  assert policy.margin(PAYS_ABOVE_06, 1) == policy.MARGIN  # evidence unknown (the T5X adapter)
  assert policy.choose(_evidence(PAYS_ABOVE_06, n), state).gamma == 0
  assert policy.choose(_evidence(PAYS_ABOVE_06, 2 * n), state).gamma == 0
  # With its margin, 1.0625 * 1.1, it might beat plain decoding, but plain decoding is left by the
  # probe rule only (every PROBE_EVERY-th plain batch), not by a refresh.
  due = dataclasses.replace(state, since_refresh=policy.REFRESH_EVERY - 1)
  assert policy.choose(_evidence(PAYS_ABOVE_06, n), due).gamma == 0
  due = dataclasses.replace(due, plain_streak=policy.PROBE_EVERY - 1)
  assert policy.choose(_evidence(PAYS_ABOVE_06, n), due).reason == policy.PROBE
  assert policy.choose(_evidence(PAYS_ABOVE_06, 4 * n), state).gamma == 1
  assert policy.best_gamma(_evidence(PAYS_ABOVE_06, 4 * n), 0.7) == 1
  assert policy.best_gamma(PAYS_ABOVE_06, 0.7) == 0


def test_every_refresh_every_th_batch_decodes_at_the_runner_up_within_the_margins():
  """At alpha 0.8 FIVE_AT_ALPHA_08's gamma 5 predicts 2.306, gamma 6 2.297 (0.4% less), within the
  margins: every REFRESH_EVERY-th batch decodes at 6, so that both stay measured; a refresh batch
  does not become the gamma the next batch keeps. Where gamma 1 predicts 1.8x and gamma 2 1.22x
  (1.34x with its margin, under gamma 1's 1.8 / 1.1), no refresh."""
  state, chosen = _confident(0.8), []
  for _ in range(3 * policy.REFRESH_EVERY):
    choice = policy.choose(FIVE_AT_ALPHA_08, state)
    chosen.append((choice.gamma, choice.reason))
    state = policy.observe(state, choice.gamma, 100, 80.0, choice.reason)
  want = [(5, policy.BEST)] * (policy.REFRESH_EVERY - 1) + [(6, policy.REFRESH)]
  assert chosen == want * 3
  assert state.gamma == 5 and state.since_refresh == 0
  state, apart = _confident(0.8), costs_lib.Costs(((0, 1e-3), (1, 1e-3), (2, 2e-3)), 2)
  for _ in range(3 * policy.REFRESH_EVERY):
    choice = policy.choose(apart, state)
    assert (choice.gamma, choice.reason) == (1, policy.BEST)
    state = policy.observe(state, choice.gamma, 100, 80.0, choice.reason)


def test_a_thin_neighbour_of_the_choice_is_refreshed_first_whatever_it_predicts():
  """FIVE_AT_ALPHA_08 with gamma 6's step measured 30% high over fewer than THIN * MIN_STEPS loop
  steps: it predicts 1.9x to gamma 5's 2.306 (under gamma 5's score even with its margin), yet the
  refresh decodes it, before gamma 4 (a runner-up within the margins, measured over more steps);
  once 6 is measured over THIN * MIN_STEPS steps it is judged by its prediction again, and the
  refresh goes back to the runner-up 4."""
  n = costs_lib.MIN_STEPS
  steps = tuple((g, s * 1.3 if g == 6 else s) for g, s in FIVE_AT_ALPHA_08.loop_steps)
  many = tuple((g, 64 * n) for g, _ in steps)
  costs = dataclasses.replace(
    FIVE_AT_ALPHA_08, loop_steps=steps, evidence=tuple((g, n if g == 6 else m) for g, m in many)
  )
  due = dataclasses.replace(_confident(0.8), gamma=5, since_refresh=policy.REFRESH_EVERY - 1)
  speedups = policy.predicted_speedups(costs, 0.8)
  assert speedups[6] * (1 + policy.margin(costs, 6)) < speedups[5] / (1 + policy.margin(costs, 5))
  assert policy.choose(costs, dataclasses.replace(due, since_refresh=0)).gamma == 5
  assert (policy.choose(costs, due).gamma, policy.choose(costs, due).reason) == (6, policy.REFRESH)
  thick = dataclasses.replace(
    costs, evidence=tuple((g, policy.THIN * n if g == 6 else m) for g, m in many)
  )
  assert (policy.choose(thick, due).gamma, policy.choose(thick, due).reason) == (4, policy.REFRESH)
  # Two runners-up within the margins: the refresh decodes the one measured over fewer steps.
  fewer = dataclasses.replace(
    FIVE_AT_ALPHA_08, evidence=tuple((g, 2 * n if g == 3 else m) for g, m in many)
  )
  assert policy.choose(fewer, due).gamma == 3


def test_while_measuring_where_only_plain_decoding_pays_it_stops_after_gamma_1():
  times = costs_lib.LoopTimes.empty(7)
  times = _measure(_measure(times, ONLY_PLAIN_PAYS, 0), ONLY_PLAIN_PAYS, 1)
  choice = policy.choose_while_measuring(times, policy.PolicyState(), True)
  # Gamma 1 predicts below plain decoding's speed (0.68x at alpha 0.7): the job does not look
  # past it (gamma 2, its step assumed flat, would predict 0.88x: not measured either way), and
  # on gammas 0..1 not even alpha 1 pays: plain, and the costs freeze.
  assert (choice.gamma, choice.reason) == (0, policy.NEVER_PAYS)
  # Frozen on gammas 0..1, where not even alpha 1 pays: plain for good, no probe.
  assert policy.choose(times.costs(), policy.PolicyState()).reason == policy.NEVER_PAYS


def test_while_measuring_it_looks_past_gamma_1_only_where_gamma_1_breaks_even():
  """Gamma 1 steps 1.9 plain steps: at alpha 0.8 it predicts 1.8 / 1.9 = 0.95x, and gamma 2, its
  step assumed flat, 2.44 / 1.9 = 1.28x. A job whose measured drafts all lose does not decode its
  next batches at gamma 2 to find out: it freezes on plain decoding (once gamma 1 is measured
  over THIN * MIN_STEPS, probing it only every RECHECK_EVERY-th batch). Gamma 1 at 1.7 plain
  steps (1.06x) breaks even, so gamma 2 (1.44x) is measured."""
  state = _confident(0.8)
  for gamma_1_step, want in [(1.9e-3, (0, policy.NEVER_PAYS)), (1.7e-3, (2, policy.CALIBRATE))]:
    costs = costs_lib.Costs(((0, 1e-3), (1, gamma_1_step)), 7)
    times = _measure(costs_lib.LoopTimes.empty(7), costs, 0)
    times = _measure(times, costs, 1, steps=policy.THIN * costs_lib.MIN_STEPS)
    assert policy.predicted_speedups(times.costs(), state.alpha())[2] > 1 + policy.MARGIN
    choice = policy.choose_while_measuring(times, state, True)
    assert (choice.gamma, choice.reason) == want


def test_one_batch_does_not_rule_drafting_out_two_do():
  """Gamma 1 at 1.9 plain steps: a perfect draft, 2 / 1.9 = 1.05x, does not beat plain decoding by
  the margin. Measured over MIN_STEPS loop steps (one batch) that is not final: every
  PROBE_EVERY-th plain batch probes gamma 1, which measures it again (while the costs are
  measured, the next batch does). Over THIN * MIN_STEPS only every RECHECK_EVERY-th does."""
  costs = costs_lib.Costs(((0, 1e-3), (1, 1.9e-3)), 7)
  state = dataclasses.replace(_confident(0.8), plain_streak=policy.PROBE_EVERY - 1)
  for steps, want in [
    (costs_lib.MIN_STEPS, (1, policy.PROBE)),
    (policy.THIN * costs_lib.MIN_STEPS, (0, policy.NEVER_PAYS)),
  ]:
    times = _measure(costs_lib.LoopTimes.empty(7), costs, 0, steps=100 * steps)
    times = _measure(times, costs, 1, steps=steps)
    assert policy.predicted_speedups(times.costs(), 1.0)[1] == pytest.approx(2 / 1.9)
    choice = policy.choose(times.costs(), state)
    assert (choice.gamma, choice.reason) == want
    assert policy.choose(times.costs(), dataclasses.replace(state, plain_streak=0)).gamma == 0
    measuring = policy.choose_while_measuring(times, policy.PolicyState(), True)
    thin = steps < policy.THIN * costs_lib.MIN_STEPS
    assert (measuring.gamma, measuring.reason) == ((1, policy.CALIBRATE) if thin else want)
    recheck = dataclasses.replace(state, plain_streak=policy.RECHECK_EVERY - 1)
    assert policy.choose(times.costs(), recheck).gamma == 1
    if not thin:
      streak = [
        policy.choose(times.costs(), dataclasses.replace(state, plain_streak=k)).gamma
        for k in range(policy.RECHECK_EVERY)
      ]
      assert streak == [0] * (policy.RECHECK_EVERY - 1) + [1]


def test_a_thin_step_where_a_perfect_draft_breaks_even_is_measured_again():
  """Gamma 1 at 2.05 plain steps: a perfect draft, 2 / 2.05 = 0.976x, pays within the margin of a
  step measured over MIN_STEPS loop steps (x 1.1) but not of one over THIN * MIN_STEPS (x 1.071).
  Thin, it is measured again (the next batch while measuring, every PROBE_EVERY-th plain batch
  after); then plain for good. At 2.3 plain steps (0.87x, x 1.1 = 0.96x) even a thin step rules
  drafting out."""
  state = dataclasses.replace(_confident(0.8), plain_streak=policy.PROBE_EVERY - 1)
  for step, steps, want in [
    (2.05e-3, costs_lib.MIN_STEPS, (1, policy.PROBE)),
    (2.05e-3, policy.THIN * costs_lib.MIN_STEPS, (0, policy.NEVER_PAYS)),
    (2.3e-3, costs_lib.MIN_STEPS, (0, policy.NEVER_PAYS)),
  ]:
    costs = costs_lib.Costs(((0, 1e-3), (1, step)), 7)
    times = _measure(costs_lib.LoopTimes.empty(7), costs, 0, steps=100 * steps)
    times = _measure(times, costs, 1, steps=steps)
    assert policy.predicted_speedups(times.costs(), 1.0)[1] < 1.0
    choice = policy.choose(times.costs(), state)
    assert (choice.gamma, choice.reason) == want
    recheck = dataclasses.replace(state, plain_streak=policy.RECHECK_EVERY - 1)
    assert policy.choose(times.costs(), recheck).gamma == want[0]
    measuring = policy.choose_while_measuring(times, policy.PolicyState(), True)
    assert (measuring.gamma, measuring.reason) == (
      (1, policy.CALIBRATE) if want[0] else (0, policy.NEVER_PAYS)
    )


def test_a_gamma_counts_as_measured_after_min_steps():
  times = costs_lib.LoopTimes.empty(3).add(1, costs_lib.BatchTiming(0.1, costs_lib.MIN_STEPS - 1))
  assert not times.measured(1)
  times = times.add(0, costs_lib.BatchTiming(0.2, costs_lib.MIN_STEPS))
  times = times.add(1, costs_lib.BatchTiming(0.01, 1))
  assert times.measured(1) and times.measured(0) and not times.measured(2)
  assert times.costs().loop_steps == (
    (0, 0.2 / costs_lib.MIN_STEPS),
    (1, 0.11 / costs_lib.MIN_STEPS),
  )
