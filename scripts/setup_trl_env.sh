#!/usr/bin/env bash
# Create (or refresh) .venv-trl: Hugging Face TRL's own GRPOTrainer, the baseline that
# benchmarks/vs_trl.py races (benchmarks/trl_runner.py runs in it). Idempotent: the venv
# has a stamp file holding a hash of its inputs, so a re-run with nothing changed is a no-op.
# Usage: scripts/setup_trl_env.sh
#
#   .venv-trl   trl + transformers + torch, nothing of agrpo. Kept apart from .venv so the
#               baseline runs exactly the versions the comparison names
#               (docs: /work/shared/reference/trl-grpotrainer-baseline.md).
#
# Use pip, not uv/poetry: torch 2.13.0+cpu comes from a local wheel folder that
# only pip sees (through the machine's pip config: find-links).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
SELF="$ROOT/scripts/setup_trl_env.sh"   # part of the stamp: editing this script re-runs it
VENV="${AGRPO_TRL_VENV:-$ROOT/.venv-trl}"

# torch: MUST be pinned exactly, as scripts/setup_env.sh does. The machine ships a
# torch-2.13.0+cpu wheel; an unpinned (or ranged) torch makes pip fetch a multi-GB CUDA build.
TORCH_PIN="torch==2.13.0"
# The versions the baseline document names. No vllm: TRL generates with transformers'
# generate on a CPU (use_vllm=False); the GPU machine brings its own vLLM.
TRL_PINS="trl==1.16.0 transformers==5.19.0 datasets accelerate"

log() { printf '[setup_trl_env] %s\n' "$*"; }
# pip's local-index config prints hundreds of harmless "Location ... is ignored" lines.
pip_q() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }

# Hash of a spec string plus the given files (missing files hash as absent).
inputs_hash() {
  local spec="$1"; shift
  { echo "$spec"; "$PYTHON" -V 2>&1; for f in "$@"; do echo "== $f"; cat "$f" 2>/dev/null || echo "<absent>"; done; } \
    | sha256sum | cut -d' ' -f1
}
up_to_date() { [[ -x "$1/bin/python" && -f "$1/.agrpo-stamp" && "$(cat "$1/.agrpo-stamp")" == "$2" ]]; }
# Drops the stamp first: an interrupted install must never look complete later.
ensure_venv() {
  [[ -x "$1/bin/python" ]] || { log "creating $1 ($("$PYTHON" -V))"; "$PYTHON" -m venv "$1"; }
  rm -f "$1/.agrpo-stamp"
}

setup_trl() {
  local v="$VENV" h
  h="$(inputs_hash "$TORCH_PIN $TRL_PINS" "$SELF")"
  if up_to_date "$v" "$h"; then log "${v#"$ROOT"/} up to date"; return; fi
  local t0=$SECONDS
  ensure_venv "$v"
  log "${v#"$ROOT"/}: pip install $TORCH_PIN"
  pip_q "$v/bin/pip" install -q "$TORCH_PIN"
  log "${v#"$ROOT"/}: pip install $TRL_PINS"
  # Keep the torch pin while resolving, so nothing can upgrade it.
  # shellcheck disable=SC2086  # TRL_PINS is a list of requirement specifiers
  pip_q "$v/bin/pip" install -q $TRL_PINS "$TORCH_PIN"
  # Fail loudly if a resolver swapped a pinned version.
  "$v/bin/python" -c 'import importlib.metadata as m
got = {p: m.version(p) for p in ("torch", "trl", "transformers")}
assert got["torch"].startswith("2.13.0") and got["trl"] == "1.16.0" and got["transformers"] == "5.19.0", got
import trl.trainer.grpo_trainer  # imports cleanly without vllm'
  echo "$h" > "$v/.agrpo-stamp"
  log "${v#"$ROOT"/} ready in $((SECONDS - t0)) s"
}

setup_trl
