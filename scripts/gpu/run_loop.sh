#!/usr/bin/env bash
# run_loop.sh: the FULL LOOP on a 2-GPU machine, one device call (~4-6 min): real vLLM 0.26
# on GPU 0, the trainer service on GPU 1 (NCCL weight sync), rollout + reward on the CPUs,
# as processes (`agrpo demo --gpu`). From the repo root, carrying .vllm-carry/sm90 and .whl:
#   bash scripts/gpu/run_loop.sh
# 1. record GPUs/versions; extract vLLM into /tmp/site; pip-install .whl/*.whl there (offline)
# 2. preflight imports (grpc/protobuf/datasets/our stubs, the vLLM worker extension)
# 3. python3 -m agrpo.cli demo --gpu --steps $STEPS under a timeout; stop anything left over
# Knobs: STEPS=40  DEMO_TIMEOUT=430 (s, whole demo incl. vLLM start)  DEMO_ARGS="--max-staleness 1 ..."
#   WORKER_EXT=auto|none|<class>  (auto: the lead's agrpo_vllm_plugin.worker extension when that
#   file exists, else none)  SITE=/tmp/site  RUN_DIR=/tmp/loop  WHL=.whl  ARCHIVE=<the sm90 archive>
#   AGRPO_VLLM_PYTHON (default: python3, which sees vLLM through PYTHONPATH)
# Into $OUT (6 files): run.log env.txt summary.json metrics.jsonl curves.png logs.tar.gz
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
OUT=${OUT:-/tmp/loop-out}; mkdir -p "$OUT"
SITE=${SITE:-/tmp/site}; RUN_DIR=${RUN_DIR:-/tmp/loop}
STEPS=${STEPS:-40}; DEMO_TIMEOUT=${DEMO_TIMEOUT:-430}; WORKER_EXT=${WORKER_EXT:-auto}
WHL=${WHL:-$ROOT/.whl}; ARCHIVE=${ARCHIVE:-$ROOT/.vllm-carry/sm90/vllm026-sm90.tar.xz}
exec > >(tee -a "$OUT/run.log") 2>&1
gpu_safe_env
cd "$ROOT" || exit 2

# ---------- 1. environment (cheap), vLLM, wheels
{ date -u; nvidia-smi --query-gpu=index,name,driver_version,memory.total,memory.used --format=csv
  nvidia-smi topo -m 2>&1 | head -4; python3 -V; nproc
  python3 -c 'import torch,transformers;print("torch",torch.__version__,"cuda",torch.version.cuda,"nccl",torch.cuda.nccl.version(),"gpus",torch.cuda.device_count(),"| transformers",transformers.__version__)'
  python3 - <<'EOF'
import importlib.metadata as md
for n in ["grpcio", "protobuf", "pyarrow", "fsspec", "huggingface-hub", "pandas", "sympy", "tokenizers",
          "aiohttp", "prometheus-client", "pyyaml", "typing-extensions"]:
    try:
        print(f"  image: {n} {md.version(n)}")
    except Exception as e:  # noqa: BLE001
        print(f"  image: {n} MISSING ({type(e).__name__})")
EOF
  env | grep -E '^(NCCL|TORCH_SYMM|NVSHMEM)' | sort; } > "$OUT/env.txt" 2>&1
say "GPUs: $(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tr '\n' ' ')"
grep -E '^torch' "$OUT/env.txt"
extract_vllm "$ARCHIVE" "$SITE" || exit 3
install_wheels "$WHL" "$SITE" || exit 4

export PYTHONPATH=$SITE:$ROOT:$ROOT/gen:$ROOT/vllm_plugin${PYTHONPATH:+:$PYTHONPATH}
# Only the demo reads it (services would take any AGRPO_* variable for a config key).
VLLM_PY=${AGRPO_VLLM_PYTHON:-$(command -v python3)}; unset AGRPO_VLLM_PYTHON
# Every process the demo starts inherits this mark, so the exit trap can end leftovers
# (vLLM runs in its own session, which the device would otherwise keep alive).
export LOOP_RUN_MARK="loop-$$-$RANDOM"
finish() {
  kill_marked "$LOOP_RUN_MARK"
  say "GPU memory used after the run: $(nvidia-smi --query-gpu=memory.used --format=csv,noheader | tr '\n' ' ')"
}
trap finish EXIT

# ---------- 2. preflight: fail in seconds, not after vLLM's 1-2 min start
python3 - "$SITE" <<'EOF' || { say "preflight imports FAILED"; exit 5; }
import sys, importlib.metadata as md
site = sys.argv[1]
import google.protobuf, grpc, grpc_health.v1.health_pb2, grpc_reflection, datasets, pydantic, yaml
from agrpo.v1 import common_pb2, trainer_service_pb2_grpc  # noqa: F401  (gencode checks protobuf)
import agrpo.demo.runner, agrpo.services.trainer.server, agrpo.services.rollout.server, agrpo.services.reward.server  # noqa
print("preflight ok: grpcio", grpc.__version__, "| protobuf", google.protobuf.__version__,
      "| datasets", datasets.__version__, "| pydantic", pydantic.VERSION, "| pyarrow", md.version("pyarrow"),
      "| fsspec", md.version("fsspec"))
for mod in (google.protobuf, grpc, datasets, pydantic):
    if not mod.__file__.startswith(site):
        sys.exit(f"{mod.__name__} comes from {mod.__file__}, not {site}")
