"""How many of a worker's pool processes are generating graphs right now.

Graph codegen needs its Triton kernels built. Sent to the worker's own queue they are built by
sibling pool processes that are already running, in parallel, and cached for everyone; built in
place they need a compile pool of their own in the generating process (Inductor's, started
cold in every pool process that generates a graph). But a graph waiting for
kernels that only busy siblings could build would wait for ever, so codegen enqueues its
kernels only while some pool process is not generating a graph (Celery hands a message only
to an idle process: its default "fair" scheduling, which the worker sets explicitly).
"""

from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Iterator


class FxSlots:
    """A counter shared by a worker's pool processes; made before Celery forks them.

    Shared memory rather than a Redis key per worker: it must be exact and immediate, and
    nothing outside the host needs it. A pool process killed mid-graph (the hard time limit)
    leaves its count behind; that only errs towards building in place, never towards a wait.
    """

    def __init__(self, concurrency: int) -> None:
        if concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, not {concurrency}")
        self.concurrency = concurrency
        self._running = multiprocessing.get_context("fork").Value("i", 0)

    @property
    def generating_now(self) -> int:
        return int(self._running.value)

    @contextlib.contextmanager
    def generating(self) -> Iterator[None]:
        """Held by a pool process for as long as it generates one graph."""
        with self._running.get_lock():
            self._running.value += 1
        try:
            yield
        finally:
            with self._running.get_lock():
                self._running.value -= 1

    def sibling_free(self) -> bool:
        """Whether some pool process is not generating a graph, and so will take the kernels
        sent to this worker's queue while the graphs wait for them."""
        return self.generating_now < self.concurrency
