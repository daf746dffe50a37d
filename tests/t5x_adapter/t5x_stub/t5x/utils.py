"""Stub of `t5x.utils`: `RestoreCheckpointConfig`, which configs/t5x/speculative.gin binds.

Same fields, defaults and checks as T5X's (its checkpointer and checkpoint-manager classes are
left out; `assignment_map` is refused). T5X's restore applies `state_transformation_fns` in order
to the checkpoint's state dict as `fn(state_dict, target_state_dict)`
(t5x.checkpoints._get_optimizer_state_dict); the tests do that themselves.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from typing import Callable
from typing import Sequence


@dataclasses.dataclass
class RestoreCheckpointConfig:
  path: str | Sequence[str]
  mode: str = 'latest'
  assignment_map: Sequence[tuple[str, str | None]] | None = None
  strict: bool = True
  fallback_to_scratch: bool = False
  dtype: str | None = None
  restore_dataset: bool = False
  state_transformation_fns: Sequence[Callable[..., Any]] = ()

  def __post_init__(self):
    if self.mode not in ('specific', 'latest', 'all'):
      raise ValueError(
        f"RestoreCheckpointConfig.mode must be 'specific', 'latest' or 'all', got {self.mode}"
      )
    if self.dtype not in (None, 'float32', 'bfloat16', 'float16'):
      raise ValueError(
        f'RestoreCheckpointConfig.dtype must be None, float32, float16 or bfloat16, got {self.dtype}'
      )
    if self.assignment_map is not None:
      raise NotImplementedError('t5x stub: assignment_map is only in real t5x')
