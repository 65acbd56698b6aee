"""What a client does while Redis is away: ask again soon under Sentinel, keep what it built.

A Sentinel failover (issue 34, finding 8) cost a cold ``compileq warm`` two things. The client
waited ``retry_after_s`` (15 s) before it asked Redis again, though the promoted replica
answered a few seconds after the kill; and what it built locally meanwhile was never stored,
so a new machine found 85% of the kernels. Two pieces here mend that:

- :class:`Reconnector`: after a connection error under Sentinel, a background thread asks the
  Sentinels for the master at once and PINGs it, again after 0.1, 0.2, 0.4 ... 1 s, until the
  master answers (then the client is told, and uses Redis again) or ``retry_after_s`` passes
  (then the client's own next call tries, as without Sentinel).
- :class:`Backlog`: kernels built locally while Redis could not be reached, kept in memory,
  bounded in count and bytes, and stored (signed as any entry) once it answers.
- :data:`entries`: the same for the graph cache's puts (FX graphs, AOTAutograd entries, C++
  objects, ``inductor/graph_cache.py`` and ``inductor/cpp_cache.py``), drained by
  :func:`store_entries` when the kernel backlog is (the client finds Redis answering) and
  after any successful call of those caches, which is the only moment a process without
  Triton kernels (a CPU job) learns that Redis is back.

Rejected alternatives: a short fixed ``retry_after_s`` for every deployment. Against a plain
Redis behind a partition each try costs a whole connect timeout, on the caller's path; under
Sentinel the probe runs off that path, and a failover is the expected, short outage.
Probing on the caller's path (the next lookup asks the Sentinels itself): a kernel would wait
out a dead master's timeout before building. Keeping the backlog on disk: it would outlive a
process that exits before Redis answers, but every such kernel is in that process's own
Inductor cache already, and a disk queue of unsigned payloads is one more thing to trust.
One backlog for every graph-cache kind, not one per kind: they share the process's one store
and answer to the same outage, so one bound (the payloads' memory) and one drain do; per-kind
backlogs would split that bound three ways, leaving room for graphs in a job whose objects
filled theirs. It is apart from the kernel client's, whose entries also owe their lease and
announcement (``KernelClient.store_backlog``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import redis

from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.cache.meta import Record
from compileq.cache.store import RedisStore
from compileq.errors import CompileqError

T = TypeVar("T")

#: A backlog holds at most this many kernels ...
BACKLOG_ENTRIES = 1024
#: ... and this many payload bytes (a kernel's is tens of KiB; a cold warm of 91 about 5 MiB).
BACKLOG_BYTES = 64 * 2**20
#: The probe's first pause, doubled after each failed probe up to ``PROBE_MAX_S``.
PROBE_FIRST_S = 0.1
PROBE_MAX_S = 1.0


@dataclass(frozen=True)
class Deferred(Generic[T]):
    """A payload built while Redis was away: its key, its bytes and the builder's context."""

    key: str
    payload: bytes
    context: T


class Backlog(Generic[T]):
    """What to store once Redis answers, first come first kept, within count and byte bounds."""

    def __init__(
        self,
        max_entries: int = BACKLOG_ENTRIES,
        max_bytes: int = BACKLOG_BYTES,
        what: str = "kernels",
    ) -> None:
        self._max_entries, self._max_bytes, self._what = max_entries, max_bytes, what
        self._lock = threading.Lock()
        self._items: dict[str, Deferred[T]] = {}
        self._bytes = 0
        #: Payloads refused for want of room: built, used, never stored (a later run rebuilds).
        self.dropped = 0

    def add(self, key: str, payload: bytes, context: T) -> bool:
        """Keep ``payload`` for later; False (and counted in ``dropped``) if it does not fit."""
        with self._lock:
            if key in self._items:
                return True
            if (
                len(self._items) >= self._max_entries
                or self._bytes + len(payload) > self._max_bytes
            ):
                self.dropped += 1
                full = True
            else:
                self._items[key] = Deferred(key, payload, context)
                self._bytes += len(payload)
                full = False
        if full:
            warn_once(
                "backlog-full",
                "compileq: more %s built while Redis was away than kept for storing later "
                "(%d of them, %d MiB); the rest stay in this process only",
                self._what,
                self._max_entries,
                self._max_bytes // 2**20,
            )
        return not full

    def take(self) -> list[Deferred[T]]:
        """Everything kept, oldest first; the backlog is empty afterwards."""
        with self._lock:
            items, self._items, self._bytes = list(self._items.values()), {}, 0
        return items

    def __len__(self) -> int:
        # No lock: every graph-cache hit asks (``store_entries``), and a dict's length is read
        # atomically; a put racing this read is stored at the next call instead.
        return len(self._items)


