"""The Celery tasks a worker runs, registered on the wire's app under the wire's names.

Messages carry one JSON string, the artifact key; the job is in the store. Importing this module
registers the tasks (``workers/process.py`` does, before Celery forks its pool, so the pool
processes inherit the job kinds' modules, none of which asks CUDA anything at import); a client
never imports it: it sends by name (``send_task``), so only the names and the app live in
``tasks/``.

Rejected alternative: the task functions in ``tasks/`` with bodies importing the worker side
lazily. The wire would then depend on the layer above it, and a client importing the wire could
reach worker code through one call.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from compileq.tasks.app import COMPILE_CPP, COMPILE_FX, COMPILE_TRITON, TUNE_TRITON, app
from compileq.workers import lifecycle, metrics
from compileq.workers.cpp import execute_compile_cpp
from compileq.workers.fx import execute_compile_fx
from compileq.workers.triton import execute_compile_triton
from compileq.workers.tune import execute_tune_triton


@app.task(name=COMPILE_TRITON, bind=True)  # type: ignore[untyped-decorator]
def compile_triton(self: Any, key: Any) -> str:
    """Build the Triton kernel whose job spec is stored under ``key``; returns what happened."""
    return _observed(self, "triton", execute_compile_triton, key)


@app.task(name=COMPILE_FX, bind=True)  # type: ignore[untyped-decorator]
def compile_fx(self: Any, key: Any) -> str:
    """Generate the code of the FX graph whose signed job is stored under ``key``."""
    return _observed(self, "fx", execute_compile_fx, key)


@app.task(name=COMPILE_CPP, bind=True)  # type: ignore[untyped-decorator]
def compile_cpp(self: Any, key: Any) -> str:
    """Build the C++ object whose signed job is stored under ``key``."""
    return _observed(self, "cpp", execute_compile_cpp, key)


@app.task(name=TUNE_TRITON, bind=True)  # type: ignore[untyped-decorator]
def tune_triton(self: Any, key: Any) -> str:
    """Time the autotuning candidate whose signed job is stored under ``key`` on this GPU."""
    return _observed(self, "tune", execute_tune_triton, key)


def _observed(task: Any, kind: str, execute: Callable[[Any], str], key: Any) -> str:
    """Run ``execute(key)`` and report its outcome, queue and duration to the worker's metrics."""
    started = time.perf_counter()
    outcome = "failed"
    try:
        with lifecycle.keeping_lease(key):  # the sender's lease outlives the build
            outcome = execute(key)
        return outcome
    finally:
        queue = str((task.request.delivery_info or {}).get("routing_key") or "unknown")
        metrics.observe(kind, queue, outcome, time.perf_counter() - started)
