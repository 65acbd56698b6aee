"""The one round trip every job kind takes to a worker: lease, seal, send, wait.

A Triton kernel, an FX graph, a C++ object and an autotuning timing travel alike. The job's
key (the content key its output is stored under) is leased (``SET NX`` with an expiry, see
``leases.py``), so one process in the cluster sends it and every other one waits for the same
output. The lease holder seals the job under ``keys.job(key)`` and sends a task named by its
kind with the key as its id, so duplicate messages collapse. The worker (``workers``: admit,
open_job, settle) stores the output, deletes the job and the lease, and announces the key on
``compileq:done``, ``ok`` or with its error.

Waiting is the same for every kind: the completion channel is subscribed to *before* anything
is sent (pub/sub is at-most-once: an announcement in between would be lost), the store is read
for each key announced done, and re-read every ``POLL_S`` as a safety net under pub/sub (a
dropped connection, a failover, an evicted message). One deadline rule: a wait gives up
``deadline_s`` after it was asked for, once the store, read then, still lacks the output; a
lease lasts that long and a second more, and its sender renews it while the job waits in its
queue (``KernelClient.keep_lease``), its worker while it builds: a slow job is never sent
again by another process while its sender or its worker lives. After a Redis failure the
leases this process still holds are orphans (``KernelClient.orphan_lease``), handed back once
Redis answers again, so nobody else waits out their expiry.

A job's early output: a worker may store part of a job's output before the whole, under
``keys.early(key)`` (an FX forward's output strides, once lowered: ``tasks/fx_strides.py``),
and announce it on the same channel. The process that sent the job may act on it while it
waits (``Early``, from its ``meanwhile``), and a wait for one job may take the early outputs
of others (``others``: a DDP frame's check waits for one forward while its other forwards'
workers lower theirs): each is read, verified as any entry, and handed over once, in the
waiting thread.

A job may have a verdict (``Job.verdict``, FX graphs: ``cache/verdicts.py``): where a worker
remembers that its build failed for a reason of the job's own. The verdict is read in the
same call as the job's output, so a miss costs no extra round trip, and a job found there is
not sent: its caller builds it at once (``known-failure``).

Whatever goes wrong, the caller builds the output itself; ``Fallback`` says why, with its
reason typed (``fallback.py``). Two ways to wait share these steps: blocking, for a set of
keys (FX graphs, C++ objects, autotuning timings: ``fetch``, ``send_and_wait``), and the
kernel client's listener thread, which resolves the futures of kernels that come and go
(``client.py``: ``take``, ``enqueue`` and a ``Watcher`` of its own).

Rejected alternative: every kind waiting through the kernel client's listener (a future per
key, resolved by its one thread). When a kernel's wait fails the listener builds it locally
itself, while a graph's fallback is Inductor's in-process compile on the caller's thread and a
timing's is stock's own timing: routing all of them through futures would have the listener
decide what only the caller can. So the kinds share the sending and the reading of
announcements, and each of the two waits is one loop over them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import redis

from compileq import keys
from compileq._log import warn_once
from compileq.cache import building, verdicts
from compileq.cache.counters import Counter, Reason
from compileq.cache.store import Entry, RedisStore
from compileq.config import Settings, redact
from compileq.errors import EntryTooLarge
from compileq.scheduler import leases
from compileq.scheduler.fallback import Fallback
from compileq.tasks import broker, events
from compileq.tasks.names import COMPILE_CPP, COMPILE_FX, COMPILE_TRITON, TUNE_TRITON

#: Safety net under pub/sub: keys still awaited are re-read from the store this often. A lost
#: announcement costs at most this much; each poll is one MGET of the keys still awaited.
POLL_S = 0.5

#: What the waiting process does with a job's early output (its payload), once, if it comes
#: before the wait ends; any error in it is its own (logged, the wait goes on).
Early = Callable[[bytes], None]


class Sender(Protocol):
    """What the round trip needs of this process's client (``KernelClient``); a protocol, so
    the client can use the round trip without the two modules importing each other."""

    @property
    def store(self) -> RedisStore: ...

    @property
    def settings(self) -> Settings: ...

    @property
    def client_id(self) -> str: ...

    def send_task(self, name: str, key: str, queue: str) -> None: ...

    def orphan_lease(self, key: str) -> None: ...

    def release_lease(self, key: str) -> None: ...

    def redis_failed(self, error: Exception) -> None: ...

    def received(self, key: str) -> None: ...

    def sent_ahead(self, key: str) -> None: ...

    def keep_lease(self, key: str) -> None: ...


@dataclass(frozen=True)
class Kind:
    """A job kind: the task a worker runs for it, and what that task does (for messages)."""

    task: str
    work: str


TRITON = Kind(COMPILE_TRITON, "build the kernel")
FX = Kind(COMPILE_FX, "generate the graph")
CPP = Kind(COMPILE_CPP, "build the C++ object")
TUNE = Kind(TUNE_TRITON, "time the candidate")


@dataclass(frozen=True)
class Job:
    """One job to send: its output's ``key``, the ``queue`` of the workers that can build it,
    and ``spec``, its bytes, made only if this process sends it."""

    kind: Kind
    key: str
    queue: str
    spec: Callable[[], bytes]
    #: Where a worker remembers that building this job failed for a reason of the job's own
    #: (``cache/verdicts.py``), read with its output; None for a kind without verdicts.
    verdict: str | None = None


def deadline(settings: Settings) -> float:
    """When a wait asked for now gives up (``time.monotonic()``): the one deadline rule."""
    return time.monotonic() + settings.deadline_s


def lease_ms(settings: Settings) -> int:
    """A lease outlives its holder's wait by a second: while the sender still waits, nobody
    else takes the lease and sends the job again; one that died before sending holds it no
    longer than a wait lasts."""
    return (int(settings.deadline_s) + 1) * 1000


def take(sender: Sender, names: Sequence[str]) -> list[bool]:
    """Take each key's lease; which ones this process now holds (the rest are in flight)."""
    store = sender.store
    return leases.take_many(
        store.client,
        names,
        sender.client_id,
        lease_ms(sender.settings),
        lambda n: store.count({Counter.STALE_LEASES: n}),
        secret=store.secret,
    )


