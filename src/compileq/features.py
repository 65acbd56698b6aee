"""``compileq.install()``: compileq's features, one ordered list, switched on in this process.

Each entry of :data:`FEATURES` is a ``hooks.feature.Feature``: it says when it is wanted (from
the settings, on a worker or a client, with FX codegen on workers or not), enables itself,
finishes its hooks after a late import, and disables itself. ``install()`` walks the list top
to bottom, the same way at every call: a feature now wanted and off is enabled, one wanted and
on is hooked again (``compileq run`` calls install() a second time once ``compile_fx`` has
loaded, see ``_boot/sitecustomize.py``), one on and no longer wanted (``install(fx=True)`` then
``install(fx=False)``) is disabled. ``uninstall()`` walks it bottom to top. What each feature
replaced in torch is in the one ledger (``hooks/ledger.py``), which puts back the true original
whatever order features go in.

Rejected alternative: a registry each module adds itself to at import. The order would be the
order of imports, which ``compileq run`` does not control (it installs while torch is still
loading), and nobody could read it in one place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from compileq import fingerprint, stack_chunks
from compileq._log import log, warn_once
from compileq.codegen import aot_regions, ddp_aot, deferred, remote, speculative, split
from compileq.config import Settings, get_settings
from compileq.errors import ConfigError
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.inductor import (
    autotune,
    cpp_cache,
    cpp_fanout,
    dynamic_profile,
    gc_window,
    graph_cache,
    index_free,
    pad_decisions,
    profiles,
    runtime_tuning,
    triton_modules,
)
from compileq.scheduler import boundary
from compileq.scheduler.client import KernelClient
from compileq.scheduler.local import LocalBuilder
from compileq.scheduler.pool import CompileqPool

_ASYNC_COMPILE = "torch._inductor.async_compile"


class KeepStackChunks(Feature):
    """Python's freed frame-stack chunks kept for reuse (``stack_chunks``). Not undone: the
    allocator stays swapped for the process's life, and keeps nothing torch can see."""

    name = "stack-chunks"
    targets = ()  # nothing of torch's or Triton's

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.keep_stack_chunks

    def enable(self, ctx: Context) -> None:
        stack_chunks.keep()


class ProcessPool(Feature):
    """compileq's pool where Inductor looks for its process pool: the feature everything else
    rides on, so first on and last off."""

    name = "process-pool"
    targets = (
        Target(_ASYNC_COMPILE, "AsyncCompile.process_pool"),
        Target(_ASYNC_COMPILE, "AsyncCompile._ready_future"),
        Target(_ASYNC_COMPILE, "AsyncCompile._get_ready"),  # the probe CompileqPool answers
        Target(_ASYNC_COMPILE, "get_compile_threads"),
        # What CompileqPool recognises as a Triton build (scheduler/recognise.py).
        Target(
            "torch._inductor.runtime.compile_tasks",
            "_worker_compile_triton",
            ("load_kernel", "extra_env", "extra_config"),
        ),
        Target(
            "torch._inductor.codecache",
            "_load_triton_kernel_from_source",
            ("kernel_name", "source_code"),
        ),
        Target("torch._inductor.runtime.cache_dir_utils", "cache_dir"),
    )

    def enable(self, ctx: Context) -> None:
        from torch._inductor import config
        from torch._inductor.async_compile import AsyncCompile, get_compile_threads

        pool: CompileqPool = ctx.pool

        @functools.lru_cache(1)  # Inductor calls process_pool.cache_clear() after a fork
        def process_pool() -> CompileqPool:
            return pool

        self.patches.set(AsyncCompile, "process_pool", staticmethod(process_pool))
        AsyncCompile._ready_future = None
        # With one compile thread Inductor never uses a pool; compileq's pool costs no CPU
        # here, so allow the parallel path even on a one-core client.
        if get_compile_threads() <= 1:
            self.patches.set(config, "compile_threads", 2)

    def disable(self) -> None:
        from torch._inductor.async_compile import AsyncCompile

        super().disable()
        AsyncCompile._ready_future = None


