"""One lock per GPU of a machine, held while timing anything on it.

Timings from one GPU are only comparable while nothing else runs on it. Two kinds of code time
on a worker's GPU: a ``tune_triton`` job (``workers/tune.py``), and a worker's FX codegen when
Inductor autotunes in process (``inductor/autotune.py``, which runs inside the worker). Both
take this lock, a ``flock`` on a file named after ``CUDA_VISIBLE_DEVICES``, so every pool
process of every worker on the machine pinned to the same GPU waits for the others. It lives
here, below both, because one of them is client-side code.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator


@contextlib.contextmanager
def gpu_lock() -> Iterator[None]:
    """Hold this machine's lock of the GPU this process is pinned to."""
    pin = os.environ.get("CUDA_VISIBLE_DEVICES", "") or "all"
    name = "".join(c if c.isalnum() or c in "-_" else "_" for c in pin)
    path = os.path.join(tempfile.gettempdir(), f"compileq-gpu-{name}.lock")
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
