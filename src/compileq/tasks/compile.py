"""Task signatures. Messages carry one JSON string, the artifact key; the job is in the store."""

from __future__ import annotations

import time
from typing import Any

from compileq.tasks.app import COMPILE_FX, COMPILE_TRITON, app


@app.task(name=COMPILE_TRITON, bind=True)  # type: ignore[untyped-decorator]
def compile_triton(self: Any, key: Any) -> str:
    """Build the Triton kernel whose job spec is stored under ``key``; returns what happened."""
    from compileq.workers import metrics
    from compileq.workers.execute import execute_compile_triton

    started = time.perf_counter()
    outcome = "failed"
    try:
        outcome = execute_compile_triton(key)
        return outcome
    finally:
        metrics.observe("triton", _queue(self), outcome, time.perf_counter() - started)


@app.task(name=COMPILE_FX, bind=True)  # type: ignore[untyped-decorator]
def compile_fx(self: Any, key: Any) -> str:
    """Generate the code of the FX graph whose signed job is stored under ``key``."""
    from compileq.workers import metrics
    from compileq.workers.fx import execute_compile_fx

    started = time.perf_counter()
    outcome = "failed"
    try:
        outcome = execute_compile_fx(key)
        return outcome
    finally:
        metrics.observe("fx", _queue(self), outcome, time.perf_counter() - started)


def _queue(task: Any) -> str:
    return str((task.request.delivery_info or {}).get("routing_key") or "unknown")
