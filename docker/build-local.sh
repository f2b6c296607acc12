#!/usr/bin/env bash
# Builds the gateway and CPU worker images without a Docker daemon or a registry, and runs them.
#
#   docker/build-local.sh [all|base|wheels|images|run]      (from anywhere; default: all)
#
# base    a Debian bookworm base with Python (debootstrap --variant=minbase), imported into podman as
#         localhost/debian-python (skipped when that image exists)
# wheels  every wheel the images install, downloaded on the host into docker/wheels/ (pip inside a build
#         may not reach or trust the package index; the Dockerfiles install these with --no-index)
# images  buildah bud --isolation chroot of docker/Dockerfile.gateway and docker/Dockerfile.cpu with
#         --build-arg BASE=localhost/debian-python, as localhost/poolgate-gateway and localhost/poolgate-cpu;
#         prints each build's seconds and each image's size
# run     the worker container serves the bundled model to the gateway container (host network, loopback
#         ports $WORKER_PORT and $GATEWAY_PORT), a request from the host gets a vector; prints the seconds
#         until /health is 200, then stops both containers
# all     base, wheels, images, run
#
# Needs root, Debian's buildah, podman, runc and debootstrap. Containers run with --runtime runc (crun fails
# on some kernels) and CONTAINERS_CONF=docker/local/containers.conf (no rlimits). The same Dockerfiles build
# from the public python:3.11-slim with plain `docker build` (docker/wheels/ empty: pip uses the index).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${BASE_IMAGE:-localhost/debian-python}
ROOTFS=${ROOTFS:-/var/tmp/poolgate-base/rootfs}
WORKER_PORT=${WORKER_PORT:-19100}
GATEWAY_PORT=${GATEWAY_PORT:-18000}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/docker/local/containers.conf}
export BUILDAH_ISOLATION=chroot

mirror() {  # the Debian mirror apt uses here (deb822 sources first, then sources.list)
  local uri
  uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -1 || true)
  [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list | awk '{print $2}' | head -1 || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

base() {
  if podman image exists "$BASE_IMAGE"; then echo "base: $BASE_IMAGE exists"; return; fi
  local start=$SECONDS
  rm -rf "$ROOTFS" && mkdir -p "$(dirname "$ROOTFS")"
  debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$ROOTFS" "$(mirror)" >"$ROOTFS.log" 2>&1 || { tail -20 "$ROOTFS.log"; exit 1; }
  tar -C "$ROOTFS" -c . | podman import - "$BASE_IMAGE" >/dev/null
  echo "base: $BASE_IMAGE in $((SECONDS - start)) s"
}

wheels() {
  # the package's dependencies (which include the gateway's list), torch pinned to the local CPU wheel,
  # and the build backend for `pip install .` inside the image; every run, so a dependency added since the
  # folder was filled is fetched too (pip keeps the files already there)
  pip download -q -d docker/wheels -c .ci/constraints.txt . "setuptools>=68" wheel
  echo "wheels: $(ls docker/wheels/*.whl | wc -l) files, $(du -sh docker/wheels | cut -f1)"
}

image() {  # image() NAME DOCKERFILE
  local start=$SECONDS
  buildah bud --isolation chroot --layers --build-arg "BASE=$BASE_IMAGE" -f "$2" -t "localhost/$1" . \
    >"/var/tmp/poolgate-build-$1.log" 2>&1 || { tail -30 "/var/tmp/poolgate-build-$1.log"; exit 1; }
  echo "image: localhost/$1 built in $((SECONDS - start)) s," \
       "$(podman image inspect --format '{{.Size}}' "localhost/$1" | awk '{printf "%.0f MB", $1/1e6}')"
}

images() {
  image poolgate-gateway docker/Dockerfile.gateway
  image poolgate-cpu docker/Dockerfile.cpu
}

run() {
  local token start
  token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  trap 'podman rm -f -t 5 poolgate-local-gateway poolgate-local-worker >/dev/null 2>&1 || true' EXIT
  start=$(date +%s.%N)
  podman run -d --runtime runc --network host --name poolgate-local-worker -e POOLGATE_WORKER_TOKEN="$token" \
    localhost/poolgate-cpu worker --listen "tcp://127.0.0.1:$WORKER_PORT" --backend cpu >/dev/null
  podman run -d --runtime runc --network host --name poolgate-local-gateway -e POOLGATE_WORKER_TOKEN="$token" \
    localhost/poolgate-gateway serve --host 127.0.0.1 --port "$GATEWAY_PORT" \
    --worker-url "tcp://127.0.0.1:$WORKER_PORT" >/dev/null
  for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$GATEWAY_PORT/health")" = 200 ] && break
    sleep 0.2
  done
  echo "run: /health 200 after $(python3 -c "import time; print(round(time.time() - $start, 1))") s"
  curl -sf "http://127.0.0.1:$GATEWAY_PORT/v1/embeddings" -H 'Content-Type: application/json' \
    -d '{"input": ["hello from the host"]}' \
    | python3 -c 'import json, sys; v = json.load(sys.stdin)["data"][0]["embedding"]; print(f"run: a vector of {len(v)} floats, norm {sum(x * x for x in v) ** 0.5:.4f}")'
}

case "${1:-all}" in
  base) base ;;
  wheels) wheels ;;
  images) base; wheels; images ;;
  run) run ;;
  all) base; wheels; images; run ;;
  *) echo "usage: $0 [all|base|wheels|images|run]" >&2; exit 2 ;;
esac
