"""``compileq.install()``: put compileq's pool where Inductor looks for its process pool."""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any

from compileq._log import log, warn_once
from compileq.config import Settings, get_settings
from compileq.errors import ConfigError
from compileq.scheduler.client import KernelClient
from compileq.scheduler.local import LocalBuilder
from compileq.scheduler.pool import CompileqPool


@dataclass
class _Installed:
    original: Any  # the staticmethod object AsyncCompile had
    pool: CompileqPool


_installed: _Installed | None = None
_lock = threading.Lock()


def install(settings: Settings | None = None) -> bool:
    """Route Inductor's Triton builds through compileq. Returns whether compileq is active.

    Never raises for a missing cluster: without a secret compileq stays off (and says so);
    without Redis or workers it builds locally. Safe to call twice.
    """
    global _installed
    settings = settings or get_settings()
    if not settings.enabled:
        return False
    with _lock:
        if _installed is not None:
            return True
        from torch._inductor import config
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads

        try:
            original = AsyncCompile.__dict__["process_pool"]
            stock = original.__func__
            client = KernelClient(settings, LocalBuilder(stock))
        except ConfigError as e:
            warn_once("config", "compileq: not installed: %s", e)
            return False
        pool = CompileqPool(client, stock)

        @functools.lru_cache(1)  # Inductor calls process_pool.cache_clear() after a fork
        def process_pool() -> CompileqPool:
            return pool

        AsyncCompile.process_pool = staticmethod(process_pool)  # type: ignore[method-assign,assignment]
        if settings.graph_cache:
            from compileq.scheduler import cpp_cache, graph_cache

            graph_cache.enable(client.store, settings.deadline_s)
            cpp_cache.enable(client.store)
        AsyncCompile._ready_future = None
        # With one compile thread Inductor never uses a pool; compileq's pool costs no CPU
        # here, so allow the parallel path even on a one-core client.
        if get_compile_threads() <= 1:
            config.compile_threads = 2
        _installed = _Installed(original, pool)
    log.info("compileq: installed (redis %s)", settings.redis_display)
    return True


def uninstall() -> None:
    """Give Inductor its own process pool back."""
    global _installed
    with _lock:
        if _installed is None:
            return
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.process_pool = _installed.original  # type: ignore[method-assign]
        from compileq.scheduler import cpp_cache, graph_cache

        graph_cache.disable()
        cpp_cache.disable()
        AsyncCompile._ready_future = None
        _installed.pool.shutdown()
        _installed = None


def installed_pool() -> CompileqPool | None:
    return None if _installed is None else _installed.pool
