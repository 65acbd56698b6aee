"""What the cluster remembers of a graph whose codegen failed on a worker: its verdict.

One failed try per graph, cluster-wide. Without a verdict, every rank or machine that misses a
graph whose codegen fails on the workers sends it again, and pays a round trip, a worker's
codegen and its failure before compiling the graph in process anyway. So the worker whose
codegen of a graph raised writes a verdict, and every later process that meets the graph finds
it and compiles in process at once: counted under the fallback reason ``known-failure`` and in
``fx_known_failures``, listed by ``compileq stats`` and named by ``compileq doctor``.

Who writes it: the worker, when its codegen of the graph raised an exception that is the
graph's, not its infrastructure's (``workers/fx_verdict.py`` tells them apart), and before it
announces the failure, so that a process asking after the lease is gone finds the verdict.
Rejected: the client, on a ``worker-error`` announcement. Announcements are unsigned pub/sub:
a client signing what it heard would let anybody who can publish have a verdict signed for any
graph; and the client cannot tell a genuine codegen error from a worker's Redis, broker or disk
failing. A killed worker, a lost broker or a passed deadline never produce a verdict at all:
nothing but a codegen that ended in an exception of the graph's writes one.

Its key: ``keys.fx_failure`` of the graph's job key (Inductor's FX-graph hash, the FX
toolchain, the target, the codegen environment and state: ``tasks/fx_jobs.py``) and compileq's
version, an artifact kind of its own (``compileq:a:fxfail:<sha256>``). A new torch, compiler or
kernel toolchain makes a new job key, a new compileq a new verdict key: either misses the old
verdict, and the graph is tried again. Rejected: a failure mark under the job's output key.
Every reader of an output would then have to tell marks from outputs, and the store's first
writer wins, so the mark would stand in the way of the output of a later, successful try.

Its life: ``COMPILEQ_FX_FAILURE_TTL_S``, a week by default, so a cause that was not the graph's
after all (a module missing on the workers, a broken compiler there) heals without anyone's
help; ``compileq forget-failures`` drops every verdict at once, for the operator who fixed it.

Its content: JSON ``{"graph", "reason", "error", "worker", "at"}``: the job key, the fallback
reason its failure was announced with (``worker-error``, or ``unimportable`` for a graph that
needed the client's own code), the exception's type and first line, the worker's id and when.
It is sealed like any entry (an HMAC over key and payload, ``cache/envelope.py``) and read like
one: a value that does not verify, or does not parse, is no verdict, and the graph is sent.

The client reads the verdict in the round trip that looks its job's output up
(``scheduler/roundtrip.py``, ``Job.verdict``), which happens only once Inductor's own caches
missed: no round trip of its own, and a cache hit never reads it. ``compileq stats``,
``doctor`` and ``forget-failures`` find the verdicts through an index, ``keys.FX_FAILURES`` (a
capped sorted set of their keys), not a SCAN of the keyspace; they read and verify each
verdict it names, since anybody who can write to Redis can write to the index.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import redis

from compileq import keys
from compileq._text import printable
from compileq._version import __version__
from compileq.cache.counters import Reason
from compileq.cache.store import Entry, RedisStore
from compileq.errors import CompileqError

#: The most verdicts the index keeps (the newest); an older verdict still works for clients
#: until it expires, it is only no longer listed.
INDEX_CAP = 1000
#: How much of an exception's first line a verdict keeps.
ERROR_CHARS = 300
#: What every verdict's key starts with (the artifact kind ``keys.fx_failure`` writes).
PREFIX = keys.artifact("fxfail", "")

_REASONS = {r.value: r for r in Reason}


def key(job_key: str, version: str = __version__) -> str:
    """The key of the verdict on the graph whose job key is ``job_key``, for compileq's
    ``version`` (this one's)."""
    return keys.fx_failure(job_key, version)


def first_line(error: BaseException) -> str:
    """``Type: first line of the message``: what a verdict keeps of an exception (Inductor's
    messages run to whole tracebacks of the lowering that failed)."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return text[:ERROR_CHARS]


@dataclass(frozen=True)
class Verdict:
    """A worker's codegen of ``graph`` (a job key) failed with ``error``, for ``reason``."""

    graph: str
    reason: Reason
    error: str
    worker: str
    #: When the worker wrote it (its clock, seconds since the epoch).
    at: float

    def to_json(self) -> dict[str, str | float]:
        return {
            "graph": self.graph,
            "reason": self.reason.value,
            "error": self.error,
            "worker": self.worker,
            "at": self.at,
        }

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Verdict | None:
        """The verdict ``data`` holds, its strings made printable (they are logged and shown);
        None for anything else."""
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            return None
        if not isinstance(obj, dict):
            return None
        graph, reason, error, worker, at = (
            obj.get(f) for f in ("graph", "reason", "error", "worker", "at")
        )
        if not (
            all(isinstance(v, str) for v in (graph, error, worker))
            and reason in _REASONS
            and isinstance(at, int | float)
            and not isinstance(at, bool)
        ):
            return None
        return cls(
            printable(cast("str", graph)),
            _REASONS[cast("str", reason)],
            printable(cast("str", error), ERROR_CHARS),
            printable(cast("str", worker)),
            float(cast("float", at)),
        )

    def describe(self, now: float | None = None) -> str:
        """One line for a log or a report: what failed, where and how long ago."""
        ago = max(0.0, (time.time() if now is None else now) - self.at)
        return f"{self.error} ({self.reason.value}; worker {self.worker}, {_ago(ago)} ago)"


def _ago(seconds: float) -> str:
    for unit, scale in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= scale:
            return f"{seconds / scale:.0f} {unit}"
    return f"{seconds:.0f} s"


def read(entry: Entry | None) -> Verdict | None:
    """The verdict a verified entry (``RedisStore.get_many``) holds; None for a miss, or an
    entry of ours that is no verdict this compileq reads."""
    if entry is None:
        return None
    try:
        return Verdict.from_bytes(entry.payload())
    except CompileqError:  # authentic, yet undecodable or over the cap: no verdict
        return None


def remember(store: RedisStore, verdict: Verdict, ttl_s: int) -> None:
    """Write ``verdict`` (replacing an older one on the same graph) for ``ttl_s`` seconds, and
    name it in the index. Raises ``RedisError``; the index write is telemetry and never does."""
    name = key(verdict.graph)
    store.replace(name, verdict.to_bytes(), ttl_s)
    store.count({}, None, [_indexed(name, verdict.at, ttl_s)])


def _indexed(name: str, at: float, ttl_s: int) -> Callable[[Any], None]:
    """A record (see ``RedisStore.count``) naming ``name`` in the index, scored ``at``, and
    dropping what has expired by now or is over the cap."""

    def record(pipe: Any) -> None:
        pipe.zadd(keys.FX_FAILURES, {name: at})
        pipe.zremrangebyscore(keys.FX_FAILURES, "-inf", f"({at - ttl_s}")
        pipe.zremrangebyrank(keys.FX_FAILURES, 0, -(INDEX_CAP + 1))
        pipe.expire(keys.FX_FAILURES, ttl_s)

    return record


def _indexed_names(client: redis.Redis) -> list[str]:
    """The verdict keys the index names, newest first; what is not one is left out."""
    try:
        raw = cast("list[bytes]", client.zrevrange(keys.FX_FAILURES, 0, INDEX_CAP - 1))
    except redis.ResponseError:  # WRONGTYPE: not written by compileq; the next write repairs it
        return []
    names = [m.decode(errors="replace") for m in raw]
    return [n for n in names if n.startswith(PREFIX) and len(n) == len(PREFIX) + 64]


def remembered(store: RedisStore) -> list[Verdict]:
    """Every verdict the index names that verifies and has not expired, newest first (by the
    verdict's own time, not the index's unsigned score)."""
    names = _indexed_names(store.client)
    found = [read(e) for e in store.get_many(names)]
    return sorted((v for v in found if v is not None), key=lambda v: -v.at)


def forget(client: redis.Redis) -> int:
    """Drop every verdict (the index's, and any left out of it: found by SCAN, as an operator's
    command may) and the index; how many verdicts were dropped."""
    names = {n.encode() for n in _indexed_names(client)}
    names.update(cast("list[bytes]", list(client.scan_iter(match=PREFIX + "*", count=1000))))
    dropped = int(client.delete(*names)) if names else 0
    client.delete(keys.FX_FAILURES)
    return dropped
