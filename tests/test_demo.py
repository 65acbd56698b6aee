"""The README's main command: `compileq demo` on its embedded default."""

from __future__ import annotations

import json
import subprocess

from tests.conftest import Env, compileq_cmd


def test_the_demo_serves_the_second_run_from_the_cache(env: Env) -> None:
    vars_ = env.vars()
    del vars_["COMPILEQ_REDIS_URL"]  # the embedded default: its own redis-server and worker
    proc = subprocess.run(
        compileq_cmd("demo", "--json"), env=vars_, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    n = result["kernels"]
    stock, cold, new = result["phases"]
    assert (stock["local"], stock["failed"]) == (n, 0)
    assert (cold["remote"], cold["local"], cold["failed"]) == (n, 0, 0)
    assert (new["hits"], new["remote"], new["local"]) == (n, 0, 0)
    assert "embedded default" in result["where"]


def test_the_demo_prints_a_table(env: Env) -> None:
    vars_ = env.vars()
    del vars_["COMPILEQ_REDIS_URL"]
    proc = subprocess.run(
        compileq_cmd("demo"), env=vars_, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    row = next(line for line in lines if line.startswith("compileq, new machine"))
    assert row.split()[-3:] == ["15", "0", "0"]  # hits, remote, local
    assert "\r" not in proc.stderr  # no progress line when stderr is not a terminal
