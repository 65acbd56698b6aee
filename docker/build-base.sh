#!/usr/bin/env bash
# Builds the stack's base image from Debian's mirror with debootstrap, then `docker import`s it.
# Why not `FROM debian:bookworm`: CI machines (and many clusters) reach Debian's mirror and PyPI
# but no image registry. Skipped when the image exists, so only the first build pays (~2-3 min).
set -euo pipefail
IMAGE=${COMPILEQ_BASE_IMAGE:-compileq-base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    exit 0
fi
command -v debootstrap >/dev/null || { echo "debootstrap is needed (apt-get install debootstrap)" >&2; exit 1; }
root=$(mktemp -d /tmp/compileq-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
# python3-dev and g++: Inductor's C++ path compiles kernels on CPU. redis-server: the broker and
# cache services run the same image (it brings redis-cli for their health checks).
debootstrap --variant=minbase \
    --include=python3,python3-venv,python3-dev,g++,redis-server,ca-certificates \
    bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || { tail -30 "$root.log" >&2; exit 1; }
rm -f "$root.log"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import \
    -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "built $IMAGE"
