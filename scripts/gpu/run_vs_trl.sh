#!/usr/bin/env bash
# run_vs_trl.sh MODE: the head-to-head on the offline one-H200 machine (benchmarks/vs_trl.py): TRL
# 1.16's GRPOTrainer (vllm_mode="colocate", the carried vLLM 0.26 in its own process) against
# agrpo demo --gpu, seeds interleaved. From the repo root, in one call carrying .vllm-carry/sm90
# and .whl (64 MiB in all: set docs/measurements/*.png aside for the call, and the wheels the race
# does not use: .whl/{peft,accelerate,math_verify,latex2sympy2_extended,antlr4}* (.whl/trl has accelerate)):
#   TASK=gpu-0.5b bash scripts/gpu/run_vs_trl.sh all
# or in two chained calls: `extract` carrying .vllm-carry/sm90, then `race` carrying .whl within 30 s.
# .whl: scripts/gpu/fetch_wheels.sh, plus TRL's own in .whl/trl (pip download --no-deps
# --python-version 3.12 trl==1.16.0 accelerate==1.16.0 -d .whl/trl). TRL goes into its own
# folder (/tmp/site-trl): agrpo's processes never see it.
# Knobs: TASK=gpu-0.5b SEEDS=0,1,2 SYSTEMS=trl,agrpo STEPS= (the task's) DEADLINE=450 (no run starts
#   after it) RUN_TIMEOUT=300 (one run) BUDGET= (seconds from this script's start at which a run is
#   stopped, keeping the steps it logged; unset: none) VS_ARGS="..." (more vs_trl.py arguments, e.g.
#   "--trl-grad-accum 16").
# The long tasks (64 completions a step of up to 1024 / 512 tokens, 60 steps by default) do not fit
# a 10-minute call with TRL's vLLM start: their defaults are DEADLINE=330 RUN_TIMEOUT=540 BUDGET=540
# (60 s left to stop the run, write its results and pack the logs), so a call keeps what fits;
# choose STEPS for the call, e.g.:
#   TASK=gpu-1.5b-long SYSTEMS=trl SEEDS=0 STEPS=20 bash scripts/gpu/run_vs_trl.sh all
#   TASK=gpu-1.5b-long SYSTEMS=agrpo SEEDS=0 STEPS=20 bash scripts/gpu/run_vs_trl.sh race   (warm)
# SmolLM2 tasks (gpu-smollm2, gpu-smollm2-long) read the model from /tmp/agrpo-cache: its GGUF comes
# in two pieces, one call each (scripts/gpu/prepare_smollm2.sh split, here; carry .cache/gpu-smol/p1,
# then .cache/gpu-smol/p2); once both are on the machine this script assembles and converts it
# (prepare_smollm2.sh assemble) before the race if the cache does not have it yet.
# Into $OUT: run.log; vs_trl/TASK/: results.json, reward_vs_time.png; vs_trl_logs_TASK.tgz: each run's
# logs and metrics (a call brings back 8 files at most; a call cut short brings back what fits).
set -uo pipefail
MODE=${1:-race}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
OUT=${OUT:-/tmp/vs-trl-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}; TRL_SITE=${TRL_SITE:-/tmp/site-trl}
BENCH=$OUT/vs_trl  # written after every run: a call cut short still brings back what ran
exec > >(tee -a "$OUT/run.log") 2>&1
gpu_safe_env
cd "$ROOT" || exit 2

case $MODE in
  extract) extract_vllm "$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz" "$SITE"; exit $? ;;
  all) extract_vllm "$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz" "$SITE" || exit 3 ;;
  race) [ -d "$SITE/vllm" ] || [[ ${SYSTEMS:-trl},${VS_ARGS:-} != *trl* && ${SYSTEMS:-},${VS_ARGS:-} != *vllm* ]] \
          || { say "no vLLM in $SITE: run 'extract' first (machine not warm?)"; exit 3; } ;;
  *) echo "unknown MODE $MODE (extract | race | all)"; exit 2 ;;
esac