class InductorKeys(Feature):
    """Inductor's torch_key and triton_key from compileq's on-disk memo (the first compile does
    not hash torch's and Triton's files again), and Triton pointed at torch's ptxas. On torch
    2.11 the key is seeded by replacing ``triton_compat.triton_key`` (in the ledger, undone on
    disable); 2.13's own caches of the keys have no way back, and hold the value Inductor would
    compute anyway."""

    name = "inductor-keys"
    # codecache.triton_key and the keys' ``set`` are newer torch's, triton_compat.triton_key
    # 2.11's: fingerprint.seed_inductor_keys takes whichever is there. Triton's own
    # ``runtime.cache.triton_key`` is what ``triton.compile`` keys its file cache on
    # (fingerprint._seed_triton_compiler); without Triton neither is replaced.
    targets = (
        Target("torch._inductor.codecache", "torch_key"),
        Target("torch._inductor.runtime.triton_compat", "HAS_TRITON"),
        Target("torch._inductor.runtime.triton_compat", "triton_key", optional=True),
        Target("torch._inductor.runtime.compile_tasks", "_set_triton_ptxas_path"),
        Target("triton.runtime.cache", "triton_key", optional=True),
    )

    def enable(self, ctx: Context) -> None:
        fingerprint.seed_inductor_keys(self.patches.set)
        fingerprint.use_torch_ptxas()


def _remote_fx_compile() -> type:
    """The class FX codegen goes to workers through; ``codegen.scheme`` imports
    ``compile_fx_ext``, so it is imported only once ``compile_fx`` has loaded."""
    from compileq.codegen.scheme import RemoteFxCompile

    return RemoteFxCompile


_POOL = ProcessPool()

#: Every feature, in the order install() enables them (uninstall() disables them backwards).
FEATURES: tuple[Feature, ...] = (
    KeepStackChunks(),  # keep_stack_chunks
    _POOL,  # always: Triton builds through the cluster
    graph_cache.FEATURE,  # graph_cache: Inductor's remote caches in the store
    triton_modules.FEATURE,  # graph_cache: Triton's C modules in the store
    cpp_cache.FEATURE,  # graph_cache: C++ objects and ISA probes in the store
    cpp_fanout.FEATURE,  # graph_cache, cpp_fanout: C++ misses built by workers
    ddp_aot.FEATURE,  # graph_cache, ddp_aot_cache; clients: DDP subgraphs cached
    aot_regions.FEATURE,  # graph_cache, aot_regions; clients: autocast, SDPA regions cached
    index_free.FEATURE,  # graph_cache, index_free_keys; clients: one entry for every GPU index
    InductorKeys(),  # always: torch_key and triton_key seeded, torch's ptxas
    gc_window.FEATURE,  # gc_window; clients: no full collections over a compile
    profiles.FEATURE,  # profiles; clients: the job's profile loaded and saved
    autotune.FEATURE,  # tune_on_workers: autotuning timings shared and taken by GPU workers
    runtime_tuning.FEATURE,  # graph_cache; clients: kernels' first-launch timings shared
    pad_decisions.FEATURE,  # graph_cache; clients: matmul padding decided once, shared
    dynamic_profile.FEATURE,  # graph_cache, dynamic_profile; clients: dynamic sizes shared
    remote.FEATURE.using(_remote_fx_compile),  # fx; clients: FX codegen on workers
    speculative.FEATURE,  # fx, speculate; clients: backwards sent with their forwards
    deferred.FEATURE,  # fx, defer_forwards; clients: DDP forwards generated side by side
    split.FEATURE,  # fx, defer_forwards, split_graphs; clients: big graphs in parts
)


@dataclass
class _Installed:
    ctx: Context
    #: The features install() enabled, to disable on uninstall() (enabled ones first in line:
    #: one whose enable raised half-way is on it too, so that its half is undone).
    on: list[Feature] = field(default_factory=list)


_installed: _Installed | None = None
_lock = threading.Lock()


