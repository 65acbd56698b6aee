"""A worker's heartbeat thread: keeps its queues' liveness entries fresh.

A worker sharing a node whose cores other jobs saturate (and started at a low priority) must
not look dead: its beats come from one dedicated thread on a fixed schedule (each beat due
``interval`` after the previous one was due, not after it ended, so a slow beat does not push
the next one back, and a thread that fell behind beats at once), doing the least it can
between reading Redis's clock and writing the record (its info is made first). A beat later
than half the TTL is said once, with the figure, so that an operator sees starvation before
clients stop routing. Rejected alternative: a heartbeat process of its own, which would beat
for a worker whose Celery process hangs.

While its CPU FX queues wait on the vector-ISA probes, it also beats into their joining sets
(the record's ``pending_fx``), and the beat that adds the queues (``extend``) leaves those
sets: clients wait for the join instead of falling back (scheduler/fx_join.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from compileq._log import log, warn_once
from compileq.cache import liveness
from compileq.tasks.probe import make_probe


class Heartbeat:
    def __init__(
        self,
        client: redis.Redis,
        worker_id: str,
        queues: list[str],
        info: dict[str, Any],
        interval_s: float,
        ttl_s: float,
        secret: bytes | None = None,
    ) -> None:
        self._client, self.worker_id, self._queues, self._info = client, worker_id, queues, info
        self._secret = secret
        self._interval, self._ttl = interval_s, ttl_s
        self._stop = threading.Event()
        # A beat in flight must not re-add the worker after stop() withdrew it: whoever holds
        # the lock when stop() is asked withdraws (see stop()).
        self._lock = threading.Lock()
        self._left = False
        self._stopping = False
        #: Joining sets the next beat leaves (once it reached Redis, none).
        self._leaving: list[str] = []
        self._thread = threading.Thread(target=self._run, name="compileq-heartbeat", daemon=True)
        #: When the last beat reached Redis (monotonic); how late the latest one was.
        self._last_ok = time.monotonic()
        self.worst_gap_s = 0.0

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        with self._lock:
            if not self._stop.is_set():
                self._beat()
            if self._stop.is_set():  # stop() was asked while this beat was in flight
                self._leave()

    def _beat(self) -> None:
        info = self._fresh_info()
        try:
            liveness.beat(
                self._client,
                self.worker_id,
                [*self._queues, *self._pending()],
                self._ttl,
                info,
                self._secret,
                leaving=self._leaving,
            )
        except redis.RedisError as e:
            warn_once("heartbeat", "compileq worker: heartbeat to Redis failed (%s); retrying", e)
            return
        self._leaving = []
        now = time.monotonic()
        gap, self._last_ok = now - self._last_ok, now
        self.worst_gap_s = max(self.worst_gap_s, gap)
        if gap > self._ttl / 2:
            warn_once(
                "heartbeat-late",
                "compileq worker: a heartbeat came %.1fs after the one before (every %.1fs, "
                "dead after %.1fs): this worker is short of CPU; raise COMPILEQ_HEARTBEAT_TTL_S "
                "on clients, or its priority",
                gap,
                self._interval,
                self._ttl,
            )

    def extend(self, queues: list[str], info: dict[str, Any]) -> None:
        """Serve more queues from now on (workers.late_fx), and say so in the very next beat."""
        with self._lock:
            before = self._pending()
            self._queues = [*self._queues, *(q for q in queues if q not in self._queues)]
            self._info = {**self._info, **info, "queues": self._queues}
            self._leaving = [*self._leaving, *(q for q in before if q not in self._pending())]
        self.beat()

    def _pending(self) -> list[str]:
        """The joining sets of the FX queues this worker has yet to add (its record says)."""
        pending = self._info.get("pending_fx")
        return [q for q in pending if isinstance(q, str)] if isinstance(pending, list) else []

    def _fresh_info(self) -> dict[str, Any]:
        """The static info plus what doctor checks per beat: the wall clock (clock skew against
        Redis's TIME, which scores the beat) and a signed probe (secret agreement)."""
        info = {**self._info, "id": self.worker_id, "wall": time.time()}
        if self._secret is not None:
            info["probe"] = make_probe(self._secret, self.worker_id)
        return info

    def _run(self) -> None:
        due = time.monotonic() + self._interval
        while not self._stop.wait(max(0.0, due - time.monotonic())):
            self.beat()
            # The next beat is due an interval after this one was, not after it ended; one
            # that fell a whole interval behind (starved) beats at once, then on schedule.
            due = max(due + self._interval, time.monotonic())

    def stop(self) -> None:
        """Withdraw from every queue, once (shutdown calls it as it starts and as it ends).

        Called from signal handlers, which run on the main thread between any two bytecodes:
        a second SIGTERM (Slurm signals every process of a step, and the supervisor forwards
        its own) can arrive inside the first one's withdrawal, and the main thread can be
        inside a beat (``extend``). Waiting on any lock there deadlocked a worker for good;
        so a repeated stop() returns at once, stop() takes the lock only when it is free, and
        a beat holding it withdraws as it ends.
        """
        # A plain flag first: Event.set() takes the event's own lock, which a second signal
        # arriving inside the first one's set() would wait on forever, like ours.
        if self._stopping:
            return
        self._stopping = True
        self._stop.set()
        if not self._lock.acquire(blocking=False):
            return  # the holder withdraws when it releases (beat) or already is (stop)
        try:
            self._leave()
        finally:
            self._lock.release()

    def _leave(self) -> None:
        if self._left:
            return
        self._left = True
        try:
            liveness.leave(
                self._client, self.worker_id, [*self._queues, *self._pending(), *self._leaving]
            )
            log.info("compileq worker: heartbeat withdrawn; finishing running builds")
        except redis.RedisError as e:
            log.warning("compileq worker: could not remove heartbeat: %s", e)
