"""The walltime benchmark's parts, one module per concern (entry point: speculative.benchmark).

machine   the machine description (CPU, memory, load average)
inputs    benchmark inputs (a seqio task, a TSV file or synthetic tokens) and model weights
methods   drafter construction and the decoding methods compared
costs     the cost model t(T), c, v(T), measured with a noise verdict (shared with scripts/)
sweep     timing every method of a (batch size, temperature) group; rows and profiles
conclude  the gamma policy, the targets check and the explanations of missed targets
report    the Markdown results page, the included pages, results.json
plots     speedup_vs_gamma.png and alpha.png
"""
