"""Cluster-wide counters, one Redis hash shared by every client and worker."""

from __future__ import annotations

import enum
from typing import Any, cast

import redis

from compileq import keys


class Counter(str, enum.Enum):
    KERNEL_HITS = "kernel_hits"
    KERNEL_MISSES = "kernel_misses"
    KERNEL_REMOTE_COMPILES = "kernel_remote_compiles"
    KERNEL_LOCAL_COMPILES = "kernel_local_compiles"
    KERNEL_REMOTE_FAILURES = "kernel_remote_failures"
    FX_HITS = "fx_hits"
    FX_MISSES = "fx_misses"
    FX_REMOTE_COMPILES = "fx_remote_compiles"
    FX_LOCAL_COMPILES = "fx_local_compiles"
    AOT_HITS = "aot_hits"
    AOT_MISSES = "aot_misses"
    CPP_HITS = "cpp_hits"
    CPP_MISSES = "cpp_misses"
    CPP_REMOTE_COMPILES = "cpp_remote_compiles"
    CPP_LOCAL_COMPILES = "cpp_local_compiles"
    FALLBACKS = "fallbacks"
    INTEGRITY_FAILURES = "integrity_failures"
    FOREIGN_SECRET_ENTRIES = "foreign_secret_entries"
    REJECTED_TASKS = "rejected_tasks"


def incr(pipe: redis.Redis | Any, counts: dict[Counter, int]) -> None:
    """Queue increments on a client or pipeline (zero counts are skipped)."""
    for counter, n in counts.items():
        if n:
            pipe.hincrby(keys.STATS, counter.value, n)


#: Counters also kept per queue (per toolchain and target): what ``compileq stats`` breaks down.
PER_QUEUE = (
    Counter.KERNEL_HITS,
    Counter.KERNEL_MISSES,
    Counter.KERNEL_REMOTE_COMPILES,
    Counter.KERNEL_LOCAL_COMPILES,
    Counter.KERNEL_REMOTE_FAILURES,
    Counter.FALLBACKS,
)


def incr_queues(pipe: redis.Redis | Any, counts: dict[str, dict[Counter, int]]) -> None:
    """Queue per-queue increments on the same pipeline as :func:`incr` (no extra round trip).

    One hash with ``<queue>|<counter>`` fields rather than a hash per queue: reading and
    resetting them is then one command, not a SCAN over queue names.
    """
    for queue, per in counts.items():
        for counter, n in per.items():
            if n:
                pipe.hincrby(keys.QUEUE_STATS, f"{queue}|{counter.value}", n)


def read_queue_counters(client: redis.Redis) -> dict[str, dict[str, int]]:
    raw = cast("dict[bytes, bytes]", client.hgetall(keys.QUEUE_STATS))
    out: dict[str, dict[str, int]] = {}
    for field, value in raw.items():
        queue, _, name = field.decode().rpartition("|")
        if queue:
            out.setdefault(queue, {c.value: 0 for c in PER_QUEUE})[name] = int(value)
    return out


def read_counters(client: redis.Redis) -> dict[str, int]:
    raw = cast("dict[bytes, bytes]", client.hgetall(keys.STATS))
    values = {c.value: 0 for c in Counter}
    values.update({k.decode(): int(v) for k, v in raw.items()})
    return values


def reset_counters(client: redis.Redis) -> None:
    """Zero the counters, per-queue counters and the slowest-builds lists."""
    slow = list(client.scan_iter(match=keys.SLOW + "*", count=1000))
    client.delete(keys.STATS, keys.QUEUE_STATS, *slow)
