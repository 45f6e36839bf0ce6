#!/usr/bin/env bash
# run_real_shapes.sh: the one-GPU schedules at a real shape (benchmarks/one_gpu_schedules.py), on the
# offline H100/H200 machine. From the repo root, carrying .vllm-carry/sm90 and .whl (set aside what
# run_vs_trl.sh's header says, to fit 64 MiB):
#   BUDGET_S=560 bash scripts/gpu/run_real_shapes.sh
# Knobs: MODEL=1.5b BATCH=64 COMPLETION=1024 STEPS=12 WARMUP=2 SEEDS=0
#   VARIANTS="sync,async,alternate,alt-keepkv:...,alt-compile:..." (one_gpu_schedules.py --variants)
# Into $OUT: run.log, schedules.jsonl (a line per run, written as it goes), logs.tgz (every run's
# metrics and service logs).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
OUT=${OUT:-/tmp/real-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}
exec > >(tee -a "$OUT/run.log") 2>&1
gpu_safe_env
cd "$ROOT" || exit 2
T0=$(date +%s); BUDGET=${BUDGET_S:-560}

[ -d "$SITE/vllm" ] || extract_vllm "$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz" "$SITE" || exit 3
[ -d "$SITE/grpc" ] || install_wheels "$ROOT/.whl" "$SITE" || exit 4
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
export VLLM_USE_FLASHINFER_SAMPLER=0 AGRPO_VLLM_PYTHON=python3
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export LOOP_RUN_MARK="real-$$-$RANDOM"
BENCH=/tmp/real-bench
pack() {
  kill_marked "$LOOP_RUN_MARK"
  [ -f "$BENCH/results.jsonl" ] && cp "$BENCH/results.jsonl" "$OUT/schedules.jsonl"
  (cd "$BENCH" 2>/dev/null && find . -type f \( -name '*.log' -o -name 'metrics.jsonl' -o -name 'summary.json' \
     -o -name 'agrpo.yaml' \) -size -20M | tar czf "$OUT/logs.tgz" -T -)
}
trap pack EXIT
LEFT=$(( BUDGET - ($(date +%s) - T0) ))
say "schedules: ${VARIANTS:-default set} ($LEFT s left)"
timeout $(( LEFT - 15 )) python3 benchmarks/one_gpu_schedules.py --model "${MODEL:-1.5b}" --batch "${BATCH:-64}" \
  --completion "${COMPLETION:-1024}" --steps "${STEPS:-12}" --warmup "${WARMUP:-2}" --seeds "${SEEDS:-0}" \
  --variants "${VARIANTS:-alternate,sync,async,alt-keepkv:trainer.schedule=alternate;trainer.recompute_in_flight=false,alt-compile:trainer.schedule=alternate;trainer.compile=true}" \
  --cache /tmp/agrpo-cache --out "$BENCH" --run-timeout "${RUN_TIMEOUT:-240}" --deadline-s $(( LEFT - 150 )) \
  2>&1 | grep -v '^\s*$' | grep -v 'it/s\]' | cut -c1-1500
say "done"
