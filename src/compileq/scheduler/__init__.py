"""The client and its pool: the pool Inductor submits to, cache lookup, single-flight,
routing, the one send-and-wait path every job kind takes, deadlines and local fallback.

Its names are imported when first used: importing the package must not pay for Celery.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Built": "compileq.scheduler.client",
    "KernelClient": "compileq.scheduler.client",
    "Outcome": "compileq.scheduler.client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