@dataclass
class Sent:
    """What became of a batch of jobs."""

    #: Sent by this process, which holds their leases until the worker drops them.
    sent: list[str] = field(default_factory=list)
    #: Leased by another process: in flight there, waited for alike.
    others: list[str] = field(default_factory=list)
    #: Over the size cap: never sent, nobody builds them.
    too_large: dict[str, EntryTooLarge] = field(default_factory=dict)
    #: Refused by the broker (or not tried after it refused one): nobody builds them.
    unsent: list[str] = field(default_factory=list)
    #: The broker's error, when it refused.
    refused: Exception | None = None

    @property
    def in_flight(self) -> list[str]:
        """The keys a worker will answer for: the ones worth waiting for."""
        return [*self.sent, *self.others]


def enqueue(sender: Sender, jobs: Sequence[Job]) -> Sent:
    """Seal and store the jobs (whose leases this process holds), then send their tasks.

    A ``RedisError`` propagates: the caller's leases are then orphans. The broker failing is
    said once per process, whichever kind met it, and the jobs not sent are returned.
    """
    store, settings = sender.store, sender.settings
    out = Sent()
    # The job outlives the lease: a message may sit in a busy queue past the sender's
    # deadline, and the worker then finds the output the sender built itself and skips it.
    ttl = settings.visibility_timeout_s * 2
    pipe = store.client.pipeline(transaction=False)
    ready: list[Job] = []
    for job in jobs:
        try:
            sealed = store.seal(keys.job(job.key), job.spec())
        except EntryTooLarge as e:
            out.too_large[job.key] = e
            continue
        pipe.set(keys.job(job.key), sealed, ex=ttl)
        ready.append(job)
    if ready:
        pipe.execute()
    for i, job in enumerate(ready):
        try:
            sender.send_task(job.kind.task, job.key, job.queue)
        except Exception as e:  # kombu raises its own OperationalError family
            # Not tried for the rest: each would wait out the same refusal.
            out.unsent, out.refused = [j.key for j in ready[i:]], e
            _broker_refused(settings, e)
            break
        out.sent.append(job.key)
        sender.keep_lease(job.key)  # while it waits in its queue, however long
    return out


def _broker_refused(settings: Settings, error: Exception) -> None:
    if broker.is_full(error):
        # A noeviction broker at maxmemory: reachable, but it refuses every write. Told
        # apart because the fix is the broker's memory, not the network.
        warn_once(
            "broker-full",
            "compileq: the broker Redis at %s is full and refuses new build messages "
            "(%s); compiling locally (raise its maxmemory or drain its queues)",
            redact(settings.broker),
            error,
        )
    else:
        warn_once("broker", "compileq: cannot reach the broker (%s); compiling locally", error)


