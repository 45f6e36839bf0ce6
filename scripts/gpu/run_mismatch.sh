#!/usr/bin/env bash
# run_mismatch.sh: trainer/vLLM logprob mismatch with and without an fp32 LM head, one H200, one
# device call (~8 min: vLLM starts in about 2): vLLM 0.26 (bf16) and the trainer's Engine on the same GPU, a random
# Qwen2.5-0.5B-shaped model (benchmarks/gpu_mismatch.py says why random, and what stands in for
# a trained model's sharpness). From the repo root, carrying .vllm-carry/sm90 and .whl:
#   bash scripts/gpu/run_mismatch.sh
# Into $OUT: run.log vllm.log mismatch.jsonl
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
OUT=${OUT:-/tmp/mismatch-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}; PORT=${PORT:-8013}; PRESET=${PRESET:-qwen2-0.5b}
WHL=${WHL:-$ROOT/.whl}; ARCHIVE=${ARCHIVE:-$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz}
exec > >(tee -a "$OUT/run.log") 2>&1
gpu_safe_env
cd "$ROOT" || exit 2
extract_vllm "$ARCHIVE" "$SITE" || exit 3
install_wheels "$WHL" "$SITE" || exit 4
export PYTHONPATH=$SITE:$ROOT VLLM_SERVER_DEV_MODE=1 VLLM_USE_FLASHINFER_SAMPLER=0
python3 "$HERE/make_tiny.py" /tmp/mm_model /tmp/mm_tok --preset "$PRESET" --device cuda 2>&1 | grep -v Writing
setsid python3 -m vllm.entrypoints.cli.main serve /tmp/mm_model --tokenizer /tmp/mm_tok --served-model-name mm \
  --host 127.0.0.1 --port "$PORT" --enforce-eager --attention-backend FLASH_ATTN --dtype bfloat16 \
  --max-model-len 1024 --max-num-seqs 128 --gpu-memory-utilization 0.3 --seed 0 \
  --logprobs-mode processed_logprobs > "$OUT/vllm.log" 2>&1 &
VP=$!
trap 'kill -TERM -- -$VP 2>/dev/null; sleep 3; kill -KILL -- -$VP 2>/dev/null' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { say "vLLM did not start"; tail -30 "$OUT/vllm.log"; exit 5; }
say "vLLM up"
timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/gpu_mismatch.py --url "http://127.0.0.1:$PORT" --served mm \
  --model /tmp/mm_model --tokenizer /tmp/mm_tok --results "$OUT/mismatch.jsonl" ${MISMATCH_ARGS:-}
say "done (rc $?)"
