"""The client: cache lookup, single-flight, remote builds, deadlines and local fallback.

One :class:`KernelClient` per process. For each kernel it asks the store first (one MGET for a
whole batch); on a miss it takes the key's lease (``SET NX``). The lease holder builds — on a
worker if one is live for the kernel's queue, else locally — and everybody else waits for the
announcement on ``compileq:done``. Whatever goes wrong (Redis gone, no worker, a worker failing,
a deadline passing) the kernel is built locally, so a training job never fails or hangs
because of compileq.

Leasing, sending and reading announcements are the round trip every job kind shares
(``roundtrip.py``); the client's own part is the futures, the listener thread that resolves
them as kernels come and go, and the local builds. While Redis is away, local builds are
kept (bounded) and stored once it answers; under Sentinel a thread asks for the new master
at once instead of waiting out ``retry_after_s`` (``outage.py``).
"""

from __future__ import annotations

import contextlib
import enum
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import redis

from compileq._log import first_time, log, warn_once
from compileq.cache import meta
from compileq.cache.counters import Counter, Reason, fallback
from compileq.cache.store import Entry, RedisStore
from compileq.config import Settings
from compileq.connect import redis_client
from compileq.errors import CompileqError, EntryTooLarge
from compileq.scheduler import boundary, leases, roundtrip
from compileq.scheduler.local import LocalBuilder
from compileq.scheduler.outage import Backlog, Reconnector, store_entries
from compileq.scheduler.progress import progress
from compileq.scheduler.routing import Router
from compileq.scheduler.share import Share
from compileq.sentinel_url import is_sentinel
from compileq.tasks import broker, events
from compileq.tasks.jobs import TRITON, TritonJob, key_of


class Outcome(str, enum.Enum):
    HIT = "hit"  # found in the cache
    REMOTE = "remote"  # built elsewhere (a worker, or another client) while this one waited
    LOCAL = "local"  # built in this process's local pool


@dataclass(frozen=True)
class Built:
    key: str
    source: Entry | bytes  # a verified cache entry, or the bytes a local build returned
    outcome: Outcome

    @property
    def payload(self) -> bytes:
        """The pickled return value of Inductor's ``_worker_compile_triton``."""
        return self.source if isinstance(self.source, bytes) else self.source.payload()


class _State(enum.Enum):
    WAITING = "waiting"  # for an announcement from whoever holds the lease
    LOCAL = "local"  # building in the local pool
    PENDING = "pending"  # a worker's codegen holds it until a sibling or a thread is free


@dataclass(eq=False)  # a flight is an identity: equal fields never make two flights one
class _Flight:
    key: str
    job: TritonJob
    extra_env: dict[str, str]
    queue: str
    material: dict[str, Any]  # what ``key`` hashes; recorded on a miss and with a local build
    deadline: float
    future: Future[Built]
    state: _State = _State.WAITING
    owner: bool = False


