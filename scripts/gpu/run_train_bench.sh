#!/usr/bin/env bash
# run_train_bench.sh: FSDP2 on 2 GPUs (== 1 GPU) and trainer tokens/s + MFU on one GPU.
# Needs the models in /tmp (scripts/gpu/make_tiny.py; run_sync_bench.sh builds them and runs this
# as PRE="bash scripts/gpu/run_train_bench.sh" before vLLM takes GPU 0). From the repo root.
# Knobs: TRAIN_SIZES="qwen2-0.5b qwen2-1.5b"  FSDP_MODEL=qwen2-0.5b  TRAIN_LIMIT=150 (s, whole step)
# Into $OUT: fsdp2.jsonl train.jsonl train.log
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       NCCL_CUMEM_ENABLE=0 OMP_NUM_THREADS=4
LOG=$OUT/train.log
s0=$SECONDS
CUDA_VISIBLE_DEVICES=0,1 timeout 100 torchrun --standalone --nproc_per_node 2 "$ROOT/benchmarks/gpu_fsdp2.py" \
  --model /tmp/${FSDP_MODEL:-qwen2-0.5b} --steps 3 --results "$OUT/fsdp2.jsonl" >> "$LOG" 2>&1
echo "[train] fsdp2 rc=$? in $((SECONDS - s0)) s"; grep '^\[fsdp2\]' "$LOG" | tail -1
for s in ${TRAIN_SIZES:-qwen2-0.5b qwen2-1.5b}; do
  left=$(( ${TRAIN_LIMIT:-150} - (SECONDS - s0) )); [ $left -gt 20 ] || { echo "[train] SKIP $s: time"; continue; }
  CUDA_VISIBLE_DEVICES=1 timeout $left python3 "$ROOT/benchmarks/gpu_train_throughput.py" --model /tmp/$s \
    --label $s --results "$OUT/train.jsonl" >> "$LOG" 2>&1
  echo "[train] throughput $s rc=$?"
done
grep -E 'Error|error' "$LOG" | tail -3 | cut -c1-300
[ -f "$OUT/train.jsonl" ] && python3 "$ROOT/benchmarks/gpu_train_throughput.py" --table "$OUT/train.jsonl"
echo "[train] done in $((SECONDS - s0)) s"
