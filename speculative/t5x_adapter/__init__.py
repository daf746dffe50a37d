"""T5X integration: speculative decoding as a gin change for `python -m t5x.infer` / `t5x.eval`.

Importing this package does not import t5x; the names that need it are loaded on first access:

  SpeculativeEncoderDecoderModel   (models) the T5X model class whose predictions are speculative
  T5XTransformer, t5x_network      (models) our T5 behind T5X's `network.Transformer` signatures

and these work without t5x:

  add_draft_checkpoint, load_draft_params, DRAFT_KEY   (draft_checkpoint) restore the draft weights
  resolve_decoder_params, draft_config, to_t5_config, T5_1_1_SIZES   (options)

`speculative.t5x_adapter.exactness` is the model's optional exactness check (`check_exactness=True`;
t5x-free). `speculative.t5x_adapter.stock` is stock T5X's own decode, which the benchmark times
(`make_stock_t5x_decode`; t5x is imported when it is called). `speculative.t5x_adapter.tasks` registers the project's seqio tasks (import it from gin). The gin run
files live in `configs/t5x/`; the rest of the `speculative` package never imports t5x.
"""

from __future__ import annotations

import importlib
from typing import Any

from speculative.t5x_adapter.draft_checkpoint import DRAFT_KEY
from speculative.t5x_adapter.draft_checkpoint import add_draft_checkpoint
from speculative.t5x_adapter.draft_checkpoint import load_draft_params
from speculative.t5x_adapter.options import T5_1_1_SIZES
from speculative.t5x_adapter.options import draft_config
from speculative.t5x_adapter.options import resolve_decoder_params
from speculative.t5x_adapter.options import to_t5_config

_LAZY = {
  'SpeculativeEncoderDecoderModel': 'models',
  'T5XTransformer': 'models',
  't5x_network': 'models',
}


def __getattr__(name: str) -> Any:
  if name in _LAZY:
    try:
      module = importlib.import_module(f'{__name__}.{_LAZY[name]}')
    except ImportError as e:
      raise ImportError(
        f'speculative.t5x_adapter.{name} needs t5x, which is not installed (it is '
        f'not on PyPI; see README "From stock T5X to speculative"): {e}'
      ) from e
    return getattr(module, name)
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = [
  'DRAFT_KEY',
  'SpeculativeEncoderDecoderModel',
  'T5XTransformer',
  'T5_1_1_SIZES',
  'add_draft_checkpoint',
  'draft_config',
  'load_draft_params',
  'resolve_decoder_params',
  't5x_network',
  'to_t5_config',
]
