#!/usr/bin/env bash
# run_sync_bench.sh: weight-sync benchmark on a 2x H200 machine, ONE device call (~8 min).
# From the repo root, with .vllm-carry/sm90 (and .gpu-scratch, if WS is set) carried along:
#   WS=.gpu-scratch/ws bash scripts/gpu/run_sync_bench.sh
# 1. extract the carried vLLM 0.26 into /tmp/site; build random Qwen2-shaped models on GPU 1
# 2. the floor: raw NCCL broadcasts GPU1 -> GPU0 of each model's bytes (benchmarks/gpu_nccl_floor.py)
# 3. per model: vLLM on GPU 0, benchmarks/gpu_weight_sync.py on GPU 1 (ours / vLLM helper /
#    ours torch-only), correctness checks, then stop vLLM
# Knobs: SIZES="qwen2-0.5b qwen2-1.5b qwen2-7b"  ROUNDS=5  DEADLINE=570 (s; a model starts only
#   with > its need left)  WS= (weight_sync package folder; default the repo's)  VARIANTS=ours,helper,ours_store,direct
#   FLOOR=0 skips step 2; PRE="cmd" runs first (after the extract), e.g. bash scripts/gpu/run_train_bench.sh
# Into $OUT: run.log env.txt floor.jsonl sync.jsonl bench.log vllm.log
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
SITE=${SITE:-/tmp/site}
SIZES=${SIZES:-qwen2-0.5b qwen2-1.5b qwen2-7b}
ROUNDS=${ROUNDS:-5}; DEADLINE=${DEADLINE:-570}; PORT=8011
VARIANTS=${VARIANTS:-ours,helper,ours_store,direct}
# One GPU: TRAINER_GPU=0 FLOOR=0 VARIANTS=ipc (vLLM and the trainer share GPU 0; CUDA IPC).
TRAINER_GPU=${TRAINER_GPU:-1}
WSARG=; [ -n "${WS:-}" ] && WSARG="--ws $ROOT/$WS"
# NVLink multicast stays off on these shared hosts; vLLM's workers use NCCL_CUMEM_ENABLE=0, so we do too
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
       NCCL_CUMEM_ENABLE=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
       HF_HUB_DISABLE_PROGRESS_BARS=1 OMP_NUM_THREADS=4
exec > >(tee -a "$OUT/run.log") 2>&1
say() { echo "[run $(date +%H:%M:%S) +${SECONDS}s] $*"; }
need() { case $1 in *7b) echo 170 ;; *) echo 110 ;; esac; }

# models on GPU 1 in the background (they need no vLLM)
( for s in $SIZES; do
    [ -f /tmp/$s/config.json ] && { touch /tmp/$s.done; continue; }
    CUDA_VISIBLE_DEVICES=$TRAINER_GPU python3 "$HERE/make_tiny.py" /tmp/$s /tmp/${s}_tok --preset $s --device cuda 2>&1 \
      | grep -v Writing | sed 's/^/[make] /'; touch /tmp/$s.done
  done ) &
MB=$!
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm --format=csv
  nvidia-smi topo -m; python3 -c 'import torch,transformers;print("torch",torch.__version__,"cuda",torch.version.cuda,"nccl",torch.cuda.nccl.version(),"transformers",transformers.__version__)'
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort; } > "$OUT/env.txt" 2>&1
t=$SECONDS; mkdir -p "$SITE"
python3 -c "import tarfile,sys;tarfile.open(sys.argv[1]).extractall(sys.argv[2],filter='data')" \
  "$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz" "$SITE" || { say "extract FAILED"; exit 3; }
say "vLLM 0.26 extracted in $((SECONDS - t)) s"
[ -n "${PRE:-}" ] && { wait $MB; say "models built; PRE: $PRE"; bash -c "$PRE"; say "PRE rc=$?"; }

