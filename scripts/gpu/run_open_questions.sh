#!/usr/bin/env bash
# run_open_questions.sh: docs/vs-trl.md's open GPU questions in one call, each step only while the
# call's budget lasts (a call cut short still brings back what ran). From the repo root, carrying
# .vllm-carry/sm90 and .whl (run_vs_trl.sh says what to set aside to fit 64 MiB):
#   BUDGET_S=560 bash scripts/gpu/run_open_questions.sh        (ONLY="3 4 5 6": those steps only, e.g. in
#   a second call: the race takes about 330 s of a 560 s call)
# 0. (only when ONLY names it: 80 s) the trainer's generator tests on the GPU;
# 1. the gpu-1.5b race, TRL colocate against agrpo demo --gpu, seeds interleaved;
# 2. the mid-run stalls (a step of 2-3 s, mostly in a model's first run on a machine): the
#    machine's first gpu-0.5b run, steps 2-14 profiled (stalls_profile.txt), and the CUDA/inductor/
#    Triton caches' sizes before and after it;
# 3. long completions (256 tokens), 0.5B, one seed each: vLLM (decode graphs) against the trainer
#    generating, by seconds per step: which should long jobs get?
# 4. the 1.5B tree step's perf/mfu (goal 0.45), profiled, on make_tiny's qwen2-1.5b preset (the
#    model of gpu.md's 0.407; the demo's 1.5b shape is smaller);
# 5. the trainer's decode at a long-job shape (64 rows x 512 tokens), CUDA graphs;
# 6. imports of torch and transformers, slowest first, and whether their bytecode is cached.
# Into $OUT (8 files at most come back): run.log, vs_trl/<task>[-race]/results.json, stalls_profile.txt,
# mfu.jsonl, mfu_profile.txt, importtime_top.txt, and logs.tgz (each run's logs, plots and traces).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/open-out}; mkdir -p "$OUT"; export OUT
cd "$ROOT" || exit 2
T0=$(date +%s); BUDGET=${BUDGET_S:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
want() { [[ " ${ONLY:-1 2 3 4 5 6} " == *" $1 "* ]]; }

python3 - <<'PY'
import glob, importlib.util, os, sys
for mod in ("torch", "transformers"):
    d = os.path.dirname(importlib.util.find_spec(mod).origin)
    print(mod, d, "writable", os.access(d, os.W_OK), "cached", len(glob.glob(f"{d}/__pycache__/*.pyc")),
          "of", len(glob.glob(f"{d}/*.py")), "| dont_write_bytecode", sys.flags.dont_write_bytecode)
PY

if want 0; then
  timeout 90 bash "$HERE/run_gpu_tests.sh" tests/gpu/test_gpu_generator.py 2>&1 | tail -4
fi

L=$(left); if want 1; then
  TASK=gpu-1.5b SEEDS=${SEEDS:-1,2,3} SYSTEMS=trl,agrpo STEPS=22 DEADLINE=$((L * 55 / 100)) RUN_TIMEOUT=110 \
    timeout $((L * 70 / 100)) bash "$HERE/run_vs_trl.sh" all | grep -v '^\s*$' | tail -12
  mv "$OUT/vs_trl/gpu-1.5b" "$OUT/vs_trl/gpu-1.5b-race"  # a race cut short leaves no logs tarball to rename:
  [ -f "$OUT/vs_trl_logs_gpu-1.5b.tgz" ] && mv "$OUT/vs_trl_logs_gpu-1.5b.tgz" "$OUT/vs_trl_logs_gpu-1.5b-race.tgz"
fi

L=$(left); if want 2 && [ "$L" -gt 120 ]; then
  caches() { echo "$1: $(du -sh ~/.nv/ComputeCache /tmp/torchinductor_* ~/.triton 2>/dev/null | tr '\n' ' ')"; }
  caches "caches before"
  TASK=gpu-0.5b SEEDS=1 SYSTEMS=agrpo-profiled STEPS=22 DEADLINE=60 RUN_TIMEOUT=90 \
    VS_ARGS="--variant agrpo-profiled:trainer.profile_steps=[2,14]" \
    timeout 100 bash "$HERE/run_vs_trl.sh" race | grep '^\[vs_trl\] a' | cut -c1-700
  caches "caches after"
  find "$OUT/vs_trl/gpu-0.5b" -name 'steps_*.txt' -exec mv {} "$OUT/stalls_profile.txt" \;
  rm -rf "$OUT/vs_trl/gpu-0.5b" "$OUT/vs_trl_logs_gpu-0.5b.tgz"
fi
L=$(left); if want 3 && [ "$L" -gt 200 ]; then
  LONG=max_completion_length=256
  TASK=gpu-0.5b SEEDS=1 SYSTEMS=agrpo-vllm-256,agrpo-trainer-256 STEPS=30 DEADLINE=$((L / 2)) RUN_TIMEOUT=$((L / 2)) \
    VS_ARGS="--variant agrpo-vllm-256:launcher.generation=vllm,$LONG --variant agrpo-trainer-256:launcher.generation=trainer,$LONG" \
    timeout $((L - 40)) bash "$HERE/run_vs_trl.sh" race | grep '^\[vs_trl\] a' | cut -c1-700
  rm -f "$OUT/vs_trl/gpu-0.5b/reward_vs_time.png"
fi
L=$(left); if want 4 && [ "$L" -gt 85 ]; then
  PYTHONPATH=/tmp/site:. timeout 75 python3 benchmarks/gpu_train_throughput.py --model preset:qwen2-1.5b \
    --label qwen2-1.5b --layouts tree1+gc0 --profile tree1+gc0 --profile-out "$OUT/mfu_profile.txt" --results "$OUT/mfu.jsonl" \
    2>&1 | grep -E 'perf_mfu|mfu|step' | tail -3 | cut -c1-300
fi
L=$(left); if want 5 && [ "$L" -gt 40 ] && [ -d /tmp/agrpo-cache/shaped-model/0.5b ]; then
  PYTHONPATH=/tmp/site:. timeout 35 python3 benchmarks/generator_decode.py --model /tmp/agrpo-cache/shaped-model/0.5b \
    --device cuda --dtype bfloat16 --paths graphs --prompts 8 --n 8 --tokens 512 --prompt-tokens 256 --calls 3 | tail -3
fi
L=$(left); if want 6 && [ "$L" -gt 20 ]; then
  S=$(date +%s)
  PYTHONPATH=/tmp/site:. timeout 20 python3 -X importtime -c 'import torch, transformers; from transformers import AutoModelForCausalLM; import transformers.models.qwen2.modeling_qwen2' 2> /tmp/imports.raw >/dev/null
  echo "imports: $(( $(date +%s) - S )) s"; sort -t'|' -k2 -n -r /tmp/imports.raw | head -45 > "$OUT/importtime_top.txt"
fi
(cd "$OUT" && find . -name '*.tgz' -o -name '*.png' -o -name '*.json.gz' | tar czf /tmp/open-logs.tgz -T - --remove-files) \
  && mv /tmp/open-logs.tgz "$OUT/logs.tgz"
ls -R "$OUT" | head -20
