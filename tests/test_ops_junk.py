"""The operator tools read Redis as untrusted input: `stats`, `doctor` and `explain` against
values any writer can set (a key of another type, a record of another shape, an unsigned
worker record), on a real redis-server, each tool run as the user runs it.

The rule: never a traceback; what cannot be read is named, never judged; a worker record
that does not verify is reported as such and is never counted as a worker nor failed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import redis

from compileq import keys
from compileq.cache import liveness
from compileq.localstack import RedisServer
from tests.conftest import SECRET, compileq_cmd

#: Its own database: the session's Redis is shared with other tests' workers.
DB = 14
#: A Triton queue name as workers write it (the digest is made up: nobody serves it).
QUEUE = f"{keys.QUEUE_PREFIX}{'0' * 20}.cuda-90-w32"
#: An artifact key with key material recorded beside it (of the wrong shapes).
KEY = keys.artifact("triton", "ab" * 32)


def tool(server: RedisServer, tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``compileq ARGS`` against database ``DB``, with only PATH, HOME and the secret set."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp),
        "COMPILEQ_SECRET": SECRET,
        "COMPILEQ_REDIS_URL": server.url(DB),
    }
    return subprocess.run(compileq_cmd(*args), env=env, capture_output=True, text=True, timeout=120)


def plant_junk(client: redis.Redis) -> None:
    """What issue 34 planted, and values of the wrong shape where compileq writes JSON."""
    client.hset(keys.artifact("junk", "hash"), "f", "v")  # an entry that is a hash
    client.zadd(keys.slow("fx"), {"{}": 99})  # a slow build without its fields
    client.zadd(keys.slow("triton"), {json.dumps({"name": 5, "key": [], "by": {}}): 1})
    client.set(keys.MISSES, "x")  # the miss log as a string
    client.set(keys.STATS, "x")  # the counters as a string
    client.hset(keys.FALLBACK_REASONS, mapping={"deadline": "many", "\xff": 3})
    client.set(keys.workers(QUEUE), "junk")  # a queue's liveness set as a string
    # Key material where a dict is expected: a list, an int where a str is.
    client.set(keys.meta(KEY), json.dumps({"material": [1, 2], "toolchain": 5, "by": 7}))


def plant_records(client: redis.Redis) -> None:
    """Unsigned worker records, as anybody who can write to Redis can make them: one with a
    probe and toolchains of the wrong types, two claiming the same GPU of one host."""
    wrong = {
        "id": "ghost-types",
        "host": 5,
        "queues": [QUEUE],
        "toolchains": [1, 2],
        "fx_toolchains": "x",
        "cpu_only": False,
        "cuda_visible_devices": 7,
        "probe": {"nonce": "n", "wall": 1.0, "sig": "forged"},
        "wall": "soon",
    }
    liveness.beat(client, "ghost-types", [QUEUE], 60.0, wrong)
    for n in (1, 2):
        twin = {
            "id": f"ghost-gpu{n}",
            "host": "h",
            "queues": [QUEUE],
            "toolchains": {"cuda-90-w32": {"torch_version": "0"}},
            "cpu_only": False,
            "cuda_visible_devices": "0",
        }
        liveness.beat(client, f"ghost-gpu{n}", [QUEUE], 60.0, twin)


COMMANDS = [
    ["stats"],
    ["stats", "--all"],
    ["stats", "--json"],
    ["doctor"],
    ["doctor", "--arch", "sm_90", "--json"],
    ["explain", "--last-misses"],
    ["explain", KEY],
    ["explain", KEY, "--diff", "here"],
    ["explain", "--diff", "ghost-gpu1"],
    ["stats", "--zero"],
]


@pytest.mark.parametrize("registry", ["records", "string"])
def test_stats_doctor_and_explain_read_junk_any_writer_can_set_without_a_traceback(
    redis_server: RedisServer, tmp_path: Path, registry: str
) -> None:
    client = redis_server.client(DB)
    client.flushdb()
    plant_junk(client)
    if registry == "records":
        plant_records(client)
    else:
        client.set(keys.WORKER_REGISTRY, "junk")  # the registry itself as a string
    codes = []
    for args in COMMANDS:
        proc = tool(redis_server, tmp_path, *args)
        output = proc.stdout + proc.stderr
        assert "Traceback" not in output, (args, output[-3000:])
        # 0 or 1 (doctor: no worker serves sm_90); 2 only as one line (explain: the
        # planted records are not workers, so --diff finds none).
        assert proc.returncode in (0, 1, 2), (args, output[-3000:])
        if proc.returncode == 2:
            assert proc.stderr.startswith("compileq: error: ") and proc.stderr.count("\n") == 1
        codes.append(proc.returncode)
    # What the tools say of the junk: named, never counted.
    values = json.loads(tool(redis_server, tmp_path, "stats", "--json").stdout)
    assert values["workers"] == 0 and values["store"]["entries_of_another_type"] == 1
    if registry == "records":
        assert set(values["ignored_worker_records"]) == {"ghost-types", "ghost-gpu1", "ghost-gpu2"}
    else:
        assert values["wrong_type_keys"] == [keys.WORKER_REGISTRY]
    misses = tool(redis_server, tmp_path, "explain", "--last-misses").stdout
    assert f"{keys.MISSES} holds another Redis type" in misses
    assert codes.count(0) >= len(COMMANDS) // 2, codes  # stats and explain ran through


def test_unsigned_worker_records_are_reported_never_counted_and_fail_no_check(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis_server.client(DB)
    client.flushdb()
    plant_records(client)
    proc = tool(redis_server, tmp_path, "doctor", "--arch", "sm_90", "--json")
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(proc.stdout.splitlines()[-1])["checks"]}
    # An unsigned record proves nothing: not "another secret", not two workers on one GPU.
    assert checks["secret"]["status"] == "warn", checks["secret"]
    assert "another COMPILEQ_SECRET" not in checks["secret"]["detail"]
    assert checks["gpu pinning"]["status"] == "ok", checks["gpu pinning"]
    records = checks["worker records"]
    assert records["status"] == "warn" and "3 worker records" in records["detail"]
    assert all(w in records["detail"] for w in ("ghost-types", "ghost-gpu1", "ghost-gpu2"))
    # The one true FAIL: no worker serves sm_90 (none of the three is one).
    assert checks["workers"]["status"] == "FAIL"

    text = tool(redis_server, tmp_path, "stats").stdout
    assert "workers: 0 live" in text
    assert "3 worker records unsigned, stale or malformed, ignored" in text
