"""Shutdown signals handled one at a time in a worker's main process.

Slurm signals every process of a job step, and the supervisor forwards the SIGTERM it gets
itself: a worker's main process receives two SIGTERMs within a millisecond. Python runs a
signal's handler on the main thread between any two bytecodes, including inside the handler of
the signal before. Celery's shutdown handler sends ``worker_shutting_down``, whose dispatch
builds its receiver list holding a ``threading.Lock``; a second SIGTERM landing in that window
runs the handler again, which waits on the lock its own thread holds. The worker then never
withdraws its heartbeat, never exits, and is killed at Slurm's KillWait (seen once in CI's
Slurm test: "Warm shutdown" printed twice, nothing after; tests/test_shutdown.py reproduces
it with the window widened).

So a shutdown signal arriving while another one's handler runs is queued, and handled after
that handler returns, in arrival order. Rejected alternatives: dropping the nested signal (a
SIGQUIT asking for a cold shutdown inside a warm one's handler would be lost), and delaying the
supervisor's forward (Slurm's own signals to each process are simultaneous, and a user's
second Ctrl-C is not ours to time).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

Handler = Callable[[int, FrameType | None], Any]

#: Celery's warm (TERM, first INT) and cold (QUIT, second INT) shutdown signals.
SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT)

#: Set on the handlers a Serialiser made (``__wrapped__`` alone could be any decorator's).
_MARK = "_compileq_serialised"


def is_serialised(handler: object) -> bool:
    return getattr(handler, _MARK, False) is True


class Serialiser:
    """Runs the wrapped handlers one at a time: a nested call waits in a queue."""

    def __init__(self) -> None:
        self._running = False
        self._pending: list[tuple[Handler, int]] = []

    def wrap(self, handler: Handler) -> Handler:
        def serialised(signum: int, frame: FrameType | None) -> None:
            if self._running:  # a plain flag: no lock can be taken safely in here
                self._pending.append((handler, signum))
                return
            self._running = True
            try:
                self._call(handler, signum, frame)
                while self._pending:
                    queued, queued_signum = self._pending.pop(0)
                    self._call(queued, queued_signum, None)
            finally:
                # Dropped even when a handler raises, or every later signal would queue forever.
                self._running = False
            # One queued after the last pop and before the flag dropped: run it (and any after).
            if self._pending:
                queued, queued_signum = self._pending.pop(0)
                self.wrap(queued)(queued_signum, None)

        serialised.__wrapped__ = handler  # type: ignore[attr-defined]
        setattr(serialised, _MARK, True)
        return serialised

    def _call(self, handler: Handler, signum: int, frame: FrameType | None) -> None:
        handler(signum, frame)
        # Celery's first SIGINT installs the cold-shutdown handler for the next one: keep that
        # one serialised too.
        now = signal.getsignal(signum)
        if callable(now) and not is_serialised(now):
            signal.signal(signum, self.wrap(now))


def serialise(*signums: int) -> bool:
    """Wrap the handlers now installed for ``signums`` (by default Celery's shutdown ones) in
    one :class:`Serialiser`, once Celery has installed them. Only the main thread may install
    handlers: elsewhere this changes nothing and returns False."""
    if threading.current_thread() is not threading.main_thread():
        return False
    serialiser = Serialiser()
    for signum in signums or SHUTDOWN_SIGNALS:
        handler = signal.getsignal(signum)
        if callable(handler) and not is_serialised(handler):
            signal.signal(signum, serialiser.wrap(handler))
    return True