# what rollout does first: the image's pyarrow/fsspec must suit datasets at run time, not only at import
import json, tempfile
from agrpo.services.common.config.sections import DatasetConfig
from agrpo.services.rollout.data import load_rows
with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
    f.write(json.dumps({"prompt": [{"role": "user", "content": "1 + 1?"}], "solution": "2"}) + "\n")
rows = load_rows(DatasetConfig(path="json", data_files=f.name))
assert rows[0]["solution"] == "2", rows
print("preflight ok: datasets loads a JSONL file")
EOF
if [ "$WORKER_EXT" = auto ]; then
  if [ -f "$ROOT/vllm_plugin/agrpo_vllm_plugin/worker.py" ]; then WORKER_EXT=agrpo_vllm_plugin.worker.AgrpoWorkerExtension
  else WORKER_EXT=none; say "WARNING: vllm_plugin/agrpo_vllm_plugin/worker.py missing: vLLM starts without a worker extension"; fi
fi
if [ "$WORKER_EXT" != none ]; then
  CUDA_VISIBLE_DEVICES=0 python3 -c "import importlib,sys; m,c=sys.argv[1].rsplit('.',1); getattr(importlib.import_module(m),c); print('worker extension ok:',sys.argv[1])" \
    "$WORKER_EXT" 2>&1 | tail -3
  [ "${PIPESTATUS[0]}" = 0 ] || { say "worker extension $WORKER_EXT does not import (WORKER_EXT=none skips it)"; exit 5; }
fi
EXT_ARGS=(--worker-extension "$WORKER_EXT")

# ---------- 3. the loop (GPU memory and utilisation every 5 s into logs/gpu.csv)
mkdir -p "$RUN_DIR/logs"
nvidia-smi --query-gpu=timestamp,index,memory.used,utilization.gpu --format=csv,noheader -l 5 \
  > "$RUN_DIR/logs/gpu.csv" 2>&1 &
SMI=$!
say "demo --gpu --steps $STEPS (timeout ${DEMO_TIMEOUT}s) ${DEMO_ARGS:-}"
# shellcheck disable=SC2086
AGRPO_VLLM_PYTHON=$VLLM_PY timeout -k 45 "$DEMO_TIMEOUT" python3 -m agrpo.cli demo --gpu --steps "$STEPS" --out "$RUN_DIR" --set launcher.generation=vllm \
  --cache /tmp/agrpo-cache --timeout $((DEMO_TIMEOUT > 210 ? DEMO_TIMEOUT - 150 : DEMO_TIMEOUT)) "${EXT_ARGS[@]}" ${DEMO_ARGS:-}
RC=$?
kill "$SMI" 2>/dev/null
say "demo rc=$RC; GPU memory peak MiB per GPU: $(awk -F', ' '{split($3,a," "); if (a[1]>m[$2]) m[$2]=a[1]} END {for (g in m) printf "%s:%s ", g, m[g]}' "$RUN_DIR/logs/gpu.csv" 2>/dev/null)"
kill_marked "$LOOP_RUN_MARK"

# ---------- outputs
for f in summary.json metrics.jsonl curves.png; do [ -f "$RUN_DIR/$f" ] && cp "$RUN_DIR/$f" "$OUT/"; done
( cd "$RUN_DIR" 2>/dev/null && tar czf "$OUT/logs.tar.gz" --ignore-failed-read logs agrpo.yaml \
    trainer_output/trained_samples.jsonl 2>/dev/null )
if [ "$RC" != 0 ]; then
  for f in "$RUN_DIR"/logs/*.log; do [ -f "$f" ] && { echo "----- tail of $f"; tail -25 "$f" | cut -c1-400; }; done
fi
[ -f "$RUN_DIR/summary.json" ] && python3 - "$RUN_DIR/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
sync = s.get("weight_sync_ms") or {}
rows = [("steps", s.get("steps")), ("wall s (vLLM start s)", f"{s.get('wall_s')} ({s.get('vllm_startup_s')})"),
        ("policy versions first -> last", f"{s.get('policy_version_first')} -> {s.get('policy_version_last')}"),
        ("samples trained", s.get("samples_trained")),
        ("dropped stale: trainer / rollout", f"{s.get('samples_dropped_stale')} / {s.get('rollout_dropped_stale')}"),
        ("max staleness trained (limit)", f"{s.get('max_trained_staleness')} ({s.get('max_staleness')})"),
        ("reward first10 -> last10", f"{s.get('reward_first10', float('nan')):.3f} -> {s.get('reward_last10', float('nan')):.3f}"),
        ("weight sync ms median (min-max, n)",
         f"{sync.get('median')} ({sync.get('min')}-{sync.get('max')}, {sync.get('n')})" if sync else "n/a"),
        ("sync phases median ms", " ".join(f"{k}={v}" for k, v in (sync.get("phases_median") or {}).items()) or "n/a"),
        ("trainer drops / rollout drops", f"{s.get('trainer_dropped')} / {s.get('rollout_drops')}"),
        ("weight transport / load", f"{s.get('weight_transport')} / {s.get('weight_load')}"),
        ("error", s.get("error", "-"))]
print("\n| what | value |\n|---|---|")
for k, v in rows:
    print(f"| {k} | {v} |")
EOF
say "done rc=$RC; \$OUT: $(ls "$OUT" | tr '\n' ' ')"
exit $RC
