#!/usr/bin/env bash
# run_reward_overload.sh: the reward API under 10x overload on the device machine's CPUs (no GPU
# used), to separate the service's shedding from the 2-core dev machine it is usually measured on.
# From the repo root, carrying .whl (grpcio, protobuf, math-verify, ...):
#   bash scripts/gpu/run_reward_overload.sh
# Needs .vllm-carry/sm90 too (pydantic, pyyaml). Runs benchmarks/reward_bench.py --overload 10 once per CPU layout in LAYOUTS
# ("server cores/load generator cores[/worker cores]"): the default gives the server (front + 2
# workers) 1 core as on the dev machine, then 3 cores shared, then the front a core of its own
# and the 2 workers one each. Knobs: DURATION=20 (s per phase)
# LAYOUTS="0/1 0,1,2/3,4,5,6 0/3,4,5,6/1,2"
# Into $OUT: run.log
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
OUT=${OUT:-/tmp/reward-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}; DURATION=${DURATION:-20}; LAYOUTS=${LAYOUTS:-"0/1 0,1,2/3,4,5,6 0/3,4,5,6/1,2"}
ARCHIVE=${ARCHIVE:-$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz}
exec > >(tee -a "$OUT/run.log") 2>&1
gpu_safe_env
cd "$ROOT" || exit 2
# the vLLM archive brings pydantic and friends (the image has none); the wheels bring grpcio, math-verify
[ -d "$SITE/pydantic" ] || extract_vllm "$ARCHIVE" "$SITE" || exit 3
install_wheels "$ROOT/.whl" "$SITE" || exit 4
export PYTHONPATH=$SITE:$ROOT:$ROOT/gen OMP_NUM_THREADS=1
say "$(nproc) CPUs usable ($(grep -c ^processor /proc/cpuinfo) listed; $(taskset -p $$)):$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for layout in $LAYOUTS; do
  IFS=/ read -r server client workers <<< "$layout"
  say "overload 10x, server on cores $server, load generator on $client, workers on ${workers:-the same cores}"
  timeout $((DURATION * 3 + 90)) python3 benchmarks/reward_bench.py --overload 10 --duration "$DURATION" \
    --server-cpus "$server" --client-cpus "$client" ${workers:+--worker-cpus "$workers"} 2>&1 \
    | grep -v -E '^\s*$' | tail -25
  say "rc=${PIPESTATUS[0]}"
done
