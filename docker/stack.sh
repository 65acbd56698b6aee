#!/usr/bin/env bash
# The compose stack's one entry point, for users and for tests/test_stack.py.
#
#   docker/stack.sh build              base image (once), wheels from the host's pip, compileq image
#   docker/stack.sh build-slurm        the same, then Debian's Slurm and munge on it (docker/slurm/)
#   docker/stack.sh compose ARGS...    `docker compose ARGS` or, without the v2 plugin, `docker-compose ARGS`
#
# Variables: PYTHON (the host interpreter whose pip fetches wheels; default .venv/bin/python, else
# python3), TORCH_SPEC (default torch==2.13.0), COMPILEQ_IMAGE (default compileq:local),
# COMPILEQ_SLURM_IMAGE (default compileq-slurm:local).
set -euo pipefail
cd "$(dirname "$0")/.."

compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose "$@"
    elif command -v docker-compose >/dev/null; then
        docker-compose "$@"
    else
        echo "neither 'docker compose' nor 'docker-compose' is installed" >&2
        exit 1
    fi
}

wheels() {
    local python=${PYTHON:-}
    [ -n "$python" ] || { [ -x .venv/bin/python ] && python=.venv/bin/python || python=python3; }
    mkdir -p docker/wheels
    # The requirements of pyproject.toml (and Flower for its profile), read, not restated.
    "$python" - "${TORCH_SPEC:-torch==2.13.0}" >docker/wheels/requirements.txt <<'PY'
import re, sys
lines = open("pyproject.toml").read().splitlines()
def array(head):  # a TOML array of strings, one per line, closed by a line "]"
    start = lines.index(head) + 1
    body = lines[start : lines.index("]", start)]
    return [m.group(1) for line in body if (m := re.match(r'\s*"([^"]+)"', line))]
deps = [d for d in array("dependencies = [") if not d.startswith("torch")]
deps += re.findall(r'"([^"]+)"', next(line for line in lines if line.startswith("cross = [")))
# async-timeout: redis needs it below CPython 3.11.3 (bookworm has 3.11.2), and pip evaluates
# python_full_version markers for the host's interpreter even under --python-version.
print("\n".join([sys.argv[1], *deps, "flower>=2.0,<3", "setuptools>=77", "async-timeout>=4.0.3"]))
PY
    # The image's interpreter is bookworm's CPython 3.11, whatever the host runs: ask pip for
    # its wheels explicitly rather than for the host's.
    local platforms=()
    for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
        platforms+=(--platform "${tag}_x86_64")
    done
    "$python" -m pip download -q --disable-pip-version-check -d docker/wheels \
        --only-binary=:all: --python-version 3.11.2 --implementation cp "${platforms[@]}" \
        -r docker/wheels/requirements.txt 2> >(grep -v "is ignored" >&2)
}

case "${1:-}" in
build)
    docker/build-base.sh
    wheels
    ls docker/wheels | grep '\.whl$' | sed 's/^/# /' >>docker/wheels/requirements.txt
    port=${COMPILEQ_WHEELS_PORT:-38517}
    python3 -m http.server --bind 127.0.0.1 --directory docker/wheels "$port" >/dev/null 2>&1 &
    server=$!
    trap 'kill "$server" 2>/dev/null' EXIT
    for _ in $(seq 50); do
        python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), 1)" 2>/dev/null && break
        sleep 0.1
    done
    kill -0 "$server" 2>/dev/null || { echo "cannot serve wheels on 127.0.0.1:$port (set COMPILEQ_WHEELS_PORT)" >&2; exit 1; }
    # The classic builder: it is in every Docker engine, where BuildKit needs buildx installed.
    DOCKER_BUILDKIT=0 docker build -q --network host --build-arg "WHEELS=http://127.0.0.1:$port" \
        -f docker/Dockerfile -t "${COMPILEQ_IMAGE:-compileq:local}" . >/dev/null
    echo "built ${COMPILEQ_IMAGE:-compileq:local}"
    ;;
build-slurm)
    "$0" build
    # A layer on the compileq image: a code change rebuilds compileq's last layers, then this
    # small one (Debian's packages, a few seconds), never torch's.
    DOCKER_BUILDKIT=0 docker build -q --network host \
        --build-arg "BASE=${COMPILEQ_IMAGE:-compileq:local}" \
        -f docker/slurm/Dockerfile -t "${COMPILEQ_SLURM_IMAGE:-compileq-slurm:local}" . >/dev/null
    echo "built ${COMPILEQ_SLURM_IMAGE:-compileq-slurm:local}"
    ;;
compose)
    shift
    compose "$@"
    ;;
*)
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
