"""The walltime benchmark's parts, one module per concern (entry point: speculative.benchmark).

main           benchmark() and its arguments (BenchmarkSettings, checked before any work): inputs,
               models, the cost model, the sweep, the whole job, the report
methods        the pair (its weights), its inputs (a seqio task, a TSV file or examples given), our
               models on each batch size's decode path, the drafters and the methods compared;
               the pages' options and command line, their batch-1 costs
costs          the cost model t(T), c, v(T), and the noise verdict of each estimate (timed with
               speculative.timing's timers, in interleaved rounds); a step's bytes, the read rate
sweep          timing every method of a (batch size, temperature) group (a page's: at batch 1); rows
               and profiles; the timing settings (TimingSettings) and a batch size's parts (Batch)
               the benchmark and paper_shape share
conclude       the best gammas, the targets check, the explanations of missed targets, the summary
markdown       the one page writer: cells, column-declared tables, sections, a page's record and files;
               the machine in a line with its load (its record: jobs/runtime.machine; whether a shape
               fits: models/memory.py)
report         the results page (its sections), links to the pages, its plots (speedup_vs_gamma.png,
               alpha.png), results.json
decode_step    the T5 decoder step on the CPU kernels against XLA's dot (python -m ...decode_step)
ceiling        a perfect draft's speedup on a job (python -m speculative.bench.ceiling)
paper_shape    T5 1.1 XXL's shape on this device (python -m speculative.bench.paper_shape)
auto_gamma     GAMMA = 'auto' against each fixed gamma, one job a process (python -m ...auto_gamma)

The benchmark's own pages, linked from the results page (python -m speculative.bench.<page>):
drafters_page  docs/drafters/: alpha per drafter (Table 3), lenience (Table 5), adaptive gamma
spectr_page    docs/spectr/: SpecTr's K drafts vs speculative decoding vs the baseline
spectr_jobs    the table of `speculative.infer` jobs run with METHOD = 'spectr' (docs/spectr/jobs.md)
"""
