"""The cyclic collector paused while torch's compiler stack is imported.

Importing torch, Inductor and Triton makes some 600,000 objects that live as long as the
process, and each collection those imports trigger walks all the ones made so far again, for
nothing: 1,064 collections, 1.8-2.1 s of a worker's 10 s of imports on the 2-core CI machine;
paused, its imports took 7.9 s of CPU instead of 10.0-10.4 s, and a client's
``compileq.install()`` (which imports Inductor) 2.8 s instead of 3.8 s.

Used around imports only: a worker's start, ``install()``, and the modules ``compileq run``
waits for. Their garbage is bounded by what the imported modules make, and the collector
runs as before once the outermost pause ends. Rejected alternatives: pausing it for a whole
compile (``inductor/gc_window.py`` says why: a long cold compile's garbage grows without
bound), and raising the thresholds for the process's life (every later collection of the
training job would change too).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off inside, as it was after. Nested pauses (``install()`` inside the
    import that ``compileq run`` waits for) end with the outermost one."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
