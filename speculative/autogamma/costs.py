"""What a step costs on the job's own device, batch and decode path: measured once, cached per key.

`GAMMA = 'auto'` needs the seconds of the calls a speculative step makes (docs/batch_jobs.md,
"Gamma 'auto'"): the target's 1-token step t(1) = v(1), its verify call v(T) over T = gamma + 1
tokens for every width the job may use (T = 1..gamma_max + 1), and the draft model's 1-token step
d(1). `measure` times them with the model calls the decode loops make (`speculative.timing`:
chained `extend` calls in one compiled loop), on the job's models and packed weights, at the job's
batch size, input length and cache length, with the cache filled up to POSITION (the keys a
mid-sentence step attends to). The values in the caches do not matter to the time (zeros: no
encoder run, nothing else to compile), only their shapes and the attended positions do.

`load_or_measure` keeps them in a JSON file (default `~/.cache/speculative/calibration.json`, or
under $XDG_CACHE_HOME), one entry per `key`: the device (backend, device kind, CPU model and usable
cores), the decode path, the batch size, the shapes, both models' configs and the loop (drafter,
sampling strategy). A second job with the same key measures nothing. A file that cannot be read as
such a cache is ignored with one warning line and measured afresh. The loops' own steps are
measured by `loop_step_seconds` on the job's compiled decode functions (speculative/infer/
auto_gamma.py calls both).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import time
from typing import Any
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from speculative import timing
from speculative.checkpoints import files

POSITION = 16  # cache positions filled before the timed calls (a mid-sentence step)
CALLS = 4  # chained calls per timing
ROUNDS = 3  # interleaved rounds (every call once per round, the order rotating); the median counts
CACHE_VERSION = 3


def default_cache_file() -> str:
  """`$XDG_CACHE_HOME/speculative/calibration.json` (XDG_CACHE_HOME defaults to ~/.cache)."""
  root = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
  return os.path.join(root, 'speculative', 'calibration.json')


@dataclasses.dataclass(frozen=True)
class Costs:
  """Measured seconds: the model calls a step makes, and two whole loop steps that anchor them.

  The step of the gamma-g loop costs its model calls, C(g) = v(g + 1) + g d(1), plus what the loop
  does besides them (sampling, the acceptance rule, the draft loop's own work, committing tokens).
  That remainder is measured on the job's compiled loops themselves: the plain loop's step c(0),
  and the steps of two speculative loops, gamma 1 (where speculating starts to pay, or not) and
  `ref_gamma`. `step(g)` is c(0) for g = 0; between the two measured speculative loops, the line
  through them against C; outside them, the nearest measured step plus the difference of the
  calls, c(near) + C(g) - C(near) (a slope fitted to two noisy steps a gamma apart would be
  amplified far out).

  Attributes:
    verify: v(T) for T = 1..gamma_max + 1; verify[0] is t(1), the target's 1-token call.
    draft_step: d(1), the draft model's 1-token call; 0.0 for a drafter without a model (prompt
      lookup proposes by a gather, negligible beside a model call).
    plain_loop_step: c(0), seconds per step of the plain loop (None: not measured, v(1) is used).
    ref_gamma: the gamma of the measured speculative loop (None: not measured).
    ref_loop_step: c(ref_gamma), seconds per step of that loop.
    one_loop_step: c(1), seconds per step of the gamma-1 loop (None: not measured).
  """

  verify: tuple[float, ...]
  draft_step: float
  plain_loop_step: float | None = None
  ref_gamma: int | None = None
  ref_loop_step: float | None = None
  one_loop_step: float | None = None

  def __post_init__(self):
    if len(self.verify) < 2 or not all(v > 0 for v in self.verify) or self.draft_step < 0:
      raise ValueError(f'costs need v(1), v(2), ... > 0 and d(1) >= 0, got {self}')
    if (self.ref_gamma is None) != (self.ref_loop_step is None) or (
      self.ref_gamma is not None and not 1 <= self.ref_gamma <= self.gamma_max
    ):
      raise ValueError(f'ref_gamma and ref_loop_step come together, gamma in 1..max: {self}')

  @property
  def gamma_max(self) -> int:
    return len(self.verify) - 1

  def calls(self, gamma: int) -> float:
    """C(gamma): the model calls of one step, v(gamma + 1) + gamma d(1) (v(1) for gamma 0)."""
    return self.verify[gamma] + gamma * self.draft_step

  def step(self, gamma: int) -> float:
    """Seconds per step of the gamma loop (the class docstring); > 0."""
    if gamma == 0:
      return self.plain_loop_step or self.verify[0]
    anchors = {}
    if self.one_loop_step is not None:
      anchors[1] = self.one_loop_step
    if self.ref_gamma is not None:
      anchors[self.ref_gamma] = self.ref_loop_step
    if not anchors:
      return self.calls(gamma)
    (g1, c1), (g2, c2) = sorted(anchors.items())[0], sorted(anchors.items())[-1]
    span = self.calls(g2) - self.calls(g1)
    if g1 < gamma < g2 and span > 0:  # between the measured loops: on the line through them
      return max(c1 + (c2 - c1) * (self.calls(gamma) - self.calls(g1)) / span, 1e-9)
    near, c_near = (g1, c1) if gamma <= g1 else (g2, c2)  # outside: the nearest, plus the calls
    return max(c_near + self.calls(gamma) - self.calls(near), 1e-9)

  def to_json(self) -> dict[str, Any]:
    ms = lambda seconds: None if seconds is None else round(seconds * 1e3, 6)  # noqa: E731
    return {
      'verify_ms': [ms(v) for v in self.verify],
      'draft_step_ms': ms(self.draft_step),
      'plain_loop_step_ms': ms(self.plain_loop_step),
      'ref_gamma': self.ref_gamma,
      'ref_loop_step_ms': ms(self.ref_loop_step),
      'one_loop_step_ms': ms(self.one_loop_step),
    }

  @classmethod
  def from_json(cls, data: Mapping[str, Any]) -> Costs:
    seconds = lambda ms: None if ms is None else float(ms) / 1e3  # noqa: E731
    return cls(
      verify=tuple(float(v) / 1e3 for v in data['verify_ms']),
      draft_step=float(data['draft_step_ms']) / 1e3,
      plain_loop_step=seconds(data.get('plain_loop_step_ms')),
      ref_gamma=data.get('ref_gamma'),
      ref_loop_step=seconds(data.get('ref_loop_step_ms')),
      one_loop_step=seconds(data.get('one_loop_step_ms')),
    )


def _zero_cache(model, params, batch: int, max_length: int, encoder_length: int):
  """A cache of `model`'s shapes and dtypes, all zeros (no encoder run, nothing compiled)."""
  shapes = jax.eval_shape(
    lambda: model.init_cache(
      params, batch, max_length, jnp.ones((batch, encoder_length), jnp.int32)
    )
  )
  return jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