[ -d "$SITE/grpc" ] || install_wheels "$ROOT/.whl" "$SITE" || exit 4
export PYTHONPATH=$SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}
# The carried vLLM has no FlashInfer: both sides sample with vLLM's own sampler.
export VLLM_USE_FLASHINFER_SAMPLER=0 AGRPO_VLLM_PYTHON=python3
TRL_PY=/tmp/trl-python
if [[ ,${SYSTEMS:-trl,agrpo}, == *,trl,* ]]; then  # a call racing agrpo's variants alone needs no TRL
  [ -d "$TRL_SITE/trl" ] || install_wheels "$ROOT/.whl/trl" "$TRL_SITE" || exit 4
  printf '#!/bin/sh\nPYTHONPATH=%s:%s exec python3 "$@"\n' "$TRL_SITE" "$SITE" > "$TRL_PY"; chmod +x "$TRL_PY"
  "$TRL_PY" -c 'import trl, accelerate, vllm, transformers, torch; print("trl", trl.__version__, "| accelerate", accelerate.__version__, "| vllm", vllm.__version__, "| transformers", transformers.__version__, "| torch", torch.__version__)' \
    || { say "TRL's imports FAILED"; exit 5; }
fi
python3 -c 'import agrpo.demo.runner, grpc, datasets; print("agrpo", __import__("agrpo").__version__)' || { say "agrpo's imports FAILED"; exit 5; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

TASK=${TASK:-gpu-0.5b}
if [[ $TASK == *-long ]]; then  # see the knobs above
  DEADLINE=${DEADLINE:-330}; RUN_TIMEOUT=${RUN_TIMEOUT:-540}; BUDGET=${BUDGET:-540}
fi
if [[ $TASK == *smollm2* && ! -f /tmp/agrpo-cache/smollm2-135m-instruct/model.safetensors ]]; then
  if [ -f "$ROOT/.cache/gpu-smol/p1/part.aa" ] && [ -f "$ROOT/.cache/gpu-smol/p2/part.ab" ]; then
    [ -d "$TRL_SITE/accelerate" ] || install_wheels "$ROOT/.whl/trl" "$TRL_SITE" || exit 4  # the conversion's accelerate
    SITE=$SITE TRL_SITE=$TRL_SITE CACHE=/tmp/agrpo-cache bash "$HERE/prepare_smollm2.sh" assemble \
      || { say "SmolLM2 assembly FAILED"; exit 6; }
  else
    say "no SmolLM2 in /tmp/agrpo-cache and no pieces in .cache/gpu-smol (prepare_smollm2.sh split, one piece a call)"; exit 6
  fi
fi

pack_logs() {  # every run's logs and metrics into one archive, then off the folder that travels back
  local d=$BENCH/$TASK
  [ -d "$d" ] || return 0
  (cd "$d" && find . -path ./inputs -prune -o -type f \( -name '*.log' -o -name '*.jsonl' -o -name 'summary.json' \
     -o -name '*.gpu.csv' -o -path '*/profile/*' \) \
     -size -20M -print | tar czf "$OUT/vs_trl_logs_$TASK.tgz" -T - \
   && find . -maxdepth 1 -type f \( -name '*.log' -o -name '*.jsonl' -o -name '*.gpu.csv' \) -delete)
}
export LOOP_RUN_MARK="vs-trl-$$-$RANDOM"
trap 'kill_marked "$LOOP_RUN_MARK"; pack_logs' EXIT
say "vs_trl --task $TASK --seeds ${SEEDS:-0,1,2} --systems ${SYSTEMS:-trl,agrpo}"
# --budget-s counts from vs_trl.py's start: what this script spent before it is taken off
# shellcheck disable=SC2086
python3 benchmarks/vs_trl.py --task "$TASK" --seeds "${SEEDS:-0,1,2}" --systems "${SYSTEMS:-trl,agrpo}" \
  ${STEPS:+--steps "$STEPS"} --trl-python "$TRL_PY" --timeout "${RUN_TIMEOUT:-300}" --deadline-s "${DEADLINE:-450}" \
  ${BUDGET:+--budget-s "$((BUDGET - SECONDS))"} --cache /tmp/agrpo-cache --out "$BENCH" ${VS_ARGS:-}
RC=$?
kill_marked "$LOOP_RUN_MARK"
say "done rc=$RC; \$OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $RC
