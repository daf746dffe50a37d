"""What a loop step costs on the job's own device, batch and decode path: timed on the job's own
batches, cached per key.

`GAMMA = 'auto'` compares the plain loop (gamma 0) with the speculative loops by their walltime per
generated token (docs/auto_gamma.md). Each is measured on the job's own compiled loop while it
decodes the job's own batches: a batch's warm walltime (the call the job times anyway, or the warm
call after the loop's compile where the job then decoded the batch at another gamma) and, timed
beside it as calibration, the same compiled call with `max_steps = 0` (the encoders, the prefill,
the loop's set-up: what a call pays once, whatever its steps). Their difference over the batch's
loop steps (its rows' most target calls) is the gamma loop's step c(gamma); the stepless time over
the batch's longest row's tokens is its fixed share per token f(gamma). A gamma's time per token is
then f(gamma) + c(gamma) / E(gamma) (E: Theorem 3.8's expected tokens per step), so a step measured
on short batches (where the fixed share dominates) predicts long ones too, and the draft's encoder
is charged to speculation.

Where the job's baseline mode decodes the same batches (the run files' jobs), a gamma's step is the
plain step plus the difference between its calls and the baseline's on the same batches, measured
seconds apart, over its loop steps, and its fixed share the plain loop's times the ratio of their
stepless calls: what a call pays once cancels in the difference, however it depends on the batch
(`LoopTimes.costs`). A gamma counts as measured once its batches have run MIN_STEPS loop steps
(`LoopTimes`). Between measured gammas a step is interpolated linearly in gamma; beyond the largest
measured one it is extrapolated, to decide whether to measure the next (`Costs.step`).
`speculative.infer`'s 'auto' mode (speculative/infer/auto_gamma.py) decides which gammas to measure
(policy.`choose_while_measuring`), times the first measuring batches stepless until they cover
STEPLESS_TOKENS tokens, adds every later batch's timing to the loop times (its fixed share from the
stepless calls) and writes the loop times to a JSON file (default
`~/.cache/speculative/calibration.json`, or under $XDG_CACHE_HOME) once measured and again at the
job's end (a job that ends still measuring writes nothing), one entry per `key`: the device
(backend, device kind, CPU model, usable cores), the jax version, the decode path, the batch size,
the shapes, GAMMA_MAX, both models' configs and the loop (drafter, sampling strategy, lenience). A
second job with the same key starts from them, makes no stepless call and adds its own batches. A
file that cannot be read as such a cache is ignored with one warning line and measured afresh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import os
from typing import Any
from typing import Iterable
from typing import Mapping

import jax

from speculative.checkpoints import files
from speculative.jobs import runtime

MIN_STEPS = 32  # loop steps a gamma's batches run before its step counts as measured
STEPLESS_TOKENS = 64  # tokens the stepless calls of the plain loop, and of the others, cover
CACHE_VERSION = 7
CACHE_STEPS = 1024  # loop steps per gamma the cache keeps (`LoopTimes.capped`)


def default_cache_file() -> str:
  """`$XDG_CACHE_HOME/speculative/calibration.json` (XDG_CACHE_HOME defaults to ~/.cache)."""
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(root, 'speculative', 'calibration.json')


@dataclasses.dataclass(frozen=True)
class Costs:
  """Seconds per loop step and fixed seconds per token at the measured gammas, and the model
  between them.

  Attributes:
    loop_steps: ((gamma, seconds per step of the gamma loop, its stepless call's time taken out),
      ...), sorted by gamma; gamma 0 is the plain loop. Needs gamma 0.
    gamma_max: the largest gamma the job may choose.
    fixed: ((gamma, the stepless call's seconds per generated token), ...) at the gammas of
      `loop_steps` (empty: none measured, 0).
    evidence: ((gamma, the loop steps its step was measured over), ...) at the gammas of
      `loop_steps` (empty: unknown; the policy's margin over plain decoding shrinks with it).
  """

  loop_steps: tuple[tuple[int, float], ...]
  gamma_max: int
  fixed: tuple[tuple[int, float], ...] = ()
  evidence: tuple[tuple[int, int], ...] = ()

  def __post_init__(self):
    gammas = [g for g, _ in self.loop_steps]
    if (
      not gammas
      or gammas[0] != 0
      or gammas != sorted(set(gammas))
      or gammas[-1] > self.gamma_max
      or not all(s > 0 for _, s in self.loop_steps)
      or (self.fixed and [g for g, _ in self.fixed] != gammas)
      or not all(f >= 0 for _, f in self.fixed)
      or (self.evidence and [g for g, _ in self.evidence] != gammas)
    ):
      raise ValueError(
        'costs need the plain loop step c(0), steps > 0 at sorted gammas <= gamma_max and fixed '
        f'shares >= 0 at the same gammas: {self}'
      )

  @property
  def top(self) -> int:
    """The largest measured gamma: the job chooses in 0..top (`policy.choose`)."""
    return self.loop_steps[-1][0]

  def step(self, gamma: int) -> float:
    """Seconds per step of the gamma loop: measured, else the line between the measured gammas
    around it, else (beyond `top`: what the job considers measuring next) the slope of the two
    largest measured gammas >= 1, at least 0, or flat with one (a longer draft never costs less;
    the plain step's slope up to gamma 1 would charge each further draft token the speculative
    loop's per-step overhead too: measured at batch 1, gamma 2's step is gamma 1's)."""
    measured = dict(self.loop_steps)
    if gamma in measured:
      return measured[gamma]
    g1 = max(g for g in measured if g < gamma)  # gamma 0 is always measured
    above = [g for g in measured if g > gamma]
    if above:
      g2 = min(above)
      return measured[g1] + (measured[g2] - measured[g1]) * (gamma - g1) / (g2 - g1)
    speculative = [g for g in measured if g >= 1]
    if len(speculative) < 2:
      return measured[g1]
    g0 = speculative[-2]
    slope = max((measured[g1] - measured[g0]) / (g1 - g0), 0.0)
    return measured[g1] + slope * (gamma - g1)

  def fixed_per_token(self, gamma: int) -> float:
    """Seconds per generated token of what a call pays once (the encoders, the prefill): measured,
    else the nearest measured gamma >= 1's (every speculative loop runs the same encoders), else
    the plain loop's."""
    measured = dict(self.fixed)
    if not measured:
      return 0.0
    if gamma in measured:
      return measured[gamma]
    speculative = [g for g in measured if g >= 1] or [0]
    return measured[min(speculative, key=lambda g: (abs(g - gamma), g))]

  def measured_steps(self, gamma: int) -> int | None:
    """The loop steps `gamma`'s step was measured over (0: not measured; None: unknown)."""
    if not self.evidence:
      return None
    return dict(self.evidence).get(gamma, 0)

  def to_json(self) -> dict[str, Any]:
    return {
      'gamma_max': self.gamma_max,
      'loop_step_ms': {str(g): round(s * 1e3, 6) for g, s in self.loop_steps},
      'fixed_ms_per_token': {str(g): round(f * 1e3, 6) for g, f in self.fixed},
      'measured_steps': {str(g): n for g, n in self.evidence},
    }

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Costs:
    steps = sorted((int(g), float(ms) / 1e3) for g, ms in data['loop_step_ms'].items())
    fixed = sorted((int(g), float(ms) / 1e3) for g, ms in data['fixed_ms_per_token'].items())
    evidence = sorted((int(g), int(n)) for g, n in data.get('measured_steps', {}).items())
    return cls(tuple(steps), int(data['gamma_max']), tuple(fixed), tuple(evidence))


@dataclasses.dataclass(frozen=True)
class BatchTiming:
  """One batch's times (or several batches' summed), from its rows' records.

  Attributes:
    seconds: warm walltime of the decode call(s).
    steps: loop steps (per batch: its rows' most target calls).
    stepless: walltime of the same call(s) with max_steps = 0, where timed (while measuring).
    tokens: generated tokens of each batch's longest row (the plain loop's steps).
    stepless_tokens: `tokens` of the batches whose stepless call was timed.
  """

  seconds: float = 0.0
  steps: int = 0
  stepless: float = 0.0
  tokens: int = 0
  stepless_tokens: int = 0

  def __add__(self, other: BatchTiming) -> BatchTiming:
    return BatchTiming(*(a + b for a, b in zip(self.to_json(), other.to_json())))

  def step(self, fixed: float) -> float:
    """Seconds per loop step: the walltime less the fixed share (`fixed` seconds per generated
    token, `fixed()` where the stepless calls were timed) over the loop steps; at least 1% of the
    whole (a noisy stepless time never makes a step free)."""
    return max(self.seconds - fixed * self.tokens, 0.01 * self.seconds) / self.steps

  def fixed(self) -> float | None:
    """The stepless calls' seconds per generated token over the batches they timed (None: none)."""
    return self.stepless / self.stepless_tokens if self.stepless_tokens else None

  def to_json(self) -> list[float]:
    return [self.seconds, self.steps, self.stepless, self.tokens, self.stepless_tokens]


def batch_timing(records: Iterable[dict]) -> BatchTiming:
  """One batch's timing from its rows' records: the batch's warm decode time (`decode_s` is it
  split evenly over the rows), its stepless call's (`stepless_s`, likewise; 0 where not timed),
  its rows' most target calls and longest row's tokens. The job and its resume both measure
  through here, from the records as written, so a resumed job's measurements equal the
  uninterrupted job's bit for bit."""
  records = list(records)
  tokens = max(int(r['num_tokens']) for r in records)
  timed = all('stepless_s' in r for r in records)
  return BatchTiming(
    seconds=sum(float(r['decode_s']) for r in records),
    steps=max(int(r['target_calls']) for r in records),
    stepless=sum(float(r['stepless_s']) for r in records) if timed else 0.0,
    tokens=tokens,
    stepless_tokens=tokens if timed else 0,
  )


@dataclasses.dataclass(frozen=True)
class LoopTimes:
  """The job's batches timed so far, summed per gamma.

  Attributes:
    own: (the batches decoded at gamma, for gamma in 0..gamma_max); gamma 0 holds the plain
      loop's batches, the job's own or its baseline mode's (`add_plain`).
    paired: (the baseline mode's decodes of the same batches as `own[gamma]`, for gamma >= 1;
      empty where the job has no baseline mode beside it).
  """

  own: tuple[BatchTiming, ...]
  paired: tuple[BatchTiming, ...]

  @classmethod
  def empty(cls, gamma_max: int) -> LoopTimes:
    none = (BatchTiming(),) * (gamma_max + 1)
    return cls(none, none)

  @property
  def gamma_max(self) -> int:
    return len(self.own) - 1

  def add(self, gamma: int, timing: BatchTiming) -> LoopTimes:
    """A batch the job decoded at `gamma`."""
    return dataclasses.replace(self, own=_add(self.own, gamma, timing))

  def add_plain(self, gamma: int, timing: BatchTiming) -> LoopTimes:
    """The baseline mode's decode of a batch the job decoded at `gamma`: the plain loop's time,
    and the pair of that batch's."""
    times = self.add(0, timing)
    if gamma == 0:
      return times
    return dataclasses.replace(times, paired=_add(self.paired, gamma, timing))

  def measured(self, gamma: int) -> bool:
    return self.own[gamma].steps >= MIN_STEPS

  def costs(self) -> Costs:
    """The measured gammas' steps and fixed shares (needs gamma 0 measured).

    The fixed share per token of every gamma >= 1 is one number: every speculative loop runs the
    same encoders and prefill, so their stepless calls are pooled over all gammas >= 1 (a share
    per gamma, from the one or two batches each was timed stepless on, differed by up to 1.7x on
    the same job); where the baseline timed the same batches, it is the plain loop's share times
    the pooled ratio of the two loops' stepless calls on those batches. Batches without a stepless
    call (decoded after the measuring) count with that share. Where the baseline timed the same
    batches, a gamma's step is the plain loop's step (over all of the baseline's batches) times
    those batches' tokens plus the difference between the two loops' calls on them, each pair
    measured seconds apart, over the gamma's loop steps; else the gamma's own.

    The difference: a batch's calls pay what a call pays once (the encoders, the prefill) F plus
    their steps, the baseline's F + t c(0) over its t tokens, the gamma loop's F + d + s c(gamma)
    over its s steps (d: the draft's encoder and set-up, `share` less the plain loop's fixed share
    per token, times t). So c(gamma) = (c(0) t + (its call - the baseline's) - d) / s, whatever
    the batch's F. F grows with the input's length, not with the tokens generated, so a share per
    token charges short batches too little of it: on one batch-1 job at gamma 3, the ratio of the
    two loops' steps (which divides F's error by s and by t, unalike) made the step of its shorter
    half of sentences 19% slower than that of its longer half, the difference 1%; the job measures
    its larger gammas last, on its shortest batches. The machine's load, which drifts over a job,
    enters only the difference (10-20% of the call at batch 1 on the CPU kernels)."""
    plain = self.own[0]
    plain_fixed = plain.fixed() or 0.0
    drafting = sum(self.own[1:], BatchTiming())
    pairs = sum(self.paired[1:], BatchTiming())
    share = drafting.fixed()
    if share is None:
      share = plain_fixed
    elif pairs.fixed():
      share = plain_fixed * share / pairs.fixed()
    plain_step = plain.step(plain_fixed)
    steps, fixed, evidence = [(0, plain_step)], [(0, plain_fixed)], [(0, int(plain.steps))]
    for g in range(1, self.gamma_max + 1):
      if not self.measured(g):
        continue
      own, pair = self.own[g], self.paired[g]
      if pair.steps:
        extra = (share - plain_fixed) * own.tokens  # d: the draft's encoder and set-up
        paired = plain_step * pair.tokens + own.seconds - pair.seconds - extra
        step = max(paired, 0.01 * own.seconds) / own.steps  # (as `BatchTiming.step`'s floor)
      else:
        step = own.step(share)
      steps.append((g, step))
      fixed.append((g, share))
      evidence.append((g, int(own.steps)))
    return Costs(tuple(steps), self.gamma_max, tuple(fixed), tuple(evidence))

  def capped(self, steps: int) -> LoopTimes:
    """What the cache keeps: each gamma's sums (its own and its pairs alike, so its ratios and
    per-step times stay) scaled down to at most `steps` loop steps, so that the next jobs' own
    batches still move the costs they start from."""

    def scale(t: BatchTiming, k: float) -> BatchTiming:
      if k >= 1.0:
        return t
      return BatchTiming(*(x * k for x in t.to_json()))  # (counts too: every ratio stays)

    ks = [steps / t.steps if t.steps else 1.0 for t in self.own]
    return LoopTimes(
      tuple(scale(t, k) for t, k in zip(self.own, ks)),
      tuple(scale(t, k) for t, k in zip(self.paired, ks)),
    )

  def to_json(self) -> dict[str, Any]:
    return {
      'own': [t.to_json() for t in self.own],
      'paired': [t.to_json() for t in self.paired],
    }

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> LoopTimes:
    own = tuple(BatchTiming(*t) for t in data['own'])
    paired = tuple(BatchTiming(*t) for t in data['paired'])
    if len(own) != len(paired) or len(own) < 2:
      raise ValueError(f'loop times need one sum per gamma for both lists: {data}')
    return cls(own, paired)


def _add(values: tuple, index: int, value) -> tuple:
  return tuple(v + value if i == index else v for i, v in enumerate(values))


def key_fields(
  *,
  decode_path: str,
  batch: int,
  encoder_length: int,
  max_length: int,
  gamma_max: int,
  target_config: Mapping[str, Any],
  draft_config: Mapping[str, Any] | None,
  loop: str,
) -> dict[str, Any]:
  """What the costs depend on: the device, the decode path, the shapes, gamma_max, the models and
  the loop (`loop`: what else shapes its step: the drafter, the sampling strategy, lenience)."""
  device = jax.devices()[0]
  return {
    'backend': jax.default_backend(),
    'device_kind': device.device_kind,
    'cpu': runtime.cpu_model(),
    'usable_cores': runtime.usable_cores(),
    'jax': jax.__version__,
    'decode_path': decode_path,
    'batch_size': batch,
    'encoder_length': encoder_length,
    'max_length': max_length,
    'gamma_max': gamma_max,
    'target_config': dict(target_config),
    'draft_config': None if draft_config is None else dict(draft_config),
    'loop': loop,
  }


def cache_key(fields: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def check_cache_file(path: str) -> None:
  """PermissionError naming `path` unless the cache file can be written there; run before any
  model loads. Its missing directories are created to be sure they can be, then removed again (a
  refused job leaves nothing behind; `store` creates them)."""
  directory = os.path.dirname(os.path.abspath(path)) or '.'
  if os.path.isdir(path):
    raise PermissionError(f'calibration cache {path} is a directory, not a file')
  existing = directory
  while not os.path.exists(existing):
    existing = os.path.dirname(existing)
  if not os.path.isdir(existing):
    raise PermissionError(f'calibration cache {path}: {existing} is a file, not a directory')
  try:
    os.makedirs(directory, exist_ok=True)
    writable = os.access(directory, os.W_OK)
  except OSError as e:
    raise PermissionError(
      f'calibration cache {path}: cannot create {directory}: {e.strerror}'
    ) from e
  finally:
    made = directory
    while made != existing:  # the directories made here, deepest first
      with contextlib.suppress(OSError):  # not made (a failed makedirs), or no longer empty
        os.rmdir(made)
      made = os.path.dirname(made)
  if not writable or (os.path.exists(path) and not os.access(path, os.W_OK)):
    raise PermissionError(f'calibration cache {path} is not writable')


def _read_cache(path: str, warn: bool = True) -> dict[str, Any]:
  """The cache's entries ({} if there is no file); a file that is not a cache: one warning line
  (`warn`: `store` rewrites a file the job's `load` has warned of already)."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding='utf-8') as f:
      data = json.load(f)
    entries = data['entries']
    if data.get('version') != CACHE_VERSION or not isinstance(entries, dict):
      raise ValueError('not a calibration cache of this version')
    for entry in entries.values():  # each entry whole: the costs a job would decide with
      Costs.from_json(entry['costs'])
      times = LoopTimes.from_json(entry['times'])
      if times.gamma_max != int(entry['fields']['gamma_max']):
        raise ValueError(
          f'loop times of gammas 0..{times.gamma_max} under GAMMA_MAX '
          f"{entry['fields']['gamma_max']}"
        )
      if not all(math.isfinite(x) for t in times.own + times.paired for x in t.to_json()):
        raise ValueError('loop times that are not finite')
      times.costs()
    return entries
  except (OSError, ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError) as e:
    if warn:
      logging.warning('calibration cache %s is unreadable (%s); measuring afresh', path, e)
    return {}


def find_costs(path: str, drafter: str | None = None, **match: Any) -> Costs | None:
  """The costs of the cache file's most recent entry measured on this machine (its CPU model and
  usable cores, as `key_fields` records them), whose key fields equal `match` (e.g. backend,
  device_kind, batch_size, target_config, draft_config), whose loop ran `drafter` (None: any)
  and whose decode path is XLA's dot; None if there is none (or no readable cache). For the T5X
  adapter, which cannot time inside T5X's jitted predict function and reads what a job
  measured."""
  match = {'cpu': runtime.cpu_model(), 'usable_cores': runtime.usable_cores(), **match}
  found = None
  for entry in _read_cache(path).values():
    fields = entry.get('fields', {})
    if (
      str(fields.get('decode_path', '')).startswith('XLA')
      and (drafter is None or str(fields.get('loop', '')).startswith(f'drafter {drafter},'))
      and all(
        json.loads(json.dumps(fields.get(k))) == json.loads(json.dumps(v)) for k, v in match.items()
      )
    ):
      found = Costs.from_json(entry['costs'])
  return found


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The costs a job decides with, and where they came from.

  Attributes:
    times: the loop times the job starts from (None: none; source 'measured'), to which it adds
      its own batches'.
    costs: the loop steps; None while the job is still measuring them (source 'measured').
    key: `cache_key` of `fields`.
    fields: `key_fields`.
    source: 'measured' (on this job's own batches), 'cache' (the cache file's entry) or
      'manifest' (a resumed job's record of the cache entry it started from).
    batches: the batches the measurement took (0 unless measured by this job).
  """

  times: LoopTimes | None
  costs: Costs | None
  key: str
  fields: dict[str, Any]
  source: str
  batches: int = 0

  def to_json(self) -> dict[str, Any]:
    """The manifest's record: the loop times the job started from (None: measured on its own
    batches, which a resume measures again from their records)."""
    return {
      'key': self.key,
      'fields': self.fields,
      'times': None if self.source == 'measured' else self.times.to_json(),
    }

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Calibration:
    """A resumed job's calibration from its manifest's record."""
    if data.get('times') is None:
      return cls(None, None, data['key'], dict(data['fields']), 'measured')
    times = LoopTimes.from_json(data['times'])
    return cls(times, times.costs(), data['key'], dict(data['fields']), 'manifest')


def load(path: str, fields: Mapping[str, Any]) -> Calibration:
  """The cache's entry for `fields`, else a calibration still to be measured (costs None)."""
  key = cache_key(fields)
  entries = _read_cache(path)
  if key in entries:
    times = LoopTimes.from_json(entries[key]['times'])
    return Calibration(times, times.costs(), key, dict(fields), 'cache')
  return Calibration(None, None, key, dict(fields), 'measured')


def store(path: str, times: LoopTimes, calibration: Calibration) -> None:
  """Writes a job's loop times (`times`: those it started from and its own batches', capped at
  CACHE_STEPS loop steps per gamma) and their costs to the cache file under `calibration`'s key
  (an unreadable file: replaced, without a second warning), as its last entry."""
  times = times.capped(CACHE_STEPS)
  entries = _read_cache(path, warn=False)
  entries.pop(calibration.key, None)  # re-stored last: the file's entries stay in write order
  entries[calibration.key] = {
    'fields': calibration.fields,
    'costs': times.costs().to_json(),
    'times': times.to_json(),
    'batches': calibration.batches,
  }
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.write_atomic(
    path, json.dumps({'version': CACHE_VERSION, 'entries': entries}, indent=1) + '\n'
  )
