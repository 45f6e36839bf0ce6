#!/usr/bin/env bash
# run_open_questions.sh: docs/vs-trl.md's open GPU questions in one call, each step only while the
# call's budget lasts (a call cut short still brings back what ran). From the repo root, carrying
# .vllm-carry/sm90 and .whl (run_vs_trl.sh says what to set aside to fit 64 MiB):
#   BUDGET_S=560 bash scripts/gpu/run_open_questions.sh        (ONLY="3 4 5 6": those steps only, e.g. in
#   a second call: one call of 560 s reaches about steps 1, 2 and 4)
# 0. the trainer's generator tests on the GPU (its decode runs on its own CUDA stream);
# 1. the gpu-1.5b race, TRL colocate against agrpo demo --gpu, seeds interleaved;
# 2. agrpo's async schedule on the same task (the default there is sync: is it the faster?);
# 3. agrpo's vLLM path with full-decode CUDA graphs and no torch.compile, then as long jobs get it
#    now (--enforce-eager), 0.5B, one seed: is the graphs flag set the faster default?
# 4. the 1.5B tree step's perf/mfu (goal 0.45), profiled: the first timing since a row's host
#    data stopped waiting for the GPU mid-row;
# 5. the trainer's decode at a long-job shape (64 rows x 512 tokens), CUDA graphs;
# 6. imports of torch and transformers, slowest first, and whether their bytecode is cached.
# Into $OUT (8 files at most come back): run.log, vs_trl/<task>[-race]/results.json, mfu.jsonl,
# mfu_profile.txt, importtime_top.txt, and logs.tgz (each run's logs and the plots).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
OUT=${OUT:-/tmp/open-out}; mkdir -p "$OUT"; export OUT
cd "$ROOT" || exit 2
T0=$(date +%s); BUDGET=${BUDGET_S:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
want() { [[ " ${ONLY:-0 1 2 3 4 5 6} " == *" $1 "* ]]; }

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
  mv "$OUT/vs_trl/gpu-1.5b" "$OUT/vs_trl/gpu-1.5b-race" && mv "$OUT/vs_trl_logs_gpu-1.5b.tgz" "$OUT/vs_trl_logs_gpu-1.5b-race.tgz"
fi

L=$(left); if want 2 && [ "$L" -gt 120 ]; then
  TASK=gpu-1.5b SEEDS=${SEEDS:-1,2,3} SYSTEMS=agrpo-async STEPS=22 DEADLINE=$((L / 3)) RUN_TIMEOUT=60 \
    timeout $((L / 2)) bash "$HERE/run_vs_trl.sh" race | grep -v '^\s*$' | tail -6
  rm -f "$OUT/vs_trl/gpu-1.5b/reward_vs_time.png"
fi
L=$(left); if want 3 && [ "$L" -gt 160 ]; then
  GRAPHS='launcher.generation=vllm,launcher.vllm_args=[--no-enforce-eager,-cc.mode=none,-cc.cudagraph_mode=FULL_DECODE_ONLY]'
  TASK=gpu-0.5b SEEDS=1 SYSTEMS=agrpo-vllm-graphs,agrpo-vllm STEPS=40 DEADLINE=$((L / 2)) RUN_TIMEOUT=$((L / 2)) VS_ARGS="--variant agrpo-vllm-graphs:$GRAPHS" \
    timeout $((L - 40)) bash "$HERE/run_vs_trl.sh" race | grep -v '^\s*$' | tail -6
  rm -f "$OUT/vs_trl/gpu-0.5b/reward_vs_time.png"
fi
L=$(left); if want 4 && [ "$L" -gt 85 ]; then
  [ -d /tmp/agrpo-cache/shaped-model/1.5b ] || PYTHONPATH=/tmp/site:. python3 -c \
    'from pathlib import Path; from agrpo.demo.models import shaped_model; shaped_model(Path("/tmp/agrpo-cache"), "1.5b")'
  PYTHONPATH=/tmp/site:. timeout 75 python3 benchmarks/gpu_train_throughput.py --model /tmp/agrpo-cache/shaped-model/1.5b \
    --label 1.5b --layouts tree1+gc0 --profile tree1+gc0 --profile-out "$OUT/mfu_profile.txt" --results "$OUT/mfu.jsonl" \
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
(cd "$OUT" && find . -name '*.tgz' -o -name '*.png' | tar czf /tmp/open-logs.tgz -T - --remove-files) \
  && mv /tmp/open-logs.tgz "$OUT/logs.tgz"
ls -R "$OUT" | head -20
