"""A broker Redis that fills up or evicts: a clear error or a fallback, never a silent loss.

The broker is its own redis-server (``COMPILEQ_BROKER_URL``); the cache is a database of the
session's redis-server, so the broker's memory limit never touches cache entries.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from compileq import keys, localstack
from compileq.cache.counters import read_counters
from compileq.config import Settings
from compileq.localstack import RedisServer
from compileq.tasks.broker import warn_if_evicting
from tests.conftest import (
    FIXTURES,
    SECRET,
    Env,
    compileq_cmd,
    manifest_rows,
    run_cli,
    start_worker,
    stop_worker,
)
from tests.reliability import Recorder
from tests.test_faults import all_kernels_sound, build_processes, paused, wait_for

GPT = FIXTURES / "gpt_head.jsonl"
CACHE_DB = 7
FILLER = b"x" * 65536


@pytest.fixture
def cache_env(redis_server: RedisServer, env: Env) -> Env:
    redis_server.client(CACHE_DB).flushdb()
    return Env(redis_server.url(CACHE_DB), env.home)


def start_broker(tmp: Path, policy: str) -> RedisServer:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is required in CI (make test installs it)")
        pytest.skip("redis-server not installed (apt-get install redis-server)")
    return localstack.start_redis(tmp / "broker", "--maxmemory-policy", policy)


def squeeze(broker: redis.Redis, headroom: int) -> None:
    """Cap the broker's memory just above what it holds now."""
    used = int(broker.info("memory")["used_memory"])
    broker.config_set("maxmemory", used + headroom)


def test_a_full_broker_is_reported_once_and_clients_build_locally(
    cache_env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    server = start_broker(tmp_path, "noeviction")
    benv = Env(cache_env.redis_url, cache_env.home, {"COMPILEQ_BROKER_URL": server.url()})
    worker = start_worker(benv, tmp_path, "--concurrency", "1")
    try:
        broker = server.client()
        squeeze(broker, 1 << 20)
        filled = 0
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            for filled in range(1000):  # a real fill, up to the refusal
                broker.set(f"filler:{filled}", FILLER)
        # Full for good: freed client buffers must not open a gap a publish slips through.
        squeeze(broker, -(512 << 10))
        n = len(manifest_rows(GPT))
        proc = run_cli(benv, "warm", str(GPT), "--json", tmp=tmp_path)
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        assert (report["local"], report["remote"], report["failed"]) == (n, 0, 0)
        assert proc.stderr.count("is full and refuses new build messages") == 1, proc.stderr
        counters = read_counters(redis.Redis.from_url(cache_env.redis_url))
        assert counters["fallbacks"] == counters["kernel_local_compiles"] == n
        assert all_kernels_sound(cache_env.redis_url, GPT)

        # The worker side: a Celery consumer that cannot declare its queue on a full broker
        # exits, and the supervisor restarts it; it never took a message it could lose.
        assert worker.process.poll() is None, worker.log.read_text()[-3000:]
        restarts = worker.log.read_text().count("restarting")
        reliability.record(
            "broker Redis full (maxmemory, noeviction): every publish refused with OOM",
            "one clear log line; kernels built locally and cached; worker survives",
            f"{filled} x 64 KiB filled it; {n} kernels: {report['local']} local, "
            f"{report['failed']} failed; 'broker is full' said "
            f"{proc.stderr.count('is full and refuses')}x; fallbacks={counters['fallbacks']}; "
            f"worker supervisor up ({restarts} restarts of its consumer process)",
            n - report["local"] - report["remote"] - report["hits"] + report["failed"],
        )
    finally:
        stop_worker(worker)
        localstack.stop(server.process)


def test_an_evicting_broker_that_drops_messages_is_caught_by_the_deadline_and_warned_about(
    cache_env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    server = start_broker(tmp_path, "allkeys-lru")
    benv = Env(cache_env.redis_url, cache_env.home, {"COMPILEQ_BROKER_URL": server.url()})
    worker = start_worker(benv, tmp_path, "--concurrency", "1")
    stack = contextlib.ExitStack()
    try:
        assert "maxmemory-policy allkeys-lru" in worker.log.read_text()
        # A worker too busy to take its messages (its build process stopped): they wait in
        # the broker's queue, where memory pressure can evict them.
        stack.enter_context(paused(build_processes(worker.process.pid)))
        broker = server.client()
        n = len(manifest_rows(GPT))
        client = subprocess.Popen(
            compileq_cmd("warm", str(GPT), "--json"),
            env=benv.vars(
                TRITON_CACHE_DIR=str(tmp_path / "client-triton"),
                TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "client-inductor"),
                COMPILEQ_DEADLINE_S="6",
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        def queued() -> list[bytes]:
            return [
                k for k in broker.scan_iter(match=keys.BROKER + "*") if broker.type(k) == b"list"
            ]

        wait_for(lambda: bool(queued()), 120, "messages waiting in the broker")
        dropped = queued()
        squeeze(broker, 256 << 10)
        for i in range(2000):  # other traffic pushes the broker over its limit
            broker.set(f"filler:{i}", FILLER)
            if not any(broker.exists(k) for k in dropped):
                break
        assert not any(broker.exists(k) for k in dropped), "the queue was never evicted"
        out, err = client.communicate(timeout=180)
        assert client.returncode == 0, err[-3000:]
        report = json.loads(out.strip().splitlines()[-1])
        assert (report["local"], report["failed"]) == (n, 0)
        assert "missed the 6s deadline" in err
        assert err.count("maxmemory-policy allkeys-lru") == 1
        counters = read_counters(redis.Redis.from_url(cache_env.redis_url))
        assert counters["fallbacks"] == counters["kernel_local_compiles"] == n
        assert all_kernels_sound(cache_env.redis_url, GPT)
        reliability.record(
            "broker Redis evicting (allkeys-lru): queued build messages evicted",
            "no silent loss: the deadline catches each dropped message, local build, counted; "
            "client and worker warn at start about the policy",
            f"{len(dropped)} queue(s) evicted with messages in them; {n} kernels: "
            f"{report['local']} local after the deadline, {report['failed']} failed; "
            f"fallbacks={counters['fallbacks']}; policy warned by client and worker",
            n - report["local"] - report["remote"] - report["hits"] + report["failed"],
        )
    finally:
        stack.close()
        stop_worker(worker)
        localstack.stop(server.process)


def test_a_broker_that_refuses_config_get_gets_no_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_broker(tmp_path, "allkeys-lru")
    try:
        server.client().acl_setuser(
            "default",
            enabled=True,
            nopass=True,
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-config"],
        )
        settings = Settings(redis_url=server.url(), secret=SECRET)
        with caplog.at_level(logging.DEBUG, logger="compileq"):
            warn_if_evicting(settings)
        assert [r.levelno for r in caplog.records] == [logging.DEBUG]
        assert "NOPERM" in caplog.text or "permission" in caplog.text
    finally:
        localstack.stop(server.process)
