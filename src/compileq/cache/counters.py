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
    #: max-autotune candidates: timings found in the store, timed by GPU workers, and timed in
    #: the compiling process because no worker could (inductor/autotune.py).
    TUNE_HITS = "tune_hits"
    TUNE_REMOTE = "tune_remote"
    TUNE_LOCAL = "tune_local"
    #: GEMMs whose every choice's time, ATen's too, came from a stored table: nothing timed.
    TUNE_TABLE_HITS = "tune_table_hits"
    FX_HITS = "fx_hits"
    FX_MISSES = "fx_misses"
    FX_REMOTE_COMPILES = "fx_remote_compiles"
    FX_LOCAL_COMPILES = "fx_local_compiles"
    #: Backward graphs whose codegen job was sent when AOTAutograd partitioned them.
    FX_SENT_AHEAD = "fx_sent_ahead"
    #: Backwards held until their forward's worker had lowered it, because Inductor may pad an
    #: activation they read (codegen/padding.py); and of those, the ones whose forward's
    #: strides came back as traced (held for nothing: the rule's false alarms).
    FX_HELD_FOR_PADDING = "fx_held_for_padding"
    FX_HELD_NOT_PADDED = "fx_held_not_padded"
    #: Graphs compiled in process at once, without a try on a worker, because a worker's
    #: codegen of the same graph (same toolchain, same compileq) had failed (cache/verdicts.py).
    FX_KNOWN_FAILURES = "fx_known_failures"
    #: Job profiles (inductor/profiles.py): loaded into the local caches, absent or late,
    #: refused (tampered, truncated, over the cap, unreadable), saved at exit.
    PROFILE_LOADS = "profile_loads"
    PROFILE_MISSES = "profile_misses"
    PROFILE_REJECTED = "profile_rejected"
    PROFILE_SAVES = "profile_saves"
    PROFILE_BYTES = "profile_bytes"
    #: Time spent fetching profiles, overlapped with the processes' imports; and the part
    #: of it the first compiles still waited for.
    PROFILE_PREFETCH_MS = "profile_prefetch_ms"
    PROFILE_WAIT_MS = "profile_wait_ms"
    #: DDPOptimizer subgraphs loaded from AOTAutograd's cache, and the outputs of compiled
    #: ones recorded so that they can be (codegen/ddp_aot.py).
    DDP_SUBGRAPH_LOADS = "ddp_subgraph_loads"
    DDP_SUBGRAPH_RECORDS = "ddp_subgraph_records"
    #: DDP subgraphs' forwards whose compile went on without waiting for their worker, and
    #: frames compiled again because such a forward's output strides were not the traced ones
    #: or its output could not be loaded (codegen/deferred.py).
    DDP_FORWARDS_DEFERRED = "ddp_forwards_deferred"
    DDP_FORWARD_MISPREDICTIONS = "ddp_forward_mispredictions"
    #: Deferred forwards whose saved activations came back padded, restrided for the backward.
    DDP_SAVED_RESTRIDED = "ddp_saved_restrided"
    #: Backwards of deferred forwards sent with restrided inputs from the strides their
    #: workers stored once they had lowered the forward, before the forward was loaded.
    DDP_SAVED_RESTRIDED_EARLY = "ddp_saved_restrided_early"
    #: Graphs outside DDP compiled in parts that the workers generated side by side
    #: (codegen/split.py); their parts count as DDP subgraphs above.
    GRAPHS_SPLIT = "graphs_split"
    AOT_HITS = "aot_hits"
    AOT_MISSES = "aot_misses"
    CPP_HITS = "cpp_hits"
    CPP_MISSES = "cpp_misses"
    CPP_REMOTE_COMPILES = "cpp_remote_compiles"
    CPP_LOCAL_COMPILES = "cpp_local_compiles"
    #: Triton's C helper modules (inductor/triton_modules.py): written from the store,
    #: missing there, built here.
    TRITON_MODULE_HITS = "triton_module_hits"
    TRITON_MODULE_MISSES = "triton_module_misses"
    TRITON_MODULE_BUILDS = "triton_module_builds"
    #: Triton kernel binaries a client compiled in its own process (inductor/triton_binaries.py:
    #: configs found at run time): written from the store, missing there, built here.
    TRITON_BINARY_HITS = "triton_binary_hits"
    TRITON_BINARY_MISSES = "triton_binary_misses"
    TRITON_BINARY_BUILDS = "triton_binary_builds"
    #: Kernels whose first launch on a client found every config timing it needed in the store
    #: (inductor/runtime_tuning.py), and kernels that benchmarked configs at first launch.
    RUNTIME_TUNE_HITS = "runtime_tune_hits"
    RUNTIME_AUTOTUNES = "runtime_autotunes"
    #: Matmul padding decisions (inductor/pad_decisions.py): found in the store, and timed
    #: here (once per matmul per cluster where ranks do not time it at the same moment).
    PAD_DECISION_HITS = "pad_decision_hits"
    PAD_DECISION_TIMINGS = "pad_decision_timings"
    #: Dynamo's record of which sizes went dynamic (inductor/dynamic_profile.py): read from the
    #: store at a process's first compile, and written after a compile that changed it.
    DYNAMIC_PROFILE_HITS = "dynamic_profile_hits"
    DYNAMIC_PROFILE_WRITES = "dynamic_profile_writes"
    FALLBACKS = "fallbacks"
    INTEGRITY_FAILURES = "integrity_failures"
    FOREIGN_SECRET_ENTRIES = "foreign_secret_entries"
    REJECTED_TASKS = "rejected_tasks"
    #: Worker records in Redis that were unsigned, stale or malformed (skipped, never routed to).
    REJECTED_RECORDS = "rejected_records"
    #: Entries that failed verification and were replaced by a verified rebuild.
    REPLACED_ENTRIES = "replaced_entries"
    #: Leases found without an expiry (never set by compileq) and treated as stale.
    STALE_LEASES = "stale_leases"
    #: Jobs a client waited on past its deadline because a live worker was building them
    #: (cache/building.py), instead of compiling them in process beside it.
    WAITED_PAST_DEADLINE = "waited_past_deadline"
    #: Kernels, graphs and C++ objects built locally while Redis could not be reached,
    #: stored once it answered.
    STORED_AFTER_OUTAGE = "stored_after_outage"


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
    KNOWN_FAILURE = "known-failure"  # a worker's codegen of this graph failed before
    INTERNAL = "compileq-error"  # compileq's own code raised (see scheduler/boundary.py)


