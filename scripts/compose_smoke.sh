#!/usr/bin/env bash
# The CPU compose file for real, on a machine that cannot pull images: build the base image
# (debootstrap + docker import) and the four images, `docker compose up` the agrpo services
# of deploy/compose/docker-compose.cpu.yaml, wait until the trainer trains, SIGKILL the
# trainer's process (as the OOM killer would: the restart policy brings it back) and then
# `docker kill` its container (Docker counts that as a manual stop: no restart policy
# applies, so it is started again as an operator would), check that it resumes its
# checkpoint each time and that `agrpo audit` in the container proves exactly-once, and
# bring everything down with its volumes. Prints the time of each phase. Needs root.
#
#   sudo scripts/compose_smoke.sh              # builds what is missing, ~15 min on 2 cores
#   REBUILD=1 sudo scripts/compose_smoke.sh    # rebuild the images
#
# Env: REBUILD=1, KEEP=1 (leave the project up), STEPS (steps before each kill, default 4),
# WHEELS (a folder with a torch +cpu wheel, served to the builds; default: pip's find-links
# folder when it has one, else the PyTorch CPU index is used).
# Prometheus and Grafana are left out: their images come from a registry.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROJECT=agrpo-smoke
FILE="$ROOT/deploy/compose/docker-compose.cpu.yaml"
STEPS="${STEPS:-4}"
BASE=agrpo/python:3.11-bookworm
T0=$SECONDS
say() { printf '[compose %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { say "FAILED: $*"; compose logs --tail 40 trainer rollout >&2 || true; exit 1; }
OVERRIDE=""
compose() { docker compose -p "$PROJECT" -f "$FILE" ${OVERRIDE:+-f "$OVERRIDE"} "$@"; }

ensure_docker() {
  if ! command -v dockerd > /dev/null; then apt-get install -y --no-install-recommends docker.io > /dev/null; fi
  if ! docker info > /dev/null 2>&1; then
    (dockerd > /var/log/agrpo-dockerd.log 2>&1 &)
    for _ in $(seq 60); do docker info > /dev/null 2>&1 && break; sleep 1; done
    docker info > /dev/null 2>&1 || { echo "dockerd did not start: /var/log/agrpo-dockerd.log"; exit 1; }
  fi
  if ! docker compose version > /dev/null 2>&1; then  # bookworm has Compose v1 only; trixie's v2 plugin is static
    local deb=/tmp/agrpo-docker-compose.deb url=http://deb.debian.org/debian
    local f; f="$(curl -fsS "$url/dists/trixie/main/binary-amd64/Packages.xz" | xz -dc \
      | awk '/^Package: docker-compose$/{p=1} p&&/^Filename:/{print $2; exit}')"
    curl -fsS -o "$deb" "$url/$f"
    mkdir -p ~/.docker/cli-plugins && dpkg-deb --fsys-tarfile "$deb" \
      | tar -xO ./usr/libexec/docker/cli-plugins/docker-compose > ~/.docker/cli-plugins/docker-compose
    chmod +x ~/.docker/cli-plugins/docker-compose
  fi
  say "docker $(docker version -f '{{.Server.Version}}'), $(docker compose version --short)"
}

build_images() {
  "$ROOT/scripts/docker/build_base_image.sh"
  local wheels="${WHEELS:-$(pip config get global.find-links 2>/dev/null || true)}" args=() server=""
  if [[ -n "$wheels" && -n "$(ls "$wheels"/torch-*+cpu-*.whl 2>/dev/null)" ]]; then
    python3 -m http.server 8765 --bind 127.0.0.1 --directory "$wheels" > /dev/null 2>&1 & server=$!
    args=(--build-arg TORCH_INDEX_URL=https://pypi.org/simple --build-arg PIP_FIND_LINKS=http://127.0.0.1:8765/)
  fi
  local ctx; ctx="$(mktemp -d /var/tmp/agrpo-ctx.XXXXXX)"
  # The legacy builder ignores <name>.dockerignore: a small staged context instead.
  (cd "$ROOT" && cp -r --parents pyproject.toml README.md services gen vllm_plugin deploy/docker "$ctx/")
  find "$ctx" -name __pycache__ -prune -exec rm -rf {} +
  for image in reward rollout trainer vllm-cpu; do
    if [[ "${REBUILD:-0}" != 1 ]] && docker image inspect "agrpo/$image:dev" > /dev/null 2>&1; then continue; fi
    local t=$SECONDS extra=()
    [[ $image == vllm-cpu ]] && extra=(--build-arg "RUNTIME_APT=libgomp1 libnuma1 g++ python3-dev")
    docker build -q --network host --build-arg BASE_IMAGE=$BASE "${args[@]}" "${extra[@]}" \
      -f "$ctx/deploy/docker/$image.Dockerfile" -t "agrpo/$image:dev" "$ctx" > /dev/null
    say "built agrpo/$image:dev in $((SECONDS - t)) s ($(docker image inspect -f '{{.Size}}' "agrpo/$image:dev" | numfmt --to=iec))"
  done
  rm -rf "$ctx"
  [[ -n "$server" ]] && kill "$server"
  return 0
}

last_step() {  # the trainer's last "step N |" log line, across its restarts
  compose logs --no-log-prefix trainer 2>/dev/null | sed -n 's/.*"message": "step \([0-9]*\) |.*/\1/p' \
    | tail -1
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2; shift 2
  local t=$SECONDS
  until "$@"; do
    (( SECONDS - t < limit )) || die "$what: not within $limit s"
    sleep 2
  done
  say "$what ($((SECONDS - t)) s)"
}

healthy() { [[ "$(docker inspect -f '{{.State.Health.Status}}' "$PROJECT-$1-1" 2>/dev/null)" == healthy ]]; }
all_healthy() { healthy reward && healthy trainer && healthy rollout; }
stepped_past() { local s; s="$(last_step)"; [[ -n "$s" ]] && (( s >= $1 )); }
resumed() { compose logs --no-log-prefix trainer 2>/dev/null | grep -q "continuing run [^ ]* from [^ ]*checkpoint-"; }

kill_and_resume() {  # kill_and_resume HOW: the trainer comes back, resumes, trains on
  local how=$1 before restarts
  before="$(last_step)"; restarts="$(docker inspect -f '{{.RestartCount}}' "$PROJECT-trainer-1")"
  if [[ $how == process ]]; then
    kill -9 "$(docker inspect -f '{{.State.Pid}}' "$PROJECT-trainer-1")"
  else
    docker kill "$PROJECT-trainer-1" > /dev/null
  fi
  say "trainer killed ($how) after step $before"
  local t=$SECONDS
  until (( $(docker inspect -f '{{.RestartCount}}' "$PROJECT-trainer-1") > restarts )) \
        && [[ "$(docker inspect -f '{{.State.Running}}' "$PROJECT-trainer-1")" == true ]]; do
    if (( SECONDS - t > 60 )); then
      [[ $how == container ]] || die "the restart policy did not restart the trainer"
      say "docker kill counts as a manual stop: no restart by policy; docker start (as an operator would)"
      docker start "$PROJECT-trainer-1" > /dev/null; break
    fi
    sleep 1
  done
  wait_for 600 "trainer serving again" healthy trainer
  wait_for 600 "trainer trained past step $before again" stepped_past $((before + 1))
}

main() {
  ensure_docker
  local t=$SECONDS
  build_images
  say "images ready ($((SECONDS - t)) s)"
  OVERRIDE="$(mktemp /tmp/agrpo-compose-override.XXXXXX.yaml)"
  # Checkpoint every 2 steps so a kill has something to resume; the run is long enough to outlive the test.
  printf 'services:\n  trainer:\n    environment:\n      AGRPO_SAVE_STEPS: "2"\n      AGRPO_NUM_TRAIN_EPOCHS: "50"\n' > "$OVERRIDE"
  compose down -v --remove-orphans > /dev/null 2>&1 || true
  compose up -d --no-build assets vllm reward trainer rollout 2> /dev/null
  wait_for 900 "reward, trainer and rollout healthy (gRPC health probes)" all_healthy
  wait_for 900 "trainer at step $STEPS" stepped_past "$STEPS"
  kill_and_resume process
  resumed || die "the trainer did not resume its checkpoint after the restart"
  wait_for 600 "trainer at step $(( $(last_step) + STEPS ))" stepped_past $(( $(last_step) + STEPS ))
  kill_and_resume container
  compose logs --no-log-prefix trainer | grep -o "continuing run [^\"]*" | tail -2
  local verdict; verdict="$(compose exec -T trainer agrpo audit /var/lib/agrpo/output 2>&1 | tail -1)"
  say "audit in the trainer container: $verdict"
  [[ $verdict == *"exactly once: OK"* ]] || die "the audit failed"
  if [[ "${KEEP:-0}" == 1 ]]; then say "left up: docker compose -p $PROJECT -f $FILE down -v"; exit 0; fi
  t=$SECONDS
  compose down -v --remove-orphans 2> /dev/null
  [[ -z "$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")" ]] || die "containers left after down"
  [[ -z "$(docker volume ls -q --filter "label=com.docker.compose.project=$PROJECT")" ]] || die "volumes left after down"
  say "down clean ($((SECONDS - t)) s); compose smoke OK"
  rm -f "$OVERRIDE"
}

main "$@"
