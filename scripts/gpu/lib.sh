# lib.sh: shell helpers for the device scripts (source it; it sets nothing by itself).
#   gpu_safe_env          export multicast-off NCCL settings + offline/quiet flags for every child
#   say MSG               timestamped log line
#   extract_vllm TAR DIR  unpack the carried vLLM archive (scripts/gpu/README.md) into DIR
#   install_wheels DIR SITE  pip-install every DIR/*.whl into SITE (offline, no deps)
#   kill_marked MARK      end every process whose environment holds LOOP_RUN_MARK=MARK (ours only)

say() { echo "[run $(date +%H:%M:%S) +${SECONDS}s] $*"; }

gpu_safe_env() {
  # NVLink multicast must stay off on these shared hosts (KINDS.md); vLLM's workers use
  # NCCL_CUMEM_ENABLE=0, and both ends of the weight-transfer communicator must agree.
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 NCCL_CUMEM_ENABLE=0
  export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
         VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TOKENIZERS_PARALLELISM=false
}

extract_vllm() {  # archive site
  local t=$SECONDS
  [ -f "$1" ] || { say "missing $1 (carry .vllm-carry/sm90)"; return 3; }
  mkdir -p "$2"
  python3 -c "import tarfile,sys;tarfile.open(sys.argv[1]).extractall(sys.argv[2],filter='data')" "$1" "$2" \
    || { say "extract of $1 FAILED"; return 3; }
  say "extracted $(basename "$1") ($(du -sm "$1" | cut -f1) MiB) in $((SECONDS - t)) s; $2 $(du -sm "$2" | cut -f1) MiB"
}

install_wheels() {  # wheel_dir site
  local t=$SECONDS n
  n=$(ls "$1"/*.whl 2>/dev/null | wc -l)
  [ "$n" -gt 0 ] || { say "no wheels in $1 (run scripts/gpu/fetch_wheels.sh here, carry .whl)"; return 4; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$2" "$1"/*.whl \
    2>&1 | grep -v -E "^\s*$|WARNING: Target directory .* already exists" || true
  # pip's status is hidden by the filter: check that every wheel landed instead.
  local w name missing=0
  for w in "$1"/*.whl; do
    name=$(basename "$w" | cut -d- -f1-2)
    ls -d "$2/$name.dist-info" >/dev/null 2>&1 || { say "wheel not installed: $name"; missing=1; }
  done
  [ "$missing" = 0 ] || return 4
  say "installed $n wheels into $2 in $((SECONDS - t)) s"
}

kill_marked() {  # mark: TERM, then KILL, every process (not this shell) started under LOOP_RUN_MARK=mark
  local mark=$1 pids p
  marked() {
    for p in /proc/[0-9]*; do
      p=${p#/proc/}
      [ "$p" = "$$" ] || [ "$p" = "$BASHPID" ] && continue
      { tr '\0' '\n' < "/proc/$p/environ"; } 2>/dev/null | grep -qx "LOOP_RUN_MARK=$mark" && echo "$p"
    done
  }
  pids=$(marked)
  [ -n "$pids" ] || return 0
  say "stopping leftover processes: $(echo $pids)"
  kill -TERM $pids 2>/dev/null
  for _ in $(seq 20); do pids=$(marked); [ -n "$pids" ] || return 0; sleep 0.5; done
  kill -KILL $pids 2>/dev/null
  return 0
}