def send(sender: Sender, jobs: Sequence[Job]) -> Sent:
    """Send the jobs whose lease this process takes; the others are in flight elsewhere.

    The leases of jobs not sent (over the cap, refused by the broker) are handed back at
    once: nobody builds those, and nobody must wait for them. On a ``RedisError`` this
    process's leases become orphans (handed back once Redis answers), and it propagates.
    """
    mine = take(sender, [j.key for j in jobs])
    leased = [j for j, took in zip(jobs, mine, strict=True) if took]
    try:
        out = enqueue(sender, leased)
    except redis.RedisError:
        for job in leased:  # else the next process waits out their expiry, a whole deadline
            sender.orphan_lease(job.key)
        raise
    except Exception:  # making a job failed (its source unreadable, a bug): nothing sent
        for job in leased:
            sender.release_lease(job.key)
        raise
    out.others = [j.key for j, took in zip(jobs, mine, strict=True) if not took]
    for key in [*out.too_large, *out.unsent]:
        sender.release_lease(key)
    return out


# -- waiting ----------------------------------------------------------------------------------


@dataclass
class Round:
    """What one look at the channel (and maybe the store) found of the awaited keys."""

    found: dict[str, Entry]
    #: Announced failed: the worker's announcement (its error and the reason it decided).
    failed: dict[str, events.Done]
    #: Announced done, but missing from the store (evicted, or rejected as corrupt).
    lost: list[str]
    #: Whether every awaited key was read (a poll), not only the ones announced.
    polled: bool


@dataclass
class Waited:
    """What a blocking wait ended with, for each key it waited for."""

    found: dict[str, Entry] = field(default_factory=dict)
    failed: dict[str, events.Done] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    #: Still missing at the deadline.
    late: list[str] = field(default_factory=list)


class Watcher:
    """The completion channel, subscribed to from construction on: build it before sending."""

    def __init__(self, store: RedisStore, connect_timeout_s: float) -> None:
        self._store = store
        self._pubsub: Any = store.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            self._pubsub.subscribe(keys.DONE_CHANNEL)
            self._pubsub.get_message(timeout=connect_timeout_s)  # the confirmation
        except BaseException:
            self._pubsub.close()
            raise
        self._last_poll = time.monotonic()

    def close(self) -> None:
        self._pubsub.close()

    def __enter__(self) -> Watcher:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def announcements(self, timeout: float) -> dict[str, events.Done]:
        """What is announced within ``timeout`` (for the first message), with whatever else
        has arrived by then. Every build in the cluster is announced on the one channel: the
        caller picks its own keys (``check``)."""
        done: dict[str, events.Done] = {}
        message = self._pubsub.get_message(timeout=timeout)
        while message is not None:
            if message.get("type") == "message" and (parsed := events.parse(message["data"])):
                done[parsed.key] = parsed
            message = self._pubsub.get_message(timeout=0)
        return done

    def check(
        self, done: dict[str, events.Done], waiting: Collection[str], force: bool = False
    ) -> Round:
        """The awaited keys (``waiting``) that ``done`` announced, read from the store if
        announced ok; and, every ``POLL_S`` or if ``force``d, every awaited key read."""
        now = time.monotonic()
        polled = force or now - self._last_poll >= POLL_S
        if polled:
            self._last_poll = now
        wanted = set(waiting)
        failed = {k: d for k, d in done.items() if k in wanted and not d.ok}
        announced = [k for k, d in done.items() if k in wanted and d.ok]
        read = [k for k in waiting if k not in failed] if polled else announced
        entries = self._store.get_many(read) if read else []
        found = {k: e for k, e in zip(read, entries, strict=True) if e is not None}
        return Round(found, failed, [k for k in announced if k not in found], polled)

    def _early(self, hoped: dict[str, Early]) -> None:
        """Read the early outputs still hoped for; hand each one found to its callback."""
        names = list(hoped)
        for name, entry in zip(names, self._store.get_many(names), strict=True):
            if entry is None:
                continue
            then = hoped.pop(name)
            try:
                then(entry.payload())
            except Exception as e:  # an early output only ever helps: the wait goes on
                warn_once("early", "compileq: an early output was not used (%s)", e)

    def wait(
        self,
        names: Iterable[str],
        until: float,
        early: Mapping[str, Early] | None = None,
        building_s: float = 0.0,
    ) -> Waited:
        """Block until every key of ``names`` is found, failed or lost, or ``until`` passes;
        then each key still missing is read once more before it is counted late. ``early``:
        keys of early outputs (``keys.early``), each handed to its callback once found.
        ``building_s``: how much longer than ``until`` to wait on for a key that a live worker
        is building when ``until`` passes (its verified mark, cache/building.py), for as long
        as that mark lives: a local compile would start over beside it."""
        waiting = set(names)
        hoped = dict(early or {})
        if hoped:  # some may be stored already (other jobs'): read before the first poll
            self._early(hoped)
        out = Waited()
        hard = until + building_s
        waited_on: set[str] = set()
        while waiting:
            now = time.monotonic()
            left = until - now
            if left <= 0 and now < hard and (marked := self._building(waiting)):
                self._waiting_on(marked - waited_on)
                waited_on |= marked
                self._settle_late(waiting - marked, out)  # the rest end now, as before
                waiting = set(marked)
                left = min(POLL_S, hard - now)
            done = self.announcements(min(POLL_S, left)) if left > 0 else {}
            seen = self.check(done, waiting, force=left <= 0)
            if hoped and (seen.polled or not hoped.keys().isdisjoint(done)):
                self._early(hoped)
            waiting -= _record(seen, out)
            if left <= 0:
                out.late = sorted({*out.late, *waiting})
                break
        return out

    def _building(self, waiting: set[str]) -> set[str]:
        return building.building(self._store.client, self._store.secret, waiting)

    def _settle_late(self, keys_: set[str], out: Waited) -> None:
        """The keys no live worker builds at the deadline: read once more, else late."""
        if not keys_:
            return
        ended = _record(self.check({}, keys_, force=True), out)
        out.late = sorted({*out.late, *(keys_ - ended)})

    def _waiting_on(self, new: set[str]) -> None:
        if not new:
            return
        self._store.count({Counter.WAITED_PAST_DEADLINE: len(new)})
        warn_once(
            "past-deadline",
            "compileq: a worker is still building %d job(s) past the deadline; waiting for it "
            "rather than compiling them here beside it (a worker that dies is given up on "
            "within %.0fs; its hard time limit ends any build)",
            len(new),
            building.TTL_MS / 1000,
        )


