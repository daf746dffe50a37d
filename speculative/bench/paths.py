"""Our models on the decode path each batch size gets: the CPU kernels or XLA's dot.

The benchmark packs the target's and the draft's weights once (`pack_models`) and hands each batch
size's cost model, groups and whole job the params of the path `kernels.policy` picks for it
(`for_batch`), as `speculative.infer` does per job; the stock-equivalent twin and stock T5X keep
XLA's path.
"""

from __future__ import annotations

from typing import Any

import jax

from speculative import kernels
from speculative.models import t5 as t5_lib


def pack_models(target, target_params, draft, draft_params, drafters: dict[str, Any]) -> dict:
  """The packed counterparts of `models`' 'target_params' and 'drafters': the target's weights,
  and the draft model's tree wherever it sits inside a drafter's params (a model drafter's, or a
  composite's)."""
  packed_draft = None if draft is None else t5_lib.pack_decode_params(draft, draft_params)

  def swap(params):
    return jax.tree_util.tree_map(
      lambda x: packed_draft if x is draft_params else x,
      params,
      is_leaf=lambda x: draft_params is not None and x is draft_params,
    )

  return {
    "target_params": t5_lib.pack_decode_params(target, target_params),
    "drafters": {name: (d, swap(p)) for name, (d, p) in drafters.items()},
  }


def for_batch(models: dict[str, Any], batch_size: int, setting: str) -> dict[str, Any]:
  """`models` with our target's and drafters' params on the path `kernels.policy` picks for this
  batch size, and that path under 'decode_path' ({'name', 'line'})."""
  path = kernels.policy.choose(setting, batch_size)
  view = dict(models, decode_path={"name": path.name, "line": path.line})
  if path.kernels:
    view.update(models["packed"])
  return view
