"""Python's full garbage collections kept off the objects that exist before a compile.

A compile allocates millions of short-lived objects, so CPython's cyclic collector runs
often during it, and now and then a full (generation 2) collection walks *every* tracked
object of the process: torch, Inductor, Triton, compileq's own Celery and Redis clients, the
user's model. Measured on the 2-core CPU machine (examples/llama_script.py, one process, new
machine): such a collection took 0.15-0.2 s over ~435,000 objects, and under compileq one fell
inside Dynamo's tracing of the first step (``bytecode_tracing`` 0.61-0.68 s against stock's
0.48-0.52 s; stock's own full collections fell before the step, by chance of its
allocation counts). With this window the step's tracing took 0.44-0.47 s and the first step
1.35-1.43 s against 1.53-1.60 s.

So from the start to the end of each outermost compile (Dynamo's compile callbacks: a frame,
a lazy backward, a CUDA-graph recording) the objects that existed before it are frozen
(``gc.freeze()``: moved to the permanent generation, never walked) and thawed at its end
(``gc.unfreeze()``: back into the oldest generation). Both are O(1) list splices. Garbage
made *during* the compile is collected as usual; objects that existed before and became
cyclic garbage during it are collected at the first full collection after it. Nothing is
left frozen once the compile ends.

Rejected alternatives: ``gc.disable()`` during the compile (a long cold compile then grows
its garbage without bound); one ``gc.freeze()`` at install and never thawed (what the
worker does before it forks, but in a training process a model deleted later would never
be collected if it holds a cycle: GPU memory leaked); raising the thresholds (fewer full
collections, each still walking everything).

A process that froze objects itself after compileq was installed (a program that freezes
before forking its data loaders) is left alone: thawing at the end would undo its freeze.
What was frozen before (CPython 3.12 starts with 375 objects of its own in the permanent
generation; 3.11 and 3.13 with none) is thawed with the first window, since ``gc.unfreeze()``
has no partial form: those objects are then collected as any other.
"""

from __future__ import annotations

import gc
import threading
from typing import Any

from compileq._log import log
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target

_CALLBACK = "torch._dynamo.callback"


class GcWindow(Feature):
    """Freeze the objects that exist at each outermost compile's start, thaw them at its end.

    No attribute of torch is replaced: the window is two callbacks on Dynamo's handler."""

    name = "gc-window"
    # register_start_callback is looked for by start(), which leaves the window off without it.
    targets = (
        Target(_CALLBACK, "callback_handler.register_end_callback"),
        Target(_CALLBACK, "callback_handler.start_callbacks"),
        Target(_CALLBACK, "callback_handler.end_callbacks"),
        Target(_CALLBACK, "callback_handler.remove_start_callback"),
        Target(_CALLBACK, "callback_handler.remove_end_callback"),
    )

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        #: Whether the current window froze (and so must thaw).
        self.frozen = False
        #: How many objects were frozen when the window was enabled, or after the last window
        #: thawed: a count above it at a compile's start means someone else froze objects since.
        self._baseline = 0
        #: Dynamo's callback handler, while the window's callbacks are on it.
        self._handler: Any = None

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.gc_window and not ctx.in_worker

    def enable(self, ctx: Context) -> None:
        self.start()

    def start(self) -> bool:
        """Open a window at each outermost compile's start and close it at its end. Returns
        whether Dynamo's callbacks were found (torch 2.11 to 2.13 have them)."""
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return False
        if not hasattr(callback_handler, "register_start_callback"):
            return False
        with self._lock:
            if self._handler is None:
                self._baseline = gc.get_freeze_count()
                callback_handler.register_start_callback(_start)
                callback_handler.register_end_callback(_end)
                self._handler = callback_handler
        return True

    def disable(self) -> None:
        """Remove the callbacks, thawing what a window still holds frozen."""
        with self._lock:
            handler, self._handler = self._handler, None
        if handler is not None:
            if _start in handler.start_callbacks:
                handler.remove_start_callback(_start)
            if _end in handler.end_callbacks:
                handler.remove_end_callback(_end)
        self.close()
        super().disable()

    def open(self) -> None:
        with self._lock:
            if not self.frozen and gc.get_freeze_count() <= self._baseline:
                gc.freeze()
                self.frozen = True

    def close(self) -> None:
        with self._lock:
            if self.frozen:
                gc.unfreeze()
                self.frozen = False
                self._baseline = gc.get_freeze_count()


FEATURE = GcWindow()


def _start(_: Any) -> None:
    """Dynamo's start callback (a module function: its identity is what Dynamo removes)."""
    try:
        FEATURE.open()
    except Exception:  # never fail a compile over a collector setting
        log.debug("compileq: gc window not opened", exc_info=True)


def _end(_: Any) -> None:
    try:
        FEATURE.close()
    except Exception:
        log.debug("compileq: gc window not closed", exc_info=True)


def enable() -> bool:
    """The window on by itself, outside ``install()`` (for tests); see ``GcWindow.start``."""
    return FEATURE.start()


def disable() -> None:
    FEATURE.disable()


def active() -> bool:
    """Whether a window is open now (objects frozen by compileq)."""
    return FEATURE.frozen
