"""DecodeOptions: the static options of a decode call, as one frozen, hashable value.

A decode loop is compiled once per set of static options (the jit cache key), so they travel
together from the run file to the loop as one object: the job builds it once (e.g.
`InferSettings.decode_options()`), `modes.decode_fns` binds it, the public decode functions pass
it to the jitted loop as one static argument. The run-time values (prompts, sampling values, the
seed, lenience) stay arrays: a new value of one of them never recompiles.

  options = DecodeOptions(max_new_tokens=64, sampling=SamplingConfig(), eos_id=1, gamma=4)
  loops.speculative_decode(target, params, drafter, draft_params, None, options=options,
                           encoder_tokens=tokens, sampling_params=values, rng=0)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from speculative import sampling as sampling_lib


def check_positive_int(name: str, value: Any) -> None:
  if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
    raise ValueError(f'{name} must be an int >= 1, got {value!r}')


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  """The static options of a decode (hashable: a jit static argument; a new value recompiles).

  Attributes:
    max_new_tokens: tokens to generate per row (>= 1).
    sampling: the sampling strategy (greedy, top-k / top-p filters); its values are run-time
      `SamplingParams`.
    eos_id: the stop token, or None.
    gamma: draft tokens per step of a speculative decode (its maximum when the drafter adapts
      it); SpecTr's draft length L. None for the baseline.
    adaptive_verify: a speculative decode feeds the target only 1 + max_b num_drafted[b] tokens
      per step (gamma+1 compiled widths in a lax.switch); False: always gamma+1.
  """

  max_new_tokens: int
  sampling: sampling_lib.SamplingConfig = sampling_lib.SamplingConfig()
  eos_id: int | None = None
  gamma: int | None = None
  adaptive_verify: bool = False

  def __post_init__(self):
    check_positive_int('max_new_tokens', self.max_new_tokens)
    if self.gamma is not None:
      check_positive_int('gamma', self.gamma)
    if not isinstance(self.sampling, sampling_lib.SamplingConfig):
      raise ValueError(f'sampling must be a SamplingConfig, got {type(self.sampling).__name__}')
    if self.eos_id is not None and (
      not isinstance(self.eos_id, (int, np.integer)) or isinstance(self.eos_id, bool)
    ):
      raise ValueError(f'eos_id must be None or an int, got {self.eos_id!r}')
    # Plain Python values, so that equal options hash equal (numpy ints would too, but print worse).
    object.__setattr__(self, 'max_new_tokens', int(self.max_new_tokens))
    object.__setattr__(self, 'gamma', None if self.gamma is None else int(self.gamma))
    object.__setattr__(self, 'eos_id', None if self.eos_id is None else int(self.eos_id))
    object.__setattr__(self, 'adaptive_verify', bool(self.adaptive_verify))

  @classmethod
  def create(cls, options: DecodeOptions | None = None, **fields: Any) -> DecodeOptions:
    """`options` with `fields` replaced, or new options from `fields` (the public decode
    functions' keyword form: `max_new_tokens=64, sampling=..., eos_id=1, gamma=4`)."""
    if options is None:
      return cls(**fields)
    if not isinstance(options, cls):
      raise ValueError(f'options must be a DecodeOptions, got {type(options).__name__}')
    return dataclasses.replace(options, **fields) if fields else options

  def speculative(self) -> DecodeOptions:
    """These options, checked for a speculative decode (gamma set)."""
    if self.gamma is None:
      raise ValueError('a speculative decode needs gamma (an int >= 1)')
    return self
