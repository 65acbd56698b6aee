"""The client's progress: one live line on a terminal while it compiles, one summary at exit.

What is counted is what this process settled, by kind: Triton kernels (from the pool), FX
graphs (the FX-graph cache), C++ objects (the C++ cache, Inductor's ISA probes included) and
autotune timings, each as a hit, built remotely (by a worker) or built locally. Counting is a
few integer additions under a lock where a build is settled; all drawing happens on a daemon
thread (every ``_REFRESH_S`` at most, and only when the numbers moved), so the hit path pays no
syscall. Rejected alternative: rendering inline, rate-limited by a clock check per kernel, which
writes to stderr from whichever thread settles a kernel and can interleave with logs.

When it is shown (``COMPILEQ_PROGRESS``): ``auto`` (default) on a terminal only, ``always``
also when stderr is a file or a pipe (the summary only: no live redraws there), ``never`` not at
all. The live line is taken away at the end of each of Dynamo's compiles, on the compiling
thread, before the program runs on, so the program's own output never lands on it (a clear
after a quiet half second, the rejected alternative, let ``print`` in that half second run on
the line); compileq's own log records take it away first too. The summary is one line ending
with a newline, printed at exit; where it is not printed it goes to the log (INFO), once.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from compileq._log import log

_REFRESH_S = 0.5

#: ``COMPILEQ_PROGRESS``'s values (``Settings.progress``).
Mode = Literal["auto", "always", "never"]
Outcome = Literal["hit", "remote", "local"]


@dataclass
class Counts:
    """One kind's settled builds."""

    hits: int = 0
    remote: int = 0
    local: int = 0

    @property
    def done(self) -> int:
        return self.hits + self.remote + self.local

    def add(self, outcome: str, n: int = 1) -> None:
        if outcome == "hit":
            self.hits += n
        elif outcome == "remote":
            self.remote += n
        else:
            self.local += n

    def describe(self) -> str:
        return f"{self.hits} hits, {self.remote} remote, {self.local} local"


#: The kinds after kernels, in the order the line names them: (field, name in the line).
_KINDS = (("graphs", "graphs"), ("cpp", "C++ objects"), ("tune", "autotune timings"))


