"""SpecTr (Sun et al., NeurIPS 2023, "SpecTr: Fast Speculative Decoding via Optimal Transport"):
selecting among K i.i.d. drafts so that the output is distributed exactly as the target's. One
import for the three parts:

  kseq.py          token-level k-Seq with the optimal rho* by bisection (the derivation of its
                   residual is that module's docstring)
  sequence.py      the sequence-level selection over K draft sequences (the paper's Algorithm 3)
  otm.py           the exact OTM-k optimum of tiny problems (LP and min-cut), the ground truth

Notation as everywhere in this project: `p` is the TARGET distribution and `q` the DRAFT (the
SpecTr paper uses the opposite letters). The decode loop is `speculative.decode.spectr_loop`
(old paths `speculative.spectr.decoding`, `speculative.spectr_decoding`).
"""

from speculative.spectr.kseq import DEFAULT_BISECTION_ITERS
from speculative.spectr.kseq import acceptance_probability
from speculative.spectr.kseq import beta
from speculative.spectr.kseq import k_sequential_output_distribution
from speculative.spectr.kseq import k_sequential_residual
from speculative.spectr.kseq import k_sequential_sample
from speculative.spectr.kseq import k_sequential_select
from speculative.spectr.kseq import rho_star
from speculative.spectr.kseq import sample_from_probabilities
from speculative.spectr.otm import otm_k_acceptance_lp
from speculative.spectr.otm import otm_k_acceptance_mincut
from speculative.spectr.sequence import SequenceSelection
from speculative.spectr.sequence import rho_star_counted
from speculative.spectr.sequence import spectr_sequence_select

__all__ = [
  'DEFAULT_BISECTION_ITERS',
  'SequenceSelection',
  'acceptance_probability',
  'beta',
  'k_sequential_output_distribution',
  'k_sequential_residual',
  'k_sequential_sample',
  'k_sequential_select',
  'otm_k_acceptance_lp',
  'otm_k_acceptance_mincut',
  'rho_star',
  'rho_star_counted',
  'sample_from_probabilities',
  'spectr_sequence_select',
]
