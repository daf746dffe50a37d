"""`SpeculativeEncoderDecoderModel`: a T5X `EncoderDecoderModel` that decodes speculatively.

Imports t5x (only `speculative.t5x_adapter` ever does). A T5X user switches a stock inference or eval
run to speculative decoding by swapping `MODEL` in gin (see `configs/t5x/speculative.gin`):

  MODEL = @t5x_adapter.SpeculativeEncoderDecoderModel()      # instead of @models.EncoderDecoderModel()
  t5x_adapter.SpeculativeEncoderDecoderModel:
    module = @network.Transformer()     # unchanged: its network.T5Config (t5_1_1/<size>.gin) is read
    draft_size = %DRAFT_SIZE            # 'small' | 'base' | 'large' | ... (T5 1.1 shapes)
    gamma = %GAMMA
    temperature = %TEMPERATURE          # T5X temperature_sample semantics (see `options`)
    ...
  utils.RestoreCheckpointConfig.state_transformation_fns = [@t5x_adapter.add_draft_checkpoint]
  t5x_adapter.add_draft_checkpoint.path = %DRAFT_CHECKPOINT_PATH

What the model does:
  * The network is `speculative.models.t5.T5` (wrapped as `T5XTransformer`, a Flax module with T5X's
    `network.Transformer` call signatures). Its parameter tree is T5X's, so the stock target
    checkpoint restores into it unchanged; the model only reads the shapes from the `module` it is
    given (a stock `network.Transformer`, or its `network.T5Config`).
  * The parameter tree gains a `'draft'` subtree (the draft T5, T5X logical axis names), filled at
    restore time by `draft_checkpoint.add_draft_checkpoint`; T5X's partitioner shards and passes it
    like the target's (see `draft_checkpoint` for why it should not be a closure). Called directly with a
    target-only tree, the model loads `draft_checkpoint_path` itself.
  * `predict_batch_with_aux` runs `speculative.decode.loops.speculative_decode` (target cache and draft
    cache, gamma drafts per target call) and returns T5X's `(decodes [B, L], {'scores': [B]})`, plus
    per-example speculative metrics in aux: num_tokens, target_calls, drafted, accepted, alpha_sum,
    alpha, acceptance_rate, block_efficiency, invalid (and the exactness check's verdicts with
    `check_exactness=True`, see `exactness`). With `method='spectr'` it runs SpecTr instead
    (`speculative.decode.spectr_loop.spectr_decode`, `num_drafts` K i.i.d. drafts of gamma = L
    tokens a step; sampling only), and aux also holds num_drafts, draft_length, selections,
    single_alpha_sum and alpha_one_draft (alpha is then alpha_sum / selections, the acceptance
    with K drafts, beside alpha_one_draft = single_alpha_sum / selections). `decoder_params`
    (temperature, topk, topp, gamma, decode_rng, eos_id, max_decode_steps, method, num_drafts)
    override the model's defaults per call with T5X's semantics; `num_decodes`, `return_all_decodes` (sorted by score, ascending) and
    `prompt_with_targets` behave as with `decoding.temperature_sample`.
  * `scores` are the target's log-probabilities of the generated tokens under the standardized
    (temperature / top-k / top-p) distribution, like temperature_sample's `rescale_log_probs=True`
    (0 for greedy). They cost one extra teacher-forced target forward per batch (skipped for greedy
    or with `compute_scores=False`).
  * Training, eval loss and `score_batch` run the target's full forward; packed examples are not
    supported.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any
from typing import Callable
from typing import Mapping
from typing import MutableMapping

from absl import logging
import flax
from flax.linen import partitioning as flax_partitioning
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import seqio
from t5x import models as t5x_models  # first: without t5x, fail before the slow imports

from speculative import checkpoints
from speculative import drafters
from speculative import sampling as sampling_lib
from speculative.autogamma import costs as costs_lib
from speculative.autogamma import policy
from speculative.decode import loops as decoding
from speculative.decode import spectr_loop
from speculative.models import t5 as t5_lib
from speculative.t5x_adapter import draft_checkpoint
from speculative.t5x_adapter import exactness
from speculative.t5x_adapter import options as options_lib
from speculative.t5x_adapter import rows as rows_lib

Array = jax.Array
PyTree = Any

DRAFT_KEY = draft_checkpoint.DRAFT_KEY
# The acceptance GAMMA = 'auto' assumes (configs/t5x/speculative.gin's EXPECTED_ALPHA too): a jitted
# predict function observes none, so unlike a job, whose prior gives way to what it observes, the
# adapter decides on this value alone.
EXPECTED_ALPHA = 0.8
# Closed-over draft params above this size get a warning (they become compile-time constants).
_CLOSURE_WARN_BYTES = 64 * 1024 * 1024
_PACKING_KEYS = (
  'encoder_segment_ids',
  'decoder_segment_ids',
  'encoder_positions',
  'decoder_positions',
)


def _reject_packing(**features: Any) -> None:
  given = sorted(name for name, value in features.items() if value is not None)
  if given:
    raise ValueError(
      f'packed examples are not supported by the speculative T5 network (got '
      f'{given}); set DatasetConfig.pack = False'
    )


class T5XTransformer(t5_lib.Transformer):
  """Our T5 (`speculative.models.t5.Transformer`) behind T5X's `network.Transformer` signatures.

  Same parameter tree as T5X's network; `decode=True` (T5X's single-token cache) is not provided:
  decoding goes through `SpeculativeEncoderDecoderModel.predict_batch_with_aux`.
  """

  def encode(
    self,
    encoder_input_tokens: Array,
    encoder_segment_ids: Array | None = None,
    enable_dropout: bool = True,
  ) -> Array:
    _reject_packing(encoder_segment_ids=encoder_segment_ids)
    return super().encode(encoder_input_tokens, deterministic=not enable_dropout)

  def __call__(
    self,
    encoder_input_tokens: Array,
    decoder_input_tokens: Array,
    decoder_target_tokens: Array | None = None,
    encoder_segment_ids: Array | None = None,
    decoder_segment_ids: Array | None = None,
    encoder_positions: Array | None = None,
    decoder_positions: Array | None = None,
    *,
    enable_dropout: bool = True,
    decode: bool = False,
    max_decode_length: int | None = None,
  ) -> Array:
    del max_decode_length
    _reject_packing(
      encoder_segment_ids=encoder_segment_ids,
      decoder_segment_ids=decoder_segment_ids,
      encoder_positions=encoder_positions,
      decoder_positions=decoder_positions,
    )
    if decode:
      raise NotImplementedError(
        'T5XTransformer has no single-token decode mode; decode with '
        'SpeculativeEncoderDecoderModel.predict_batch_with_aux'
      )
    return super().__call__(
      encoder_input_tokens,
      decoder_input_tokens,
      decoder_target_tokens,
      deterministic=not enable_dropout,
    )


def t5x_network(config: Any) -> T5XTransformer:
  """A `T5XTransformer` from a T5X `network.T5Config` (or ours): `module = @t5x_network()` in gin."""
  return T5XTransformer(options_lib.to_t5_config(config))


def _params_axes(logical_axes: PyTree) -> dict:
  """Flax `params_axes` collection (`<name>_axes` = AxisMetadata) from PartitionSpec leaves."""
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(logical_axes))
  return flax.traverse_util.unflatten_dict(
    {
      path[:-1] + (path[-1] + '_axes',): flax_partitioning.AxisMetadata(names=tuple(spec))
      for path, spec in flat.items()
    }
  )


def _tree_bytes(tree: PyTree) -> int:
  return sum(
    int(np.prod(np.shape(x))) * np.dtype(x.dtype).itemsize for x in jax.tree_util.tree_leaves(tree)
  )


def _corpus_free_drafter(name: str, target: t5_lib.T5, draft: t5_lib.T5) -> Any:
  """The registry's drafter `name` over the draft model; drafters that estimate tables from a
  training corpus cannot be built inside a T5X model (ValueError)."""
  if drafters.needs_corpus(name):
    raise ValueError(
      f'drafter {name!r} estimates tables from a corpus; the T5X adapter takes '
      f"one of {[n for n in drafters.DRAFTERS if not drafters.needs_corpus(n)]}"
    )
  drafter, _ = drafters.build_drafter(name, vocab_size=target.vocab_size, draft_model=draft)
  return drafter


class SpeculativeEncoderDecoderModel(t5x_models.EncoderDecoderModel):
  """T5X encoder-decoder model whose predictions come from speculative decoding (module docstring).

  Args (beyond `t5x.models.EncoderDecoderModel`'s, which keep their meaning):
    module: a stock T5X `network.Transformer` (its `config` gives the target's shapes), a
      `T5XTransformer`, or a T5 config (T5X's or ours).
    draft_size: the draft's T5 1.1 size ('tiny', 'small', 'base', 'large', 'xl', 'xxl'); it
      inherits vocab size, dtype and dropout from the target. Exclusive with `draft_config`.
    draft_config: an explicit draft config (T5X `network.T5Config` or ours).
    draft_checkpoint_path: the draft's weights when `predict_batch_with_aux` is called with
      target-only params (the T5X restore path uses `draft_checkpoint.add_draft_checkpoint`).
    gamma: draft tokens per target call, or 'auto': chosen once per batch size (when T5X traces
      the predict function; a choice inside its jit is not possible) by Theorem 3.8 from the costs a
      `speculative.infer` job with GAMMA = 'auto' measured for these models on this device at that
      batch size on XLA's path (KERNELS = 'off' on a CPU), read from `calibration_file`, at the
      acceptance `expected_alpha`; 0 is plain decoding. aux gains 'gamma'.
    calibration_file: the cost cache (None: `autogamma.costs.default_cache_file()`).
    expected_alpha: the acceptance the 'auto' choice assumes (default EXPECTED_ALPHA, 0.8, as
      configs/t5x/speculative.gin's; no acceptance is observed inside T5X's jitted call).
    drafter: a name of the drafter registry (`speculative.drafters.registry`) that needs no corpus:
      'model' (default), 'prompt_lookup' or 'prompt_lookup+model'; its params are the draft's.
    method: 'speculative' (default; one draft a step) or 'spectr' (SpecTr: `num_drafts` K i.i.d.
      drafts of gamma tokens, one target call over K x (gamma+1) positions; exact; needs sampling
      and drafter 'model', whose draws are i.i.d.).
    num_drafts: K in 1..8 (1 with 'speculative'); K = 1 emits speculative decoding's tokens.
    temperature, topk, topp: default sampling, with T5X `temperature_sample` semantics and defaults
      (1.0, 1, 0.0 = greedy; temperature 1 with topk 0 is exact sampling).
    compute_scores: compute `scores` in aux (one extra target forward unless greedy).
    cache_cross_kv: compute each layer's cross-attention K/V once per input (stock T5X recomputes
      them every step); outputs are identical.
    check_exactness: greedy calls also run the baseline decode on the same rows and audit every
      row that differs (`exactness`; docs/exactness.md): a mismatch raises
      `exactness.ExactnessError`, near-ties are logged, and aux gains 'exactness_verdict' (-1 not
      checked, 0 identical, 1 near-tie, 2 mismatch), 'exactness_position', 'exactness_gap',
      'exactness_deficit' and 'exactness_bound'. Costs a baseline decode per call.
    decode_fn: accepted for signature compatibility with stock gin files and ignored.
  """

  def __init__(
    self,
    module: Any,
    input_vocabulary: seqio.Vocabulary,
    output_vocabulary: seqio.Vocabulary,
    optimizer_def: Any = None,
    decode_fn: Callable[..., Any] | None = None,
    feature_converter_cls: Callable[..., seqio.FeatureConverter] | None = None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    loss_normalizing_factor: Any = None,
    default_decoder_params: t5x_models.DecoderParams | None = None,
    *,
    draft_size: str | None = None,
    draft_config: Any = None,
    draft_checkpoint_path: str | None = None,
    gamma: int | str = 4,
    calibration_file: str | None = None,
    expected_alpha: float = EXPECTED_ALPHA,
    drafter: str = 'model',
    method: str = 'speculative',
    num_drafts: int = 1,
    temperature: float = 1.0,
    topk: int = 1,
    topp: float = 0.0,
    compute_scores: bool = True,
    cache_cross_kv: bool = True,
    check_exactness: bool = False,
  ):
    config_source = getattr(module, 'config', module)
    target_config = options_lib.to_t5_config(config_source)
    self._target = t5_lib.T5(target_config, cache_cross_kv=cache_cross_kv)
    self._draft = t5_lib.T5(
      options_lib.draft_config(target_config, draft_size, draft_config),
      cache_cross_kv=cache_cross_kv,
    )
    self._drafter = _corpus_free_drafter(drafter, self._target, self._draft)
    self._draft_checkpoint_path = draft_checkpoint_path
    self._draft_params: PyTree | None = None
    self._compute_scores = bool(compute_scores)
    self._check_exactness = bool(check_exactness)
    self._drafter_name = drafter
    self._decode_defaults = dict(gamma=gamma, temperature=temperature, topk=topk, topp=topp)
    self._calibration_file = calibration_file or costs_lib.default_cache_file()
    if not 0.0 <= float(expected_alpha) <= 1.0:
      raise ValueError(f'expected_alpha must be in [0, 1], got {expected_alpha!r}')
    self._expected_alpha = float(expected_alpha)
    if method != 'speculative' or num_drafts != 1:  # a one-draft model's defaults stay as before
      self._decode_defaults.update(method=method, num_drafts=num_drafts)
    # Validate the defaults now: a bad gin binding fails at construction, not mid-job. (The
    # vocabulary's eos_id is read at decode time: reading it here would open a gs:// model file.)
    defaults = options_lib.resolve_decoder_params(None, **self._decode_defaults)
    self._check_spectr_drafter(defaults)
    if self._check_exactness and not defaults.sampling.greedy:
      logging.warning(
        'check_exactness applies to greedy decodes only; the default decode samples (%s), so '
        'its aux exactness_verdict is -1 (not checked)',
        self._decode_defaults,
      )
    super().__init__(
      module=T5XTransformer(target_config),
      input_vocabulary=input_vocabulary,
      output_vocabulary=output_vocabulary,
      optimizer_def=optimizer_def,
      decode_fn=decode_fn,
      feature_converter_cls=feature_converter_cls,
      label_smoothing=label_smoothing,
      z_loss=z_loss,
      loss_normalizing_factor=loss_normalizing_factor,
      default_decoder_params=default_decoder_params,
    )

  # -- accessors -------------------------------------------------------------------------------
  @property
  def target(self) -> t5_lib.T5:
    return self._target

  @property
  def draft(self) -> t5_lib.T5:
    return self._draft

  @property
  def gamma(self) -> int | str:
    gamma = self._decode_defaults['gamma']
    return gamma if gamma == options_lib.AUTO else int(gamma)

  @property
  def check_exactness(self) -> bool:
    return self._check_exactness

  @property
  def decode_defaults(self) -> dict[str, Any]:
    """The default gamma / temperature / topk / topp (per-call `decoder_params` override them)."""
    return dict(self._decode_defaults)

  def _check_spectr_drafter(self, opts: options_lib.DecodeOptions) -> None:
    """SpecTr needs i.i.d. drafts: the draft model's; a deterministic drafter is refused."""
    if opts.method == 'spectr' and self._drafter_name != 'model':
      raise ValueError(
        f"method = 'spectr' needs drafter = 'model' (i.i.d. drafts); drafter "
        f'{self._drafter_name!r} is deterministic and would give K identical drafts'
      )

  # -- parameters ------------------------------------------------------------------------------
  def get_initial_variables(
    self, rng: Array, input_shapes: Mapping[str, Any], input_types: Mapping[str, Any] | None = None
  ) -> flax.core.FrozenDict:
    """{'params': target tree + {'draft': draft tree}, 'params_axes': T5X logical axis names}."""
    del input_shapes, input_types  # parameter shapes do not depend on the batch
    target_rng, draft_rng = jax.random.split(rng)
    params = self._target.init_params(target_rng)
    params[DRAFT_KEY] = self._draft.init_params(draft_rng)
    axes = _params_axes(self._target.logical_axes())
    axes[DRAFT_KEY] = _params_axes(self._draft.logical_axes())
    return flax.core.freeze({'params': params, 'params_axes': axes})

  def _load_draft_params(self) -> PyTree:
    if self._draft_params is None:
      if not self._draft_checkpoint_path:
        raise ValueError(
          f"no draft parameters: params has no {DRAFT_KEY!r} subtree (restore with "
          'draft_checkpoint.add_draft_checkpoint) and the model has no '
          'draft_checkpoint_path'
        )
      params = draft_checkpoint.load_draft_params(
        self._draft_checkpoint_path, self._draft.param_shapes()
      )
      self._draft_params = jax.tree_util.tree_map(jnp.asarray, params)
    return self._draft_params

  def split_params(
    self, params: PyTree, *, need_draft: bool = True
  ) -> tuple[PyTree, PyTree | None]:
    """(target params, draft params) from the model's tree (draft loaded if absent and needed)."""
    if DRAFT_KEY in params:
      target = {k: v for k, v in params.items() if k != DRAFT_KEY}
      return target, params[DRAFT_KEY]
    target = dict(params.items())
    if not need_draft:
      return target, None
    draft = self._load_draft_params()
    if isinstance(jax.tree_util.tree_leaves(target)[0], jax.core.Tracer) and (
      _tree_bytes(draft) > _CLOSURE_WARN_BYTES
    ):
      logging.warning(
        'the %d-byte draft params are closed over inside a traced function and become '
        'compile-time constants; put them in the parameter tree instead (restore with '
        'draft_checkpoint.add_draft_checkpoint)',
        _tree_bytes(draft),
      )
    return target, draft

  # -- training / scoring: the target network --------------------------------------------------
  def _compute_logits(
    self,
    params: PyTree,
    batch: Mapping[str, Array],
    dropout_rng: Array | None = None,
    mutable: Any = False,
    other_variables: PyTree | None = None,
  ) -> Array:
    if mutable:
      raise NotImplementedError(
        'intermediates (score_batch(return_intermediates=True)) are not '
        'supported by SpeculativeEncoderDecoderModel'
      )
    del other_variables
    _reject_packing(**{k: batch.get(k) for k in _PACKING_KEYS})
    target_params, _ = self.split_params(params, need_draft=False)
    return self._target.forward(
      target_params,
      batch['encoder_input_tokens'],
      batch['decoder_input_tokens'],
      decoder_target_tokens=batch.get('decoder_target_tokens'),
      dropout_rng=dropout_rng,
    )

  # -- prediction ------------------------------------------------------------------------------
  def predict_batch_with_aux(
    self,
    params: PyTree,
    batch: Mapping[str, Array],
    rng: Array | None = None,
    decoder_params: MutableMapping[str, Any] | None = None,
    return_all_decodes: bool | None = None,
    num_decodes: int | None = None,
    prompt_with_targets: bool = False,
  ) -> tuple[Array, Mapping[str, Array]]:
    """Speculative decoding of a batch, with T5X's inputs and outputs.

    Args:
      params: the model's parameters (target tree, plus 'draft' when restored through T5X).
      batch: 'encoder_input_tokens' [B, S] and 'decoder_input_tokens' [B, L] (L = decode length).
      rng: decode RNG (exclusive with decoder_params['decode_rng']); default PRNGKey(0).
      decoder_params: per-call overrides (see `options.resolve_decoder_params`).
      return_all_decodes: return [B, num_decodes, L] sorted by ascending score.
      num_decodes: independent samples per input.
      prompt_with_targets: continue from `decoder_input_tokens` (EOS stripped) as a prompt; the
        output then starts with the prompt, as in T5X.

    Returns:
      decodes [B, L] int32 (or [B, num_decodes, L]) and aux {'scores': [B], metrics: [B]} (or
      [B, num_decodes]), plus the `exactness.AUX_KEYS` with check_exactness.
    """
    if return_all_decodes is None:
      return_all_decodes = self._default_decoder_params.return_all_decodes
    num_decodes = int(
      self._default_decoder_params.num_decodes if num_decodes is None else num_decodes
    )
    if num_decodes < 1:
      raise ValueError(f'num_decodes must be >= 1, got {num_decodes}')
    opts = self._resolve_options(rng, decoder_params)
    target_params, draft_params = self.split_params(params)
    rows = rows_lib.expand_rows(batch, num_decodes, opts.eos_id, prompt_with_targets)
    decode_len = rows.decoder_input_tokens.shape[1]
    common = rows_lib.decode_args(rows, opts, decode_len)
    if opts.method == 'spectr':
      result = spectr_loop.spectr_decode(
        self._target,
        target_params,
        self._drafter,
        draft_params,
        num_drafts=opts.num_drafts,
        draft_length=opts.gamma,
        **common,
      )
    else:
      gamma = opts.gamma
      if gamma == options_lib.AUTO:
        gamma = self.auto_gamma(rows.encoder_tokens.shape[0])
        opts = dataclasses.replace(opts, gamma=gamma)
      if gamma == 0:  # plain decoding pays most on this device at this batch size
        result = decoding.autoregressive_decode(self._target, target_params, **common)
      else:
        result = decoding.speculative_decode(
          self._target, target_params, self._drafter, draft_params, gamma=gamma, **common
        )
    decodes, num_tokens = rows_lib.t5x_layout(
      result, rows, decode_len, prompt_with_targets
    )  # [B*N, L]
    if self._compute_scores and not opts.sampling.greedy:
      scores = self._scores(
        target_params, rows.encoder_tokens, decodes, rows.prompt_len, num_tokens, opts
      )
    else:  # greedy: log 1 per token, as T5X reports
      scores = jnp.zeros((decodes.shape[0],), jnp.float32)
    aux = rows_lib.metrics_aux(result, scores, num_tokens, opts)  # each [B*N]
    if self._decode_defaults['gamma'] == options_lib.AUTO or (decoder_params or {}).get(
      'gamma'
    ) == (options_lib.AUTO):
      aux['gamma'] = jnp.full((decodes.shape[0],), opts.gamma, jnp.int32)
    if self._check_exactness:
      aux.update(
        self._exactness_aux(target_params, rows, opts, common, decodes, num_tokens, num_decodes)
      )
    return rows_lib.sort_decodes(decodes, aux, num_decodes, bool(return_all_decodes))

  def auto_gamma(self, batch: int) -> int:
    """gamma = 'auto' at `batch` rows: the best gamma (0..the largest measured) at `expected_alpha`
    by the costs measured for these models and this drafter on this machine and device at this
    batch size (the cache file's most recent XLA-path entry); a ValueError naming what to run
    where there is none."""
    device = jax.devices()[0]
    costs = costs_lib.find_costs(
      self._calibration_file,
      drafter=self._drafter_name,
      backend=jax.default_backend(),
      device_kind=device.device_kind,
      batch_size=int(batch),
      target_config=checkpoints.config_dict(self._target.config),
      draft_config=checkpoints.config_dict(self._draft.config),
    )
    if costs is None:
      raise ValueError(
        f"gamma = 'auto': no measured costs for batch {batch} of these target and draft models "
        f'on this {jax.default_backend()} device (XLA path) in {self._calibration_file}; '
        "measure them with a speculative.infer job (GAMMA = 'auto', BATCH_SIZE = "
        f"{batch}, KERNELS = 'off', the same models: configs/runs/infer.gin), which caches them "
        'there, or give an int gamma'
      )
    return policy.best_gamma(costs, self._expected_alpha)

  def _exactness_aux(
    self,
    target_params: PyTree,
    rows: rows_lib.ExpandedRows,
    opts: options_lib.DecodeOptions,
    common: dict[str, Any],
    decodes: Array,
    num_tokens: Array,
    num_decodes: int,
  ) -> dict[str, Array]:
    """check_exactness: the baseline decode of the same rows and the audit of every row whose
    greedy output differs (raises on a mismatch); verdict -1 for sampled decodes."""
    if not opts.sampling.greedy:
      return exactness.not_checked_aux(decodes.shape[0])
    baseline = decoding.autoregressive_decode(self._target, target_params, **common)
    prompt_with_targets = rows.prompt_tokens is not None
    baseline_decodes, baseline_tokens = rows_lib.t5x_layout(
      baseline, rows, decodes.shape[1], prompt_with_targets
    )
    aux = exactness.exactness_aux(
      self._target,
      target_params,
      rows.encoder_tokens,
      baseline_decodes,
      baseline_tokens,
      decodes,
      num_tokens,
      offsets=rows.prompt_len,
    )
    return exactness.enforce(aux, num_decodes)

  def _resolve_options(
    self, rng: Array | None, decoder_params: MutableMapping[str, Any] | None
  ) -> options_lib.DecodeOptions:
    """The call's DecodeOptions: model defaults, overridden by `decoder_params` and `rng`."""
    decoder_params = dict(decoder_params or {})
    if rng is not None:
      if decoder_params.get('decode_rng') is not None:
        raise ValueError(
          'got an RNG both from the `rng` argument and decoder_params'
          "['decode_rng']; pass one or the other"
        )
      decoder_params['decode_rng'] = rng
    eos_id = getattr(self.output_vocabulary, 'eos_id', None)
    eos_id = 1 if eos_id is None else eos_id  # T5's EOS where the vocabulary names none (0 is one)
    opts = options_lib.resolve_decoder_params(
      decoder_params, **{**self._decode_defaults, 'eos_id': eos_id}
    )
    if opts.decode_rng is None:
      opts = dataclasses.replace(opts, decode_rng=jax.random.PRNGKey(0))
    self._check_spectr_drafter(opts)
    return opts

  def _scores(
    self,
    target_params: PyTree,
    encoder_tokens: Array,
    decodes: Array,
    prompt_len: Array,
    num_tokens: Array,
    opts: options_lib.DecodeOptions,
  ) -> Array:
    """[rows] sum of the target's standardized log-probs of the generated tokens."""
    return _generated_log_probs(
      target_params,
      encoder_tokens,
      decodes,
      prompt_len,
      num_tokens,
      opts.sampling_params,
      target=self._target,
      sampling=opts.sampling,
    )


@functools.partial(jax.jit, static_argnames=('target', 'sampling'))
def _generated_log_probs(
  target_params: PyTree,
  encoder_tokens: Array,
  decodes: Array,
  prompt_len: Array,
  num_tokens: Array,
  sampling_params: sampling_lib.SamplingParams,
  *,
  target: t5_lib.T5,
  sampling: sampling_lib.SamplingConfig,
) -> Array:
  """`SpeculativeEncoderDecoderModel._scores` in one compiled call (called outside a jit, each
  op of the forward would compile on its own; under T5X's jitted predict it is traced inline)."""
  logits = target.forward(
    target_params, encoder_tokens, t5_lib.shift_right(decodes)
  )  # [rows, L, V]
  probs = sampling_lib.probs_from_logits(logits, sampling, sampling_params)
  token_probs = jnp.take_along_axis(probs, decodes[..., None], axis=-1)[..., 0]  # [rows, L]
  log_probs = jnp.log(jnp.maximum(token_probs, jnp.finfo(jnp.float32).tiny))
  positions = jnp.arange(decodes.shape[1])[None, :]
  generated = (positions >= prompt_len[:, None]) & (positions < (prompt_len + num_tokens)[:, None])
  return jnp.sum(jnp.where(generated, log_probs, 0.0), axis=1)
