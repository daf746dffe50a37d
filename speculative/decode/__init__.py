"""Decoding: the loops and what they run on.

loops     `autoregressive_decode` and `speculative_decode` (Leviathan et al. 2023, Algorithm 1)
spectr_loop  `spectr_decode` (Sun et al. 2023): K drafts a step, `speculative.spectr`'s selection
step      one step of every loop, in the order it runs (draft, verify, accept, commit), and `run`
state     the loop state, its metrics, the state before the first step and the while-loop
inputs    prompt preparation and argument checks shared by every loop
modes     the jitted decode functions of a job's modes (baseline, speculative, spectr, ...)
batching  batches of examples, sorted by length
audit     the exactness audit: greedy divergences and their explanation
"""
