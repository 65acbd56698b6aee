"""One failed try per graph, cluster-wide: a graph whose codegen failed on a worker is remembered
(cache/verdicts.py), and every later process compiles it in process without sending it.

Real components: the session's redis-server, a real ``compileq worker`` told to fail every
graph's codegen (``COMPILEQ_TEST_WORKER_FAULT``, workers/faults.py), real torch.compile.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis

from compileq import keys
from compileq.cache import verdicts
from compileq.cache.counters import Reason, read_counters
from compileq.cache.stats import render
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.errors import EntryTooLarge
from compileq.localstack import RedisServer
from compileq.scheduler import roundtrip
from compileq.scheduler.fallback import Fallback
from compileq.tasks.fx_jobs import FX
from compileq.workers import faults, fx_verdict
from tests.conftest import SECRET, Env, run_cli, start_worker, stats, stop_worker
from tests.test_doctor import doctor
from tests.test_fx_remote import TINY, run_client

#: A database of this module's own: its worker fails every graph, and no other test's may
#: take those graphs' jobs (the session's worker serves database 0).
FAULTY_DB = 9
#: Where the tests without a worker send jobs (nobody consumes them: the database is flushed).
NOBODY_DB = 10

#: What the worker logs each time a graph's codegen fails (workers/fx.py): one try each.
TRIED = "compileq worker: FX codegen of "


def tries(log: Path) -> int:
    return sum(" failed: " in line for line in log.read_text().splitlines() if TRIED in line)


def test_a_graph_whose_worker_codegen_fails_costs_one_try_and_a_new_machine_compiles_it_unsent(
    redis_server: RedisServer, session_home: Path, tmp_path: Path
) -> None:
    db = redis_server.client(FAULTY_DB)
    db.flushdb()
    cluster = Env(redis_server.url(FAULTY_DB), session_home)
    worker = start_worker(cluster, tmp_path, extra_env={faults.VARIABLE: faults.FX_CODEGEN})
    try:
        first = run_client(cluster, tmp_path, "first", TINY)
        assert first.result == {**first.result, "matches_eager": True, "compileq": True}
        after_first = stats(cluster, tmp_path)
        # Its forward and its backward each failed once on the worker, and were compiled here.
        assert tries(worker.log) == 2, worker.log.read_text()[-3000:]
        assert after_first["fx_remote_compiles"] == 0 and after_first["fallbacks"] == 2
        assert after_first["fx_failures"]["remembered"] == 2

        # A new machine (empty local caches) that does not read the FX-graph cache: with it,
        # the first machine's in-process output would be found and no codegen would start.
        fresh = Env(cluster.redis_url, session_home, {"COMPILEQ_GRAPH_CACHE": "0"})
        second = run_client(fresh, tmp_path, "second", TINY)
        assert second.result == {**second.result, "matches_eager": True, "compileq": True}
        after = stats(cluster, tmp_path)
        # Neither graph was sent: the worker tried nothing more, and both compiled here at once.
        assert tries(worker.log) == 2, worker.log.read_text()[-3000:]
        assert after["fx_known_failures"] - after_first["fx_known_failures"] == 2
        assert after["fallbacks"] - after_first["fallbacks"] == 2
        assert after["fx_remote_compiles"] == 0
        assert second.stderr.count("a worker could not generate the graph before") == 1
        assert "InjectedCodegenFault" in second.stderr
    finally:
        stop_worker(worker)

    # `compileq stats` names them, with the worker's error and reason.
    failures = after["fx_failures"]
    assert failures["remembered"] == 2 and len(failures["newest"]) == 2
    for row in failures["newest"]:
        assert row["error"].startswith("InjectedCodegenFault: graph codegen failed on purpose")
        assert row["reason"] == Reason.WORKER_ERROR.value
        assert row["graph"].startswith(keys.artifact(FX, ""))
    text = run_cli(cluster, "stats", tmp=tmp_path).stdout
    assert "failing codegen on workers: 2 graphs, compiled in process" in text, text
    assert text.count("InjectedCodegenFault: graph codegen failed on purpose") == 2, text
    assert "known-failure" in text  # among the fallbacks, by reason
    # So does doctor, with the fix.
    _, checks, _ = doctor(cluster, tmp_path)
    assert checks["fx failures"]["status"] == "warn"
    assert checks["fx failures"]["detail"].startswith("2 graphs fail codegen on workers (2 ")
    assert "compileq forget-failures" in checks["fx failures"]["hint"]

    # Once the cause is fixed, forget-failures sends them to workers again.
    forgot = run_cli(cluster, "forget-failures", tmp=tmp_path).stdout
    assert "forgot 2 graphs" in forgot, forgot
    assert stats(cluster, tmp_path)["fx_failures"] == {"remembered": 0, "newest": []}
    _, checks, _ = doctor(cluster, tmp_path)
    assert checks["fx failures"]["status"] == "ok"


@pytest.fixture
def nobody(redis_server: RedisServer) -> tuple[redis.Redis, Settings]:
    """A database no worker serves, emptied; the settings of a client of it."""
    client = redis_server.client(NOBODY_DB)
    client.flushdb()
    return client, Settings(redis_url=redis_server.url(NOBODY_DB), secret=SECRET)


def a_verdict(job_key: str, at: float | None = None) -> verdicts.Verdict:
    return verdicts.Verdict(
        job_key,
        Reason.WORKER_ERROR,
        "LoweringException: no lowering for aten.frobnicate",
        "node1:cpu:42",
        time.time() if at is None else at,
    )


def test_a_job_with_a_verdict_is_neither_leased_nor_stored_nor_sent(
    nobody: tuple[redis.Redis, Settings],
) -> None:
    from compileq.scheduler.client import KernelClient
    from compileq.scheduler.local import LocalBuilder

    client, settings = nobody
    store = RedisStore(client, settings)
    job_key = keys.artifact(FX, "7" * 64)
    verdicts.remember(store, a_verdict(job_key), ttl_s=3600)
    assert 3590 < client.ttl(verdicts.key(job_key)) <= 3600
    made: list[str] = []

    def spec() -> bytes:
        made.append("job")
        return b"graph"

    job = roundtrip.Job(roundtrip.FX, job_key, "compileq.fx.nobody", spec, verdicts.key(job_key))
    sender = KernelClient(settings, LocalBuilder(lambda: None))
    try:
        for way in (roundtrip.fetch, roundtrip.found_or_sent):
            with pytest.raises(Fallback) as raised:
                way(sender, job)
            assert raised.value.reason is Reason.KNOWN_FAILURE
            assert "no lowering for aten.frobnicate" in raised.value.detail
            assert "worker node1:cpu:42" in raised.value.detail
        assert roundtrip.send_ahead(sender, job) is False
    finally:
        sender.close()
    assert made == []  # no job was even made, let alone stored or sent
    assert client.get(keys.lock(job_key)) is None and client.get(keys.job(job_key)) is None


def test_a_verdict_that_does_not_verify_is_no_verdict_and_stats_list_only_those_that_do(
    nobody: tuple[redis.Redis, Settings],
) -> None:
    from compileq.scheduler.client import KernelClient
    from compileq.scheduler.local import LocalBuilder

    client, settings = nobody
    store = RedisStore(client, settings)
    planted, kept = keys.artifact(FX, "5" * 64), keys.artifact(FX, "6" * 64)
    # Written by someone who can write to Redis but has no secret: raw JSON, and in the index.
    client.set(verdicts.key(planted), a_verdict(planted).to_bytes())
    client.zadd(keys.FX_FAILURES, {verdicts.key(planted): time.time()})
    verdicts.remember(store, a_verdict(kept, at=time.time() - 60), ttl_s=3600)
    sender = KernelClient(settings, LocalBuilder(lambda: None))
    try:
        job = roundtrip.Job(
            roundtrip.FX, planted, "compileq.fx.nobody", lambda: b"g", verdicts.key(planted)
        )
        assert roundtrip.found_or_sent(sender, job) is None  # sent, as with no verdict at all
    finally:
        sender.close()
    assert client.get(keys.job(planted)) is not None and client.get(keys.lock(planted))
    assert read_counters(client)["integrity_failures"] >= 1  # and it was counted
    # Listed: the verdict that verifies, not the one the index names that does not.
    assert [v.graph for v in verdicts.remembered(store)] == [kept]
    shown = {"remembered": 1, "newest": [a_verdict(kept).to_json()]}
    text = render({"kinds": {}, "fx_failures": shown})
    assert "failing codegen on workers: 1 graph," in text
    assert "worker node1:cpu:42" in text and kept in text


def test_a_verdicts_key_changes_with_the_graphs_job_and_with_compileqs_version() -> None:
    # The job key covers the graph, its FX toolchain, target and codegen state (fx_jobs.py):
    # a new toolchain is a new job key; a new compileq a new verdict key for the same job.
    graph, other = keys.artifact(FX, "1" * 64), keys.artifact(FX, "2" * 64)
    assert verdicts.key(graph) == verdicts.key(graph)
    assert len({verdicts.key(graph), verdicts.key(other), verdicts.key(graph, "0.0.1")}) == 3
    assert verdicts.key(graph).startswith(verdicts.PREFIX)


def test_a_verdict_round_trips_and_anything_else_reads_as_none() -> None:
    verdict = a_verdict(keys.artifact(FX, "3" * 64), at=1_000.0)
    assert verdicts.Verdict.from_bytes(verdict.to_bytes()) == verdict
    good = json.loads(verdict.to_bytes())
    for bad in (
        b"not json",
        b"[1, 2]",
        json.dumps({**good, "reason": "a-reason-nobody-knows"}).encode(),
        json.dumps({**good, "at": True}).encode(),
        json.dumps({**good, "worker": 7}).encode(),
    ):
        assert verdicts.Verdict.from_bytes(bad) is None, bad
    forged = json.dumps({**good, "error": "boom\n[INFO] forged line"}).encode()
    read = verdicts.Verdict.from_bytes(forged)
    assert read is not None and "\n" not in read.describe()
    assert verdicts.first_line(RuntimeError("first\nsecond")) == "RuntimeError: first"


def test_only_a_codegen_error_of_the_graphs_own_earns_a_verdict() -> None:
    import torch
    from billiard.exceptions import SoftTimeLimitExceeded

    from compileq.tasks.portable import StandInCalled

    def raised_from(error: BaseException, cause: BaseException) -> BaseException:
        error.__cause__ = cause
        return error

    graphs = [
        RuntimeError("no lowering for aten.frobnicate"),
        faults.InjectedCodegenFault("on purpose"),
        StandInCalled("__main__.helper"),
        ImportError("No module named 'mylib'"),
    ]
    infrastructure = [
        redis.ConnectionError("Redis went away"),
        OSError(28, "No space left on device"),
        MemoryError(),
        torch.OutOfMemoryError("CUDA out of memory"),
        SoftTimeLimitExceeded(),
        EntryTooLarge("compileq:a:fxcode:x", 10, 1),
        # Inductor's wrapper around what a lowering met: the cause decides.
        raised_from(RuntimeError("lowering failed"), redis.TimeoutError("timed out")),
    ]
    assert [fx_verdict.the_graphs(e) for e in graphs] == [True] * len(graphs)
    assert [fx_verdict.the_graphs(e) for e in infrastructure] == [False] * len(infrastructure)