class KernelClient:
    def __init__(
        self,
        settings: Settings,
        local: LocalBuilder,
        *,
        on_worker: Callable[[], bool] | None = None,
        kernel_share: Callable[[], int] | None = None,
        local_slots: int = 1,
    ) -> None:
        """``on_worker``: this client runs inside a worker's FX codegen, and the callable says
        whether a sibling pool process is free to build what it enqueues. While one is, it
        enqueues its misses like any client; else it builds them itself without taking leases:
        a graph waiting for a queue whose every consumer is busy waiting too would deadlock.
        Its own builds count as remote. ``kernel_share``, with it: how many of this process's
        kernels may be with siblings at once; then misses go to siblings or to ``local_slots``
        builds here, whichever has room first (``share.py``)."""
        self._settings = settings
        self._local = local
        self._on_worker = on_worker
        self._share: Share[_Flight] | None = None
        if on_worker is not None and kernel_share is not None:
            self._share = Share(
                kernel_share, max(1, local_slots), self._send_shared, self._build_shared
            )
        self._built = (
            Counter.KERNEL_LOCAL_COMPILES if on_worker is None else Counter.KERNEL_REMOTE_COMPILES
        )
        self._id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._redis = redis_client(settings.redis_url, settings)
        self._store = RedisStore(self._redis, settings)
        if on_worker is None:  # a worker's codegen shows no progress of its own
            progress.configure(settings.progress)
        self._router = Router(self._redis, settings, lambda counts: self._store.count(counts))
        # An entry sealed with another secret is replaced by our build only while a live
        # worker proves the cluster shares our secret (see RedisStore.replace_foreign).
        self._store.replace_foreign = self._router.shares_secret
        self._store.on_unreachable = self._redis_failed
        # Made at the first send (``send_task``): a client whose every lookup hits never
        # imports Celery (``tasks/names.py``).
        self._app: Any = None
        self._app_lock = threading.Lock()
        self._lock = threading.Lock()
        self._flights: dict[str, _Flight] = {}
        #: Keys whose lease this client holds but could not release while Redis was down:
        #: released once Redis answers again (see release_orphans).
        self._orphans: set[str] = set()
        #: Leases of jobs this process sent ahead without waiting for them (speculative): a
        #: Redis failure may lose their messages, so they become orphans too.
        self._ahead: set[str] = set()
        self._down_until = 0.0
        self._closed = threading.Event()
        #: Kernels built here while Redis could not be reached: stored once it answers.
        self._backlog: Backlog[tuple[_Flight, float]] = Backlog()
        #: Under Sentinel a failover is a short outage: ask for the new master at once.
        self._reconnector = (
            Reconnector(self._redis, self._redis_back, self._closed)
            if is_sentinel(settings.redis_url)
            else None
        )
        self._subscribed = threading.Event()
        self._listener: threading.Thread | None = None
        self._pid = os.getpid()
        #: The leases of the jobs this process sent, refreshed until their worker drops them.
        self._sent = leases.Leases(
            self._redis,
            ttl_s=roundtrip.lease_ms(settings) / 1000,
            max_hold_s=settings.visibility_timeout_s,
            secret=self._store.secret,
            owner=self._id,
        )

    # -- public -------------------------------------------------------------------------------

    @property
    def store(self) -> RedisStore:
        return self._store

    @property
    def client_id(self) -> str:
        """``host:pid:nonce``: the owner written into the leases this client takes."""
        return self._id

    @property
    def router(self) -> Router:
        return self._router

    @property
    def settings(self) -> Settings:
        return self._settings

    def send_task(self, name: str, key: str, queue: str) -> None:
        """Enqueue task ``name`` for ``key`` (also its task id, so duplicates collapse)."""
        if self._app is None:
            with self._app_lock:
                if self._app is None:
                    from compileq.tasks.app import client_app

                    self._app = client_app(self._settings)
        self._app.send_task(name, args=[key], queue=queue, task_id=key)

    @property
    def in_worker(self) -> bool:
        """Whether this client runs inside a worker's FX codegen (a pool process)."""
        return self._on_worker is not None

    def redis_down(self) -> bool:
        """Whether Redis failed recently: everything compiles locally until ``retry_after_s``
        passes or, under Sentinel, until the probe finds the master answering again."""
        return time.monotonic() < self._down_until

    def redis_failed(self, error: Exception) -> None:
        self._redis_failed(error)

    def orphan_lease(self, key: str) -> None:
        """``key``'s lease is ours, but Redis failed before we could release it."""
        with self._lock:
            self._orphans.add(key)

    def release_lease(self, key: str) -> None:
        """Hand back ``key``'s lease now, or, if Redis fails, as soon as it answers again."""
        try:
            leases.release(self._redis, key, self._id)
        except redis.RedisError:
            self.orphan_lease(key)

    def keep_lease(self, key: str) -> None:
        """``key``'s job is sent: keep its lease (ours) alive while this process lives, until
        the worker that settles the job drops it.

        A lease lasts its sender's deadline and a second, and a job may wait in its queue
        longer than that behind a busy worker's other builds (on the 2-core CI machine: a
        backward sent ahead waited over a minute behind two 40 s codegens). Unrenewed, the
        lease lapsed there, the next process asking for the key sent the job again, and both
        messages were built at once: 7 codegens for a DDP job's 6 graphs. A worker renews the
        lease while it builds (workers/lifecycle.keeping_lease), which covers a sender that
        died since; this covers the time in the queue. Rejected alternative: a lease as long
        as the visibility timeout from the start, which a sender dying before its message
        went out would hold that long."""
        self._sent.keep(key)

    def sent_ahead(self, key: str) -> None:
        """This process sent ``key``'s job and holds its lease, but waits for it later."""
        with self._lock:
            self._ahead.add(key)

    def received(self, key: str) -> None:
        """``key``'s output is here: the worker dropped its lease."""
        with self._lock:
            self._ahead.discard(key)

    def release_orphans(self) -> None:
        """Hand back the leases Redis failure kept us from releasing, now that it answers.

        Without this, after a failover (whose replica holds our leases: they were
        replicated) or a Redis restart with its data, every other client asking for those
        keys would wait out their expiry, a whole deadline, before building them.
        """
        with self._lock:
            if not self._orphans:
                return
            orphans, self._orphans = self._orphans, set()
        left = set(orphans)
        try:
            for key in orphans:
                leases.release(self._redis, key, self._id)  # owner-checked: never another's
                left.discard(key)
        except redis.RedisError:
            with self._lock:
                self._orphans |= left

    def submit(self, job: TritonJob, extra_env: dict[str, str] | None = None) -> Future[Built]:
        return self.submit_many([(job, extra_env or {})])[0]

    def submit_many(self, jobs: Sequence[tuple[TritonJob, dict[str, str]]]) -> list[Future[Built]]:
        """Futures resolving to each job's build; duplicates in flight share one future."""
        futures: list[Future[Built]] = []
        new: list[_Flight] = []
        deadline = time.monotonic() + self._settings.deadline_s
        with self._lock:
            for job, env in jobs:
                target = job.target
                if target is None:
                    raise CompileqError(f"kernel {job.name}: no DeviceProperties in its source")
                material = job.key_material(self._router.toolchain(target), target)
                key = key_of(material)
                flight = self._flights.get(key)
                if flight is None:
                    queue = self._router.queue(target)
                    flight = _Flight(key, job, env, queue, material, deadline, Future())
                    self._flights[key] = flight
                    new.append(flight)
                futures.append(flight.future)
        if new:
            progress.start(len(new))
            self._dispatch(new)
        return futures

    def close(self) -> None:
        """Stop listening. The listener is a daemon thread that notices within 0.2 s; nothing
        it holds needs flushing, so close() does not wait for it."""
        self._closed.set()

    # -- dispatch -----------------------------------------------------------------------------

    def _dispatch(self, flights: list[_Flight]) -> None:
        if time.monotonic() < self._down_until:
            self._build_locally(flights)
            return
        try:
            self._ensure_listener()
            entries = self._store.get_many([f.key for f in flights])
            misses = []
            for flight, entry in zip(flights, entries, strict=True):
                if entry is None:
                    misses.append(flight)
                else:
                    self._resolve(flight, Built(flight.key, entry, Outcome.HIT))
            if self._on_worker is None:
                self._send(misses, flights)
                return
            self._store.count(
                {
                    Counter.KERNEL_HITS: len(flights) - len(misses),
                    Counter.KERNEL_MISSES: len(misses),
                },
                _per_queue(flights, misses, []),
            )
            if self._share is not None:
                with self._lock:
                    for f in misses:
                        f.state = _State.PENDING
                self._share.add(misses)
            elif self._on_worker():
                self._send(misses, [])
            else:
                self._build_locally(misses)
        except redis.RedisError as e:
            self._redis_failed(e)  # builds every waiting flight, these included, locally
        except Exception as e:  # a bug, or a value from Redis it could not read: stock's way
            boundary.internal_error("the kernel client", e)
            self._build_locally(flights)

    def _send(self, misses: list[_Flight], looked_up: list[_Flight]) -> None:
        """Lease ``misses`` and send those this client owns to a live worker (the rest wait
        for their owner; with no live worker, built here). ``looked_up``: the batch whose
        hits and misses are counted with this (empty where they were counted already)."""
        owners = self._take_leases(misses)
        remote: list[_Flight] = []
        unserved: list[_Flight] = []
        for f in owners:
            (remote if self._router.has_worker(f.queue) else unserved).append(f)
        for queue, flight in {f.queue: f for f in unserved}.items():
            # Asked once per queue: the answer reads every worker's record.
            if flight.job.target is not None and first_time(f"no-worker:{queue}"):
                log.warning(
                    "compileq: no live worker for queue %s (%s); compiling locally",
                    queue,
                    self._router.why_unserved(flight.job.target),
                )
        counts = {Counter.FALLBACKS: len(unserved)}
        if looked_up:
            counts[Counter.KERNEL_HITS] = len(looked_up) - len(misses)
            counts[Counter.KERNEL_MISSES] = len(misses)
        self._store.count(
            counts,
            _per_queue(looked_up, misses if looked_up else [], unserved),
            [
                *([meta.record_misses([self._miss_record(f) for f in misses])] if misses else ()),
                fallback(Reason.NO_WORKER, len(unserved)),
            ],
        )
        self._enqueue(remote)
        self._build_locally(unserved)

    def _send_shared(self, flights: list[_Flight]) -> None:
        """``Share``'s way to send: ``flights`` wait for a sibling's build from now on."""
        flights = self._claim_pending(flights, _State.WAITING)
        if not flights:
            return
        try:
            self._send(flights, [])
        except redis.RedisError as e:
            self._redis_failed(e)
        except Exception as e:
            boundary.internal_error("the kernel client", e)
            self._build_locally(flights)

    def _build_shared(self, flights: list[_Flight]) -> None:
        """``Share``'s way to build here."""
        self._build_locally(self._claim_pending(flights, _State.PENDING))

    def _claim_pending(self, flights: list[_Flight], state: _State) -> list[_Flight]:
        """Those of ``flights`` still pending, now in ``state``; the rest (built here after a
        Redis failure, or ended meanwhile) give their room back."""
        deadline = time.monotonic() + self._settings.deadline_s
        with self._lock:
            claimed = [f for f in flights if f.state is _State.PENDING and not f.future.done()]
            for f in claimed:
                f.state = state
                # Its wait starts now: one held here past the submit's deadline would
                # otherwise be given up on at its first look and built twice.
                f.deadline = deadline
        share = self._share
        if share is not None:
            for f in flights:
                if f not in claimed:
                    share.done(f)
        return claimed

    def _miss_record(self, flight: _Flight) -> dict[str, Any]:
        target = flight.job.target
        toolchain = self._router.toolchain(target).describe() if target is not None else {}
        return {
            "key": flight.key,
            "name": flight.job.name,
            "queue": flight.queue,
            "material": flight.material,
            "toolchain": toolchain,
            "client": self._id,
            "time": time.time(),
        }

    def _take_leases(self, flights: list[_Flight]) -> list[_Flight]:
        """Take each key's lease; return the flights this client now owns (the rest wait).

        Unlike ``leases.Leases`` (FX graphs, built in this process and refreshed while it
        lives), a kernel lease is handed on: the worker that builds deletes it. So it is the
        round trip's fixed lease (``roundtrip.lease_ms``), past which waiters build locally.
        """
        taken = roundtrip.take(self, [f.key for f in flights])
        owned = []
        for f, took in zip(flights, taken, strict=True):
            f.owner = bool(took)
            if f.owner:
                owned.append(f)
        return owned

    def _enqueue(self, flights: list[_Flight]) -> None:
        """Send the jobs of ``flights`` (leased by this client); what cannot be sent is built
        here, its lease kept until then: the local build announces it to whoever waits."""
        if not flights:
            return
        by_key = {f.key: f for f in flights}
        sent = roundtrip.enqueue(
            self,
            [roundtrip.Job(roundtrip.TRITON, f.key, f.queue, f.job.to_json) for f in flights],
        )
        if sent.too_large:
            error = next(iter(sent.too_large.values()))
            warn_once("job-too-large", "compileq: %s; building it locally", error)
            self._fall_back([by_key[k] for k in sent.too_large], Reason.SIZE_CAP)
        if sent.unsent:  # the broker refused: said once by the round trip
            self._fall_back([by_key[k] for k in sent.unsent], Reason.BROKER)

    # -- local builds -------------------------------------------------------------------------

    def _fall_back(self, flights: list[_Flight], reason: Reason) -> None:
        """Count ``flights`` as fallbacks for ``reason`` (in total and per queue), build here."""
        self._store.count(
            {Counter.FALLBACKS: len(flights)},
            _per_queue([], [], flights),
            [fallback(reason, len(flights))],
        )
        self._build_locally(flights)

    def _build_locally(self, flights: list[_Flight]) -> None:
        for f in flights:
            with self._lock:
                if f.state is _State.LOCAL or f.future.done():
                    continue
                f.state = _State.LOCAL
            future = self._local.submit(f.job, f.extra_env)
            future.add_done_callback(lambda fut, f=f: self._local_done(f, fut))  # type: ignore[misc]

    def _local_done(self, flight: _Flight, future: Future[tuple[bytes, float]]) -> None:
        error = future.exception()
        if error is not None:
            # The same error stock Inductor would raise; the lease is freed so nobody waits.
            self._release(
                flight, events.Done(flight.key, False, f"{type(error).__name__}: {error}")
            )
            self._fail(flight, error)
            return
        payload, seconds = future.result()
        if time.monotonic() < self._down_until:
            self._defer(flight, payload, seconds)
        else:
            try:
                self._store_built(flight, payload, seconds)
            except EntryTooLarge as e:
                warn_once("too-large", "compileq: %s; kept local only", e)
            except redis.RedisError as e:
                self._defer(flight, payload, seconds)
                self._redis_failed(e)
        self._resolve(flight, Built(flight.key, payload, Outcome.LOCAL))

    def _store_built(
        self, flight: _Flight, payload: bytes, seconds: float, late: bool = False
    ) -> None:
        """Store a local build (signed, first writer wins), count it, hand its lease back and
        announce it. ``late``: built while Redis was away, counted as stored after the outage."""
        wrote = self._store.put(flight.key, payload)
        counts = {self._built: 1}
        if late and wrote:
            counts[Counter.STORED_AFTER_OUTAGE] = 1
        self._store.count(
            counts, {flight.queue: {self._built: 1}}, self._build_records(flight, seconds, wrote)
        )
        self._release(flight, events.Done(flight.key, True))

    def _defer(self, flight: _Flight, payload: bytes, seconds: float) -> None:
        """Keep a local build for when Redis answers again; its lease is an orphan till then."""
        if flight.owner:
            self.orphan_lease(flight.key)
        self._backlog.add(flight.key, payload, (flight, seconds))

    def store_backlog(self) -> int:
        """Store what was built here while Redis was away (it answers again); how many were
        stored. What Redis fails on now stays for the next time it answers."""
        if time.monotonic() < self._down_until:
            return 0
        store_entries(self._store)  # the graph cache's too (logged and counted there)
        if not len(self._backlog):
            return 0
        stored = 0
        items = self._backlog.take()
        for n, item in enumerate(items):
            flight, seconds = item.context
            try:
                self._store_built(flight, item.payload, seconds, late=True)
                stored += 1
            except EntryTooLarge:
                continue
            except redis.RedisError as e:
                for rest in items[n:]:
                    self._backlog.add(rest.key, rest.payload, rest.context)
                self._redis_failed(e)
                break
        return stored

    def store_backlog_within(self, timeout_s: float) -> int:
        """Wait, at most ``timeout_s``, for Redis to answer again and take what this process
        built while it was away; how many builds are still kept here only. For ``compileq
        warm``, whose builds are its whole point: its last builds done locally in a failover
        would otherwise leave with the process, if it ends before the probe finds the new
        master (a training job does not wait so on its way out; its backlog is a cache)."""
        if not len(self._backlog):
            return 0
        deadline = time.monotonic() + timeout_s
        log.warning(
            "compileq: waiting up to %.0f s for Redis to store %d kernels built here while it "
            "was away",
            timeout_s,
            len(self._backlog),
        )
        # Probed as a Sentinel client probes in a failover, plain Redis too: this process has
        # nothing left to do but wait, so no dispatch would find Redis answering again.
        prober = self._reconnector or Reconnector(self._redis, self._redis_back, self._closed)
        while len(self._backlog) and time.monotonic() < deadline and not self._closed.is_set():
            prober.start(deadline)  # the probe stores the backlog once the master answers
            self._closed.wait(0.1)
        return len(self._backlog)

    def _redis_back(self, master: str, outage_s: float) -> None:
        """The Reconnector found the master answering: use Redis again from now on."""
        self._down_until = 0.0
        log.warning(
            "compileq: Redis at %s answers again (master %s, %.1f s after it failed); "
            "using the cluster again",
            self._settings.redis_display,
            master,
            outage_s,
        )
        self.release_orphans()
        stored = self.store_backlog()
        if stored:
            log.warning("compileq: stored %d kernels built here while Redis was away", stored)

    def _build_records(self, flight: _Flight, seconds: float, wrote: bool) -> list[meta.Record]:
        records = [meta.record_build_time(TRITON, flight.key, flight.job.name, seconds, self._id)]
        target = flight.job.target
        if wrote and target is not None:
            toolchain = self._router.toolchain(target).describe()
            record = meta.entry_record(
                flight.material, toolchain, name=flight.job.name, by=self._id, seconds=seconds
            )
            records.append(meta.record_entry(flight.key, record, self._store.ttl_s))
        return records

    def _release(self, flight: _Flight, done: events.Done) -> None:
        if time.monotonic() < self._down_until:
            if flight.owner:
                self.orphan_lease(flight.key)
            return
        try:
            if flight.owner:
                leases.release(self._redis, flight.key, self._id)
            events.announce(self._redis, done)
        except redis.RedisError as e:
            if flight.owner:
                self.orphan_lease(flight.key)
            self._redis_failed(e)

    # -- waiting ------------------------------------------------------------------------------

    def _ensure_listener(self) -> None:
        if self._pid != os.getpid():
            # A fork copied this client but not its listener thread, which is what polls and
            # enforces deadlines: without one a child's flights could wait forever. Start
            # afresh; the parent's flights are the parent's business.
            self._pid = os.getpid()
            with self._lock:
                self._flights = {f.key: f for f in self._flights.values() if not f.future.done()}
            self._listener = None
            self._subscribed = threading.Event()
        if self._listener is None:
            self._listener = threading.Thread(
                target=self._listen, name="compileq-listener", daemon=True
            )
            self._listener.start()
            # Once per process, off the caller's path: a slow or refused CONFIG GET must not
            # delay the first kernel.
            threading.Thread(
                target=broker.warn_if_evicting, args=(self._settings,), daemon=True
            ).start()
        # Subscribe before the first lookup: an announcement between a miss and the
        # subscription would otherwise only be seen by the poll (roundtrip.POLL_S) later.
        self._subscribed.wait(timeout=self._settings.connect_timeout_s)

    def _listen(self) -> None:
        watcher: roundtrip.Watcher | None = None
        try:
            while not self._closed.is_set():
                try:
                    if watcher is None:
                        if time.monotonic() < self._down_until:
                            self._closed.wait(0.2)
                            continue
                        watcher = roundtrip.Watcher(self._store, self._settings.connect_timeout_s)
                        self._subscribed.set()
                        self.store_backlog()  # Redis answers (again): store what waited
                    done = watcher.announcements(timeout=0.2)
                    waiting = self._waiting()  # after the wait: flights added meanwhile count
                    now = time.monotonic()
                    # The round trip's deadline rule: a flight past its deadline is read once
                    # more (a forced poll) before it is built here.
                    late = any(now >= f.deadline for f in waiting)
                    seen = watcher.check(done, [f.key for f in waiting], force=late)
                    if seen.polled:
                        self.release_orphans()  # Redis answers (again): hand back what we hold
                    self._settle(waiting, seen, now)
                except redis.RedisError as e:
                    _closed(watcher)
                    watcher = None
                    self._redis_failed(e)
                except Exception:  # never let the listener die: waiting flights would hang
                    log.exception("compileq: listener error")
                    self._closed.wait(0.2)
        finally:
            _closed(watcher)

    def _waiting(self, *states: _State) -> list[_Flight]:
        """The flights in ``states`` (default: waiting for an announcement)."""
        wanted = states or (_State.WAITING,)
        with self._lock:
            return [f for f in self._flights.values() if f.state in wanted]

    def _settle(self, waiting: list[_Flight], seen: roundtrip.Round, now: float) -> None:
        """End the ``waiting`` flights that ``seen`` (one look of the watcher at ``now``)
        decides: found, failed (built here), lost (built here) or past their deadline."""
        lost = set(seen.lost)
        failed: list[_Flight] = []
        late: list[_Flight] = []
        for flight in waiting:
            entry = seen.found.get(flight.key)
            if entry is not None:
                self._resolve(flight, Built(flight.key, entry, Outcome.REMOTE))
            elif flight.key in seen.failed:
                failed.append(flight)
            elif flight.key in lost:  # evicted, or rejected as corrupt: build it here
                self._build_locally([flight])
            elif now >= flight.deadline:  # read just now (a forced poll), and still missing
                late.append(flight)
        if failed:
            self._failed_remotely(failed, seen.failed)
        if late:
            warn_once(
                "deadline",
                "compileq: remote builds missed the %.0fs deadline; compiling locally",
                self._settings.deadline_s,
            )
            self._fall_back(late, Reason.DEADLINE)

    def _failed_remotely(self, flights: list[_Flight], failed: dict[str, events.Done]) -> None:
        """Build ``flights`` here: their workers announced a failure (``failed``)."""
        reasons: dict[Reason, int] = {}
        for flight in flights:
            done = failed[flight.key]
            warn_once(
                "remote-failed",
                "compileq: a remote build failed (%s); compiling locally",
                done.error,
            )
            reason = done.reason or Reason.WORKER_ERROR
            reasons[reason] = reasons.get(reason, 0) + 1
            self._build_locally([flight])
        # Counted like a deadline miss: the cluster did not deliver (a worker refusing the
        # job, e.g. for a signature made with another secret), and `fallbacks` is where an
        # operator looks for kernels that went local.
        self._store.count(
            {Counter.FALLBACKS: len(flights)},
            None,
            [fallback(reason, n) for reason, n in reasons.items()],
        )

    # -- endings ------------------------------------------------------------------------------

    def _redis_failed(self, error: Exception) -> None:
        self._down_until = time.monotonic() + self._settings.retry_after_s
        if self._reconnector is not None and not self._closed.is_set():
            self._reconnector.start(self._down_until)
        with self._lock:
            # A failover may have lost the messages of the jobs sent ahead, not their
            # leases (replicated): hand those back too once Redis answers, else everyone
            # who needs such a graph waits a whole deadline for a build that never comes.
            self._orphans |= self._ahead
            self._ahead.clear()
        warn_once(
            "redis-down",
            "compileq: Redis at %s failed (%s); compiling locally",
            self._settings.redis_display,
            error,
        )
        self._build_locally(self._waiting(_State.WAITING, _State.PENDING))

    def _take(self, flight: _Flight) -> bool:
        """Claim the right to end ``flight``: announcement, poll and local build may race."""
        with self._lock:
            if self._flights.get(flight.key) is not flight:
                return False
            del self._flights[flight.key]
        return True

    def _resolve(self, flight: _Flight, built: Built) -> None:
        if self._take(flight):
            progress.kernel(built.outcome.value)
            flight.future.set_result(built)
            self._ended(flight)

    def _fail(self, flight: _Flight, error: BaseException) -> None:
        if self._take(flight):
            flight.future.set_exception(error)
            self._ended(flight)

    def _ended(self, flight: _Flight) -> None:
        """A worker's codegen: ``flight``'s room goes to the next kernel waiting for one."""
        if self._share is not None:
            self._share.done(flight)


def _closed(watcher: roundtrip.Watcher | None) -> None:
    """Close ``watcher`` if there is one, whatever state its connection is in."""
    if watcher is not None:
        with contextlib.suppress(Exception):
            watcher.close()


def _per_queue(
    looked_up: list[_Flight], misses: list[_Flight], fallbacks: list[_Flight]
) -> dict[str, dict[Counter, int]]:
    """Per-queue tallies of a batch: what ``compileq stats`` shows per toolchain and target.
    ``misses`` is a subset of ``looked_up``; the rest of ``looked_up`` were hits."""
    missed = {f.key for f in misses}
    out: dict[str, dict[Counter, int]] = {}
    for f in looked_up:
        tally = out.setdefault(f.queue, {Counter.KERNEL_HITS: 0, Counter.KERNEL_MISSES: 0})
        tally[Counter.KERNEL_MISSES if f.key in missed else Counter.KERNEL_HITS] += 1
    for f in fallbacks:
        tally = out.setdefault(f.queue, {})
        tally[Counter.FALLBACKS] = tally.get(Counter.FALLBACKS, 0) + 1
    return out
