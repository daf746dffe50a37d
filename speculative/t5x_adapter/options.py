"""T5X vocabulary of the adapter, without t5x: network sizes and `decoder_params` resolution.

Two small concerns that the T5X model class (`speculative.t5x_adapter.models`) needs but that do not
themselves need t5x, so they are testable (and usable) anywhere:

* **Network shapes.** `T5_1_1_SIZES` holds the T5 1.1 shapes of T5X's `t5x/examples/t5/t5_1_1/
  <size>.gin` files (docs/design.md section 3); `to_t5_config` turns a T5X `network.T5Config` (or any object
  with the same fields) into our `T5Config`; `draft_config` builds the draft's config from a size name
  (the gin macro `DRAFT_SIZE`), inheriting vocabulary, dtype and dropout from the target.

* **Decoder params.** Stock T5X forwards `decoder_params` to `decoding.temperature_sample`, whose
  keyword defaults are `temperature=1.0, topk=1, topp=0.0`: topk=1 makes even temperature 1 greedy,
  temperature <= 1e-4 (`MIN_TEMPERATURE`) is greedy whatever topk/topp say, topk=0 and topp=0.0 mean
  "no filter", and a non-zero topk together with a non-zero topp is an error. `resolve_decoder_params`
  applies exactly these rules and returns our static `SamplingConfig` plus run-time `SamplingParams`,
  the static `gamma`, `eos_id`, `max_decode_steps`, the method ('speculative' or 'spectr', with
  SpecTr's `num_drafts` K) and the decode RNG.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from speculative import sampling as sampling_lib
from speculative.models import t5 as t5_lib

# (emb_dim, num_heads, num_encoder_layers, num_decoder_layers, head_dim, mlp_dim), as in T5X's
# t5x/examples/t5/t5_1_1/<size>.gin (vocab 32128, gated GELU for all of them).
T5_1_1_SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
  'tiny': (8, 4, 2, 2, 3, 16),
  'small': (512, 6, 8, 8, 64, 1024),
  'base': (768, 12, 12, 12, 64, 2048),
  'large': (1024, 16, 24, 24, 64, 2816),
  'xl': (2048, 32, 24, 24, 64, 5120),
  'xxl': (4096, 64, 24, 24, 64, 10240),
}

# T5X's `decoding.MIN_TEMPERATURE`: at or below it `temperature_sample` decodes greedily.
T5X_MIN_TEMPERATURE = 1e-4

# decoder_params keys that stock T5X decoding accepts but speculative decoding cannot honour.
_UNSUPPORTED_DECODER_PARAMS = (
  'max_decode_steps_hard_limit',
  'rescale_log_probs',
  'state_callback_fn',
  'logit_callback_fn',
  'alpha',
  'cache_offset',
)
_SUPPORTED_DECODER_PARAMS = (
  'temperature',
  'topk',
  'topp',
  'gamma',
  'decode_rng',
  'eos_id',
  'max_decode_steps',
  'method',
  'num_drafts',
)
# The decode methods: one draft a step, or SpecTr's K i.i.d. drafts of gamma tokens (K in 1..8).
METHODS = ('speculative', 'spectr')
AUTO = 'auto'  # gamma chosen from measured costs (speculative/autogamma/)
NUM_DRAFTS_RANGE = (1, 8)


def _dtype_name(dtype: Any) -> str:
  return jnp.dtype(dtype).name


def to_t5_config(config: Any, **overrides: Any) -> t5_lib.T5Config:
  """Our `T5Config` from a T5X `network.T5Config` (or ours, or any object with those fields).

  Args:
    config: the source config; missing optional fields take our defaults.
    **overrides: field values that replace the source's (e.g. dtype='float32').
  """
  if isinstance(config, t5_lib.T5Config) and not overrides:
    return config
  if isinstance(config, Mapping):
    get = lambda name: config[name]  # noqa: E731
    has = lambda name: name in config  # noqa: E731
  else:
    get = lambda name: getattr(config, name)  # noqa: E731
    has = lambda name: hasattr(config, name)  # noqa: E731
  if not has('vocab_size'):
    raise ValueError(f'not a T5 config (no vocab_size field): {config!r}')
  fields = {f.name for f in dataclasses.fields(t5_lib.T5Config)}
  values = {name: get(name) for name in fields if has(name)}
  values.update(overrides)
  if 'dtype' in values:
    values['dtype'] = _dtype_name(values['dtype'])
  return t5_lib.T5Config(**values)


def draft_config(
  target_config: t5_lib.T5Config, size: str | None = None, config: Any = None
) -> t5_lib.T5Config:
  """The draft network's config: an explicit `config`, or the T5 1.1 shape called `size`.

  A size-built draft inherits the target's vocab_size, dtype, dropout_rate, activations and
  attention options; an explicit config is converted with `to_t5_config` and must share the target's
  vocabulary size.
  """
  if (size is None) == (config is None):
    raise ValueError(
      'give exactly one of draft size (e.g. DRAFT_SIZE = "small") and draft config; '
      f'got size={size!r}, config={config!r}'
    )
  if config is not None:
    result = to_t5_config(config)
  else:
    if not isinstance(size, str) or size.lower() not in T5_1_1_SIZES:
      raise ValueError(f'unknown draft size {size!r}; expected one of {sorted(T5_1_1_SIZES)}')
    emb, heads, enc_layers, dec_layers, head_dim, mlp = T5_1_1_SIZES[size.lower()]
    result = dataclasses.replace(
      target_config,
      emb_dim=emb,
      num_heads=heads,
      num_encoder_layers=enc_layers,
      num_decoder_layers=dec_layers,
      head_dim=head_dim,
      mlp_dim=mlp,
    )
  if result.vocab_size != target_config.vocab_size:
    raise ValueError(
      f'draft and target vocabularies differ: draft vocab_size {result.vocab_size} '
      f'!= target vocab_size {target_config.vocab_size}'
    )
  return result


# ----------------------------------------------------------------------------------------------
# decoder_params.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  """Everything one `predict_batch_with_aux` call decodes with.

  Attributes:
    gamma: draft tokens per speculative step (static), or 'auto' (the model chooses it per batch
      size from measured costs: `SpeculativeEncoderDecoderModel`).
    sampling: static sampling strategy.
    sampling_params: run-time temperature / top-k / top-p values ([] arrays).
    eos_id: stop token (static).
    max_decode_steps: cap on generated tokens (static) or None for the full decoder length.
    decode_rng: PRNG key (or None: the caller's `rng`, else PRNGKey(0), as in T5X).
    method: 'speculative' (one draft a step) or 'spectr' (K drafts of gamma tokens; static).
    num_drafts: K (static; 1 with 'speculative').
  """

  gamma: int | str
  sampling: sampling_lib.SamplingConfig
  sampling_params: sampling_lib.SamplingParams
  eos_id: int
  max_decode_steps: int | None
  decode_rng: Any
  method: str = 'speculative'
  num_drafts: int = 1


def _is_traced(x: Any) -> bool:
  return isinstance(x, jax.core.Tracer)


def _static_int(name: str, value: Any, minimum: int) -> int:
  if _is_traced(value):
    raise ValueError(
      f'decoder_params[{name!r}] must be a Python int (it fixes shapes and is '
      f'compiled in), got a traced array'
    )
  try:
    exact = not isinstance(value, (bool, np.bool_)) and np.ndim(value) == 0 and int(value) == value
  except (TypeError, ValueError, OverflowError):  # None, a string, inf
    exact = False
  if not exact:
    hint = " or 'auto'" if name == 'gamma' else ''
    raise ValueError(f'decoder_params[{name!r}] must be an int{hint}, got {value!r}')
  if int(value) < minimum:
    raise ValueError(f'decoder_params[{name!r}] must be >= {minimum}, got {value!r}')
  return int(value)


def _scalar(name: str, value: Any) -> Any:
  if np.ndim(value) != 0:
    raise ValueError(
      f'decoder_params[{name!r}] must be a scalar; per-example values (shape '
      f'{np.shape(value)}) are not supported by speculative decoding'
    )
  return value


def resolve_decoder_params(
  decoder_params: Mapping[str, Any] | None,
  *,
  gamma: int | str,
  temperature: float = 1.0,
  topk: int = 1,
  topp: float = 0.0,
  eos_id: int = 1,
  method: str = 'speculative',
  num_drafts: int = 1,
) -> DecodeOptions:
  """Merges per-call `decoder_params` over the model's defaults, with T5X's semantics.

  Args:
    decoder_params: T5X-style overrides: temperature, topk, topp, gamma, decode_rng, eos_id,
      max_decode_steps, method, num_drafts. Other keys raise a ValueError naming them.
    gamma, temperature, topk, topp, eos_id: the model's defaults (T5X's defaults for the three
      sampling knobs are 1.0, 1, 0.0, i.e. greedy).

  Returns:
    DecodeOptions. Concrete values give the minimal static strategy (greedy when T5X would be
    greedy: temperature <= 1e-4 or topk == 1); traced values give the generic top-k + top-p
    strategy whose run-time values reproduce the same rules, so nothing recompiles.
  """
  params = dict(decoder_params or {})
  _check_keys(params)
  gamma = params.get('gamma', gamma)
  gamma = AUTO if isinstance(gamma, str) and gamma == AUTO else _static_int('gamma', gamma, 1)
  eos_id = _static_int('eos_id', params.get('eos_id', eos_id), 0)
  max_steps = params.get('max_decode_steps')
  max_steps = None if max_steps is None else _static_int('max_decode_steps', max_steps, 1)
  temperature = _scalar('temperature', params.get('temperature', temperature))
  topk = _scalar('topk', params.get('topk', topk))
  topp = _scalar('topp', params.get('topp', topp))
  if any(_is_traced(v) for v in (temperature, topk, topp)):
    sampling, sampling_params = _traced_sampling(temperature, topk, topp)
  else:
    topk = _static_int('topk', topk, 0)  # 2.7 is not a top-k (T5X's topk is an int)
    sampling, sampling_params = _static_sampling(float(temperature), topk, float(topp))
  method, num_drafts = check_method(
    params.get('method', method), params.get('num_drafts', num_drafts), sampling
  )
  if gamma == AUTO and method == 'spectr':
    raise ValueError(
      "gamma = 'auto' chooses one draft's length; with method = 'spectr' give an int"
    )
  return DecodeOptions(
    gamma=gamma,
    sampling=sampling,
    sampling_params=sampling_params,
    eos_id=eos_id,
    max_decode_steps=max_steps,
    decode_rng=params.get('decode_rng'),
    method=method,
    num_drafts=num_drafts,
  )


def check_method(
  method: Any, num_drafts: Any, sampling: sampling_lib.SamplingConfig | None = None
) -> tuple[str, int]:
  """(method, K), checked: a method of METHODS, K an int in NUM_DRAFTS_RANGE, K = 1 with
  'speculative', and SpecTr under sampling only (`sampling` greedy: its K drafts would be the same
  argmax draft, and SpecTr speculative decoding with K-fold work). ValueError naming the problem."""
  if _is_traced(method) or method not in METHODS:
    raise ValueError(f'method must be one of {METHODS}, got {method!r}')
  low, high = NUM_DRAFTS_RANGE
  num_drafts = _static_int('num_drafts', num_drafts, low)
  if num_drafts > high:
    raise ValueError(f"decoder_params['num_drafts'] must be <= {high}, got {num_drafts}")
  if method == 'speculative' and num_drafts != 1:
    raise ValueError(f"num_drafts = {num_drafts} needs method = 'spectr' (K drafts a step)")
  if method == 'spectr' and sampling is not None and sampling.greedy:
    raise ValueError(
      "method = 'spectr' needs sampling (temperature > 1e-4 and topk != 1): greedy drafts are "
      "K copies of one argmax draft, i.e. speculative decoding; use method = 'speculative'"
    )
  return method, num_drafts


def _check_keys(params: Mapping[str, Any]) -> None:
  """ValueError naming the decoder_params keys that are unsupported or unknown."""
  unsupported = sorted(k for k in params if k in _UNSUPPORTED_DECODER_PARAMS)
  if unsupported:
    raise ValueError(
      f'decoder_params {unsupported} are not supported by speculative decoding '
      f'(supported: {list(_SUPPORTED_DECODER_PARAMS)})'
    )
  unknown = sorted(k for k in params if k not in _SUPPORTED_DECODER_PARAMS)
  if unknown:
    raise ValueError(
      f'unknown decoder_params {unknown}; supported: {list(_SUPPORTED_DECODER_PARAMS)}'
    )


def _static_sampling(
  temperature: float, topk: int, topp: float
) -> tuple[sampling_lib.SamplingConfig, sampling_lib.SamplingParams]:
  """Concrete values, checked: the minimal static strategy with T5X's rules (greedy at or below
  `T5X_MIN_TEMPERATURE` or with topk == 1)."""
  if not np.isfinite(temperature) or temperature < 0:
    raise ValueError(f'temperature must be a finite number >= 0, got {temperature}')
  if topk < 0:
    raise ValueError(f'topk must be >= 0 (0 = no top-k filter), got {topk}')
  if not 0.0 <= topp <= 1.0:
    raise ValueError(f'topp must be in [0, 1] (0 = no nucleus filter), got {topp}')
  if topk and topp:
    raise ValueError(
      f'at most one of topk ({topk}) and topp ({topp}) may be non-zero (as in '
      'T5X temperature_sample)'
    )
  if temperature <= T5X_MIN_TEMPERATURE or topk == 1:
    # T5X: greedy below MIN_TEMPERATURE; top-1 sampling is argmax.
    return sampling_lib.SamplingConfig(greedy=True), sampling_lib.SamplingParams.create(0.0)
  return (
    sampling_lib.SamplingConfig(top_k=topk > 0, top_p=topp > 0),
    sampling_lib.SamplingParams.create(temperature, topk, topp or 1.0),
  )


def _traced_sampling(
  temperature: Any, topk: Any, topp: Any
) -> tuple[sampling_lib.SamplingConfig, sampling_lib.SamplingParams]:
  """Traced values: one generic strategy (top-k + top-p); the T5X rules become run-time selects."""
  temperature = jnp.asarray(temperature, jnp.float32)
  topk = jnp.asarray(topk, jnp.int32)
  topp = jnp.asarray(topp, jnp.float32)
  greedy = (temperature <= T5X_MIN_TEMPERATURE) | (topk == 1)
  return sampling_lib.SamplingConfig(top_k=True, top_p=True), sampling_lib.SamplingParams(
    temperature=jnp.where(greedy, 0.0, temperature),
    top_k=jnp.maximum(topk, 0),
    top_p=jnp.where(topp > 0, jnp.minimum(topp, 1.0), 1.0),
  )