def _stay_off(
    settings: Settings | None = None,
    *,
    fx: bool | None = None,
    on_worker: Callable[[], bool] | None = None,
    send_slot: Callable[[], AbstractContextManager[bool]] | None = None,
    kernel_share: Callable[[], int] | None = None,
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
    send_slot: Callable[[], AbstractContextManager[bool]] | None = None,
    kernel_share: Callable[[], int] | None = None,
) -> bool:
    """Route Inductor's Triton builds through compileq. Returns whether compileq is active.

    ``fx`` (default: ``settings.fx``, i.e. ``COMPILEQ_FX``) also sends FX graph codegen to
    workers. ``on_worker`` is for a worker's own FX codegen: its kernels are enqueued only
    while ``on_worker()`` says a sibling pool process is free (see ``KernelClient``), else
    built in place and stored; either way they count as remote builds. ``send_slot``, with
    it, reserves a free sibling for each C++ object sent (``inductor/cpp_fanout.py``), and
    ``kernel_share`` says how many of its kernels may be with siblings at once, the rest built
    by its own compile threads as they free (``scheduler/share.py``).

    Never raises: with a missing secret or a bad setting compileq stays off and says why,
    once; without Redis or workers it builds locally. Safe to call again: a later call finishes
    the hooks whose module was still loading at the first (``compileq run``), and switches
    features on or off as its settings and ``fx`` now want them. The first call's client (its
    Redis, its ``on_worker``) stays for the process's life.
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
        first = _installed is None
        if _installed is None:
            import torch._inductor.async_compile  # noqa: F401  (what the pool's targets are in)

            if not _POOL.fits():  # every other feature rides on it: said once, stock stays
                return False
            ctx = _context(settings, want_fx, on_worker, send_slot, kernel_share)
            if ctx is None:
                return False
            _installed = _Installed(ctx)
        else:
            ctx = dataclasses.replace(_installed.ctx, settings=settings, fx=want_fx)
            _installed.ctx = ctx
        _walk(_installed, ctx)
        fx_on = remote.FEATURE in _installed.on
    if first:
        log.info(
            "compileq: installed (redis %s%s)", settings.redis_display, ", FX" if fx_on else ""
        )
    return True


def _context(
    settings: Settings,
    fx: bool,
    on_worker: Callable[[], bool] | None,
    send_slot: Callable[[], AbstractContextManager[bool]] | None = None,
    kernel_share: Callable[[], int] | None = None,
) -> Context | None:
    """The client and pool every feature shares; None (compileq stays off) for a bad setting."""
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    stock = AsyncCompile.__dict__["process_pool"].__func__
    try:
        client = KernelClient(
            settings,
            LocalBuilder(stock),
            on_worker=on_worker,
            kernel_share=kernel_share,
            local_slots=get_compile_threads() if kernel_share is not None else 1,
        )
    except ConfigError as e:
        warn_once("config", "compileq: not installed: %s", e)
        return None
    boundary.count_with(lambda counts, records: client.store.count(counts, None, records))
    return Context(settings, client, on_worker, send_slot, fx, CompileqPool(client, stock))


def _walk(installed: _Installed, ctx: Context) -> None:
    """Each feature as ``ctx`` wants it: enabled, hooked again, or disabled. One whose targets
    in this torch do not fit stays off (``Feature.fits``: said once, once per process)."""
    for feature in FEATURES:
        wanted, on = feature.wanted(ctx), feature in installed.on
        if wanted and not on:
            if not feature.fits():
                continue
            installed.on.append(feature)
            feature.enable(ctx)
            feature.fits()  # and what enable() imported
        elif wanted:
            feature.hook()
        elif on:
            installed.on.remove(feature)
            feature.disable()


def uninstall() -> None:
    """Give Inductor its own process pool back, and torch every function compileq wrapped."""
    global _installed
    with _lock:
        if _installed is None:
            return
        installed, _installed = _installed, None
        for feature in reversed(FEATURES):
            if feature in installed.on:
                try:
                    feature.disable()
                except Exception as e:  # the others still go
                    log.warning("compileq: %s not disabled cleanly (%s)", feature.name, e)
        installed.ctx.pool.shutdown()


@dataclass(frozen=True)
class State:
    """One feature as ``install()`` would leave it on this torch (``survey``)."""

    name: str
    on: bool
    #: Why it is off: its setting, or what in this torch does not fit (``Feature.misfit``).
    why: str = ""
    #: Off because a target of its moved in this torch, not by its setting.
    moved: bool = False


def survey(settings: Settings, *, fx: bool = True) -> list[State]:
    """Every feature as ``install()`` with ``settings`` would leave it in a client on the
    torch installed here (``fx``: as ``compileq run`` installs, FX codegen on), each target
    imported and checked; for ``compileq doctor`` and docs/RELEASES.md. Changes nothing."""
    ctx = Context(settings, client=None, fx=fx)
    states = []
    for feature in FEATURES:
        misfit = feature.misfit or next(
            (p for t in feature.targets if (p := t.misfit()) is not None), None
        )
        if misfit is not None:
            states.append(State(feature.name, False, misfit, moved=True))
        elif not feature.wanted(ctx):
            states.append(State(feature.name, False, "off by its setting"))
        else:
            states.append(State(feature.name, True))
    return states


def installed_pool() -> CompileqPool | None:
    if _installed is None:
        return None
    pool: CompileqPool = _installed.ctx.pool
    return pool
