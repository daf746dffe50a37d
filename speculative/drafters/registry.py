"""The drafter registry: one place that turns a drafter name and its options into a drafter.

    drafter, draft_params = registry.build_drafter('prompt_lookup+model', vocab_size=V,
                                                   draft_model=draft, draft_params=params)

Names (`DRAFTERS`):
  model                a smaller CachedLM (`ModelDrafter`); params: the draft model's.
  prompt_lookup        copying only (`PromptLookupDrafter`); params: None.
  prompt_lookup+model  copying, else the draft model; params: the draft model's.
  unigram / bigram     n-gram tables estimated from `train_sequences`; params: the table.

`needs_draft_model(name)` / `needs_corpus(name)` say what a name needs before anything is loaded.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any
from typing import Callable
from typing import Sequence

import numpy as np

from speculative.drafters import base
from speculative.drafters import model as model_lib
from speculative.drafters import prompt_lookup
from speculative.drafters import tables

TokenSequences = Sequence[Sequence[int]]


@dataclasses.dataclass(frozen=True)
class DrafterOptions:
  """Everything a registered constructor may use (`build_drafter`'s arguments).

  Attributes:
    vocab_size: V, the target's vocabulary size.
    draft_model: the draft CachedLM (names with `needs_draft_model`).
    draft_params: its params (returned as the drafter's params; None is allowed when the caller
      supplies them later, e.g. the T5X adapter at predict time).
    train_sequences: decoder streams to estimate n-gram tables from (names with `needs_corpus`):
      a sequence of token-id sequences, or a zero-argument callable returning one (called only
      when needed).
    stop_below: `ModelDrafter.stop_below` (0 = fixed gamma).
    ngram_sizes: `PromptLookupDrafter.ngram_sizes`.
    target_model / target_params: the target and its params, for a drafter that drafts with the
      target itself (a registered test or benchmark drafter; the built-in ones do not use them).
  """

  vocab_size: int
  draft_model: Any = None
  draft_params: Any = None
  train_sequences: TokenSequences | Callable[[], TokenSequences] | None = None
  stop_below: float = 0.0
  ngram_sizes: tuple[int, ...] = prompt_lookup.DEFAULT_NGRAM_SIZES
  target_model: Any = None
  target_params: Any = None

  def sequences(self) -> TokenSequences:
    if self.train_sequences is None:
      raise ValueError(
        'this drafter estimates n-gram tables: pass train_sequences (e.g. '
        "speculative.data.tasks.target_token_sequences('train'))"
      )
    return self.train_sequences() if callable(self.train_sequences) else self.train_sequences

  def model_drafter(self) -> model_lib.ModelDrafter:
    return model_lib.ModelDrafter(self.draft_model, stop_below=self.stop_below)


@dataclasses.dataclass(frozen=True)
class DrafterSpec:
  """A registered drafter.

  Attributes:
    description: one line for help texts and reports.
    needs_draft_model: build needs `draft_model` (and returns `draft_params` as the params).
    needs_corpus: build needs `train_sequences`.
    build: DrafterOptions -> (drafter, params).
  """

  description: str
  needs_draft_model: bool
  needs_corpus: bool
  build: Callable[[DrafterOptions], tuple[base.Drafter, Any]]


def _model(options: DrafterOptions) -> tuple[base.Drafter, Any]:
  return options.model_drafter(), options.draft_params


def _prompt_lookup(options: DrafterOptions) -> tuple[base.Drafter, Any]:
  return prompt_lookup.PromptLookupDrafter(options.vocab_size, options.ngram_sizes), None


def _prompt_lookup_model(options: DrafterOptions) -> tuple[base.Drafter, Any]:
  drafter = prompt_lookup.PromptLookupDrafter(
    options.vocab_size, options.ngram_sizes, fallback=options.model_drafter()
  )
  return drafter, options.draft_params


def _unigram(options: DrafterOptions) -> tuple[base.Drafter, Any]:
  return (
    tables.UnigramDrafter(options.vocab_size),
    tables.estimate_unigram(options.sequences(), options.vocab_size),
  )


def _bigram(options: DrafterOptions) -> tuple[base.Drafter, Any]:
  return (
    tables.BigramDrafter(options.vocab_size),
    tables.estimate_bigram(options.sequences(), options.vocab_size),
  )


DRAFTERS: dict[str, DrafterSpec] = {
  'model': DrafterSpec('the draft model (ModelDrafter)', True, False, _model),
  'prompt_lookup': DrafterSpec(
    'copy n-gram continuations from the stream or the source', False, False, _prompt_lookup
  ),
  'prompt_lookup+model': DrafterSpec(
    'prompt lookup, else the draft model', True, False, _prompt_lookup_model
  ),
  'unigram': DrafterSpec('i.i.d. draws from the corpus unigram table', False, True, _unigram),
  'bigram': DrafterSpec('the corpus bigram table (sparse, smoothed)', False, True, _bigram),
}


def register_drafter(
  name: str,
  build: Callable[[DrafterOptions], tuple[base.Drafter, Any]],
  description: str = '',
  needs_draft_model: bool = False,
  needs_corpus: bool = False,
) -> None:
  """Makes `name` a drafter name everywhere drafters are built by name (the benchmark's `drafters`
  option, `build_drafter`); build(options: DrafterOptions) -> (drafter, params)."""
  if not name or ':' in name:
    raise ValueError(f"drafter names must be non-empty and contain no ':'; got {name!r}")
  DRAFTERS[name] = DrafterSpec(description or name, needs_draft_model, needs_corpus, build)


def spec(name: str) -> DrafterSpec:
  """The DrafterSpec of a registered `name`, or of 'package.module:build' (a build function
  defined elsewhere, taking DrafterOptions); ValueError for an unknown name."""
  if name in DRAFTERS:
    return DRAFTERS[name]
  if ':' in name:
    module_name, _, attribute = name.partition(':')
    try:
      module = importlib.import_module(module_name)
    except ImportError as e:
      raise ValueError(f'drafter {name!r}: cannot import {module_name!r} ({e})') from e
    if not hasattr(module, attribute):
      raise ValueError(f'drafter {name!r}: {module_name} has no attribute {attribute!r}')
    return DrafterSpec(name, False, False, getattr(module, attribute))
  raise ValueError(
    f"unknown drafter {name!r}; known: {sorted(DRAFTERS)} (or 'package.module:build')"
  )


def needs_draft_model(name: str) -> bool:
  return spec(name).needs_draft_model


def needs_corpus(name: str) -> bool:
  return spec(name).needs_corpus


def build_drafter(
  name: str,
  *,
  vocab_size: int,
  draft_model: Any = None,
  draft_params: Any = None,
  train_sequences: TokenSequences | Callable[[], TokenSequences] | None = None,
  stop_below: float = 0.0,
  ngram_sizes: tuple[int, ...] = prompt_lookup.DEFAULT_NGRAM_SIZES,
  target_model: Any = None,
  target_params: Any = None,
) -> tuple[base.Drafter, Any]:
  """(drafter, its params) for a registered name; see `DrafterOptions` for the options."""
  drafter_spec = spec(name)
  if not isinstance(vocab_size, (int, np.integer)) or vocab_size < 1:
    raise ValueError(f'vocab_size must be an int >= 1, got {vocab_size!r}')
  if drafter_spec.needs_draft_model:
    if draft_model is None:
      raise ValueError(f'drafter {name!r} needs a draft model (draft_config and a checkpoint)')
    if draft_model.vocab_size != vocab_size:
      raise ValueError(
        f'draft and target vocabularies differ: draft vocab_size '
        f'{draft_model.vocab_size} != target vocab_size {vocab_size}'
      )
  options = DrafterOptions(
    vocab_size=int(vocab_size),
    draft_model=draft_model,
    draft_params=draft_params,
    train_sequences=train_sequences,
    stop_below=stop_below,
    ngram_sizes=tuple(ngram_sizes),
    target_model=target_model,
    target_params=target_params,
  )
  return drafter_spec.build(options)
