"""``compileq.install()``: put compileq's pool where Inductor looks for its process pool."""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compileq import fingerprint, stack_chunks
from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.codegen import deferred, remote, speculative
from compileq.config import Settings, get_settings
from compileq.errors import ConfigError
from compileq.inductor import autotune
from compileq.scheduler import boundary
from compileq.scheduler.client import KernelClient
from compileq.scheduler.local import LocalBuilder
from compileq.scheduler.pool import CompileqPool


@dataclass
class _Installed:
    original: Any  # the staticmethod object AsyncCompile had
    pool: CompileqPool
    fx: bool


_installed: _Installed | None = None
_lock = threading.Lock()


def _stay_off(
    settings: Settings | None = None,
    *,
    fx: bool | None = None,
    on_worker: Callable[[], bool] | None = None,
) -> bool:
    """What install() does when it cannot finish: undo what it did, and leave stock alone."""
    with contextlib.suppress(Exception):
        uninstall()
    return False


@boundary.guard("install()", instead=_stay_off)
def install(
    settings: Settings | None = None,
    *,
    fx: bool | None = None,
    on_worker: Callable[[], bool] | None = None,
) -> bool:
    """Route Inductor's Triton builds through compileq. Returns whether compileq is active.

    ``fx`` (default: ``settings.fx``, i.e. ``COMPILEQ_FX``) also sends FX graph codegen to
    workers. ``on_worker`` is for a worker's own FX codegen: its kernels are enqueued only
    while ``on_worker()`` says a sibling pool process is free (see ``KernelClient``), else
    built in place and stored; either way they count as remote builds.

    Never raises: with a missing secret or a bad setting compileq stays off and says why,
    once; without Redis or workers it builds locally. Safe to call twice; a second call finishes
    the FX hook if the first came while ``compile_fx`` was still loading.
    """
    global _installed
    try:
        settings = settings or get_settings()
    except ConfigError as e:  # one line, secrets redacted (config.load_settings)
        warn_once("config", "compileq: not installed: %s", e)
        return False
    if not settings.enabled:
        return False
    want_fx = settings.fx if fx is None else fx
    with _lock:
        if _installed is not None:
            if _installed.fx:
                remote.enable(_installed.pool.client)
                if settings.speculate:
                    speculative.enable()
                if settings.defer_forwards:
                    deferred.enable(functools.partial(_count, _installed.pool.client))
            if settings.graph_cache:
                from compileq.inductor import graph_cache

                graph_cache.hook_compile_fx()
                from compileq.codegen import ddp_aot

                ddp_aot.hook()  # nothing unless the first call enabled it
                from compileq.inductor import index_free

                index_free.hook()  # nothing unless the first call enabled it
            from compileq.inductor import profiles

            profiles.hook_compile_fx()
            return True
        if settings.keep_stack_chunks:
            stack_chunks.keep()
        from torch._inductor import config
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads

        try:
            original = AsyncCompile.__dict__["process_pool"]
            stock = original.__func__
            client = KernelClient(settings, LocalBuilder(stock), on_worker=on_worker)
        except ConfigError as e:
            warn_once("config", "compileq: not installed: %s", e)
            return False
        pool = CompileqPool(client, stock)
        boundary.count_with(lambda counts, records: client.store.count(counts, None, records))

        @functools.lru_cache(1)  # Inductor calls process_pool.cache_clear() after a fork
        def process_pool() -> CompileqPool:
            return pool

        AsyncCompile.process_pool = staticmethod(process_pool)  # type: ignore[method-assign,assignment]
        # Recorded at once, so that uninstall() can undo a partial install (boundary.guard).
        _installed = _Installed(original, pool, False)
        if settings.graph_cache:
            from compileq.inductor import cpp_cache, graph_cache, triton_modules

            graph_cache.enable(client.store, settings.deadline_s)
            triton_modules.enable(client.store)
            built = (
                Counter.CPP_REMOTE_COMPILES if on_worker is not None else Counter.CPP_LOCAL_COMPILES
            )
            cpp_cache.enable(client.store, built)
            if settings.cpp_fanout:
                from compileq.inductor import cpp_fanout

                cpp_fanout.enable(client, on_worker)
            if settings.ddp_aot_cache and on_worker is None:
                from compileq.codegen import ddp_aot

                ddp_aot.enable(client.store)
            if settings.index_free_keys and on_worker is None:
                from compileq.inductor import index_free

                index_free.enable()
        # Inductor's torch_key and triton_key from compileq's on-disk memo: the first compile
        # does not hash torch's and Triton's files again.
        fingerprint.seed_inductor_keys()
        fingerprint.use_torch_ptxas()
        if settings.gc_window and on_worker is None:
            from compileq.inductor import gc_window

            gc_window.enable()
        if settings.profiles and on_worker is None:
            from compileq.inductor import profiles

            profiles.enable(client.store)
        if settings.tune_on_workers:
            autotune.enable(client)
        if want_fx and on_worker is None:
            remote.enable(client)
            if settings.speculate:
                speculative.enable()
            if settings.defer_forwards:
                deferred.enable(functools.partial(_count, client))
        AsyncCompile._ready_future = None
        # With one compile thread Inductor never uses a pool; compileq's pool costs no CPU
        # here, so allow the parallel path even on a one-core client.
        if get_compile_threads() <= 1:
            config.compile_threads = 2
        _installed.fx = want_fx and on_worker is None
    log.info("compileq: installed (redis %s%s)", settings.redis_display, ", FX" if want_fx else "")
    return True


def _count(client: KernelClient, counter: Counter) -> None:
    try:
        client.store.count({counter: 1})
    except Exception as e:  # a count may be lost, never a compile
        log.debug("compileq: %s not counted (%s)", counter.value, e)


def uninstall() -> None:
    """Give Inductor its own process pool back."""
    global _installed
    with _lock:
        if _installed is None:
            return
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.process_pool = _installed.original  # type: ignore[method-assign]
        from compileq.codegen import ddp_aot
        from compileq.inductor import (
            cpp_cache,
            cpp_fanout,
            gc_window,
            graph_cache,
            index_free,
            triton_modules,
        )

        gc_window.disable()
        autotune.disable()
        triton_modules.disable()
        ddp_aot.disable()
        index_free.disable()
        remote.disable()
        speculative.disable()
        deferred.disable()
        graph_cache.disable()
        cpp_cache.disable()
        cpp_fanout.disable()
        AsyncCompile._ready_future = None
        _installed.pool.shutdown()
        _installed = None


def installed_pool() -> CompileqPool | None:
    return None if _installed is None else _installed.pool
