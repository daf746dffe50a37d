#!/bin/bash
# The SpecTr jobs of docs/spectr/jobs.md (issue 51's Numbers): `speculative.infer` with
# METHOD = 'spectr' at temperature 1, 200 examples, L = GAMMA = 3, one process per job, smallest
# first, the load average printed before and after each. From the repository root:
#   scripts/spectr_jobs.sh > outputs/spectr_jobs.log
#   .venv/bin/python -m speculative.bench.spectr_jobs outputs/numbers/* --log outputs/spectr_jobs.log
# PYTHON (default .venv/bin/python) runs the jobs; NICE (default 19) their niceness.
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
cell() {
  name=$1; gin=$2; k=$3; b=$4
  echo "=== $name $(date -u +%H:%M:%S) uptime: $(uptime)"
  set -- --gin_file="$gin" --gin_bindings="TEMPERATURE = 1.0" --gin_bindings="METHOD = 'spectr'" \
    --gin_bindings="GAMMA = 3" --gin_bindings="NUM_EXAMPLES = 200" \
    --gin_bindings="NUM_DRAFTS = $k" --gin_bindings="BATCH_SIZE = $b" \
    --gin_bindings="INFER_OUTPUT_DIR = 'outputs/numbers/$name'" --gin_bindings="OVERWRITE = True"
  echo "command: python -m speculative.infer $*"
  start=$(date +%s)
  nice -n "${NICE:-19}" "$PYTHON" -m speculative.infer "$@" > "outputs/numbers/$name.log" 2>&1
  echo "rc=$? wall=$(( $(date +%s) - start ))s end $(date -u +%H:%M:%S) uptime: $(uptime)"
}
mkdir -p outputs/numbers
cell ende_k1_b1 configs/local/run.gin 1 1
cell ende_k2_b1 configs/local/run.gin 2 1
cell ende_k4_b1 configs/local/run.gin 4 1
cell ende_k2_b8 configs/local/run.gin 2 8
cell summ_k1_b1 configs/local/summarize.gin 1 1
cell summ_k2_b1 configs/local/summarize.gin 2 1
cell summ_k4_b1 configs/local/summarize.gin 4 1
echo "=== all done $(date -u +%H:%M:%S)"
