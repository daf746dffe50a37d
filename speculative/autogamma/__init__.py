"""Gamma chosen by the job: measured step costs (`costs`) and the per-batch choice (`policy`).

  costs    Costs (seconds per loop step by gamma), LoopTimes (the job's batches timed), the
           per-device cache file
  policy   PolicyState, `choose` (Theorem 3.8 with the costs and the observed alpha, the probe rule
           out of gamma 0), `choose_while_measuring`, `observe`

`speculative.infer` uses them for `GAMMA = 'auto'` (speculative/infer/auto_gamma.py); the T5X adapter
picks one gamma per batch size from the cache file's costs (speculative/t5x_adapter/models.py).
"""

from speculative.autogamma import costs
from speculative.autogamma import policy

__all__ = ['costs', 'policy']
