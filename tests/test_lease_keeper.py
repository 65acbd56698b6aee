"""A worker keeps the sender's lease alive while it builds (workers/lifecycle.keeping_lease).

The sender's lease outlives its own wait by a second. A build slower than that, on a loaded
worker, used to leave the key unleased mid-build: the next process asking for it (a lazy
backward compile after the forward, a late rank) sent the job again and the graph was
generated twice. Real redis-server, the session's real --cpu-only worker, real torch.compile.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import redis

from compileq import keys
from compileq.localstack import RedisServer
from compileq.scheduler.leases import (
    extend,
    honoured,
    release,
    server_ms,
    signed_value,
    take_many,
)
from tests.conftest import SECRET, Env, Worker, compileq_cmd, stats
from tests.scripts import LLAMA

#: A database no worker heartbeats into and no other test uses.
_LONELY_DB = 13
#: The sender's deadline: its lease lives a second longer, far shorter than a codegen here.
_DEADLINE_S = 1
_LEASE_S = _DEADLINE_S + 1


def test_a_building_worker_renews_only_a_live_signed_lease_and_keeps_it_the_senders(
    redis_server: RedisServer,
) -> None:
    db = redis_server.client(_LONELY_DB)
    db.flushdb()
    secret = SECRET.encode()
    assert take_many(db, ["b"], "sender", _LEASE_S * 1000, secret=secret) == [True]
    for _ in range(2 * _LEASE_S):  # twice its signed life, renewed every second
        time.sleep(1.0)
        assert extend(db, "b", secret) == _LEASE_S * 1000
    value = db.get(keys.lock("b"))
    assert isinstance(value, bytes) and value.startswith(b"sender|")  # still the sender's
    assert take_many(db, ["b"], "other", 5_000, secret=secret) == [False]
    assert release(db, "b", "sender")  # the sender's own release still finds it
    # Nothing renewed: no lease, one whose signed life is over, another secret's, a planted
    # value (each left as it was).
    db.set(
        keys.lock("old"),
        signed_value(secret, "old", "gone", server_ms(db) - 5_000, 2_000),
        px=3_600_000,
    )
    db.set(keys.lock("f"), signed_value(b"other", "f", "x", server_ms(db), 60_000), px=60_000)
    db.set(keys.lock("p"), b"planted", px=60_000)
    assert [extend(db, k, secret) for k in ("b", "old", "f", "p")] == [0, 0, 0, 0]
    assert db.get(keys.lock("p")) == b"planted"


def test_a_job_built_past_its_senders_lease_keeps_the_lease_and_is_built_once(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # The sender waits 1 s (its lease: 2 s), then compiles the graph itself; the worker goes
    # on generating it for many seconds more. Its backward, sent ahead, is asked for again by
    # the lazy backward compile once the forward is done: long after 2 s.
    proc = subprocess.Popen(
        compileq_cmd(
            "run",
            "--",
            sys.executable,
            str(LLAMA),
            "--layers",
            "2",
            "--width",
            "72",
            "--rank-caches",
            str(tmp_path / "job"),
        ),
        env=env.vars(
            COMPILEQ_DEADLINE_S=str(_DEADLINE_S),
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "launcher"),
        ),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr").open("w"),
    )
    secret = SECRET.encode()
    first_seen: dict[str, float] = {}
    kept = lapsed = 0
    ends = time.monotonic() + 600
    # Every job still open (sent, not yet settled) older than its sender's lease, whose
    # output is not stored yet: being built (its lease kept live), or still in the queue (a
    # pool process busy with the other graph's C++ objects: nothing keeps that one's lease).
    while time.monotonic() < ends and (proc.poll() is None or _open_jobs(clean_cache)):
        now = time.monotonic()
        for key in _open_jobs(clean_cache):
            first_seen.setdefault(key, now)
            if now - first_seen[key] < _LEASE_S + 1 or clean_cache.exists(key):
                continue
            value = clean_cache.get(keys.lock(key))
            live = value is not None and honoured(secret, key, value, server_ms(clean_cache))
            kept, lapsed = kept + live, lapsed + (not live)
        time.sleep(0.2)
    proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "stderr").read_text()[-3000:]
    assert first_seen, "no FX job was sent"
    # Leases seen live past their sender's lifetime: only a worker renewing them does that.
    assert kept > 0, f"no lease outlived its sender's {_LEASE_S} s ({lapsed} lapsed)"
    # No graph generated twice on the worker: none was sent again while it was built.
    log = worker.log.read_text()
    assert all(log.count(f"generated graph {key} ") <= 1 for key in first_seen), first_seen
    assert stats(env, tmp_path)["fx_remote_compiles"] <= len(first_seen)
    assert all(clean_cache.exists(key) for key in first_seen)  # every output stored
    assert not list(clean_cache.scan_iter(match=keys.LOCK + "*"))  # every lease dropped


def _open_jobs(client: redis.Redis) -> list[str]:
    """The FX jobs sent and not settled: their job specs are still stored."""
    prefix = keys.job(keys.artifact("fxcode", ""))
    return [k.decode()[len(keys.JOB) :] for k in client.scan_iter(match=prefix + "*")]
