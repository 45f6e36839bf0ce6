#!/usr/bin/env bash
# run_rollout_bench.sh: the rollout service vs a raw client on one vLLM 0.26 (GPU 0), one device call
# (issue 17 item 3). benchmarks/rollout_throughput.py runs, per concurrency, a raw aiohttp client and the
# rollout service (real reward service, a stand-in trainer that acks at once) against the same server,
# side by side: tok/s, service/raw, requests in flight (client side and vLLM's running+waiting).
# From the repo root, carrying .vllm-carry/sm90 and .whl:
#   bash scripts/gpu/run_rollout_bench.sh
# Knobs: PRESETS="tiny" (add qwen2-0.5b for a 0.5B-shaped model), INFLIGHT=64,256,512, PROMPT_TOKENS=1000,
#   MAX_TOKENS=512, WAVES=3 (requests per run = WAVES x in flight), REPEATS=1, BUDGET=480 (s, whole script),
#   EAGER_TINY=1 (tiny runs --enforce-eager), EAGER_BIG=0 (the 0.5B model with CUDA graphs), BENCH_ARGS="",
#   VLLM_ARGS="" (more vllm serve flags, e.g. "--api-server-count 4": past the one API server's
#   ~12k tok/s cap that both clients hit in docs/gpu.md; not yet run)
# Into $OUT: run.log (the tables), vllm-<preset>.log
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
OUT=${OUT:-/tmp/rollout-bench-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}; PORT=${PORT:-8017}; BUDGET=${BUDGET:-480}
WHL=${WHL:-$ROOT/.whl}; ARCHIVE=${ARCHIVE:-$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz}
PRESETS=${PRESETS:-tiny}; INFLIGHT=${INFLIGHT:-64,256,512}; PROMPT_TOKENS=${PROMPT_TOKENS:-1000}
MAX_TOKENS=${MAX_TOKENS:-512}; WAVES=${WAVES:-3}; REPEATS=${REPEATS:-1}
EAGER_TINY=${EAGER_TINY:-1}; EAGER_BIG=${EAGER_BIG:-0}
exec > >(tee -a "$OUT/run.log") 2>&1
gpu_safe_env
cd "$ROOT" || exit 2
say "GPUs: $(nvidia-smi --query-gpu=index,name,memory.used --format=csv,noheader | tr '\n' ' ')"
extract_vllm "$ARCHIVE" "$SITE" || exit 3
install_wheels "$WHL" "$SITE" || exit 4
export PYTHONPATH=$SITE:$ROOT:$ROOT/gen${PYTHONPATH:+:$PYTHONPATH}
export VLLM_SERVER_DEV_MODE=1 VLLM_USE_FLASHINFER_SAMPLER=0 OMP_NUM_THREADS=1
export LOOP_RUN_MARK="rollout-bench-$$-$RANDOM"  # every child carries it: the exit trap ends leftovers
trap 'kill_marked "$LOOP_RUN_MARK"' EXIT
MAX_LEN=$((PROMPT_TOKENS + MAX_TOKENS + 256))
python3 -c "import vllm, aiohttp, grpc, datasets; print('vllm', vllm.__version__, '| aiohttp', aiohttp.__version__, \
'| grpcio', grpc.__version__)" || { say "imports FAILED"; exit 5; }

serve() {  # preset eager(0/1) log
  local eager=()
  [ "$2" = 1 ] && eager=(--enforce-eager)
  CUDA_VISIBLE_DEVICES=0 setsid python3 -m vllm.entrypoints.cli.main serve "/tmp/rb_$1" --tokenizer "/tmp/rb_$1_tok" \
    --host 127.0.0.1 --port "$PORT" "${eager[@]}" --attention-backend FLASH_ATTN --dtype bfloat16 \
    --max-model-len "$MAX_LEN" --max-num-seqs 1024 --gpu-memory-utilization 0.3 --seed 0 \
    --logprobs-mode processed_logprobs ${VLLM_ARGS:-} > "$3" 2>&1 &
  VP=$!
}
stop_vllm() {
  [ -n "${VP:-}" ] || return 0
  kill -TERM -- -"$VP" 2>/dev/null
  for _ in $(seq 30); do kill -0 -- -"$VP" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- -"$VP" 2>/dev/null
  VP=
}

left=$(echo $PRESETS | wc -w)
for preset in $PRESETS; do
  eager=$EAGER_BIG; [ "$preset" = tiny ] && eager=$EAGER_TINY
  slice=$(( (BUDGET - SECONDS - 15) / left )); left=$((left - 1))
  [ "$slice" -gt 60 ] || { say "no time left for $preset (${slice} s)"; break; }
  t_end=$((SECONDS + slice))
  say "== $preset (eager=$eager), ${slice} s: make model, start vLLM, benchmark"
  # 1k-token prompts + 512 new tokens exceed the tiny preset's 1024 positions: past them vLLM's
  # logprobs are NaN and every answer a 400, so the model is made with room for MAX_LEN
  timeout 120 python3 "$HERE/make_tiny.py" "/tmp/rb_$preset" "/tmp/rb_${preset}_tok" --preset "$preset" --device cuda \
    --max-positions "$MAX_LEN" \
    2>&1 | grep -v Writing
  serve "$preset" "$eager" "$OUT/vllm-$preset.log"
  up=0
  while [ $SECONDS -lt $((t_end - 30)) ]; do
    python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      "http://127.0.0.1:$PORT/health" 2>/dev/null && { up=1; break; }
    kill -0 "$VP" 2>/dev/null || break
    sleep 1
  done
  if [ "$up" = 1 ]; then
    say "vLLM ($preset) up; benchmark for at most $((t_end - SECONDS)) s"
    timeout --kill-after=10 $((t_end - SECONDS)) python3 benchmarks/rollout_throughput.py \
      --vllm-url "http://127.0.0.1:$PORT" --model-dir "/tmp/rb_$preset" --tokenizer "/tmp/rb_${preset}_tok" \
      --inflight "$INFLIGHT" --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" --waves "$WAVES" \
      --repeats "$REPEATS" ${BENCH_ARGS:-}
    say "benchmark ($preset) rc $?"
  else
    say "vLLM ($preset) did not come up"; tail -30 "$OUT/vllm-$preset.log"
  fi
  stop_vllm
done
say "done"
