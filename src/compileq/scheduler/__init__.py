"""Client side: the pool Inductor submits to, cache lookup, single-flight, routing, fallback.

Its names are imported when first used: ``compileq run``'s start-up hook imports
``scheduler.profiles`` in every process, before torch, and must not pay for Celery.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Built": "compileq.scheduler.client",
    "KernelClient": "compileq.scheduler.client",
    "Outcome": "compileq.scheduler.client",
    "install": "compileq.scheduler.install",
    "installed_pool": "compileq.scheduler.install",
    "uninstall": "compileq.scheduler.install",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