def fallback(reason: Reason, n: int = 1) -> Callable[[Any], None]:
    """A record (see :meth:`RedisStore.count`) counting ``n`` fallbacks for ``reason``."""

    def record(pipe: Any) -> None:
        if n:
            pipe.hincrby(keys.FALLBACK_REASONS, reason.value, n)

    return record


def _hash(client: redis.Redis, key: str) -> dict[str, int]:
    """A counters hash as read back from Redis, where anybody may have written: a key of
    another type reads as empty (the next count repairs it, see RedisStore.count), and
    fields that are not known counters with integer values are skipped."""
    try:
        raw = cast("dict[bytes, bytes]", client.hgetall(key))
    except redis.ResponseError:  # WRONGTYPE
        return {}
    out = {}
    for field, value in raw.items():
        try:
            out[field.decode()] = int(value)
        except (UnicodeDecodeError, ValueError):
            continue
    return out


def read_fallback_reasons(client: redis.Redis) -> dict[str, int]:
    known = {r.value for r in Reason}
    return {k: v for k, v in _hash(client, keys.FALLBACK_REASONS).items() if k in known}


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
    out: dict[str, dict[str, int]] = {}
    known = {c.value for c in PER_QUEUE}
    for field, value in _hash(client, keys.QUEUE_STATS).items():
        queue, _, name = field.rpartition("|")
        if queue.startswith((keys.QUEUE_PREFIX, keys.FX_QUEUE_PREFIX)) and name in known:
            out.setdefault(queue, {c.value: 0 for c in PER_QUEUE})[name] = value
    return out


def read_counters(client: redis.Redis) -> dict[str, int]:
    values = {c.value: 0 for c in Counter}
    values.update({k: v for k, v in _hash(client, keys.STATS).items() if k in values})
    return values


#: The keys that hold counters: what reset_counters drops (with the slowest-builds lists,
#: found by their prefix), and what a snapshot of the cache must hold to restore them.
COUNTER_KEYS = (keys.STATS, keys.QUEUE_STATS, keys.FALLBACK_REASONS)


def reset_counters(client: redis.Redis) -> None:
    """Zero the counters, per-queue counters, fallback reasons and the slowest-builds lists."""
    slow = list(client.scan_iter(match=keys.SLOW + "*", count=1000))
    client.delete(*COUNTER_KEYS, *slow)
