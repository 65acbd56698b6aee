"""Poisoned Redis: values that anybody with write access to Redis (but not the secret) can
plant, each of which once failed a compile or parked the cluster.

For each: the compile completes with the correct result, well within ``deadline_s`` where a
fast path exists; the event is counted; the bad value is skipped, replaced or expired. Real
redis-server, the session's real ``--cpu-only`` worker, real builds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from pydantic import SecretStr

from compileq import keys
from compileq.cache import liveness
from compileq.cache.store import RedisStore
from compileq.config import Settings
from tests.conftest import (
    FIXTURES,
    SECRET,
    CacheSnapshot,
    Env,
    RedisServer,
    Worker,
    compileq_cmd,
    manifest_rows,
    restore_cache,
    stats,
    warm_json,
    wipe_cache,
)
from tests.reliability import Recorder
from tests.test_fx_remote import TINY, run_client

GPT = FIXTURES / "gpt_head.jsonl"
#: A database no worker heartbeats into: whatever is live there, an attacker planted.
_LONELY_DB = 6
#: Long enough that waiting it out would show; every bound asserted below is well under it.
_DEADLINE_S = 120


def _kernel_keys(client: redis.Redis) -> list[bytes]:
    return sorted(client.scan_iter(match=keys.artifact("triton", "") + "*"))


def _real_queues(client: redis.Redis) -> list[str]:
    """The queues the session's worker serves: this machine's toolchain, so the clients'."""
    prefix = keys.WORKERS.encode()
    return [k[len(prefix) :].decode() for k in client.scan_iter(match=keys.WORKERS + "*")]


