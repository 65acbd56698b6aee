"""`compileq stats` like `sccache --show-stats`: a row per kind of build, the store against its
limit, the workers per toolchain with their real toolchain; `--all`, `--json`, `--zero`.

Counters are written by compileq's own counting path (``RedisStore.count``) into a database of
this test's, and read back by the CLI as a user runs it; the workers are the session's real
cross-compiling worker.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from compileq.cache.counters import Counter, Reason, fallback
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.fingerprint import torch_identity
from compileq.localstack import RedisServer
from tests.conftest import SECRET, Env, Worker, run_cli, stats

DB = 12


def row(text: str, label: str) -> list[str]:
    """The cells of the table row for ``label``."""
    (line,) = [line for line in text.splitlines() if line.strip().startswith(label)]
    return line.strip()[len(label) :].split()


def test_the_default_stats_are_a_row_per_kind_with_hit_rates_and_fallbacks_by_reason(
    redis_server: RedisServer, env: Env, tmp_path: Path
) -> None:
    client = redis_server.client(DB)
    client.flushdb()
    store = RedisStore(client, Settings(redis_url=redis_server.url(DB), secret=SECRET))
    # A CPU job's counts: C++ objects and graphs, no Triton kernel.
    store.count(
        {
            Counter.CPP_HITS: 3,
            Counter.CPP_MISSES: 1,
            Counter.CPP_REMOTE_COMPILES: 1,
            Counter.FX_HITS: 1,
            Counter.FX_MISSES: 1,
            Counter.FX_LOCAL_COMPILES: 1,
            Counter.TUNE_HITS: 1,
            Counter.TUNE_LOCAL: 3,
            Counter.FALLBACKS: 3,
        },
        records=[fallback(Reason.NO_WORKER, 2), fallback(Reason.DEADLINE)],
    )
    store.put("compileq:a:cpp:" + "0" * 64, b"x" * 1000)
    local = Env(redis_server.url(DB), env.home)
    text = run_cli(local, "stats", tmp=tmp_path).stdout
    assert row(text, "C++ objects") == ["4", "3", "75.0%", "1", "0"], text
    assert row(text, "FX graphs") == ["2", "1", "50.0%", "0", "1"], text
    assert row(text, "autotune results") == ["4", "1", "25.0%", "0", "3"], text
    assert row(text, "Triton kernels") == ["0", "0", "-", "0", "0"], text
    assert "fallbacks: 3 (2 no-worker, 1 deadline)" in text, text
    cap = Settings.model_fields["max_entry_bytes"].default / 2**20
    assert re.search(rf"store: 1 entry, \d+ B \(each at most {cap:.1f} MiB", text), text
    assert "Redis uses" in text and "kernel_remote_failures" not in text  # the short form

    everything = run_cli(local, "stats", "--all", tmp=tmp_path).stdout
    summary = text.split("\nstore:")[0].splitlines()  # the table (Redis's memory moves)
    assert everything.splitlines()[: len(summary)] == summary
    assert "kernel_remote_failures" in everything and "cpp_hit_rate" in everything

    values = json.loads(run_cli(local, "stats", "--json", tmp=tmp_path).stdout.splitlines()[-1])
    assert {c.value for c in Counter} <= set(values)  # every counter, by its name
    assert values["cpp_hit_rate"] == 0.75 and values["kinds"]["C++ objects"]["hits"] == 3

    # --zero shows, then zeroes; --reset is the same flag.
    zeroed = run_cli(local, "stats", "--zero", tmp=tmp_path).stdout
    assert row(zeroed, "C++ objects")[:2] == ["4", "3"] and zeroed.endswith("counters zeroed\n")
    assert row(run_cli(local, "stats", tmp=tmp_path).stdout, "C++ objects")[:2] == ["0", "0"]
    store.count({Counter.CPP_HITS: 1})
    run_cli(local, "stats", "--reset", tmp=tmp_path)
    assert json.loads(run_cli(local, "stats", "--json", tmp=tmp_path).stdout)["cpp_hits"] == 0


def test_stats_list_workers_per_toolchain_with_their_real_toolchain(
    env: Env, worker: Worker, tmp_path: Path
) -> None:
    values = json.loads(run_cli(env, "stats", "--json", tmp=tmp_path).stdout.splitlines()[-1])
    version = torch_identity()[0]  # as fingerprints name it: 2.13.0, not 2.13.0+cpu
    rows = values["toolchains"]
    kinds = {r["kind"] for r in rows}
    # The cross-compiling worker serves kernels, graphs (CPU ones once its ISAs are known)
    # and C++ objects: every row names the torch it builds with, none says None.
    assert {"Triton kernels", "FX graphs", "C++ objects"} <= kinds, rows
    for r in rows:
        assert f"torch {version}" in r["toolchain"], r
        assert "None" not in r["toolchain"], r
    # The suite's stats() reads in this process what the command prints.
    read = stats(env, tmp_path)
    assert read.keys() == values.keys() and read["toolchains"] == rows, (read, values)
    text = run_cli(env, "stats", tmp=tmp_path).stdout
    assert "None" not in text and f"torch {version}" in text, text
    assert re.search(r"workers: [1-9]\d* live, per toolchain:", text), text
