"""Task signatures. Messages carry one JSON string, the artifact key; the job is in the store."""

from __future__ import annotations

from typing import Any

from compileq.tasks.app import COMPILE_FX, COMPILE_TRITON, app


@app.task(name=COMPILE_TRITON)  # type: ignore[untyped-decorator]
def compile_triton(key: Any) -> str:
    """Build the Triton kernel whose job spec is stored under ``key``; returns what happened."""
    from compileq.workers.execute import execute_compile_triton

    return execute_compile_triton(key)


@app.task(name=COMPILE_FX)  # type: ignore[untyped-decorator]
def compile_fx(key: Any) -> str:
    """Generate the code of the FX graph whose signed job is stored under ``key``."""
    from compileq.workers.fx import execute_compile_fx

    return execute_compile_fx(key)