@dataclass(frozen=True)
class Owed:
    """What a graph-cache put that missed Redis still owes once stored: its counters, its
    records (a build time), and the records of a new entry (only if the put wrote it)."""

    counts: dict[Counter, int]
    records: list[Record]
    if_written: list[Record]


#: Graph-cache entries built here while Redis was away (one backlog for every kind: above).
entries: Backlog[Owed] = Backlog(what="graph-cache entries")


def unreachable(error: redis.RedisError) -> bool:
    """Whether ``error`` says Redis is away (down, partitioned, or a demoted master refusing
    writes during a failover), so a put may succeed later; not a refusal it would repeat."""
    return isinstance(error, (redis.ConnectionError, redis.TimeoutError, redis.ReadOnlyError))


def store_entries(store: RedisStore) -> int:
    """Store (signed, through ``store.put``, which also replaces a value that does not verify)
    what :data:`entries` kept, now that Redis answers; how many it wrote, each counted in
    ``stored_after_outage``. What Redis fails on now stays for the next time it answers."""
    if not len(entries):
        return 0
    stored = 0
    items = entries.take()
    for n, item in enumerate(items):
        owed = item.context
        try:
            wrote = store.put(item.key, item.payload)
        except CompileqError:  # too large: never storable, as it would not have been before
            continue
        except redis.RedisError as e:
            if not unreachable(e):  # refused (as it would have been then): not kept again
                warn_once("backlog-put", "compileq: graph-cache entry not stored: %s", e)
                continue
            for rest in items[n:]:
                entries.add(rest.key, rest.payload, rest.context)
            log.debug("compileq: graph-cache entries kept for later once more (%s)", e)
            break
        counts = dict(owed.counts)
        if wrote:
            stored += 1
            counts[Counter.STORED_AFTER_OUTAGE] = counts.get(Counter.STORED_AFTER_OUTAGE, 0) + 1
        store.count(counts, None, owed.records + (owed.if_written if wrote else []))
    if stored:
        log.warning(
            "compileq: stored %d graph-cache entries built here while Redis was away", stored
        )
    return stored


def probe(client: redis.Redis) -> str:
    """Ask the Sentinels where the master is (redis-py drops idle connections to a former one)
    and PING it; ``host:port`` of the master that answered. Raises redis.RedisError."""
    where = ""
    ask: Callable[[], tuple[str, int]] | None = getattr(
        client.connection_pool, "get_master_address", None
    )
    if ask is not None:
        host, port = ask()
        where = f"{host}:{port}"
    client.ping()
    return where


class Reconnector:
    """Probes the master after a connection error until it answers, off the caller's path.

    ``on_back(master, outage_s)`` runs on the probe's thread once the master answers;
    ``start(until)`` (from any thread, any number of times) probes until ``until``
    (``time.monotonic()``) at most; ``stop`` ends it for good (the client closed).
    """

    def __init__(
        self,
        client: redis.Redis,
        on_back: Callable[[str, float], None],
        stop: threading.Event,
    ) -> None:
        self._client = client
        self._on_back = on_back
        self._stop = stop
        self._lock = threading.Lock()
        self._until = 0.0
        self._since = 0.0
        self._thread: threading.Thread | None = None

    def start(self, until: float) -> None:
        with self._lock:
            self._until = max(self._until, until)
            if self._thread is not None and self._thread.is_alive():
                return
            self._since = time.monotonic()
            self._thread = threading.Thread(
                target=self._run, name="compileq-reconnect", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        pause = PROBE_FIRST_S
        while not self._stop.is_set():
            try:
                master = probe(self._client)
            except redis.RedisError as e:
                log.debug("compileq: Redis probe failed (%s)", e)
                with self._lock:
                    if time.monotonic() + pause >= self._until:
                        self._thread = None
                        return
                self._stop.wait(pause)
                pause = min(pause * 2, PROBE_MAX_S)
                continue
            except Exception as e:  # a bug here must not end the client's recovery silently
                log.warning("compileq: Redis probe error (%s)", e)
                with self._lock:
                    self._thread = None
                return
            with self._lock:
                self._thread = None
                outage_s = time.monotonic() - self._since
            self._on_back(master, outage_s)
            return
