#!/bin/bash
# The paper-shape jobs (docs/paper_shape.md, "The paper-shape job"): `speculative.infer` with the
# target grown to T5 1.1 XXL's shape (configs/benchmark/paper_shape_job.gin), greedy, one process
# per job, each job's report.md gathered into one page. From the repository root, on a GPU or TPU:
#
#   scripts/paper_shape_jobs.sh [CELL ...]      # default cells: auto:1 auto:8 auto:32 3:1 7:1
#
# A cell is GAMMA:BATCH_SIZE ('auto' or a fixed gamma). Environment: PYTHON (default python3), GIN
# (default configs/benchmark/paper_shape_job.gin; configs/benchmark/paper_shape_job_small.gin is
# the same on a CPU in minutes), OUT (default outputs/paper_shape_jobs: the jobs' output
# directories, their logs and paper_shape_jobs.md), JOB_TIMEOUT (seconds per job, default 1800).
# The jobs share one JAX compilation cache folder (/tmp), so a program two jobs compile alike
# (the baseline's loop at one batch size) compiles once, and one calibration file (OUT/
# calibration.json): a cell's first 'auto' job measures its costs, a second run starts from them.
set -u
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
GIN=${GIN:-configs/benchmark/paper_shape_job.gin}
OUT=${OUT:-outputs/paper_shape_jobs}
CELLS=("$@")
[ ${#CELLS[@]} -eq 0 ] && CELLS=(auto:1 auto:8 auto:32 3:1 7:1)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 JAX_COMPILATION_CACHE_DIR=${JAX_COMPILATION_CACHE_DIR:-/tmp/speculative-paper-shape-jax-cache}
PAGE="$OUT/paper_shape_jobs.md"
{
  echo "# The paper-shape jobs"
  echo
  echo "\`scripts/paper_shape_jobs.sh ${CELLS[*]}\` with GIN=$GIN, at commit" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%Y-%m-%d)."
  if command -v nvidia-smi > /dev/null; then
    echo; echo "Device: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader)"
  fi
} > "$PAGE"
for cell in "${CELLS[@]}"; do
  gamma=${cell%%:*}; batch=${cell##*:}
  [ "$gamma" = auto ] && gamma_binding="GAMMA = 'auto'" || gamma_binding="GAMMA = $gamma"
  name="gamma-${gamma}_batch-${batch}"
  set -- --gin_file="$GIN" --gin_bindings="$gamma_binding" --gin_bindings="BATCH_SIZE = $batch" \
    --gin_bindings="INFER_OUTPUT_DIR = '$OUT/$name'" --gin_bindings="OVERWRITE = True" \
    --gin_bindings="CALIBRATION_FILE = '$OUT/calibration.json'" --gin_bindings="infer.progress = False"
  echo "=== $name $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  start=$(date +%s)
  timeout "${JOB_TIMEOUT:-1800}" "$PYTHON" -m speculative.infer "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  wall=$(( $(date +%s) - start ))
  echo "rc=$rc wall=${wall}s: $(grep -E 'Walltime speedup|Identical outputs' "$OUT/$name.log" | tr '\n' ' ')"
  {
    echo; echo "## GAMMA = $gamma, BATCH_SIZE = $batch (exit status $rc, ${wall} s with loading and compiles)"
    echo; echo "    python -m speculative.infer $(printf '%q ' "$@")"
    echo
    if [ -f "$OUT/$name/report.md" ]; then  # its headings a level down, without the examples
      grep -v '^# Batch inference report\|^Examples (the first\|^- \|^  ' "$OUT/$name/report.md" | sed 's/^## /### /'
    else
      tail -5 "$OUT/$name.log"
    fi
  } >> "$PAGE"
done
echo "=== done $(date -u +%H:%M:%S): $PAGE"