if [ "${FLOOR:-1}" = 1 ]; then  # both GPUs, nothing else running; rank 0 on GPU 1 sends, as the trainer does
  wait $MB; say "models built"
  CUDA_VISIBLE_DEVICES=1,0 timeout 120 torchrun --standalone --nproc_per_node 2 "$ROOT/benchmarks/gpu_nccl_floor.py" \
    --presets $SIZES --results "$OUT/floor.jsonl" 2>&1 | grep -v -E '^\s*$|OMP_NUM_THREADS|\*{5}' | tail -12
  say "floor rc=$?"
fi

export PYTHONPATH=$SITE:$ROOT/vllm_plugin VLLM_SERVER_DEV_MODE=1 VLLM_USE_FLASHINFER_SAMPLER=0
VP=
serve() {  # label mem_util
  rm -f /tmp/vllm.pgid; echo "===== $1 =====" >> "$OUT/vllm.log"
  CUDA_VISIBLE_DEVICES=0 setsid bash -c 'echo $$ > /tmp/vllm.pgid; exec "$@"' vllm \
    python3 -m vllm.entrypoints.cli.main serve /tmp/$1 --tokenizer /tmp/$1_tok --served-model-name "$1" \
    --host 127.0.0.1 --port $PORT --enforce-eager --attention-backend FLASH_ATTN --dtype bfloat16 \
    --max-model-len 1024 --max-num-seqs 32 --gpu-memory-utilization "$2" --seed 0 \
    --weight-transfer-config '{"backend":"nccl"}' --logprobs-mode processed_logprobs \
    --worker-extension-cls agrpo_vllm_plugin.worker.AgrpoWorkerExtension >> "$OUT/vllm.log" 2>&1 &
  for _ in $(seq 50); do [ -s /tmp/vllm.pgid ] && break; sleep 0.1; done
  VP=$(cat /tmp/vllm.pgid); say "vLLM ($1) launched, pgid $VP"
}
stop() {
  [ -n "$VP" ] || return 0
  kill -TERM -- -"$VP" 2>/dev/null
  for _ in $(seq 30); do kill -0 -- -"$VP" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- -"$VP" 2>/dev/null; say "vLLM stopped"; VP=
}
trap stop EXIT
P=29600
for s in $SIZES; do
  left=$((DEADLINE - SECONDS))
  [ $left -gt "$(need $s)" ] || { say "SKIP $s: ${left}s left, needs $(need $s)"; continue; }
  for _ in $(seq 240); do [ -f /tmp/$s.done ] && break; sleep 0.5; done
  [ -f /tmp/$s/config.json ] || { say "SKIP $s: model not built"; continue; }
  mem=0.3; case $s in *7b) mem=0.4 ;; esac
  serve "$s" $mem
  T0=$SECONDS
  CUDA_VISIBLE_DEVICES=$TRAINER_GPU timeout $((DEADLINE - SECONDS - 10)) python3 "$ROOT/benchmarks/gpu_weight_sync.py" \
    --url http://127.0.0.1:$PORT --model /tmp/$s --label "$s" --rounds "$ROUNDS" --port $P $WSARG \
    --variants "$VARIANTS" --vllm-pid "$VP" --results "$OUT/sync.jsonl" >> "$OUT/bench.log" 2>&1
  rc=$?; say "bench $s rc=$rc in $((SECONDS - T0)) s"; grep -E 'Error|error' "$OUT/bench.log" | tail -3 | cut -c1-400
  grep -q "Application startup complete" "$OUT/vllm.log" || { say "vLLM did not come up:"; tail -30 "$OUT/vllm.log"; }
  stop; P=$((P + 10))
done
[ -f "$OUT/floor.jsonl" ] && { echo; python3 "$ROOT/benchmarks/gpu_nccl_floor.py" --table "$OUT/floor.jsonl"; }
echo; python3 "$ROOT/benchmarks/gpu_weight_sync.py" --table "$OUT/sync.jsonl" --floor "$OUT/floor.jsonl"
say done
