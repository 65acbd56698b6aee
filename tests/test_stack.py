"""The compose stack, for real: Docker builds the images, compose starts both Redis instances and a
cross-compiling worker, and the example trainer runs twice, the second time as a new machine.

Without a Docker engine the test is skipped locally and fails in CI (CI=true), where `make test`
installs and starts one (`make docker`).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.docker_engine import STACK, build_images, json_line, require_docker

ROOT = Path(__file__).parents[1]

Compose = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def compose() -> Iterator[Compose]:
    require_docker("the stack test")
    build_images("build")
    env = {**os.environ, "COMPILEQ_SECRET": secrets.token_hex(32)}
    project = f"compileq-test-{os.getpid()}"

    def run(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(STACK), "compose", "-p", project, "--profile", "cpu", *args],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, f"compose {' '.join(args)}:\n{proc.stderr[-4000:]}"
        return proc

    try:
        run("up", "-d", "worker-cpu")
        worker = run("ps", "-q", "worker-cpu").stdout.strip()
        deadline = time.monotonic() + 300
        while True:
            state = subprocess.run(
                ["docker", "inspect", "--format", "{{.State.Health.Status}}", worker],
                capture_output=True,
                text=True,
            ).stdout.strip()
            if state == "healthy":
                break
            if time.monotonic() > deadline:
                logs = run("logs", "--tail", "50", "worker-cpu").stdout
                pytest.fail(f"the worker never became healthy ({state}):\n{logs}")
            time.sleep(2)
        yield run
    finally:
        subprocess.run(
            [str(STACK), "compose", "-p", project, "--profile", "cpu", "down", "-v"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            timeout=300,
        )


def test_the_stack_serves_a_new_machines_training_step_from_its_cache(compose: Compose) -> None:
    def stats() -> dict[str, int]:
        return json_line(compose("exec", "-T", "worker-cpu", "compileq", "stats", "--json").stdout)

    # `run --rm` makes a fresh container each time: its Inductor and Triton caches start empty,
    # exactly as on a machine that joins the cluster.
    cold = json_line(compose("run", "--rm", "-T", "trainer").stdout)
    after_cold = stats()
    new = json_line(compose("run", "--rm", "-T", "trainer").stdout)
    after_new = stats()

    assert cold["matches_eager"] and new["matches_eager"]
    assert cold["loss"] == new["loss"]
    assert after_cold["fx_local_compiles"] + after_cold.get("fx_remote_compiles", 0) > 0
    assert after_cold["cpp_local_compiles"] + after_cold.get("cpp_remote_compiles", 0) > 0
    delta = {
        k: after_new[k] - after_cold.get(k, 0) for k in after_new if isinstance(after_new[k], int)
    }
    assert delta["fx_hits"] > 0 and delta["cpp_hits"] > 0, delta
    compiles = {k: v for k, v in delta.items() if k.endswith("_compiles")}
    assert set(compiles.values()) == {0}, compiles
