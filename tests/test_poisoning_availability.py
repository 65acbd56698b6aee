"""Poisoned Redis, availability: nothing a writer without the secret puts in Redis costs more
than one rebuild (issue 34, findings 1-5).

Each test plants what anybody with write access to Redis can plant, then checks what compileq
recorded (its counters, the store's contents, the census), never wall time: an empty value
under an entry, a lock with an hour's TTL, vector-ISA verdicts under another key id, a
liveness key of the wrong type, a crowd of fresh ghost members. Real redis-server, the
session's real ``--cpu-only`` worker, real builds.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import redis

from compileq import keys
from compileq.cache import liveness
from compileq.cache.envelope import MAGIC
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.scheduler.leases import Leases, server_ms, signed_value, take_many
from compileq.scheduler.routing import Router
from tests.conftest import (
    FIXTURES,
    SECRET,
    CacheSnapshot,
    Env,
    RedisServer,
    Worker,
    manifest_rows,
    restore_cache,
    stats,
    warm_json,
    wipe_cache,
)
from tests.test_fx_remote import COMPILES, TINY, run_client

GPT = FIXTURES / "gpt_head.jsonl"
#: What a wait gives up after here: a planted lock waited out would cost it per key.
_DEADLINE_S = "60"
#: A database no worker heartbeats into and no other test uses.
_LONELY_DB = 10


def _artifacts(client: redis.Redis, kind: str = "") -> list[bytes]:
    return sorted(
        client.scan_iter(match=keys.artifact(kind, "") + "*" if kind else keys.ARTIFACT + "*")
    )


def _compiles(counters: dict[str, int]) -> int:
    return sum(int(counters.get(c, 0)) for c in COMPILES)


def _real_queues(client: redis.Redis) -> list[str]:
    prefix = keys.WORKERS.encode()
    return [k[len(prefix) :].decode() for k in client.scan_iter(match=keys.WORKERS + "*")]


def _server_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return seconds + micros / 1e6


def test_empty_and_truncated_values_under_entries_cost_one_rebuild_each_and_are_replaced(
    env: Env,
    filled_cache: CacheSnapshot,
    clean_cache: redis.Redis,
    tmp_path: Path,
    settings: Settings,
) -> None:
    n = len(manifest_rows(GPT))
    restore_cache(clean_cache, filled_cache)  # GPT's kernels warmed, then TINY's graphs
    kernels = _artifacts(clean_cache, "triton")
    assert len(kernels) == n
    victims = _artifacts(clean_cache)
    others = [v for v in victims if v not in kernels]
    assert others  # graphs, C++ objects, ISA verdicts
    # Every kernel entry emptied (SET NX then refuses the rebuild, and the bounded read calls
    # it a miss); every other entry emptied or cut to two bytes, alternately.
    for key in kernels:
        clean_cache.set(key, b"")
    for i, key in enumerate(others):
        clean_cache.set(key, b"" if i % 2 else MAGIC[:2])

    before = stats(env, tmp_path)
    rebuilt = warm_json(env, GPT, tmp_path / "rebuild", COMPILEQ_DEADLINE_S=_DEADLINE_S)
    second = run_client(env, tmp_path, "second", TINY)
    middle = stats(env, tmp_path)
    again = warm_json(env, GPT, tmp_path / "again")
    third = run_client(env, tmp_path, "third", TINY)
    after = stats(env, tmp_path)

    # Each kernel rebuilt once by the worker, whose verified build replaced the empty value.
    assert (rebuilt["remote"], rebuilt["local"], rebuilt["failed"]) == (n, 0, 0)
    assert middle["replaced_entries"] - before["replaced_entries"] >= n
    assert second.result["matches_eager"] is True and third.result["matches_eager"] is True
    assert _compiles(middle) - _compiles(before) <= len(others)
    # Then nothing is missing for good: every kernel hits, no graph or object is built again.
    assert (again["hits"], again["failed"]) == (n, 0)
    assert _compiles(after) == _compiles(middle)
    ours = RedisStore(clean_cache, settings)
    assert all(ours.holds(k.decode()) for k in kernels)
    assert "missing from the store" not in second.stderr + third.stderr


def test_a_lock_planted_with_an_hours_ttl_is_taken_over_at_once_for_kernels_and_graphs(
    env: Env, filled_cache: CacheSnapshot, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    n = len(manifest_rows(GPT))
    restore_cache(clean_cache, filled_cache)  # GPT's kernels warmed, then TINY's graphs
    victims = [k.decode() for k in clean_cache.scan_iter(match=keys.ARTIFACT + "*")]
    graphs = [v for v in victims if v.startswith(keys.artifact("fx", ""))]
    assert len(graphs) >= 2
    wipe_cache(clean_cache)
    for victim in victims:  # an expiry, unlike test_poisoning's planted locks: an hour's
        clean_cache.set(keys.lock(victim), b"planted", px=3_600_000)

    report = warm_json(env, GPT, tmp_path / "warm", COMPILEQ_DEADLINE_S=_DEADLINE_S)
    run = run_client(env, tmp_path, "second", TINY)
    # Built by the worker, not locally after a deadline waited out for a lock nobody holds.
    assert (report["remote"], report["local"], report["failed"]) == (n, 0, 0)
    assert run.result["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["stale_leases"] >= n + len(graphs)
    assert "deadline" not in counters["fallback_reasons"]
    leased = [v for v in victims if v.startswith((keys.artifact("triton", ""), *graphs))]
    assert all(clean_cache.get(keys.lock(v)) != b"planted" for v in leased)


def test_a_lease_is_honoured_only_while_its_signed_life_lasts_and_renewal_extends_it(
    redis_server: RedisServer,
) -> None:
    db = redis_server.client(_LONELY_DB)
    db.flushdb()
    secret = SECRET.encode()
    # A genuine lease, signed 5 s ago for 2 s, copied back under its key with an hour's TTL.
    replayed = signed_value(secret, "k", "gone", server_ms(db) - 5_000, 2_000)
    db.set(keys.lock("k"), replayed, px=3_600_000)
    # Another owner's live lease, and one signed with another secret.
    live = signed_value(secret, "j", "alive", server_ms(db), 60_000)
    db.set(keys.lock("j"), live, px=60_000)
    db.set(keys.lock("f"), signed_value(b"other", "f", "x", server_ms(db), 60_000), px=60_000)
    stale: list[int] = []
    assert take_many(db, ["k", "j", "f"], "me", 5_000, stale.append, secret=secret) == [
        True,
        False,
        True,
    ]
    assert stale == [2] and db.get(keys.lock("j")) == live.encode()
    # A holder that lives renews: its lease outlasts its signed life many times over.
    holder = Leases(db, ttl_s=2.0, secret=secret)
    assert holder.acquire("r")
    time.sleep(5.0)  # two and a half signed lives; renewed every 0.67 s
    assert take_many(db, ["r"], "me", 5_000, secret=secret) == [False]
    holder.release("r")
    assert db.get(keys.lock("r")) is None


def test_isa_verdicts_under_a_planted_key_id_are_replaced_by_the_next_client(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    # A client's first graph probes this CPU's vector ISAs and stores the verdicts.
    assert run_client(env, tmp_path, "first", TINY).result["matches_eager"] is True
    verdicts = _artifacts(clean_cache, "isa")
    assert verdicts
    for key in verdicts:  # 8 bytes where the key id sits: it reads as another secret's
        blob = clean_cache.get(key) or b""
        clean_cache.set(key, blob[:3] + os.urandom(8) + blob[11:])
    ours = RedisStore(clean_cache, settings)
    assert not any(ours.holds(k.decode()) for k in verdicts)
    before = stats(env, tmp_path)

    second = run_client(env, tmp_path, "second", TINY)
    assert second.result["matches_eager"] is True
    # The client probed once and, the live worker proving the cluster shares its secret,
    # replaced each planted verdict; the next client finds them all.
    assert all(ours.holds(k.decode()) for k in verdicts)
    after = stats(env, tmp_path)
    assert after["replaced_entries"] - before["replaced_entries"] >= len(verdicts)


def test_a_liveness_key_of_the_wrong_type_is_repaired_by_the_next_heartbeat(
    worker: Worker, redis_server: RedisServer, settings: Settings
) -> None:
    db = redis_server.client(0)
    queue = next(q for q in _real_queues(db) if q.startswith(keys.QUEUE_PREFIX))
    db.delete(keys.workers(queue))
    db.set(keys.workers(queue), b"junk")
    # Read by a client meanwhile: nobody verified there, not "Redis failed".
    found = liveness.census(db, queue, settings.heartbeat_ttl_s, SECRET.encode())
    assert found.wrong_type or found.live  # a beat may already have repaired it
    # The worker's next beats put it back as a sorted set, and the worker is live again.
    for _ in range(100):  # heartbeats every 0.5 s here; the pytest run's own limit bounds it
        if db.type(keys.workers(queue)) == b"zset":
            break
        time.sleep(0.2)
    assert db.type(keys.workers(queue)) == b"zset"
    assert liveness.live_count(db, queue, 3.0, SECRET.encode()) == 1
    assert Router(db, settings).has_worker(queue)


def test_a_client_reads_a_wrong_typed_liveness_key_as_no_worker_without_an_error(
    redis_server: RedisServer, settings: Settings
) -> None:
    db = redis_server.client(_LONELY_DB)
    db.flushdb()
    queue = keys.FX_QUEUE_PREFIX + "test.cpu-avx2"
    db.set(keys.workers(queue), b"junk")
    db.set(keys.WORKER_REGISTRY, b"junk")
    found = liveness.census(db, queue, 3.0, SECRET.encode())
    assert (found.live, found.wrong_type) == ([], True)
    assert liveness.workers_info(db) == [] and liveness.live_workers(db) == []
    router = Router(db, settings)
    assert router.has_worker(queue) is False
    # A heartbeat (the one a worker beats) repairs both keys.
    info = {"id": "w1", "queues": [queue]}
    assert liveness.beat(db, "w1", [queue], 3.0, info, SECRET.encode()) == 2
    assert db.type(keys.workers(queue)) == b"zset" and db.type(keys.WORKER_REGISTRY) == b"zset"
    assert router.live_count(queue) == 1


def test_a_crowd_of_fresh_ghost_members_does_not_hide_a_real_worker(
    redis_server: RedisServer, settings: Settings
) -> None:
    db = redis_server.client(_LONELY_DB)
    db.flushdb()
    secret, queue, ttl = SECRET.encode(), keys.QUEUE_PREFIX + "test.sm_90", 3.0
    liveness.beat(db, "real", [queue], ttl, {"id": "real", "queues": [queue]}, secret)
    now = _server_now(db)
    # Unsigned ghosts with records, scored just before the real beat and just after it
    # (within the window, not far enough ahead to be trimmed), 20 times the old read's 32.
    ghosts = {f"ghost{i}": now + (1.0 if i % 2 else -1.0) for i in range(640)}
    db.zadd(keys.workers(queue), ghosts)
    # And names and signatures that are not ASCII (a tag compared as text would raise).
    ghosts.update({"ghost\u00e9": now, "x#" + "\u00e9" * 32: now})
    for ghost in ghosts:
        record = {"id": ghost, "queues": [queue], "beat_time": now, "sig": "\u00e9" * 64}
        db.set(keys.worker_info(ghost), json.dumps(record))
    found = liveness.census(db, queue, ttl, secret)
    assert [w["id"] for w in found.live] == ["real"]
    assert Router(db, settings).has_worker(queue)