def measure(
  target,
  target_params,
  draft,
  draft_params,
  *,
  batch: int,
  encoder_length: int,
  max_length: int,
  gamma_max: int,
) -> Costs:
  """v(1..gamma_max+1) of `target` and d(1) of `draft` (None: no draft model), each the fastest of
  ROUNDS interleaved rounds of CALLS chained calls; every call compiled first, in parallel."""
  start = jnp.full((batch,), POSITION, jnp.int32)  # [B]
  calls = {}  # name -> (compiled repeat_extend, its arguments)
  models = [('target', target, target_params, range(1, gamma_max + 2))]
  if draft is not None:
    models.append(('draft', draft, draft_params, (1,)))
  for name, model, params, widths in models:
    cache = _zero_cache(model, params, batch, max_length, encoder_length)
    for width in widths:
      args = (params, cache, jnp.ones((batch, width), jnp.int32), start)  # tokens [B, width]
      lowered = timing.repeat_extend.lower(*args, jnp.int32(CALLS), model=model)
      calls[(name, width)] = (lowered, args)
  with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
    compiled = dict(zip(calls, pool.map(lambda item: item[0].compile(), calls.values())))
  runs = {
    key: (lambda fn, args: lambda: fn(*args, jnp.int32(CALLS)))(compiled[key], calls[key][1])
    for key in calls
  }
  for run in runs.values():  # warm: first execution
    timing.timed(run)
  seconds: dict[Any, list[float]] = {key: [] for key in runs}
  keys = list(runs)
  for r in range(ROUNDS):
    shift = r % len(keys)
    for key in keys[shift:] + keys[:shift]:
      seconds[key].append(timing.timed(runs[key])[0] / CALLS)
  # The fastest round: load on a shared machine only ever adds time. A wider call never costs
  # less than a narrower one, so v(T) is made non-decreasing (a noisy dip is lifted to its left).
  best = {key: float(np.min(s)) for key, s in seconds.items()}
  verify = np.maximum.accumulate([best[('target', w)] for w in range(1, gamma_max + 2)])
  return Costs(
    verify=tuple(float(v) for v in verify),
    draft_step=best[('draft', 1)] if draft is not None else 0.0,
  )


