#!/usr/bin/env bash
# The what-if's GPU error tables (analysis.advise): recordings at several settings and the unprofiled sweeps of
# the same settings, on a machine with one H100/H200 that two ranks share (NCCL >= 2.30 under MPS, as
# ../shared/notes/gpu.md describes; `bash ../shared/tools/gpu-carry.sh` builds .gpu/, send it along).
#   bash scripts/gpu_advise_sweeps.sh            (scripts/gpu_checks.sh runs it too, in its "advise" block)
# Writes under $OUT (or ./gpu-out/advise): log.txt, summary.txt, advise.tar (all of it in one file) and
#   ob_<MiB>/overlap_bucket.sqlite.xz   overlap_bucket recorded at 1, 25 (then 5, 100) MiB; sweep_ob.csv: 1/5/25/100
#   torch_25/torch.sqlite.xz            torch recorded at 25 MiB;                          sweep_torch.csv: 1/5/25/100
#   fsdp_<N>/fsdp.sqlite.xz             fsdp recorded at prefetch 2 and 1;                 fsdp_{1,2,3}.csv
# Medium model, 2 ranks sharing the GPU; recordings --steps 5 --warmup 2, sweeps --steps 8 --warmup 3. Most
# needed first; a step whose usual time no longer fits ADVISE_BUDGET_S (default 420 s) is skipped and logged.
# No --separate-reduce-scatter: a second NCCL communicator hangs with two ranks on one GPU.
# The error tables, on any machine afterwards (one command per strategy):
#   python benchmarks/advise_crossval.py --impl overlap_bucket --traces $OUT/ob_*/overlap_bucket.sqlite.xz --measured $OUT/sweep_ob.csv
#   python benchmarks/advise_crossval.py --impl torch --traces $OUT/torch_25/torch.sqlite.xz --measured $OUT/sweep_torch.csv
#   python benchmarks/advise_crossval.py --impl fsdp --traces $OUT/fsdp_*/fsdp.sqlite.xz --measured 1=$OUT/fsdp_1.csv 2=$OUT/fsdp_2.csv 3=$OUT/fsdp_3.csv
set -u
OUT=${OUT:-$PWD/gpu-out/advise}
BUDGET=${ADVISE_BUDGET_S:-420}
mkdir -p "$OUT"
L=$OUT/log.txt
: > "$L"
export PYTHONUNBUFFERED=1 PYTHON=${PYTHON:-python3}
source .gpu/setup.sh >> "$L" 2>&1  # sourced, never in a pipe: its exports (LD_PRELOAD, NSYS, MPS) must stay
T0=$(date +%s)
step() {  # step USUAL_S TIMEOUT_S CMD...: run CMD if its usual time still fits the budget
    local usual=$1 t=$2
    shift 2
    if [ $(($(date +%s) - T0 + usual)) -gt "$BUDGET" ]; then
        echo "=== skipped (budget ${BUDGET} s): $*" >> "$L"
        return
    fi
    echo "=== $(date +%T) [$t s] $*" >> "$L"
    setsid timeout -k 5 "$t" "$@" >> "$L" 2>&1 &  # its own process group: a cut step's ranks go with it
    local pid=$!
    wait $pid
    echo "=== rc=$?" >> "$L"
    kill -9 -- -$pid 2> /dev/null
    sleep 2
}
N="--world-size 2 --backend nccl --share-gpus --model medium"
record() {  # record FOLDER IMPL ARGS...: an nsys run, its export compressed at once
    local folder=$OUT/$1
    shift
    step 65 75 bash run_nsys.sh "$@" --trace cuda,nvtx $N --steps 5 --warmup 2 -o "$folder"
    rm -f "$folder"/*.nsys-rep
    xz -T0 -6 "$folder"/*.sqlite 2> /dev/null
}
bench() {  # bench USUAL_S CSV ARGS...: the unprofiled step time
    local usual=$1 csv=$OUT/$2
    shift 2
    step "$usual" $((usual + 40)) $PYTHON -m ddp.benchmark $N --steps 8 --warmup 3 --csv "$csv" --overwrite "$@"
}
bench 65 sweep_ob.csv --impl overlap_bucket --bucket-mb 1 5 25 100
record ob_1 overlap_bucket --bucket-mb 1
record ob_25 overlap_bucket --bucket-mb 25
bench 65 sweep_torch.csv --impl torch --bucket-mb 1 5 25 100
record torch_25 torch --bucket-mb 25
bench 27 fsdp_1.csv --impl fsdp --prefetch 1
bench 27 fsdp_2.csv --impl fsdp --prefetch 2
bench 27 fsdp_3.csv --impl fsdp --prefetch 3
record fsdp_2 fsdp --prefetch 2
record fsdp_1 fsdp --prefetch 1
record ob_5 overlap_bucket --bucket-mb 5
record ob_100 overlap_bucket --bucket-mb 100
echo "=== done in $(($(date +%s) - T0)) s" >> "$L"
[ -n "${ADVISE_KEEP_MPS:-}" ] || echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
grep -vE "Warning|warn_once|return func" "$L" | grep -E "^===|error|Error|ms/step" > "$OUT/summary.txt"
# one file of everything (a device run may bring back only a few files): tar xf advise.tar where the tables are made
(cd "$OUT" && tar cf advise.tar --exclude advise.tar ./*)
cat "$OUT/summary.txt"
