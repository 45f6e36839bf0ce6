#!/usr/bin/env bash
# run_tree_bench.sh: the Engine's tree attention on one GPU in one call: the single-GPU numerics
# tests (tests/gpu/test_gpu_train.py) and tokens/s + MFU per layout for each model size
# (benchmarks/gpu_train_throughput.py). The sizes' processes compile at the same time, then time
# one after another once the tests are done (--barrier + a lock), so the compiles cost wall time
# once and no timing overlaps other GPU work. From the repo root.
# Knobs: SIZES="qwen2-0.5b qwen2-1.5b"  LAYOUTS=...  PROFILE=tree  TESTS=1  LIMIT=420 (s, per process)
# Into $OUT: train.jsonl gpu_tests.log <size>.log <size>_profile.txt
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=.
SIZES=(${SIZES:-qwen2-0.5b qwen2-1.5b})
LAYOUTS=${LAYOUTS:-tree,packed,tree_sdpa,tree2,tree3,tree+r,packed+r,tree_sdpa+r}
LIMIT=${LIMIT:-420}
BAR=$(mktemp -d); s0=$SECONDS
[ "${TESTS:-1}" = 1 ] && flock "$BAR/lock" timeout 240 python3 -m pytest tests/gpu/test_gpu_train.py -q -s -rs \
  -p no:cacheprovider --confcutdir=tests/gpu -k "not fsdp2" > "$OUT/gpu_tests.log" 2>&1 &
for s in "${SIZES[@]}"; do
  timeout $LIMIT python3 benchmarks/gpu_train_throughput.py --model preset:$s --label $s --layouts "$LAYOUTS" \
    --profile "${PROFILE-tree}" --profile-out "$OUT/${s}_profile.txt" --barrier "$BAR" \
    --barrier-count ${#SIZES[@]} --results "$OUT/train.jsonl" > "$OUT/$s.log" 2>&1 &
done
wait
grep -sE "passed|failed|rel diff|Error" "$OUT/gpu_tests.log" | cut -c1-300 | tail -6
grep -hE "^\[(mask|profile)\]|Error" "$OUT"/qwen2-*.log | cut -c1-300 | tail -12
python3 benchmarks/gpu_train_throughput.py --table "$OUT/train.jsonl"
echo "[tree-bench] done in $((SECONDS - s0)) s"