LOOP_ROUNDS = 3  # at most; fewer where one round already takes LOOP_BUDGET_SECONDS
LOOP_BUDGET_SECONDS = 1.0


def loop_step_seconds(
  decode_fns: Mapping[Any, Any], encoder_tokens, rng
) -> dict[Any, float | None]:
  """Seconds per step of compiled decode loops, {name: decode_fn(encoder_tokens, rng,
  max_steps=n)} (the modes' functions), on a whole batch: the decode to its end, less what a call
  pays once (the encoder, the prefill, dispatch: the same call stopped before its first step,
  `max_steps=0`), over the loop steps it ran (its rows' most target calls). The whole decode, not a
  few early steps: a step's cost moves as the rows spread (ragged lengths, finished rows riding
  along). The loops and the two runs interleave, the fastest of up to LOOP_ROUNDS rounds counts
  (fewer once LOOP_BUDGET_SECONDS are spent). None for a loop that ran fewer than 2 steps."""
  names = list(decode_fns)
  for name in names:  # compile and warm (max_steps is a run-time value: one program)
    jax.block_until_ready(decode_fns[name](encoder_tokens, rng, max_steps=0))
  times = {(name, n): [] for name in names for n in (0, None)}
  steps = {}
  start = time.perf_counter()
  for r in range(LOOP_ROUNDS):
    if r and time.perf_counter() - start > LOOP_BUDGET_SECONDS:
      break
    for name in names[r % len(names) :] + names[: r % len(names)]:
      for n in (0, None):
        seconds, result = timing.timed(
          lambda: decode_fns[name](encoder_tokens, rng, max_steps=n)  # noqa: B023
        )
        times[(name, n)].append(seconds)
        if n is None:
          steps[name] = int(np.max(np.asarray(result.metrics.target_calls)))
  return {
    name: max(min(times[(name, None)]) - min(times[(name, 0)]), 1e-9) / steps[name]
    if steps[name] >= 2
    else None
    for name in names
  }


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
  """What the costs depend on: the device, the decode path, the shapes, the models and the loop
  (`loop`: what else shapes its step: the drafter, the sampling strategy)."""
  device = jax.devices()[0]
  return {
    'backend': jax.default_backend(),
    'device_kind': device.device_kind,
    'cpu': _cpu_model(),
    'usable_cores': len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None,
    'jax': jax.__version__,
    'decode_path': decode_path,
    'batch_size': batch,
    'encoder_length': encoder_length,
    'max_length': max_length,
    'gamma_max': gamma_max,
    'position': POSITION,
    'target_config': dict(target_config),
    'draft_config': None if draft_config is None else dict(draft_config),
    'loop': loop,
  }


