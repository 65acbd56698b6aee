"""What operators read back about entries: key material, build times and recent misses.

Written where the work happens (a worker's or client's build, a client's miss), always queued
on a pipeline that is executed anyway (the counters'), so recording adds commands but never a
round trip. Read by ``compileq stats`` and ``compileq explain``.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis

from compileq import keys

#: Kernel misses kept for ``compileq explain --last-misses``. A record is ~1 KiB; 1,000 of
#: them cover the misses of a large model's compile and stay around 1 MiB.
MISS_LOG_LEN = 1000
#: Builds kept per kind in the slowest-builds sorted set.
SLOW_LEN = 50

#: Something that queues commands on a pipeline (see ``RedisStore.count``).
Record = Callable[[Any], None]


def entry_record(
    material: dict[str, Any], toolchain: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    """The JSON stored next to an entry: the material its key hashes and the toolchain's parts."""
    return {
        "material": material,
        "toolchain": toolchain,
        "host": socket.gethostname(),
        "time": time.time(),
        **extra,
    }


def record_entry(key: str, record: dict[str, Any], ttl_s: int | None) -> Record:
    """Store ``record`` under ``compileq:meta:<key>`` and index it by kernel name and source."""
    material = record["material"]

    def queue(pipe: Any) -> None:
        pipe.set(keys.meta(key), json.dumps(record, sort_keys=True), ex=ttl_s)
        if "source" in material:  # the kernel's source, its own name left out (TritonJob)
            index = keys.siblings(str(material["kind"]), str(material["source"]))
            pipe.sadd(index, key)
            if ttl_s:
                pipe.expire(index, ttl_s)

    return queue


def record_build_time(
    kind: str, key: str, name: str, seconds: float, by: str, started: float | None = None
) -> Record:
    """Add a build to the capped ``compileq:slow:<kind>`` set (the slowest ``SLOW_LEN`` stay).

    ``started``: its wall-clock start (Unix time), so that builds which ran at the same time
    can be seen to overlap.
    """
    fields: dict[str, Any] = {"name": name, "key": key, "by": by}
    if started is not None:
        fields["started"] = round(started, 3)
    member = json.dumps(fields, sort_keys=True)

    def queue(pipe: Any) -> None:
        pipe.zadd(keys.slow(kind), {member: round(seconds, 4)})
        pipe.zremrangebyrank(keys.slow(kind), 0, -(SLOW_LEN + 1))

    return queue


def record_misses(records: Sequence[dict[str, Any]]) -> Record:
    def queue(pipe: Any) -> None:
        pipe.lpush(keys.MISSES, *(json.dumps(r, sort_keys=True) for r in records))
        pipe.ltrim(keys.MISSES, 0, MISS_LOG_LEN - 1)

    return queue


# -- reading ----------------------------------------------------------------------------------


def _json(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_meta(client: redis.Redis, artifact_keys: Sequence[str]) -> list[dict[str, Any] | None]:
    if not artifact_keys:
        return []
    raws = cast("list[bytes | None]", client.mget([keys.meta(k) for k in artifact_keys]))
    return [_json(r) for r in raws]


def sibling_keys(client: redis.Redis, kind: str, source_sha: str) -> list[str]:
    members = cast("set[bytes]", client.smembers(keys.siblings(kind, source_sha)))
    return sorted(m.decode() for m in members)


def last_misses(client: redis.Redis, n: int) -> list[dict[str, Any]]:
    raws = cast("list[bytes]", client.lrange(keys.MISSES, 0, max(n, 1) - 1))
    return [r for r in (_json(raw) for raw in raws) if r is not None]


def slowest(client: redis.Redis, kind: str, n: int) -> list[dict[str, Any]]:
    rows = cast(
        "list[tuple[bytes, float]]",
        client.zrevrange(keys.slow(kind), 0, n - 1, withscores=True),
    )
    out = []
    for member, score in rows:
        value = _json(member)
        if value is not None:
            out.append({**value, "seconds": score})
    return out


def slow_kinds(client: redis.Redis) -> list[str]:
    return sorted(
        k.decode()[len(keys.SLOW) :] for k in client.scan_iter(match=keys.SLOW + "*", count=1000)
    )
