"""The walltime benchmark's parts, one module per concern (entry point: speculative.benchmark).

main           benchmark(): inputs, models, the cost model, the sweep, the whole job, the report
settings       BenchmarkSettings: the benchmark's arguments, checked before any work
machine        the machine description (CPU, memory, load average)
inputs         benchmark inputs (a seqio task, a TSV file or synthetic tokens) and model weights
paths          our models on the decode path each batch size gets (CPU kernels or XLA's dot)
methods        drafter construction and the decoding methods compared
noise          the noise verdict of a measured estimate (median, spread, refusal)
timing         timers of jitted model calls, timed in interleaved rounds
costs          the cost model t(T), c, v(T) (re-exports noise and timing)
roofline       the memory-bandwidth floor and the bare decoder matmuls' v(T)
sweep          timing every method of a (batch size, temperature) group; rows and profiles
whole_job      every input of the split at the sweep's best batch size
conclude       the gamma policy, the targets check and the explanations of missed targets
markdown       the one page writer: cells, column-declared tables, sections, a page's record and files
report         the results page (its sections), the included pages, results.json
plots          speedup_vs_gamma.png and alpha.png
decode_step    the T5 decoder step on the CPU kernels against XLA's dot (python -m ...decode_step)

The benchmark's own pages, included into the results page (python -m speculative.bench.<page>):
pages          what they measure alike: the pair's options and loading, decode functions, batch-1
               cost model and timing
drafters_page  docs/drafters/: alpha per drafter (Table 3), lenience (Table 5), adaptive gamma
spectr_page    docs/spectr/: SpecTr's K drafts vs speculative decoding vs the baseline
spectr_jobs    the table of `speculative.infer` jobs run with METHOD = 'spectr' (docs/spectr/jobs.md)
"""
