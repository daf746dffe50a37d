"""CPU kernels for decode steps, called from jitted JAX code through the XLA FFI.

  matmul            weight-streaming matmul over weights packed once at model load (`pack`): every
                    weight is read once per call for all rows, so a (gamma+1)-token verify costs
                    about one 1-token step (matmul.cc)
  decode_attention  softmax attention of new tokens over the heads-first cache (attention.cc)
  rms_norm          T5's RMS layer norm (rms_norm.cc)

Each computes every output row alone in a fixed order (one FMA chain per matmul output element,
fixed 16-lane reductions elsewhere), so a T-token call gives each row the bits of T one-token calls,
on every ISA path (AVX-512, AVX2+FMA, portable; chosen at run time). reference.py has NumPy
references; bench.py a microbenchmark against XLA's dot and the roofline.

The library is built by `python -m speculative.kernels.build` (the Makefile runs it). Where it is
missing, stale, not loadable, or switched off (`SPECULATIVE_KERNELS=0`), `status()` says why in one
line and the models stay on XLA. The models use the kernels only where a job packed their weights
(`speculative.models.t5.pack_decode_params`); `policy` chooses that per job.
"""

from speculative.kernels import policy
from speculative.kernels.attention import decode_attention
from speculative.kernels.library import ENV_SWITCH
from speculative.kernels.library import available
from speculative.kernels.library import best_isa
from speculative.kernels.library import status
from speculative.kernels.library import switched_off
from speculative.kernels.matmul import STORAGE_DTYPES
from speculative.kernels.matmul import check_packed
from speculative.kernels.matmul import matmul
from speculative.kernels.matmul import pack
from speculative.kernels.norm import rms_norm

__all__ = [
  'ENV_SWITCH',
  'STORAGE_DTYPES',
  'available',
  'best_isa',
  'check_packed',
  'decode_attention',
  'matmul',
  'pack',
  'policy',
  'rms_norm',
  'status',
  'switched_off',
]
