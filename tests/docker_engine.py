"""A Docker engine for the tests that run real containers (tests/test_stack.py, test_slurm.py).

Without one they are skipped locally and fail in CI (CI=true), where `make test` installs and
starts one (`make docker`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest


def why_no_docker() -> str | None:
    """Why these tests cannot run here, or None when they can."""
    if shutil.which("docker") is None:
        return "no docker command (make docker installs Debian's docker.io)"
    info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return (
            f"no Docker engine answers (make docker starts dockerd): {info.stderr.strip()[-300:]}"
        )
    plugin = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=60)
    if plugin.returncode != 0 and shutil.which("docker-compose") is None:
        return "neither 'docker compose' nor 'docker-compose' is installed"
    base = subprocess.run(
        ["docker", "image", "inspect", "compileq-base:bookworm"], capture_output=True, timeout=60
    )
    if base.returncode != 0 and shutil.which("debootstrap") is None:
        return "the base image needs debootstrap (apt-get install debootstrap)"
    return None


def require_docker(what: str) -> None:
    """Skip the calling test where Docker cannot run; in CI, fail instead."""
    reason = why_no_docker()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"{what} must run in CI: {reason}")
        pytest.skip(reason)


STACK = Path(__file__).resolve().parents[1] / "docker" / "stack.sh"


#: The targets built in this session. ``build-slurm`` runs ``build`` first, so the Slurm test
#: (``make test-all``; it runs first, by file name) leaves the stack test's image built: a second ``build``
#: would only ask PyPI again for every wheel and Docker for every cached layer, for nothing.
_BUILT: set[str] = set()
_INCLUDES = {"build": {"build"}, "build-slurm": {"build", "build-slurm"}}


def build_images(target: str) -> None:
    """``docker/stack.sh TARGET`` (``build``, ``build-slurm``), once a session: Docker's layer
    cache makes a later session's call cheap, and a code change rebuilds only compileq's last
    layers."""
    if target in _BUILT:
        return
    build = subprocess.run(
        [str(STACK), target],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    _BUILT.update(_INCLUDES.get(target, {target}))


def json_line(text: str) -> dict[str, Any]:
    """The last line of ``text`` that is a JSON object."""
    line = next(line for line in reversed(text.splitlines()) if line.startswith("{"))
    result: dict[str, Any] = json.loads(line)
    return result
