#!/usr/bin/env bash
# fetch_wheels.sh: run HERE (PyPI reachable), from anywhere in the repo. Downloads into .whl/
# the wheels our services need on the offline GPU machine (Python 3.12, manylinux x86_64)
# that neither its image nor the carried vLLM archive brings, at the versions of .venv.
#   bash scripts/gpu/fetch_wheels.sh        then carry ".whl" (scripts/gpu/run_loop.sh installs them)
# Not needed there (image: torch, transformers, safetensors, tokenizers, pyyaml, aiohttp, tqdm,
# matplotlib, jinja2, prometheus-client, numpy, pandas, pyarrow, fsspec, huggingface-hub,
# requests, xxhash, sympy; vLLM archive: pydantic(+core), typing_extensions, annotated_types,
# typing_inspection). The image's grpcio/protobuf are too old for our generated stubs.
# math-verify + latex2sympy2_extended + antlr4 serve the `accuracy` reward (lazy; ~0.4 MiB);
# peft + accelerate serve LoRA (the trainer's `peft` section, docs/lora.md).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd); cd "$ROOT"
DEST=${DEST:-.whl}; PYVER=${PYVER:-3.12}  # the device's Python; PYVER=3.11 only for a dry run here
# name==version used when .venv lacks the package
PINS="grpcio==1.85.3 grpcio-health-checking==1.85.1 grpcio-reflection==1.85.1 protobuf==7.36.2
datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
math-verify==0.9.0 latex2sympy2_extended==1.11.0 antlr4-python3-runtime==4.13.2
peft==0.21.2 accelerate==1.16.0"
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3

grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p "$DEST"

SPECS=()
for pin in $PINS; do  # the .venv's version wins: the device must run what the tests ran
  name=${pin%%==*}
  ver=$("$PY" -c "import importlib.metadata as m,sys; print(m.version(sys.argv[1]))" "$name" 2>/dev/null || echo "${pin#*==}")
  SPECS+=("$name==$ver")
done
echo "[fetch_wheels] ${SPECS[*]}"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${SPECS[@]}" \
  2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# Keep exactly the wanted files: two versions of one package stop the whole install there.
norm() { echo "$1" | tr 'A-Z-.' 'a-z__'; }
keep=" "
for spec in "${SPECS[@]}"; do keep+="$(norm "${spec%%==*}")-${spec#*==} "; done
for w in "$DEST"/*.whl; do
  base=$(basename "$w"); id="$(norm "$(echo "$base" | cut -d- -f1)")-$(echo "$base" | cut -d- -f2)"
  case "$keep" in *" $id "*) ;; *) echo "[fetch_wheels] removing $base (not wanted / other version)"; rm -f "$w" ;; esac
done

echo "[fetch_wheels] Requires-Dist (what the device must already have):"
for w in "$DEST"/*.whl; do
  reqs=$(unzip -p "$w" '*.dist-info/METADATA' | { grep '^Requires-Dist' || true; } | { grep -v 'extra ==' || true; } \
         | sed 's/^Requires-Dist: //' | tr '\n' ';' | sed 's/;$//')
  printf '  %-48s %s\n' "$(basename "$w" | cut -d- -f1-2)" "${reqs:--}"
done
echo "[fetch_wheels] sizes:"
ls -l "$DEST"/*.whl | awk '{printf "  %8.2f MiB  %s\n", $5/1048576, $9; s+=$5} END {printf "  %8.2f MiB  total\n", s/1048576}'
# The device call carries at most 64 MiB: the working tree + the vLLM archive + these wheels.
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
untracked=$(git ls-files -z --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
whl=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
carry=$(du -cb .vllm-carry/sm90 2>/dev/null | tail -1 | cut -f1); carry=${carry:-0}
awk -v t="$tree" -v u="$untracked" -v w="$whl" -v c="$carry" 'BEGIN {
  s = t + u + w + c
  printf "[fetch_wheels] one call carries %.1f MiB of 64 (tree %.1f + untracked %.1f + .whl %.1f + .vllm-carry/sm90 %.1f)\n",
         s/1048576, t/1048576, u/1048576, w/1048576, c/1048576
  if (s > 64 * 1048576) { print "[fetch_wheels] TOO BIG for one call"; exit 1 } }'
