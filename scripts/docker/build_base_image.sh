#!/usr/bin/env bash
# Build the agrpo Dockerfiles' base image locally, for machines that cannot pull from a
# registry (no python:3.11-slim-bookworm): debootstrap a minimal Debian bookworm with
# Debian's Python 3.11 and `docker import` it. Needs root, Docker and the Debian mirror.
#
#   sudo scripts/docker/build_base_image.sh                   # -> agrpo/python:3.11-bookworm
#   TAG=local/python:3.11 FORCE=1 scripts/docker/build_base_image.sh
#   docker build --network host --build-arg BASE_IMAGE=agrpo/python:3.11-bookworm \
#       -f deploy/docker/reward.Dockerfile -t agrpo/reward:dev <context>
#
# Env: TAG (image tag), FORCE=1 (rebuild even if TAG exists), MIRROR (Debian mirror),
# PACKAGES (what --include installs), EXTRA_CA_CERTS (PEM files to trust, e.g. a
# TLS-intercepting egress proxy's CA; they also land in /etc/pip.conf's bundle, so pip in
# `docker build` reaches PyPI through the proxy. They stay in images built FROM it).
# The Dockerfiles need: `python` on PATH (python-is-python3), `python -m venv`
# (python3-venv: ensurepip's pip wheel), CA certificates for pip, groupadd/useradd (passwd,
# in minbase). No system pip: every image's pip lives in its venv.
set -euo pipefail

TAG="${TAG:-agrpo/python:3.11-bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
PACKAGES="${PACKAGES:-python3.11,python3-venv,python-is-python3,ca-certificates}"
EXTRA_CA_CERTS="${EXTRA_CA_CERTS:-}"

# What the image is made of; an image built from other inputs (say other CA certificates) is rebuilt.
recipe="$(printf '%s\n' "$MIRROR" "$PACKAGES"; for crt in $EXTRA_CA_CERTS; do cat "$crt"; done)"
recipe="$(printf '%s' "$recipe" | sha256sum | cut -c1-16)"
if [[ "${FORCE:-0}" != 1 ]] \
   && [[ "$(docker image inspect -f '{{index .Config.Labels "agrpo.base.recipe"}}' "$TAG" 2>/dev/null)" == "$recipe" ]]; then
  echo "$TAG exists (FORCE=1 rebuilds)"; exit 0
fi
command -v debootstrap > /dev/null || apt-get install -y --no-install-recommends debootstrap

start=$SECONDS
tmp="$(mktemp -d /var/tmp/agrpo-base.XXXXXX)"
trap 'rm -rf "$tmp"' EXIT
root="$tmp/root"
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR"

for crt in $EXTRA_CA_CERTS; do
  cp "$crt" "$root/usr/local/share/ca-certificates/$(basename "${crt%.*}").crt"
done
if [[ -n "$EXTRA_CA_CERTS" ]]; then
  chroot "$root" update-ca-certificates
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > "$root/etc/pip.conf"
fi

chroot "$root" apt-get clean
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* \
       "$root"/debootstrap "$root"/tmp/* "$root"/usr/share/doc/* "$root"/usr/share/man/*

# docker import sets no environment: give the Dockerfiles' `ENV PATH=/opt/venv/bin:$PATH` a PATH.
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python"]' \
  --change "LABEL agrpo.base.recipe=$recipe" \
  --message "debootstrap --variant=minbase bookworm ($PACKAGES)" - "$TAG"
docker run --rm "$TAG" python -c 'import sys, venv, ssl; print(sys.version)'
echo "built $TAG in $((SECONDS - start))s: $(docker image inspect -f '{{.Size}}' "$TAG" | numfmt --to=iec)"
