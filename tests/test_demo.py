"""The README's main command: `compileq demo` on its embedded default."""

from __future__ import annotations

import json
import subprocess

import pytest

from compileq.demo import COLD, NEW, STOCK, render
from tests.conftest import Env, compileq_cmd


@pytest.mark.release
def test_the_demo_serves_the_second_run_from_the_cache(env: Env) -> None:
    vars_ = env.vars()
    del vars_["COMPILEQ_REDIS_URL"]  # the embedded default: its own redis-server and worker
    proc = subprocess.run(
        compileq_cmd("demo", "--json"), env=vars_, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\r" not in proc.stderr  # no progress line when stderr is not a terminal
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "embedded default" in result["where"]
    stock, cold, new = result["phases"]
    assert [p["phase"] for p in result["phases"]] == [STOCK, COLD, NEW]
    assert all(p["matches_eager"] for p in result["phases"])
    assert stock["loss"] == pytest.approx(cold["loss"]) == pytest.approx(new["loss"])
    # The cold run compiled its graphs and kernels; the new machine compiled nothing.
    assert cold["remote"] + cold["local"] > 0
    assert new["hits"] > 0 and (new["remote"], new["local"]) == (0, 0)
    assert new["counters"]["fx_hits"] > 0 and new["counters"]["cpp_hits"] > 0

    table = render(result).splitlines()
    row = next(line for line in table if line.startswith(NEW))
    assert row.split()[-3:] == [str(new["hits"]), "0", "0"]  # hits, remote, local
    assert next(line for line in table if line.startswith(STOCK)).split()[-3:] == ["-"] * 3


def test_the_demos_columns_add_up_every_kind_of_hit_and_build() -> None:
    from compileq.demo import summarize

    counters = {
        "kernel_hits": 1,
        "fx_hits": 2,
        "aot_hits": 3,
        "cpp_hits": 4,
        "kernel_remote_compiles": 5,
        "fx_remote_compiles": 6,
        "cpp_remote_compiles": 7,
        "kernel_local_compiles": 8,
        "fx_local_compiles": 9,
        "cpp_local_compiles": 10,
        "integrity_failures": 100,
    }
    assert summarize(counters) == {"hits": 10, "remote": 18, "local": 27}
    assert summarize({}) == {"hits": 0, "remote": 0, "local": 0}  # absent counters count 0