def _record(seen: Round, out: Waited) -> set[str]:
    """What one look found, added to ``out``; the keys it ended (found, failed or lost)."""
    out.found.update(seen.found)
    out.failed.update(seen.failed)
    out.lost.extend(seen.lost)
    return {*seen.found, *seen.failed, *seen.lost}


def send_and_wait(
    sender: Sender,
    jobs: Sequence[Job],
    until: float,
    meanwhile: Callable[[], Early | None] = lambda: None,
    others: Mapping[str, Early] | None = None,
) -> tuple[Sent, Waited]:
    """Send what this process leases of ``jobs``, and wait until ``until`` for every one in
    flight (sent here or by whoever holds its lease); not for those that could not be sent,
    which nobody builds. ``meanwhile`` runs once this process has sent some, before it waits;
    what it returns is handed the early output of each job sent here, if one comes.
    ``others``: early outputs of other jobs (by ``keys.early`` key) read meanwhile, each
    handed to its callback once if it comes before the wait ends.
    A ``RedisError`` propagates, with this process's leases orphaned."""
    with Watcher(sender.store, sender.settings.connect_timeout_s) as watcher:
        sent = send(sender, jobs)
        then = meanwhile() if sent.sent else None
        early = dict(others or {})
        if then is not None:
            early.update({keys.early(key): then for key in sent.sent})
        try:
            return sent, watcher.wait(
                sent.in_flight, until, early, sender.settings.task_time_limit_s
            )
        except redis.RedisError:
            for key in sent.sent:  # its message may be lost: nobody must wait out the lease
                sender.orphan_lease(key)
            raise


def refused(kind: Kind, done: events.Done) -> Fallback:
    """A worker's failure announcement as the fallback it means: the reason is the worker's
    (``workers/lifecycle.failure_reason``), decided from the exception itself."""
    detail = f"the worker could not {kind.work} ({done.error or 'no reason given'})"
    return Fallback(done.reason or Reason.WORKER_ERROR, detail)


