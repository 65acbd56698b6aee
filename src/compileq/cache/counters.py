"""Cluster-wide counters, one Redis hash shared by every client and worker."""

from __future__ import annotations

import enum
from collections.abc import Callable
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


class Reason(str, enum.Enum):
    """Why a kernel or graph was built in the client (each one also counts in ``fallbacks``)."""

    UNIMPORTABLE = "unimportable"  # codegen needed the client's own code (a stand-in was called)
    DEVICE = "device"  # a graph on devices the wire does not carry
    SIZE_CAP = "size-cap"  # a job over COMPILEQ_MAX_ENTRY_BYTES
    DEADLINE = "deadline"  # no result within COMPILEQ_DEADLINE_S
    WORKER_ERROR = "worker-error"  # the worker's build failed or refused the job
    NO_WORKER = "no-worker"  # no live worker for the queue
    UNSERIALIZABLE = "unserializable"  # Inductor would not pickle the graph
    REDIS = "redis"  # Redis failed or is down
    BROKER = "broker"  # the broker refused or could not be reached
    LOST = "lost"  # announced done, but the output was gone from the store


def fallback(reason: Reason, n: int = 1) -> Callable[[Any], None]:
    """A record (see :meth:`RedisStore.count`) counting ``n`` fallbacks for ``reason``."""

    def record(pipe: Any) -> None:
        if n:
            pipe.hincrby(keys.FALLBACK_REASONS, reason.value, n)

    return record


def read_fallback_reasons(client: redis.Redis) -> dict[str, int]:
    raw = cast("dict[bytes, bytes]", client.hgetall(keys.FALLBACK_REASONS))
    return {k.decode(errors="replace"): int(v) for k, v in raw.items() if v.isdigit()}


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
    """Zero the counters, per-queue counters, fallback reasons and the slowest-builds lists."""
    slow = list(client.scan_iter(match=keys.SLOW + "*", count=1000))
    client.delete(keys.STATS, keys.QUEUE_STATS, keys.FALLBACK_REASONS, *slow)
