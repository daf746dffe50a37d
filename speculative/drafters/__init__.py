"""Draft sources for speculative decoding: a small model, n-gram tables, prompt lookup (copying).

One module per concept:
  base           the `Drafter` protocol (and `GuidedDrafter`), `DraftProposal`, row helpers; the
                 only module the decode loops import.
  model          ModelDrafter(model, stop_below=0.): a smaller CachedLM with its own cache;
                 `stop_below` > 0 makes gamma adaptive (stop after a token the draft is unsure of).
  adaptive       AdaptiveGammaDrafter(inner, ...): drafts k <= gamma tokens per row, k chosen each
                 step from an online estimate of alpha (Theorem 3.8 with the estimate).
  tables         UnigramDrafter / BigramDrafter: n-gram tables (c ~ 0; paper Table 3), from
                 `estimate_unigram` / `estimate_bigram` on token ids of a corpus.
  oracle         OracleDrafter(vocab_size, inner=None): proposes a continuation known in advance
                 (the target's own greedy output): the measured ceiling of a perfect draft
                 (speculative.bench.ceiling); not a draft source for real jobs.
  prompt_lookup  PromptLookupDrafter(...): copies the continuation of the latest n-gram match in the
                 decoder stream or the encoder input (paper Sec. 3.6), with an optional fallback.
  registry       name -> drafter: `build_drafter`, `DRAFTERS`, `needs_draft_model`,
                 `register_drafter` (the one registry: infer, the benchmark, the adapter).

The names below are re-exported so `from speculative import drafters; drafters.ModelDrafter` works.
"""

from speculative.data.tasks import target_token_sequences as libreoffice_target_sequences
from speculative.drafters.adaptive import AdaptiveGammaDrafter
from speculative.drafters.adaptive import AdaptiveState
from speculative.drafters.base import Drafter
from speculative.drafters.base import DraftProposal
from speculative.drafters.base import DraftState
from speculative.drafters.base import GuidedDrafter
from speculative.drafters.base import write_rows
from speculative.drafters.model import ModelDrafter
from speculative.drafters.model import draft_confidence
from speculative.drafters.oracle import OracleDrafter
from speculative.drafters.oracle import OracleState
from speculative.drafters.prompt_lookup import DEFAULT_NGRAM_SIZES
from speculative.drafters.prompt_lookup import PromptLookupDrafter
from speculative.drafters.prompt_lookup import PromptLookupState
from speculative.drafters.registry import DRAFTERS
from speculative.drafters.registry import DrafterOptions
from speculative.drafters.registry import DrafterSpec
from speculative.drafters.registry import build_drafter
from speculative.drafters.registry import needs_corpus
from speculative.drafters.registry import needs_draft_model
from speculative.drafters.registry import register_drafter
from speculative.drafters.tables import BigramDrafter
from speculative.drafters.tables import UnigramDrafter
from speculative.drafters.tables import bigram_log_probs
from speculative.drafters.tables import estimate_bigram
from speculative.drafters.tables import estimate_unigram

__all__ = [
  'AdaptiveGammaDrafter',
  'AdaptiveState',
  'BigramDrafter',
  'DEFAULT_NGRAM_SIZES',
  'DRAFTERS',
  'DraftProposal',
  'DraftState',
  'Drafter',
  'DrafterOptions',
  'DrafterSpec',
  'GuidedDrafter',
  'ModelDrafter',
  'OracleDrafter',
  'OracleState',
  'PromptLookupDrafter',
  'PromptLookupState',
  'UnigramDrafter',
  'bigram_log_probs',
  'build_drafter',
  'draft_confidence',
  'estimate_bigram',
  'estimate_unigram',
  'libreoffice_target_sequences',
  'needs_corpus',
  'needs_draft_model',
  'register_drafter',
  'write_rows',
]
