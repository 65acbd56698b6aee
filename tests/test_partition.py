"""A network partition between a client and Redis, made with network namespaces.

redis-server and a worker live in one namespace, the client in another; the only path between
them is a veth pair whose server end the test takes down mid-run for a bounded time. The test
itself talks to redis-server over a unix socket, which no partition touches.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.localstack import stop
from tests import netns
from tests.conftest import FIXTURES, LOAD_CLIENT, SECRET, Env, manifest_rows
from tests.reliability import Recorder
from tests.test_faults import all_kernels_sound, wait_for

MLP = FIXTURES / "dynamic_mlp.jsonl"
PORT = 6390  # inside the server namespace only: no clash with anything outside it
PARTITION_S = 8.0  # longer than the 5 s socket timeout, so the client must notice
DEADLINE_S = 20.0


class Cluster:
    def __init__(self, link: netns.Link, workdir: Path, env: Env) -> None:
        self.link = link
        self.workdir = workdir
        self.sock = workdir / "redis.sock"
        self.admin_url = f"unix://{self.sock}?db=0"
        self.home = env.home
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self, argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        self.procs.append(proc)
        return proc

    def start(self) -> redis.Redis:
        server = self.spawn(
            self.link.server_argv(
                "redis-server",
                "--port",
                str(PORT),
                "--bind",
                f"{netns.SERVER_IP} 127.0.0.1",
                # Reachable only from the client namespace made for this test.
                "--protected-mode",
                "no",
                "--unixsocket",
                str(self.sock),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ),
            self.workdir / "redis.log",
            {},
        )
        admin = redis.Redis.from_url(self.admin_url)
        wait_for(lambda: self.sock.exists() and bool(admin.ping()), 20, "redis-server")
        assert server.poll() is None
        # The worker shares the server's namespace and reaches it on that namespace's loopback.
        worker_env = Env(f"redis://127.0.0.1:{PORT}/0", self.home).vars(
            TRITON_CACHE_DIR=str(self.workdir / "worker-triton")
        )
        worker = self.spawn(
            self.link.server_argv(
                sys.executable,
                "-m",
                "compileq.cli",
                "worker",
                "--cpu-only",
                "--arch",
                "sm_90",
                "--concurrency",
                "2",
            ),
            self.workdir / "worker.log",
            worker_env,
        )
        wait_for(
            lambda: worker.poll() is None and any(admin.scan_iter(match=keys.WORKERS + "*")),
            180,
            "the worker's heartbeat",
        )
        return admin

    def client(self, name: str) -> subprocess.Popen[bytes]:
        env = Env(f"redis://{netns.SERVER_IP}:{PORT}/0", self.home).vars(
            TRITON_CACHE_DIR=str(self.workdir / f"{name}-triton"),
            TORCHINDUCTOR_CACHE_DIR=str(self.workdir / f"{name}-inductor"),
            COMPILEQ_DEADLINE_S=str(DEADLINE_S),
            COMPILEQ_RETRY_AFTER_S="2",
        )
        argv = self.link.client_argv(sys.executable, str(LOAD_CLIENT), str(MLP))
        return self.spawn(argv, self.workdir / f"{name}.log", env)

    def report(self, proc: subprocess.Popen[bytes], name: str) -> dict[str, object]:
        proc.wait(timeout=DEADLINE_S + PARTITION_S + 120)  # a hang fails here, not forever
        log = (self.workdir / f"{name}.log").read_text()
        assert proc.returncode == 0, log[-3000:]
        return dict(json.loads(log.strip().splitlines()[-1]))

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text()

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop(proc, timeout=10)


@pytest.fixture
def cluster(env: Env) -> Iterator[Cluster]:
    # A short path: unix socket paths are limited to 107 bytes.
    with tempfile.TemporaryDirectory(prefix="cq-part-") as tmp, netns.link() as link:
        made = Cluster(link, Path(tmp), env)
        try:
            yield made
        finally:
            made.stop()


def test_a_partition_between_client_and_redis_mid_run_loses_nothing(
    cluster: Cluster, reliability: Recorder
) -> None:
    n = len(manifest_rows(MLP))
    admin = cluster.start()
    client = cluster.client("client")
    wait_for(lambda: any(admin.scan_iter(match=keys.LOCK + "*")), 120, "a lease")
    # Mid-run: one kernel built and stored, others in flight. Cut at the first lease only,
    # and in about a run in four no build had reached the store yet: the client built all 15
    # itself, and the rerun after healing had nothing to hit.
    built = keys.artifact("triton", "*")
    wait_for(lambda: any(admin.scan_iter(match=built)), 120, "a stored kernel")
    started = time.monotonic()
    cluster.link.cut()
    try:
        time.sleep(PARTITION_S)
    finally:
        cluster.link.heal()
    report = cluster.report(client, "client")
    finished_after = time.monotonic() - started
    assert (report["kernels"], report["failed"], report["bad"]) == (n, 0, 0), report["problems"]
    # The remote builds in flight could not be heard of: the client built them itself, and
    # said so once per failing component (the cache Redis, and the broker if it was sending).
    assert isinstance(report["local"], int) and report["local"] > 0
    said = [line for line in cluster.log("client").splitlines() if "compiling locally" in line]
    assert 1 <= len(said) == len(set(said)) <= 2, said

    # Nothing corrupt: every entry the partition left verifies under the secret.
    store = RedisStore(admin, Settings(redis_url=cluster.admin_url, secret=SECRET))
    entries = [k.decode() for k in admin.scan_iter(match=keys.ARTIFACT + "*")]
    unsound = sum(e is None for e in store.get_many(entries))
    assert unsound == 0 and int(admin.hget(keys.STATS, "integrity_failures") or 0) == 0

    # Healed: a new client gets hits, and afterwards every kernel is in the cache, sound.
    rerun = cluster.report(cluster.client("rerun"), "rerun")
    assert (rerun["failed"], rerun["bad"]) == (0, 0), rerun["problems"]
    assert isinstance(rerun["hits"], int) and rerun["hits"] > 0
    assert all_kernels_sound(cluster.admin_url, MLP)
    reliability.record(
        "network partition client/Redis: veth link down 8 s mid-run (netns)",
        "client falls back to local builds and finishes; no hang; cache sound; hits after healing",
        f"{n} kernels: {report['remote']} remote, {report['local']} local, "
        f"{report['failed']} failed, {report['bad']} wrong; client done {finished_after:.0f} s "
        f"after the cut (deadline {DEADLINE_S:.0f} s); {len(entries)} entries, {unsound} "
        f"unsound; rerun after healing: {rerun['hits']} hits, {rerun['remote']} remote, "
        f"{rerun['local']} local",
        int(report["failed"]) + int(report["bad"]) + unsound + int(rerun["failed"]),  # type: ignore[call-overload]
    )
