"""Task signatures. Messages carry one JSON string, the artifact key; the job is in the store."""

from __future__ import annotations

import time
from typing import Any

from compileq.tasks.app import COMPILE_TRITON, app


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
        queue = (self.request.delivery_info or {}).get("routing_key") or "unknown"
        metrics.observe("triton", str(queue), outcome, time.perf_counter() - started)