def stored(sender: Sender, job: Job) -> Entry | None:
    """``job``'s output if the store has it, read in one call with its verdict; raises
    ``Fallback`` (``known-failure``) where there is no output but a worker's build of the very
    job failed before: sending it again would only fail again."""
    if job.verdict is None:
        return sender.store.get_many([job.key])[0]
    output, verdict_entry = sender.store.get_many([job.key, job.verdict])
    verdict = None if output is not None else verdicts.read(verdict_entry)
    if verdict is None:
        return output
    raise Fallback(
        Reason.KNOWN_FAILURE,
        f"a worker could not {job.kind.work} before: {verdict.describe()}; not sent again "
        "until that verdict expires (COMPILEQ_FX_FAILURE_TTL_S, or `compileq forget-failures`)",
    )


def not_sent(job: Job, sent: Sent) -> Fallback | None:
    """Why ``job`` was not sent, if it was not (over the cap, or the broker refused it)."""
    if job.key in sent.too_large:
        return Fallback(Reason.SIZE_CAP, str(sent.too_large[job.key]))
    if job.key in sent.unsent:
        return Fallback(Reason.BROKER, f"cannot reach the broker ({sent.refused})")
    return None


def output(job: Job, sent: Sent, waited: Waited, deadline_s: float) -> bytes:
    """``job``'s output from a round trip's end, or the ``Fallback`` saying why there is none."""
    entry = waited.found.get(job.key)
    if entry is not None:
        return entry.payload()
    unsent = not_sent(job, sent)
    if unsent is not None:
        raise unsent
    if job.key in waited.failed:
        raise refused(job.kind, waited.failed[job.key])
    if job.key in waited.lost:
        raise Fallback(Reason.LOST, "the worker's output is missing from the store")
    raise Fallback(
        Reason.DEADLINE, f"a worker did not {job.kind.work} within the {deadline_s:.0f}s deadline"
    )


def fetch(
    sender: Sender,
    job: Job,
    meanwhile: Callable[[], Early | None] = lambda: None,
    others: Mapping[str, Early] | None = None,
) -> bytes:
    """The output stored under ``job.key``: found, or the job sent (unless in flight already)
    and waited for. ``meanwhile`` and ``others``: as for ``send_and_wait`` (neither is
    called when the output is found at once). Raises ``Fallback``."""
    settings = sender.settings
    until = deadline(settings)
    try:
        entry = stored(sender, job)  # this very job was built before (by anyone)
        if entry is not None:
            payload = entry.payload()
        else:
            sent, waited = send_and_wait(sender, [job], until, meanwhile, others)
            payload = output(job, sent, waited, settings.deadline_s)
    except redis.RedisError as e:
        sender.redis_failed(e)
        raise Fallback(Reason.REDIS, f"Redis failed ({e})") from e
    except EntryTooLarge as e:  # an output over the cap, read back
        raise Fallback(Reason.SIZE_CAP, str(e)) from e
    sender.received(job.key)
    return payload


def found_or_sent(
    sender: Sender, job: Job, meanwhile: Callable[[], object] = lambda: None
) -> bytes | None:
    """``job``'s output if the store has it; else send the job (unless it is in flight
    already) and return None without waiting: ``fetch`` of the same job waits later.
    ``meanwhile`` runs once this process has sent it (nothing waits here for an early
    output). Raises ``Fallback``."""
    try:
        entry = stored(sender, job)
        if entry is not None:
            sender.received(job.key)
            return entry.payload()
        sent = send(sender, [job])
    except redis.RedisError as e:
        sender.redis_failed(e)
        raise Fallback(Reason.REDIS, f"Redis failed ({e})") from e
    except EntryTooLarge as e:
        raise Fallback(Reason.SIZE_CAP, str(e)) from e
    unsent = not_sent(job, sent)
    if unsent is not None:
        raise unsent
    if sent.sent:
        meanwhile()
    return None


def send_ahead(sender: Sender, job: Job) -> bool:
    """Send the job unless its output is stored or in flight already, and do not wait for it:
    a later ``fetch`` finds the output, or this process's own lease and waits for the worker.
    Whether this process sent it; any failure only means it did not."""
    try:
        if stored(sender, job) is not None:
            return False
        sent = send(sender, [job])
    except (redis.RedisError, EntryTooLarge, Fallback):  # a known failure is not sent either
        return False
    if not sent.sent:
        return False
    # A Redis failure may lose its message, not its lease (replicated): the client hands the
    # lease back then, else everyone who needs this output waits a whole deadline for it.
    sender.sent_ahead(job.key)
    return True
