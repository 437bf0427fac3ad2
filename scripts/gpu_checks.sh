#!/usr/bin/env bash
# The GPU checks of the slow-rank knob, process groups and the what-if, in one bounded run for a machine
# with one H100/H200 (two ranks share it: NCCL >= 2.30 under MPS, as ../shared/notes/gpu.md describes).
# In the project root, after `bash ../shared/tools/gpu-carry.sh` built .gpu/ (send it along):
#   bash scripts/gpu_checks.sh
# Writes under $OUT (or ./gpu-out): log.txt, summary.txt and the recordings (xz-compressed exports,
# torch.profiler files, ddp.benchmark CSVs), which are analysed on any machine afterwards:
#   slow_<place>/overlap_bucket.sqlite.xz  rank 1 held back 40 ms at <place> (backward, issue)
#   ob_<MiB>/overlap_bucket.sqlite.xz      recorded at 25 (and 1) MiB buckets; sweep_ob.csv: 1/5/25/100 unprofiled
#   fsdp_2/fsdp.sqlite.xz                  recorded at prefetch 2; fsdp_{1,2}.csv unprofiled
# fsdp with --separate-reduce-scatter (a second NCCL communicator) hung with two ranks sharing one H200
# under MPS (2026-11-28, docs/measurements/2026-11-28-gpu-h200.md), so it is not among the steps.
# Every step is bounded; a failing step is logged and the next one runs. Most needed first: a run cut
# short keeps what it recorded.
set -u
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
L=$OUT/log.txt
: > "$L"
export PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
# sourced, never in a pipe: a pipe runs it in a subshell and its exports (LD_PRELOAD, NSYS, MPS) are lost
source .gpu/setup.sh >> "$L" 2>&1
step() {
    local t=$1
    shift
    echo "=== $(date +%T) [$t s] $*" >> "$L"
    timeout -k 5 "$t" "$@" >> "$L" 2>&1
    echo "=== rc=$?" >> "$L"
    # a step cut by its timeout can leave ranks holding the GPU ("busy or unavailable" for the next one)
    pkill -9 -f "multiprocessing.spawn|-m profiling.run|-m ddp.benchmark" > /dev/null 2>&1
    sleep 2
}
{ nvidia-smi -L; $PYTHON -c "import torch,sys;print(sys.version.split()[0], torch.__version__)"; } >> "$L" 2>&1
N="--world-size 2 --backend nccl --share-gpus --model medium"
S="--steps 5 --warmup 2"
T="--trace cuda,nvtx"
record() {  # record TIMEOUT FOLDER IMPL ARGS...: an nsys run, its export compressed at once (a cut run keeps it)
    local t=$1 folder=$OUT/$2
    shift 2
    step "$t" bash run_nsys.sh "$@" $N $S -o "$folder"
    rm -f "$folder"/*.nsys-rep
    xz -T0 -6 "$folder"/*.sqlite 2> /dev/null
}
bench() {  # bench TIMEOUT CSV ARGS...: the unprofiled step time
    local t=$1 csv=$OUT/$2
    shift 2
    step "$t" $PYTHON -m ddp.benchmark $N --steps 8 --warmup 3 --csv "$csv" --overwrite "$@"
}
record 75 slow_backward overlap_bucket $T --slow-rank 1:backward:40
record 70 ob_25 overlap_bucket $T --bucket-mb 25
bench 100 sweep_ob.csv --impl overlap_bucket --bucket-mb 1 5 25 100
record 70 fsdp_2 fsdp $T --prefetch 2
bench 45 fsdp_1.csv --impl fsdp --prefetch 1
bench 45 fsdp_2.csv --impl fsdp --prefetch 2
record 75 slow_issue overlap_bucket $T --slow-rank 1:issue:40
record 70 ob_1 overlap_bucket $T --bucket-mb 1
# ---- advise (what-if) GPU error tables: recordings and unprofiled sweeps of overlap_bucket, torch and fsdp, in
# $OUT/advise (scripts/gpu_advise_sweeps.sh: what it records, its own budget ADVISE_BUDGET_S, default 420 s, and
# the offline commands that make the tables). ADVISE=0 leaves it out.
[ "${ADVISE:-1}" = 0 ] || OUT=$OUT/advise ADVISE_KEEP_MPS=1 bash scripts/gpu_advise_sweeps.sh > /dev/null 2>&1
# ---- end of the advise block
echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
grep -vE "Warning|warn_once|return func" "$L" | grep -E "^===|PASS|FAIL|error|Error|ms/step|illegal" > "$OUT/summary.txt"
cat "$OUT/summary.txt"
