"""How many of a worker's pool processes are generating graphs right now, and how many are
building an object one of those graphs sent and waits on.

Graph codegen needs its Triton kernels built. Sent to the worker's own queue they are built by
sibling pool processes that are already running, in parallel, and cached for everyone; built in
place they need a compile pool of their own in the generating process (Inductor's, started
cold in every pool process that generates a graph). But a graph waiting for
kernels that only busy siblings could build would wait for ever, so codegen enqueues its
kernels only while some pool process is not generating a graph (Celery hands a message only
to an idle process: its default "fair" scheduling, which the worker sets explicitly), and no
more of them at once than its share of the free siblings can build (``kernel_share``): the rest
its own compile threads take as they free (``scheduler/share.py``, where swin_base's 727
kernels sent to one free sibling were measured).

A C++ object is different: built in place it needs no pool, only a thread of Inductor's that
runs the compiler, and a graph's codegen runs as many of those at once as it has compile
threads. Sent, it waits for a free sibling, which builds one object at a time. So a graph's
codegen sends a C++ object only while it can reserve a sibling for it (``sending``): free
siblings less those already building a sent object. Measured on the 2-core CI machine
(docs/BENCHMARKS.md, twenty-ninth session): ghostnet_100's backward, sent ahead beside its
forward, sent 77 objects one at a time to the one sibling its forward freed, while its own
two compile threads waited: its cold first step was 1.17x of stock's (the mean of two), and
0.86x and 0.79x once the codegen built beside the one object sent. Rejected: never sending
from a worker's codegen (on a worker of many processes the free ones then idle while one
process builds a big graph's objects on its few threads).
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator


class FxSlots:
    """Counters shared by a worker's pool processes; made before Celery forks them.

    Shared memory rather than a Redis key per worker: it must be exact and immediate, and
    nothing outside the host needs it. A pool process killed mid-graph (the hard time limit)
    leaves its count behind; that only errs towards building in place, never towards a wait.
    """

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.concurrency = concurrency
        # [graphs generating, sent objects being built]: one lock over both, so a reservation
        # sees the two together.
        self._counts = multiprocessing.get_context("fork").Array("i", 2)

    @property
    def generating_now(self) -> int:
        return int(self._counts[_GENERATING])

    @property
    def sending_now(self) -> int:
        return int(self._counts[_SENT])

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Held by a pool process for as long as it generates one graph."""
        with self._counts.get_lock():
            self._counts[_GENERATING] += 1
        try:
            yield
        finally:
            with self._counts.get_lock():
                self._counts[_GENERATING] -= 1

    @contextlib.contextmanager
    def sending(self) -> Iterator[bool]:
        """A free sibling reserved for one object this codegen sends and waits on, for as long
        as the block runs: yields whether one was free (False: build it here)."""
        with self._counts.get_lock():
            free = self.concurrency - self._counts[_GENERATING] - self._counts[_SENT]
            if free > 0:
                self._counts[_SENT] += 1
        if free <= 0:
            yield False
            return
        try:
            yield True
        finally:
            with self._counts.get_lock():
                self._counts[_SENT] -= 1

    def kernel_share(self) -> int:
        """How many of one generating graph's kernels may be with siblings at once: its even
        part of the siblings free (neither generating nor building a sent object), times
        ``KERNELS_PER_SIBLING``; 0 where none is free. The rest it builds on its own compile
        threads (``scheduler/share.py``)."""
        with self._counts.get_lock():
            generating = self._counts[_GENERATING]
            free = self.concurrency - generating - self._counts[_SENT]
        if free <= 0:
            return 0
        return int(-(-free // max(1, generating)) * KERNELS_PER_SIBLING)

    def sibling_free(self) -> bool:
        """Whether some pool process is not generating a graph, and so will take the kernels
        sent to this worker's queue while the graphs wait for them."""
        return self.generating_now < self.concurrency


_GENERATING, _SENT = 0, 1
#: One building, one queued behind it: a sibling never waits for the round trip of the next.
KERNELS_PER_SIBLING = 2
