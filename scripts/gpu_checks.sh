#!/usr/bin/env bash
# The GPU checks of the slow-rank knob, process groups and the what-if, in one bounded run for a machine
# with one H100/H200 (two ranks share it: NCCL >= 2.30 under MPS, as ../shared/notes/gpu.md describes).
# In the project root, after `bash ../shared/tools/gpu-carry.sh` built .gpu/ (send it along):
#   bash scripts/gpu_checks.sh
# Writes under $OUT (or ./gpu-out): log.txt, summary.txt and the recordings (xz-compressed exports,
# torch.profiler files, ddp.benchmark CSVs), which are analysed on any machine afterwards:
#   slow_<place>/overlap_bucket.sqlite   rank 1 held back 40 ms at <place> (backward, issue)
#   groups/fsdp.rank<N>.json.gz          fsdp with separate reduce-scatters under torch.profiler
#   ob_<MiB>/overlap_bucket.sqlite       the bucket sweep, recorded at each size; sweep_ob.csv unprofiled
#   fsdp_<setting>/fsdp.sqlite           prefetch 1, 2 and 2 with separate reduce-scatters; fsdp_<setting>.csv
# Every step is bounded; a failing step is logged and the next one runs. Most needed first.
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
}
{ nvidia-smi -L; $PYTHON -c "import torch,sys;print(sys.version.split()[0], torch.__version__)"; } >> "$L" 2>&1
N="--world-size 2 --backend nccl --share-gpus --model medium"
S="--steps 5 --warmup 2"
T="--trace cuda,nvtx"
for place in backward issue; do
    step 90 bash run_nsys.sh overlap_bucket $N $S $T --slow-rank 1:$place:40 -o "$OUT/slow_$place"
done
step 90 bash run_nsys.sh fsdp $N $S --separate-reduce-scatter --profiler torch -o "$OUT/groups"
for mb in 1 25 100; do
    step 70 bash run_nsys.sh overlap_bucket $N $S $T --bucket-mb $mb -o "$OUT/ob_$mb"
done
step 120 $PYTHON -m ddp.benchmark --impl overlap_bucket --bucket-mb 1 25 100 $N --steps 8 --warmup 3 \
    --csv "$OUT/sweep_ob.csv" --overwrite
for setting in 1 2 2s; do
    knobs="--prefetch ${setting%s}"
    [ "$setting" != "${setting%s}" ] && knobs="$knobs --separate-reduce-scatter"
    step 70 bash run_nsys.sh fsdp $N $S $T $knobs -o "$OUT/fsdp_$setting"
    step 60 $PYTHON -m ddp.benchmark --impl fsdp $N --steps 8 --warmup 3 $knobs --csv "$OUT/fsdp_$setting.csv" --overwrite
done
echo quit | nvidia-cuda-mps-control > /dev/null 2>&1
find "$OUT" -name "*.nsys-rep" -delete
find "$OUT" -name "*.sqlite" -exec xz -T0 -6 {} +
grep -vE "Warning|warn_once|return func" "$L" | grep -E "^===|PASS|FAIL|error|Error|ms/step|illegal" > "$OUT/summary.txt"
cat "$OUT/summary.txt"
