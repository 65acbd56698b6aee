"""Graphs built while Redis was away are stored once it answers (issue 34, finding 8).

tests/test_sentinel.py covers the Triton kernels a client builds during a failover; this file
covers the graph cache's entries (FX graphs, AOTAutograd entries, C++ objects) of a CPU job,
whose only calls to Redis are those caches'. Against a private redis-server that the test
kills as the job starts and starts again on the same port (as tests/test_faults.py's
restart), so no other test's Redis goes away.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

from compileq import keys, localstack
from compileq.cache.counters import read_counters, reset_counters
from compileq.cache.store import RedisStore
from compileq.config import Settings
from tests.conftest import CLIENTS, SECRET, Env, compileq_cmd

STEPS = CLIENTS / "failover_steps.py"


def steps(env: Env, caches: Path, *args: str) -> subprocess.Popen[str]:
    """failover_steps.py ARGS under ``compileq run`` on ``caches``' empty Inductor cache dirs
    (a new machine), FX codegen in process (no worker: Redis is away, then every graph hits)."""
    return subprocess.Popen(
        compileq_cmd("run", "--", sys.executable, str(STEPS), *args),
        env=env.vars(
            TRITON_CACHE_DIR=str(caches / "triton"),
            TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
            COMPILEQ_FX="0",
        ),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def entries_of(db: redis.Redis, kind: str) -> int:
    return sum(1 for _ in db.scan_iter(match=keys.artifact(kind, "*")))


def test_graphs_compiled_while_redis_was_stopped_are_stored_once_it_answers_and_a_new_machine_finds_them(
    env: Env, tmp_path: Path
) -> None:
    server = localstack.start_redis(tmp_path / "redis")
    renv = Env(server.url(), env.home)
    job = steps(renv, tmp_path / "first", "24", "40", "--pause")
    try:
        # Killed before the job has imported torch: its first step compiles with Redis away.
        server.process.kill()
        server.process.wait()
        assert job.stdout is not None and job.stdin is not None
        first = json.loads(job.stdout.readline())
        assert first == {"first": True}, first
        server = localstack.start_redis(tmp_path / "redis", port=server.port)
        db = server.client()
        assert entries_of(db, "fx") == 0  # nothing reached the store during the outage
        job.stdin.write("go\n")  # step 2: its graph cache lookups find Redis answering
        job.stdin.flush()
        out, err = job.communicate(timeout=600)
        assert job.returncode == 0, err[-4000:]
        last = json.loads(out.strip().splitlines()[-1])
        assert last["first"] and last["second"] and last["compileq"], last
        assert "graph cache unavailable" in err  # step 1 did run while Redis was away
        assert "built here while Redis was away" in err, err[-4000:]
        counters = read_counters(db)
        # Step 1's forward and backward FX graphs, its AOTAutograd entry and its C++ objects.
        assert counters["stored_after_outage"] >= 4, counters
        # Step 2's were stored as usual: 2 of the FX graphs are step 1's, stored late.
        assert entries_of(db, "fx") == 4 and entries_of(db, "aot") == 2, counters
        # Counted once each, when stored: step 1's compiles were not lost with the outage.
        assert counters["fx_local_compiles"] == 4, counters

        # A new machine (fresh local dirs) runs both steps: every graph and object is a hit.
        reset_counters(db)
        again = steps(renv, tmp_path / "second", "24", "40")
        out, err = again.communicate(timeout=600)
        assert again.returncode == 0, err[-4000:]
        assert json.loads(out.strip().splitlines()[-1])["first"], out
        found = read_counters(db)
        assert found["fx_hits"] >= 4 and found["fx_misses"] == 0, found
        assert found["aot_hits"] >= 2 and found["aot_misses"] == 0, found
        assert found["cpp_misses"] == 0 and found["cpp_local_compiles"] == 0, found
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
        localstack.stop(server.process)


def test_a_graph_put_that_finds_redis_away_is_stored_signed_and_counted_by_the_next_call_it_answers(
    clean_cache: redis.Redis, settings: Settings
) -> None:
    from compileq.inductor import graph_cache
    from compileq.scheduler import outage

    away_url = f"redis://127.0.0.1:{localstack.free_port()}/0"  # nothing listens there
    away = Settings(redis_url=away_url, secret=SECRET)
    graph_cache.enable(RedisStore(redis.Redis.from_url(away_url), away), deadline_s=5)
    kept = len(outage.entries)
    try:
        fx = graph_cache.FxGraphBackend()
        fx._put("fxgraph-built-while-away", b"generated graph")  # Inductor's put: no error
        assert len(outage.entries) == kept + 1
    finally:
        graph_cache.disable()
    name = fx._key("fxgraph-built-while-away")
    clean_cache.set(name, b"")  # planted meanwhile: the late put replaces it all the same
    store = RedisStore(clean_cache, settings)
    graph_cache.enable(store, deadline_s=5)
    try:
        # Any call of the graph caches that Redis answers stores what waited.
        assert graph_cache.AOTAutogradBackend()._get("aot-after-the-outage") is None
    finally:
        graph_cache.disable()
    assert len(outage.entries) == 0
    assert store.get(name) == b"generated graph"  # signed with the secret: it verifies
    counters = read_counters(clean_cache)
    assert counters["stored_after_outage"] >= 1 and counters["fx_local_compiles"] >= 1, counters
