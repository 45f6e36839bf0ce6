#!/usr/bin/env bash
# run_memory_bench.sh: the trainer engine per memory mode on one GPU (benchmarks/gpu_trainer_memory.py):
# tokens/s and memory of today's path, FSDP2 on one rank, bf16 weights + AdamW, FSDP2 CPU offload.
# From the repo root, carrying .whl and .whl-mem (pydantic for py3.12: the image lacks it; not needed
# where an earlier call on the warm machine extracted the vLLM archive into $SITE).
# Knobs: SIZES="qwen2-1.5b"  MODES="plain,fsdp,bf16,offload" (LoRA rows: MODES=plain,bf16,lora SIZES="qwen2-1.5b qwen2-7b")  LIMIT=240 (s per mode)  EXTRA="--no-compile"
# Into $OUT: mem.jsonl, <size>.log
set -uo pipefail
ROOT=$(pwd); OUT=${OUT:-/tmp/mem-out}; mkdir -p "$OUT"; SITE=${SITE:-/tmp/site}
source scripts/gpu/lib.sh
gpu_safe_env
export OMP_NUM_THREADS=8 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
install_wheels .whl "$SITE" || exit 4
if [ -d .whl-mem ]; then install_wheels .whl-mem "$SITE" || exit 4; fi  # pydantic, where no vLLM archive was extracted
PYTHONPATH=$SITE python3 -c 'import pydantic' 2>/dev/null || { say "no pydantic in $SITE: carry .whl-mem (pydantic for py3.12)"; exit 4; }
export PYTHONPATH=$SITE:$ROOT:$ROOT/gen
for s in ${SIZES:-qwen2-1.5b}; do
  t=$SECONDS
  python3 scripts/gpu/make_tiny.py "/tmp/$s" "/tmp/$s-tok" --preset "$s" --device cuda > "$OUT/$s.log" 2>&1 \
    || { tail -5 "$OUT/$s.log"; continue; }
  say "built $s in $((SECONDS - t)) s"
  python3 benchmarks/gpu_trainer_memory.py --model "/tmp/$s" --tokenizer "/tmp/$s-tok" --modes "${MODES:-plain,fsdp,bf16,offload}" \
    --limit-s "${LIMIT:-240}" --results "$OUT/mem.jsonl" ${EXTRA:-} >> "$OUT/$s.log" 2>&1
  rm -rf "/tmp/$s"
  say "$s done at +$SECONDS s"
done
python3 benchmarks/gpu_trainer_memory.py --table "$OUT/mem.jsonl"