@dataclass
class Tally:
    kernels: Counts = field(default_factory=Counts)
    graphs: Counts = field(default_factory=Counts)
    cpp: Counts = field(default_factory=Counts)
    tune: Counts = field(default_factory=Counts)
    #: Kernels handed to the pool: the live line's "done/submitted".
    submitted: int = 0

    def copy(self) -> Tally:
        def of(counts: Counts) -> Counts:
            return Counts(counts.hits, counts.remote, counts.local)

        return Tally(of(self.kernels), of(self.graphs), of(self.cpp), of(self.tune), self.submitted)

    def in_flight(self) -> int:
        return max(0, self.submitted - self.kernels.done)

    def line(self, live: bool = False) -> str:
        k = self.kernels
        parts = []
        if k.done or self.submitted or not any(getattr(self, f).done for f, _ in _KINDS):
            done = f"{k.done}/{self.submitted}" if live and self.submitted else str(k.done)
            parts.append(f"{done} kernels ({k.describe()})")
        for name, shown in _KINDS:
            counts: Counts = getattr(self, name)
            if counts.done:
                parts.append(f"{counts.done} {shown} ({counts.describe()})")
        return ", ".join(parts)


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
        self._out = threading.Lock()  # a draw, a clear and the summary never interleave
        #: None until a client of this process configures it: a worker's own builds (its ISA
        #: probes, its codegen) are counted, never shown nor logged.
        self._mode: Mode | None = None
        #: Set when a compile ended and the line was taken away; the next count unsets it. A
        #: draw already under way then draws nothing, so the line never comes back after it.
        self._idle = False

    def configure(self, mode: Mode) -> None:
        """``COMPILEQ_PROGRESS`` of the process's client (``KernelClient``)."""
        self._mode = mode

    # -- counting (hot) ---------------------------------------------------------------------

    def start(self, kernels: int = 0) -> None:
        """Work begins: ``kernels`` submitted (or a graph looked up). The summary's time runs
        from the first start, not from the first result."""
        with self._lock:
            self._tally.submitted += kernels
            first = self._mark_started()
        self._changed_after(first)
        self._watch_compiles()

    def kernel(self, outcome: str) -> None:
        """``outcome`` is ``hit``, ``remote`` or ``local`` (``client.Outcome`` values)."""
        self._settled("kernels", outcome)

    def graph(self, hit: bool, remote: bool = False) -> None:
        """An FX graph found in the store (``hit``), or generated by a worker (``remote``) or
        in this process, and then stored."""
        self._settled("graphs", "hit" if hit else "remote" if remote else "local")

    def cpp(self, outcome: Outcome) -> None:
        """A C++ object written from the store, built by a worker, or compiled here."""
        self._settled("cpp", outcome)

    def tuned(self, hits: int = 0, remote: int = 0, local: int = 0) -> None:
        """Autotuning timings: found in the store, timed by workers, timed here."""
        if not (hits or remote or local):
            return
        with self._lock:
            counts = self._tally.tune
            counts.hits, counts.remote, counts.local = (
                counts.hits + hits,
                counts.remote + remote,
                counts.local + local,
            )
            first = self._mark_started()
        self._changed_after(first)

    def _settled(self, kind: str, outcome: str) -> None:
        with self._lock:
            getattr(self._tally, kind).add(outcome)
            first = self._mark_started()
        self._changed_after(first)

    def _mark_started(self) -> bool:
        """Under the lock: note the first event's time; True if this was it."""
        first = self._started is None
        if first:
            self._started = time.monotonic()
        return first

    def _changed_after(self, first: bool) -> None:
        self._idle = False
        if first:
            self._begin()
        if self._thread is not None:  # only a terminal has a reader; skip the wake-up otherwise
            self._changed.set()

    def snapshot(self) -> Tally:
        with self._lock:
            return self._tally.copy()

    # -- where it is shown ------------------------------------------------------------------

    def _stream_now(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _terminal(self) -> TextIO | None:
        """The stream, if it is a terminal and the live line may be drawn on it."""
        if self._mode in (None, "never"):
            return None
        stream = self._stream_now()
        try:
            return stream if stream.isatty() else None
        except (AttributeError, ValueError):  # closed or replaced by something without a tty
            return None

    def _prints_summary(self) -> bool:
        return self._mode == "always" or self._terminal() is not None

    def _begin(self) -> None:
        atexit.register(self.finish)
        if self._terminal() is not None:
            # compileq's own warnings (a deadline, a fallback) go to the same terminal, from
            # any thread: each takes the line away first, so it starts a line of its own.
            log.addFilter(self._before_log)
            self._thread = threading.Thread(
                target=self._render, name="compileq-progress", daemon=True
            )
            self._thread.start()

    def _before_log(self, record: logging.LogRecord) -> bool:
        self._clear()
        return True  # a filter that lets every record through

    def _watch_compiles(self) -> None:
        """Take the live line away at the end of each of Dynamo's compiles (outermost), on
        the thread that compiled, before the program's next output. Dynamo's reset drops its
        callbacks, so this is checked again at each start; without Dynamo (``compileq warm``)
        the line is cleared once nothing is in flight."""
        if self._thread is None or "torch._dynamo" not in sys.modules:
            return
        try:
            from torch._dynamo.callback import callback_handler
        except Exception:  # no Dynamo (or another torch): the quiet-time clear still applies
            return
        if self._compile_ended not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(self._compile_ended)

    def _compile_ended(self, _: Any = None) -> None:
        try:
            with self._out:
                self._idle = True
                self._changed.clear()
                self._clear_locked()
        except Exception:  # never fail a compile over a progress line
            log.debug("compileq: progress line not cleared", exc_info=True)

    # -- output -----------------------------------------------------------------------------

    def _render(self) -> None:
        while True:
            self._changed.wait()
            self._changed.clear()
            self._draw()
            time.sleep(_REFRESH_S)
            if not self._changed.is_set() and not self.snapshot().in_flight():
                # Nothing in flight: take the line away, or the program's own output would
                # be written after it on the same terminal line.
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
            if self._finished or self._idle:
                return
            try:
                out.write(line)
                out.flush()
                self._shown = True
            except (OSError, ValueError):
                pass

    def finish(self) -> None:
        """Take the live line away and show the summary, once (registered with atexit on first
        use; ``compileq warm`` calls it before printing its report): printed on stderr as one
        line ending with a newline where progress is shown, else logged."""
        if os.getpid() != self._pid:  # a forked child inherited the handler, not the work
            return
        with self._out:  # no draw can come between the clear and the summary
            started, done = self._started, self._finished
            self._finished = True
            self._clear_locked()
            if started is None or done or self._mode is None:
                return
            summary = f"compileq: {self.snapshot().line()} in {time.monotonic() - started:.1f}s"
            if self._prints_summary():
                try:
                    stream = self._stream_now()
                    stream.write(summary + "\n")
                    stream.flush()
                    return
                except (OSError, ValueError, AttributeError):
                    pass  # stderr closed at exit: the log may still take it
        log.info("%s", summary)  # off a terminal: the log's, at its level


#: The process's progress (every client of a process adds to it).
progress = Progress()
