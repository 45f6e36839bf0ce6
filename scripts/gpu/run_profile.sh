#!/usr/bin/env bash
# run_profile.sh: where agrpo's seconds go on the lent GPU, in one call carrying .whl (no vLLM:
# the trainer generates, as agrpo demo --gpu does for a short job). From the repo root:
#   bash scripts/gpu/run_profile.sh
# 1. imports: python -X importtime of torch and transformers' model classes, the 40 slowest
#    modules by cumulative time (the trainer's start is mostly imports).
# 2. per TASK (vs_trl.py's): one agrpo demo run with trainer.profile_steps=PROFILE_STEPS
#    (services/trainer/profiling.py: every thread, the wait for samples included) and the
#    generator's decode-shape log lines.
# 3. the 1.5B-shaped tree step in one process, profiled (benchmarks/gpu_train_throughput.py).
# Knobs: TASKS="gpu-1.5b gpu-0.5b" PROFILE_STEPS=[8,10] STEPS=30 SEEDS=1 TREE=1 (0 skips 3).
# Into $OUT: run.log, importtime_top.txt, vs_trl_logs_TASK.tgz, vs_trl.tgz (results), tree_profile.tgz.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
OUT=${OUT:-/tmp/profile-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}
exec > >(tee -a "$OUT/run.log") 2>&1
gpu_safe_env
cd "$ROOT" || exit 2
[ -d "$SITE/grpc" ] || install_wheels "$ROOT/.whl" "$SITE" || exit 4
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}

say "imports"
python3 -X importtime -c 'import torch, transformers; from transformers import AutoModelForCausalLM; import transformers.models.qwen2.modeling_qwen2' \
  2> "$OUT/importtime.raw" >/dev/null
sort -t'|' -k2 -n -r "$OUT/importtime.raw" | head -40 > "$OUT/importtime_top.txt"; rm -f "$OUT/importtime.raw"
head -12 "$OUT/importtime_top.txt"

for task in ${TASKS:-gpu-1.5b gpu-0.5b}; do
  say "profiled demo: $task"
  OUT=$OUT TASK=$task SEEDS=${SEEDS:-1} SYSTEMS=agrpo STEPS=${STEPS:-30} DEADLINE=200 RUN_TIMEOUT=180 \
    VS_ARGS="--set trainer.profile_steps=${PROFILE_STEPS:-[8,10]}" bash "$HERE/run_vs_trl.sh" race >/dev/null
  tar xzf "$OUT/vs_trl_logs_$task.tgz" -O --wildcards '*trainer.log' 2>/dev/null | grep -E 'decode steps|profile of' | cut -c1-300
done
(cd "$OUT" && tar czf vs_trl.tgz vs_trl && rm -rf vs_trl)

if [ "${TREE:-1}" = 1 ] && [ -d /tmp/agrpo-cache/shaped-model/1.5b ]; then
  say "the 1.5B tree step, profiled"
  mkdir -p "$OUT/tree"
  timeout 240 python3 benchmarks/gpu_train_throughput.py --model /tmp/agrpo-cache/shaped-model/1.5b --label 1.5b \
    --layouts tree1+gc0 --profile tree1+gc0 --profile-out "$OUT/tree/profile.txt" --results "$OUT/tree/tree.jsonl" > "$OUT/tree/tree.log" 2>&1
  grep -E '^\[profile\]|"perf/mfu"|mfu' "$OUT/tree/tree.log" | tail -4 | cut -c1-400
  (cd "$OUT" && tar czf tree_profile.tgz tree && rm -rf tree)
fi
say "done; \$OUT: $(ls "$OUT" | tr '\n' ' ')"
