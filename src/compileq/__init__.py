"""compileq: a distributed compile-task queue for torch.compile.

``compileq.install()`` sends Inductor's Triton builds to Celery workers behind a Redis
content-addressed cache; see README.md.
"""

from __future__ import annotations

from typing import Any

from compileq._version import __version__


def install(settings: Any = None, *, fx: bool | None = None) -> bool:
    """Route torch.compile's builds through compileq; ``fx=True`` also its graph codegen
    (default: the ``COMPILEQ_FX`` setting)."""
    from compileq._gc import collector_paused

    with collector_paused():  # its first call imports Inductor: see compileq/_gc.py
        from compileq.features import install as _install

        return _install(settings, fx=fx)


def uninstall() -> None:
    from compileq.features import uninstall as _uninstall

    _uninstall()


__all__ = ["__version__", "install", "uninstall"]