def _scans(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


@pytest.fixture
def lonely(redis_server: RedisServer, session_home: Path) -> tuple[Env, redis.Redis]:
    client = redis_server.client(_LONELY_DB)
    client.flushdb()
    # A long heartbeat TTL: a member planted now still counts as recent when a client asks.
    slow = {"COMPILEQ_HEARTBEAT_TTL_S": "120"}
    return Env(redis_server.url(_LONELY_DB), session_home, slow), client


def test_forged_worker_records_are_skipped_counted_and_never_fail_a_compile(
    lonely: tuple[Env, redis.Redis],
    worker: Worker,
    redis_server: RedisServer,
    tmp_path: Path,
    reliability: Recorder,
) -> None:
    env, db = lonely
    queues = _real_queues(redis_server.client(0))
    seconds, micros = db.time()
    now = seconds + micros / 1e6
    # A record that is not JSON of a worker (the AttributeError that failed compiles), and
    # a ghost: well-formed, unsigned, scored a century ahead, on every real queue.
    db.set(keys.worker_info("x"), b"1")
    db.zadd(keys.WORKER_REGISTRY, {"x": now, "ghost": now})
    forged = "evil\n[fake log line]"
    ghost = {"id": "ghost", "host": forged, "queues": queues, "fx_toolchains": {forged: {}}}
    db.set(keys.worker_info("ghost"), json.dumps({**ghost, "beat_time": now, "sig": "0" * 64}))
    for queue in queues:
        db.zadd(keys.workers(queue), {"x": now, "ghost": now + 100 * 365 * 86400})

    n = len(manifest_rows(GPT))
    scans = _scans(db)
    started = time.monotonic()
    report = warm_json(env, GPT, tmp_path / "warm", COMPILEQ_DEADLINE_S=str(_DEADLINE_S))
    warm_s = time.monotonic() - started
    # Misses with nobody live read the workers' records from the registry, never by a SCAN
    # of the whole keyspace (the server's count covers every client of every database).
    assert _scans(db) == scans
    # Nobody is live: built here at once, not after waiting for a ghost to build them.
    assert (report["local"], report["remote"], report["failed"]) == (n, 0, 0)
    assert warm_s < _DEADLINE_S / 3
    # Graph codegen asks the same question of the same records.
    run = run_client(env, tmp_path, "fx", TINY)
    assert run.result == {**run.result, "matches_eager": True, "compileq": True}
    assert "Traceback" not in run.stderr and "\n[fake log line]" not in run.stderr
    assert all(db.zscore(keys.workers(q), "ghost") is None for q in queues)  # trimmed
    counters = stats(env, tmp_path)
    assert counters["rejected_records"] >= 2
    assert counters["fallback_reasons"].get("no-worker", 0) >= n
    assert "compileq-error" not in counters["fallback_reasons"]
    reliability.record(
        "forged worker records: a non-JSON record, an unsigned ghost scored a century ahead",
        "skipped and counted; nobody is live, so kernels and graphs build locally at once; the "
        "ghost's score trimmed; nothing from the record reaches the log unescaped",
        f"{n} kernels: {report['local']} local, {report['failed']} failed, in {warm_s:.1f} s "
        f"(deadline {_DEADLINE_S} s); graph job matches eager: {run.result['matches_eager']}; "
        f"rejected_records={counters['rejected_records']}; ghost trimmed",
        report["failed"],
        attacker="write access to Redis",
    )


def test_a_heartbeat_copied_from_a_dead_worker_is_not_live_and_a_real_one_is(
    lonely: tuple[Env, redis.Redis],
) -> None:
    _, db = lonely
    secret, queue = SECRET.encode(), "compileq.triton.test.sm_90"
    liveness.beat(db, "real", [queue], 3.0, {"id": "real", "queues": [queue]}, secret)
    assert [w["id"] for w in liveness.census(db, queue, 3.0, secret).live] == ["real"]
    # A record the real worker signed a minute ago, replayed under a fresh score.
    seconds, _ = db.time()
    old = liveness.signed(secret, {"id": "dead", "queues": [queue]}, seconds - 60.0)
    db.set(keys.worker_info("dead"), json.dumps(old))
    db.zadd(keys.workers(queue), {"dead": seconds})
    # And one signed with another secret.
    other = liveness.signed(b"not the secret", {"id": "other", "queues": [queue]}, seconds)
    db.set(keys.worker_info("other"), json.dumps(other))
    db.zadd(keys.workers(queue), {"other": seconds})
    found = liveness.census(db, queue, 3.0, secret)
    assert [w["id"] for w in found.live] == ["real"]
    assert sorted(found.rejected) == ["dead", "other"]


def test_an_oversized_kernel_job_builds_locally_and_is_counted_under_the_size_cap(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, reliability: Recorder
) -> None:
    n = len(manifest_rows(GPT))
    # Every GPT kernel's source is over 2 KB: each job is over this cap.
    report = warm_json(env, GPT, tmp_path, COMPILEQ_MAX_ENTRY_BYTES="1500")
    assert (report["local"], report["remote"], report["failed"]) == (n, 0, 0)
    counters = stats(env, tmp_path)
    assert counters["fallback_reasons"] == {"size-cap": n}
    assert _kernel_keys(clean_cache) == []  # over the cap: kept local, never stored
    reliability.record(
        "a kernel job over COMPILEQ_MAX_ENTRY_BYTES",
        "built locally, counted under the size-cap reason; never a failed compile",
        f"{n} kernels: {report['local']} local, {report['failed']} failed; "
        f"fallback_reasons={counters['fallback_reasons']}",
        report["failed"],
        attacker="none (a setting)",
    )


def test_bad_entries_of_every_kind_are_rebuilt_once_then_hit(
    env: Env,
    worker: Worker,
    clean_cache: redis.Redis,
    tmp_path: Path,
    settings: Settings,
    reliability: Recorder,
) -> None:
    n = len(manifest_rows(GPT))
    warm_json(env, GPT, tmp_path / "fill")
    victims = _kernel_keys(clean_cache)
    assert len(victims) == n
    # One each: 8 bytes rewritten where the key id sits (it then reads as another secret's);
    # sealed with the secret used before a key rotation; a value over the size cap (never
    # transferred: read as its length); a value of another Redis type.
    old = RedisStore(clean_cache, settings.model_copy(update={"secret": SecretStr("old")}))
    ours = RedisStore(clean_cache, settings)
    assert n == 4
    rewritten, rotated, oversized, other_type = victims
    blob = clean_cache.get(rewritten) or b""
    clean_cache.set(rewritten, blob[:3] + os.urandom(8) + blob[11:])
    clean_cache.set(rotated, old.seal(rotated.decode(), ours.get(rotated.decode()) or b""))
    # Over the clients' cap here (2 MiB, the kernels are ~100 KB): the default cap, 448 MiB,
    # would make this test write half a gigabyte into Redis.
    cap = 2**21
    clean_cache.set(oversized, b"\0" * (cap + 1))
    clean_cache.delete(other_type)
    clean_cache.hset(other_type, "not", "an entry")

    rebuilt = warm_json(env, GPT, tmp_path / "rebuild", COMPILEQ_MAX_ENTRY_BYTES=str(cap))
    after = warm_json(env, GPT, tmp_path / "after", COMPILEQ_MAX_ENTRY_BYTES=str(cap))
    counters = stats(env, tmp_path)
    # Each built once (by the worker, whose verified build replaces the bad entry), then hit.
    assert (rebuilt["remote"], rebuilt["local"], rebuilt["failed"]) == (n, 0, 0)
    # The oversized one is over the clients' cap but not the worker's (the default): a worker
    # that reads it before building finds damage and drops it, and its build is then a plain
    # write rather than a replacement.
    assert counters["replaced_entries"] in (n - 1, n)
    assert (after["hits"], after["failed"]) == (n, 0)
    assert all(e is not None for e in ours.get_many([k.decode() for k in victims]))
    reliability.record(
        "entries with a rewritten key id, sealed with a rotated-out secret, over the size "
        "cap (the clients' cap + 1), and of another Redis type (one each)",
        "each a miss (the oversized one never transferred), rebuilt once; the verified build "
        "replaces it (compare-and-set on the bad value), so the next client hits; key "
        "rotation is the second case for the whole cache",
        f"{n} kernels: rebuilt {rebuilt['remote']} remotely, {rebuilt['local']} locally, "
        f"{rebuilt['failed']} failed; replaced_entries={counters['replaced_entries']}; next "
        f"client {after['hits']}/{n} hits",
        rebuilt["failed"] + after["failed"],
        attacker="write access to Redis (none for a rotation)",
    )


def test_a_counter_key_of_the_wrong_type_turns_no_hit_into_a_miss_and_is_repaired(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, reliability: Recorder
) -> None:
    n = len(manifest_rows(GPT))
    warm_json(env, GPT, tmp_path / "fill")
    clean_cache.set(keys.STATS, b"x")  # every HINCRBY on it now fails WRONGTYPE
    report = warm_json(env, GPT, tmp_path / "poisoned")
    assert (report["hits"], report["local"], report["failed"]) == (n, 0, 0)
    # The counter key was put back as a hash, and counts again.
    assert clean_cache.type(keys.STATS) in (b"hash", b"none")
    again = warm_json(env, GPT, tmp_path / "again")
    counters = stats(env, tmp_path)
    assert again["hits"] == n and counters["kernel_hits"] == n
    reliability.record(
        "SET compileq:stats x: the counters hash replaced by a string",
        "counter writes fail apart from the work: hits stay hits, nothing thinks Redis is "
        "down; the key is dropped and recreated as a hash",
        f"{n} kernels: {report['hits']} hits, {report['local']} local, {report['failed']} "
        f"failed; afterwards compileq:stats counts again ({counters['kernel_hits']} hits)",
        report["failed"],
        attacker="write access to Redis",
    )


def test_record_keys_of_the_wrong_type_are_repaired_and_record_again(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, reliability: Recorder
) -> None:
    # What `explain` and `stats` read besides the counters: the misses list and the slowest
    # builds' sorted set, each replaced by a string.
    n = len(manifest_rows(GPT))
    planted = {keys.MISSES: b"list", keys.slow("triton"): b"zset"}
    for key in planted:
        clean_cache.set(key, b"x")
    cold = warm_json(env, GPT, tmp_path / "cold")  # every kernel misses and is built
    assert (cold["remote"] + cold["local"], cold["failed"]) == (n, 0)
    # Dropped by the first write that met them, and recreated by a later one.
    assert {clean_cache.type(k) for k in planted} <= {*planted.values(), b"none"}
    for pattern in (keys.ARTIFACT, keys.LOCK, keys.JOB):  # built again; the records stay
        for key in clean_cache.scan_iter(match=pattern + "*"):
            clean_cache.delete(key)
    again = warm_json(env, GPT, tmp_path / "again")
    assert again["failed"] == 0
    assert [clean_cache.type(k) for k in planted] == list(planted.values())
    assert clean_cache.llen(keys.MISSES) >= n and clean_cache.zcard(keys.slow("triton")) >= 1
    reliability.record(
        "SET compileq:misses x and SET compileq:slow:triton x: the records explain and stats "
        "read replaced by strings",
        "record writes fail apart from the work; each key is dropped and recreated with its "
        "own type, so explain and stats read new records again",
        f"{n} kernels built ({cold['remote']} remote, {cold['local']} local, 0 failed); "
        f"afterwards {clean_cache.llen(keys.MISSES)} misses and "
        f"{clean_cache.zcard(keys.slow('triton'))} slowest builds recorded again",
        cold["failed"] + again["failed"],
        attacker="write access to Redis",
    )


def test_leases_without_an_expiry_are_taken_over_at_once_for_kernels_and_graphs(
    env: Env,
    filled_cache: CacheSnapshot,
    clean_cache: redis.Redis,
    tmp_path: Path,
    reliability: Recorder,
) -> None:
    n = len(manifest_rows(GPT))
    restore_cache(clean_cache, filled_cache)  # GPT's kernels warmed, then TINY's graphs
    victims = [k.decode() for k in clean_cache.scan_iter(match=keys.ARTIFACT + "*")]
    graphs = [v for v in victims if v.startswith(keys.artifact("fx", ""))]
    assert len(graphs) >= 2
    wipe_cache(clean_cache)
    for victim in victims:
        clean_cache.set(keys.lock(victim), b"planted")  # no expiry: no compileq lease has none

    started = time.monotonic()
    report = warm_json(env, GPT, tmp_path / "warm", COMPILEQ_DEADLINE_S=str(_DEADLINE_S))
    run = run_client(env, tmp_path, "second", TINY)
    wall_s = time.monotonic() - started
    assert (report["failed"], report["hits"] + report["remote"] + report["local"]) == (0, n)
    assert run.result["matches_eager"] is True
    # Without the takeover each graph and each kernel batch waited out 120 s.
    assert wall_s < _DEADLINE_S
    counters = stats(env, tmp_path)
    assert counters["stale_leases"] >= n + len(graphs)
    leased = [v for v in victims if v.startswith((keys.artifact("triton", ""), *graphs))]
    assert all(clean_cache.get(keys.lock(v)) != b"planted" for v in leased)
    reliability.record(
        "leases planted without an expiry on every kernel and graph key",
        "treated as stale: replaced at once (compare on the value), counted; nobody waits "
        "the deadline",
        f"{n} kernels and a {len(graphs)}-graph job: {report['failed']} failed, matches eager "
        f"{run.result['matches_eager']}, both done in {wall_s:.0f} s (deadline "
        f"{_DEADLINE_S} s per wait); stale_leases={counters['stale_leases']}",
        report["failed"],
        attacker="write access to Redis",
    )


def test_bad_settings_leave_compileq_off_and_the_training_job_runs(
    env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    password = "s3cr3t-pw-xyz"
    bad = env.vars(COMPILEQ_DEADLINE_S="soon", COMPILEQ_REDIS_URL=f"http://u:{password}@h/0")
    proc = subprocess.run(
        [sys.executable, "-c", "import compileq; print(compileq.install())"],
        env=bad,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stderr
    assert "Traceback" not in proc.stderr and password not in proc.stderr
    assert proc.stderr.count("compileq: not installed") == 1
    # The training job, as users start it: `compileq run` installs compileq in the child.
    job = subprocess.run(
        compileq_cmd("run", "--", sys.executable, str(TINY)),
        env={**bad, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    result = json.loads(job.stdout.strip().splitlines()[-1])
    assert result == {**result, "matches_eager": True, "compileq": False}
    assert "Traceback" not in job.stderr and password not in job.stderr
    reliability.record(
        "wrong-typed COMPILEQ_* values and a non-Redis URL with a password, at install()",
        "install() returns False and says why once, without the password; the training job "
        "compiles with stock Inductor",
        f"install() printed {proc.stdout.strip()}; 'not installed' said "
        f"{proc.stderr.count('compileq: not installed')}x, password shown: "
        f"{password in proc.stderr + job.stderr}; job matches eager: {result['matches_eager']}",
        0,
        attacker="none (a setting)",
    )
