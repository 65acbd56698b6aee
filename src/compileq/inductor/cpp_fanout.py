"""A C++ object that misses the store is built by a worker, any node's, not here.

Inductor builds each C++ kernel of a graph on its own compile threads, all on this machine.
Sent to the C++ queue of this compiler, torch and CPU (``tasks/cpp_jobs.py``), a cold graph's
objects are built by every free pool process of every worker serving it, each once for the
cluster (single flight on the object's key, as graphs: ``scheduler/roundtrip.py``), while the
thread that would have run the compiler here waits. Where no worker serves the queue, a
command line cannot travel, or the round trip fails, the object is built here as stock
builds it: slower, never failed.

Inductor's precompiled header is not sent (155 MB for its CPU prefix): its text and the
command line that precompiles it are, and a worker precompiles it once and keeps it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import redis

from compileq._log import warn_once
from compileq.fingerprint import cpp_toolchain
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.scheduler import boundary, roundtrip
from compileq.scheduler.client import KernelClient
from compileq.scheduler.fallback import Fallback
from compileq.tasks.cpp_jobs import CppJob, Unportable, machine_dirs
from compileq.tasks.queues import cpp_queue

#: Each precompiled header Inductor asked for here (made or skipped): path -> its builder.
_headers: dict[str, Any] = {}


class CppFanout(Feature):
    """Send a C++ object that misses the store to a worker (``cpp_cache`` asks)."""

    name = "cpp-fanout"
    # What a C++ job is made of (tasks/cpp_jobs.py); ``_precompiling`` is read where it is set.
    targets = (
        Target("torch._inductor.cpp_builder", "CppBuilder.get_target_file_path"),
        Target("torch._inductor.cpp_builder", "CppBuilder.get_command_line"),
    )

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache and ctx.settings.cpp_fanout


FEATURE = CppFanout()


def _slot() -> AbstractContextManager[bool]:
    """Whether what misses may be sent now, held while it is built: in a worker's codegen, only
    while a sibling pool process is free to build it and not already building another sent
    object (``workers/fx_slots.py``: a sibling builds one object at a time, where this
    process's own compile threads build several; and waiting on busy siblings that wait too
    would never end); in a client, always. A worker's codegen installed without a slot
    (``send_slot`` is optional beside ``on_worker``) falls back to whether any sibling is free:
    never sending into a pool that is all generating."""
    ctx = FEATURE.ctx
    if ctx is not None and ctx.send_slot is not None:
        return ctx.send_slot()
    return contextlib.nullcontext(ctx is None or ctx.on_worker is None or ctx.on_worker())


def precompiled_header(builders: Sequence[Any]) -> bool:
    """Whether ``builders`` precompile a header; if so, later jobs that include it say so."""
    if not any(getattr(b, "_precompiling", False) for b in builders):
        return False
    for builder in builders:
        target = str(builder.get_target_file_path())
        if target.endswith(".gch"):
            _headers[target[: -len(".gch")]] = builder
    return True


def _served_queue(client: KernelClient) -> str | None:
    """This machine's C++ queue, if a live worker serves it (a Redis failure reads as no)."""
    queue = cpp_queue(cpp_toolchain())
    try:
        return queue if client.router.has_worker(queue) else None
    except redis.RedisError as e:
        client.redis_failed(e)
        return None


def _not_sending(header: Sequence[Any]) -> bool:
    return False


@boundary.guard("C++ fan-out", instead=_not_sending)
def sends_builds(header: Sequence[Any]) -> bool:
    """Whether the objects that include this precompiled ``header`` (its builders) go to
    workers now: a live worker serves this machine's C++ queue, and the header's own command
    line can travel (else neither will theirs, and they are built here, with the header).
    Never in a worker's codegen, whose pool process keeps its header for every graph."""
    client = FEATURE.client
    if client is None or client.in_worker or client.redis_down():
        return False
    try:
        CppJob.from_builders(cpp_toolchain(), header, machine_dirs())
    except (Unportable, OSError, ValueError):
        return False
    return _served_queue(client) is not None


def _built_here(key: str, builders: Sequence[Any]) -> bytes | None:
    return None


@boundary.guard("C++ fan-out", instead=_built_here)
def built_remotely(key: str, builders: Sequence[Any]) -> bytes | None:
    """The object's bytes, built by a worker (or by another client's worker meanwhile); None
    where it must be built here."""
    client = FEATURE.client
    if client is None or client.redis_down():
        return None
    with _slot() as may_send:
        queue = _served_queue(client) if may_send else None
        if queue is None:
            return None
        return _fetch(client, key, queue, builders)


def _fetch(client: KernelClient, key: str, queue: str, builders: Sequence[Any]) -> bytes | None:
    try:
        job = CppJob.from_builders(cpp_toolchain(), builders, machine_dirs(), _headers)
        return roundtrip.fetch(client, roundtrip.Job(roundtrip.CPP, key, queue, job.to_bytes))
    except Unportable as e:
        warn_once("cpp-unportable", "compileq: C++ object built here (%s)", e)
    except Fallback as e:
        warn_once(f"cpp-{e.topic}", "compileq: %s; building the C++ object here", e)
    except (OSError, ValueError) as e:  # a source unreadable, or a job over the cap
        warn_once("cpp-job", "compileq: C++ object built here (%s)", e)
    return None