def cache_key(fields: Mapping[str, Any]) -> str:
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


def _cpu_model() -> str | None:
  try:
    with open('/proc/cpuinfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('model name'):
          return line.split(':', 1)[1].strip()
  except OSError:
    pass
  return None


def check_cache_file(path: str) -> None:
  """PermissionError naming `path` unless the cache file can be written there (its directory is
  created if needed); run before any model loads."""
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
  except OSError as e:
    raise PermissionError(
      f'calibration cache {path}: cannot create {directory}: {e.strerror}'
    ) from e
  if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
    raise PermissionError(f'calibration cache {path} is not writable')


def _read_cache(path: str) -> dict[str, Any]:
  """The cache's entries ({} if there is no file); a file that is not a cache: one warning line."""
  if not os.path.exists(path):
    return {}
  try:
    with open(path, encoding='utf-8') as f:
      data = json.load(f)
    entries = data['entries']
    if data.get('version') != CACHE_VERSION or not isinstance(entries, dict):
      raise ValueError('not a calibration cache of this version')
    for entry in entries.values():
      Costs.from_json(entry['costs'])
    return entries
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    logging.warning('calibration cache %s is unreadable (%s); measuring afresh', path, e)
    return {}


def find_costs(path: str, **match: Any) -> Costs | None:
  """The costs of the cache file's most recent entry whose key fields equal `match` (e.g.
  backend, device_kind, batch_size, target_config, draft_config) and whose decode path is XLA's
  dot; None if there is none (or no readable cache). For the T5X adapter, which cannot time
  inside T5X's jitted predict function and reads what a job measured."""
  found = None
  for entry in _read_cache(path).values():
    fields = entry.get('fields', {})
    if str(fields.get('decode_path', '')).startswith('XLA') and all(
      json.loads(json.dumps(fields.get(k))) == json.loads(json.dumps(v)) for k, v in match.items()
    ):
      found = Costs.from_json(entry['costs'])
  return found


@dataclasses.dataclass(frozen=True)
class Calibration:
  """The costs a job used and where they came from.

  Attributes:
    costs: the measured costs.
    key: `cache_key` of `fields`.
    fields: `key_fields`.
    source: 'measured', 'cache' (the cache file's entry) or 'manifest' (a resumed job's record).
    seconds: the time it took this job (0 unless measured; compiles included).
    measured_seconds: the time of the measurement that produced the costs.
  """

  costs: Costs
  key: str
  fields: dict[str, Any]
  source: str
  seconds: float
  measured_seconds: float

  def to_json(self) -> dict[str, Any]:
    """The manifest's record (what a resume reuses)."""
    return {
      'key': self.key,
      'fields': self.fields,
      'costs': self.costs.to_json(),
      'measured_seconds': self.measured_seconds,
    }

  @classmethod
  def from_json(cls, data: Mapping[str, Any], source: str) -> Calibration:
    return cls(
      costs=Costs.from_json(data['costs']),
      key=data['key'],
      fields=dict(data['fields']),
      source=source,
      seconds=0.0,
      measured_seconds=float(data['measured_seconds']),
    )


def load_or_measure(path: str, fields: Mapping[str, Any], measure_fn) -> Calibration:
  """The cache's entry for `fields`, else `measure_fn()` timed and written to the cache file."""
  key = cache_key(fields)
  entries = _read_cache(path)
  if key in entries:
    return Calibration.from_json(entries[key], 'cache')
  start = time.perf_counter()
  costs = measure_fn()
  seconds = time.perf_counter() - start
  calibration = Calibration(costs, key, dict(fields), 'measured', seconds, seconds)
  entries[key] = calibration.to_json()
  files.write_atomic(
    path, json.dumps({'version': CACHE_VERSION, 'entries': entries}, indent=1) + '\n'
  )
  return calibration
