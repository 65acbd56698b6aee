"""How a worker's graph codegen splits the kernels it misses between its sibling pool
processes and its own compile pool: pulled by whichever of the two has room first.

A graph's codegen on a worker (``workers/fx.py``) needs every kernel of the graph built before
it can finish. Sent to the worker's own queue, a kernel is built by a sibling pool process that
is not generating a graph, one kernel at a time; built here, by the codegen's own compile pool
(Inductor's, one build per compile thread). Sending every miss while any sibling is free, the
rule until the thirty-second session, measured badly where siblings are few and graphs many: on
one H200 with a worker of four pool processes, swin_base's two graphs and the backward sent
ahead generated at once and sent all 727 kernels to the one free sibling, which built them one
by one while the three codegens and their CPUs waited (the worker 1.55 of 4 CPUs busy); 114
kernels waited past the 60 s deadline and were built twice; its cold first step was 1.53x of
stock's (docs/BENCHMARKS.md).

So misses wait here, unsent, and each goes to the first of: a sibling, while fewer than this
codegen's share of the free siblings (``share()``, from ``workers/fx_slots.FxSlots``) are
building or queued for it; or a compile thread of its own, while fewer than ``local_slots``
local builds run. Both kinds of room are refilled as builds end, so a small graph on a large
worker still goes wholly to its idle siblings, and a large graph uses its own threads beside
them instead of queuing behind them. Rejected: deciding each miss once, as it arrives (the
codegen submits a graph's kernels within milliseconds, so all but the first share would go to
its own pool, and the siblings would idle after their first few); and a share read once per
graph (siblings free and fill as other graphs start and end).

What an end frees is handed out by a thread of the share's own, not by the thread that
reported the end: that is the client's listener (a send's Redis round trips would delay every
other announcement it reads) or the reader thread of Inductor's compile pool (a local build's
done callback, held by a submit's pickling and pipe write while other results wait). The share's
first version, handing out on those threads, hung three codegens of five to the worker's 300 s
soft limit on one H200; the cause found was elsewhere, in the client: a held miss kept its
submit's deadline and was given up on at its first look (``KernelClient._claim_pending``; on
the 2-core CI machine 2 of 92 kernels came back from the sibling, the rest were built twice).
The two were fixed together; the thread is a precaution not measured apart.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from compileq._log import log

F = TypeVar("F", bound=Hashable)


class Share(Generic[F]):
    """The misses of one codegen process, handed to ``send`` or ``build`` as room frees.

    ``share()``: how many of this process's kernels may be with siblings at once (0: none free).
    ``done(item)`` must be called once each item handed out has ended, however it ended. ``add``
    hands out on the caller's thread; what ``done`` frees is handed out on the share's own
    thread (started at the first ``done`` of each process). Callbacks run outside the lock.
    """

    def __init__(
        self,
        share: Callable[[], int],
        local_slots: int,
        send: Callable[[list[F]], None],
        build: Callable[[list[F]], None],
    ) -> None:
        if local_slots < 1:
            raise ValueError(f"local_slots must be at least 1, not {local_slots}")
        self._share = share
        self._local_slots = local_slots
        self._send = send
        self._build = build
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._asked = 0  # ends reported
        self._pumped = 0  # ends whose room the handout thread has handed on
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._pending: collections.deque[F] = collections.deque()
        self._sent: set[F] = set()
        self._local: set[F] = set()

    @property
    def counts(self) -> tuple[int, int, int]:
        """(waiting here, with siblings, building here)."""
        with self._lock:
            return len(self._pending), len(self._sent), len(self._local)

    def add(self, items: list[F]) -> None:
        """Misses to build; handed out at once as far as there is room."""
        with self._lock:
            self._pending.extend(items)
        self._pump()

    def done(self, item: F) -> None:
        """``item`` ended (built, fetched or failed): its room goes to the next waiting, on
        the share's own thread."""
        with self._lock:
            if item in self._sent:
                self._sent.discard(item)
            elif item in self._local:
                self._local.discard(item)
            else:
                return
            self._asked += 1
            self._wake.notify()
            if self._thread is None or self._pid != os.getpid():  # none yet, or a fork's copy
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._hand_out, name="compileq-share", daemon=True
                )
                self._thread.start()

    def settled(self, timeout: float) -> bool:
        """Wait until every end reported so far has had its room handed on."""
        with self._wake:
            return self._wake.wait_for(lambda: self._pumped == self._asked, timeout)

    def _hand_out(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._pumped < self._asked)
                asked = self._asked
            try:
                self._pump()
            except Exception:  # the callbacks guard themselves; never let the thread die
                log.exception("compileq: handing out kernel builds")
            with self._wake:
                self._pumped = asked
                self._wake.notify_all()

    def _pump(self) -> None:
        share = self._share()  # outside the lock: it takes the worker's shared-memory lock
        with self._lock:
            room = share - len(self._sent)
            to_send: list[F] = []
            while self._pending and room > 0:
                to_send.append(self._pending.popleft())
                room -= 1
            self._sent.update(to_send)
            to_build: list[F] = []
            while self._pending and len(self._local) < self._local_slots:
                item = self._pending.popleft()
                self._local.add(item)
                to_build.append(item)
        if to_send:
            self._send(to_send)
        if to_build:
            self._build(to_build)
