"""The client's progress: one live line on a terminal, one summary line in the log at exit.

Counting is a few integer additions under a lock, done where a kernel or graph is settled; all
output happens on a separate daemon thread (every ``_REFRESH_S`` at most, and only when the
numbers moved), so the hit path pays no syscall. Rejected alternative: rendering inline,
rate-limited by a clock check per kernel, which still writes to stderr from whichever thread
settles a kernel (Inductor's, the listener, a pool callback) and can interleave with logs.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from compileq._log import log

_REFRESH_S = 0.5


@dataclass
class Tally:
    kernels: int = 0
    hits: int = 0
    remote: int = 0
    local: int = 0
    graphs: int = 0
    graph_hits: int = 0
    submitted: int = 0

    def line(self, live: bool = False) -> str:
        done = f"{self.kernels}/{self.submitted}" if live and self.submitted else str(self.kernels)
        text = f"{done} kernels ({self.hits} hits, {self.remote} remote, {self.local} local)"
        if self.graphs:
            text += f", {self.graphs} graphs ({self.graph_hits} hits)"
        return text


class Progress:
    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lock = threading.Lock()
        self._tally = Tally()
        self._started: float | None = None
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None
        self._shown = False
        self._finished = False
        self._pid = os.getpid()
        self._out = threading.Lock()  # a draw and the final clear never interleave

    # -- counting (hot) ---------------------------------------------------------------------

    def start(self, kernels: int = 0) -> None:
        """Work begins: ``kernels`` submitted (or a graph looked up). The summary's time runs
        from the first start, not from the first result."""
        with self._lock:
            self._tally.submitted += kernels
            first = self._mark_started()
        self._changed_after(first)

    def kernel(self, outcome: str) -> None:
        """``outcome`` is ``hit``, ``remote`` or ``local`` (``client.Outcome`` values)."""
        with self._lock:
            t = self._tally
            t.kernels += 1
            if outcome == "hit":
                t.hits += 1
            elif outcome == "remote":
                t.remote += 1
            else:
                t.local += 1
            first = self._mark_started()
        self._changed_after(first)

    def graph(self, hit: bool) -> None:
        with self._lock:
            self._tally.graphs += 1
            self._tally.graph_hits += hit
            first = self._mark_started()
        self._changed_after(first)

    def _mark_started(self) -> bool:
        """Under the lock: note the first event's time; True if this was it."""
        first = self._started is None
        if first:
            self._started = time.monotonic()
        return first

    def _changed_after(self, first: bool) -> None:
        if first:
            self._begin()
        if self._thread is not None:  # only a terminal has a reader; skip the wake-up otherwise
            self._changed.set()

    def snapshot(self) -> Tally:
        with self._lock:
            return Tally(**self._tally.__dict__)

    # -- output -----------------------------------------------------------------------------

    def _terminal(self) -> TextIO | None:
        stream = self._stream if self._stream is not None else sys.stderr
        try:
            return stream if stream.isatty() else None
        except (AttributeError, ValueError):  # closed or replaced by something without a tty
            return None

    def _begin(self) -> None:
        atexit.register(self.finish)
        if self._terminal() is not None:
            self._thread = threading.Thread(
                target=self._render, name="compileq-progress", daemon=True
            )
            self._thread.start()

    def _render(self) -> None:
        while True:
            self._changed.wait()
            self._changed.clear()
            self._draw()
            time.sleep(_REFRESH_S)
            if not self._changed.is_set():
                t = self.snapshot()
                if t.kernels >= t.submitted:
                    # Nothing in flight: take the line away, or the program's own output
                    # would be written after it on the same terminal line.
                    self._clear()

    def _clear(self) -> None:
        with self._out:
            self._clear_locked()

    def _clear_locked(self) -> None:
        out = self._terminal()
        if self._shown and out is not None:
            try:
                out.write("\r\x1b[K")
                out.flush()
            except (OSError, ValueError):
                pass
            self._shown = False

    def _draw(self) -> None:
        out = self._terminal()
        if out is None or os.getpid() != self._pid:
            return
        line = f"\r\x1b[Kcompileq: {self.snapshot().line(live=True)}"
        with self._out:
            if self._finished:
                return
            try:
                out.write(line)
                out.flush()
                self._shown = True
            except (OSError, ValueError):
                pass

    def finish(self) -> None:
        """Clear the live line and log the summary, once (registered with atexit on first use;
        ``compileq warm`` calls it before printing its report)."""
        if os.getpid() != self._pid:  # a forked child inherited the handler, not the work
            return
        with self._out:  # no draw can come between the clear and the summary
            started, done = self._started, self._finished
            self._finished = True
            self._clear_locked()
        if started is None or done:
            return
        log.info("compileq: %s in %.1fs", self.snapshot().line(), time.monotonic() - started)


#: The process's progress (every client of a process adds to it).
progress = Progress()
