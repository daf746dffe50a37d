"""The walltime benchmark's parts, one module per concern (entry point: speculative.benchmark).

settings       BenchmarkSettings: the benchmark's arguments, checked before any work
machine        the machine description (CPU, memory, load average)
inputs         benchmark inputs (a seqio task, a TSV file or synthetic tokens) and model weights
methods        drafter construction and the decoding methods compared
noise          the noise verdict of a measured estimate (median, spread, refusal)
timing         timers of jitted model calls, timed in interleaved rounds
costs          the cost model t(T), c, v(T) (re-exports noise and timing; shared with scripts/)
sweep          timing every method of a (batch size, temperature) group; rows and profiles
conclude       the gamma policy, the targets check and the explanations of missed targets
cells          Markdown cells and tables of the results page
cost_sections  the page's cost model, noise, profile and roofline sections
report         the Markdown results page, the included pages, results.json
plots          speedup_vs_gamma.png and alpha.png
"""
