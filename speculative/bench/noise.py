"""The noise verdict of a measured cost estimate (pure functions of per-round times).

Noise. The timers are run in interleaved rounds: every timer once per round, the order rotating
from round to round, so a change of background load hits all of them alike. A ratio (c, v(T)) is
computed per round, from the two times of the same round, and summarized by its median over rounds
and its spread = interquartile range / median of the per-round ratios. An estimate is refused
(`judge` returns the reason) when
  * fewer than MIN_ROUNDS rounds were timed (the spread cannot be measured),
  * some round's time was not resolved above timer jitter (a non-positive marginal time),
  * the spread exceeds MAX_SPREAD (0.25: the middle half of the rounds disagree by more than a
    quarter of the value, so a predicted speedup could be off by as much),
  * it is physically impossible (v(T) < 1: a T-token call cannot be cheaper than a 1-token call).
A prediction (EXP) and the loop overheads derived from refused estimates are reported as "too
noisy to predict" instead of a number.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any
from typing import Mapping
from typing import Sequence

import numpy as np

MAX_SPREAD = 0.25
MIN_ROUNDS = 3


@dataclasses.dataclass(frozen=True)
class Estimate:
  """Median over rounds of a per-round quantity, with its relative spread.

  Attributes:
    value: median of the resolved (finite, positive) per-round values; nan if none.
    spread: (75th - 25th percentile) / median of the resolved values; inf if none.
    rounds: number of rounds.
    unresolved: rounds whose value was not finite and positive (timer jitter above the signal).
  """

  value: float
  spread: float
  rounds: int
  unresolved: int

  def to_json(self) -> dict[str, Any]:
    return dataclasses.asdict(self)


def estimate(samples: Sequence[float]) -> Estimate:
  """The Estimate of per-round values `samples`."""
  if not len(samples):  # pylint: disable=g-explicit-length-test
    raise ValueError("no samples to estimate from")
  x = np.asarray(samples, np.float64)
  ok = x[np.isfinite(x) & (x > 0)]
  if not ok.size:
    return Estimate(math.nan, math.inf, len(x), len(x))
  median = float(np.median(ok))
  q25, q75 = np.percentile(ok, [25, 75])
  return Estimate(median, float((q75 - q25) / median), len(x), int(len(x) - ok.size))


def ratio_samples(
  numerator: Sequence[float], denominator: Sequence[float], scale: float = 1.0
) -> list[float]:
  """Per-round ratios scale * numerator[r] / denominator[r] (nan where the denominator is not
  positive), pairing the two times measured in the same round."""
  if len(numerator) != len(denominator):
    raise ValueError(f"rounds differ: {len(numerator)} vs {len(denominator)}")
  return [scale * a / b if b > 0 else math.nan for a, b in zip(numerator, denominator)]


def judge(
  est: Estimate, what: str, *, minimum: float | None = None, max_spread: float = MAX_SPREAD
) -> str | None:
  """None if `est` is usable, else why it is too noisy (see the module docstring)."""
  if est.rounds < MIN_ROUNDS:
    return f"{what}: {est.rounds} timing rounds, too few to measure the noise (need {MIN_ROUNDS})"
  if est.unresolved:
    return f"{what}: not resolved above timer jitter in {est.unresolved} of {est.rounds} rounds"
  if not est.spread <= max_spread:
    return (
      f"{what} = {est.value:.3g}: spread (interquartile range / median over rounds) "
      f"{est.spread:.2f} > {max_spread:.2f}"
    )
  if minimum is not None and est.value < minimum:
    return f"{what} = {est.value:.3g} < {minimum:g}, physically impossible"
  return None


class NoiseLog:
  """Estimates by name and the reasons of the refused ones, kept in `data` (the JSON-ready
  `costs['noise']`: max_spread, min_rounds, estimates {name: Estimate}, refused {name: reason})."""

  def __init__(self, data: dict[str, Any] | None = None, max_spread: float = MAX_SPREAD):
    self.data = (
      data
      if data is not None
      else {"max_spread": max_spread, "min_rounds": MIN_ROUNDS, "estimates": {}, "refused": {}}
    )

  def add(
    self,
    name: str,
    samples: Sequence[float],
    minimum: float | None = None,
    fallback: float = math.nan,
  ) -> float:
    """Records the estimate of `samples` under `name`; returns its value, or `fallback` where no
    round resolved it (the estimate is refused either way)."""
    est = estimate(samples)
    self.data["estimates"][name] = est.to_json()
    reason = judge(est, name, minimum=minimum, max_spread=self.data["max_spread"])
    if reason:
      self.data["refused"][name] = reason
    return est.value if math.isfinite(est.value) else fallback


def refusal(noise: Mapping[str, Any] | None, names: Sequence[str]) -> str | None:
  """The reasons (joined) why any of the estimates `names` in a `costs['noise']` dict is refused;
  None if all are usable or the costs carry no noise record (measured before it existed)."""
  if not noise:
    return None
  reasons = [noise["refused"][n] for n in names if n in noise["refused"]]
  return "; ".join(reasons) or None


def v_key(num_tokens: int) -> str:
  return f"v({num_tokens})"


def c_key(drafter: str, detail: str = "") -> str:
  return f"c[{drafter}{', ' + detail if detail else ''}]"


TARGET_STEP = "t(1)"
STOCK_STEP = "stock t(1)"
