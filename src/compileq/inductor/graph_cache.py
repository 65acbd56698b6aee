"""Inductor's FX-graph, AOTAutograd and autotune remote caches, backed by compileq's store.

Inductor lets a ``RemoteCache`` subclass name a backend factory (``backend_override_cls``);
compileq sets it on the Redis-flavoured caches, so their entries are signed, compressed,
namespaced (``compileq:a:<kind>:<sha256>``) and counted like kernels, with no
``TORCHINDUCTOR_*`` variable for the user to set. The rejected alternative, stock's
``RedisRemoteCacheBackend``, stores unsigned pickles that any Redis writer could replace.

A put that finds Redis away keeps its entry (``scheduler/outage.py``'s ``entries``) and it
is stored, and counted, after the next call of these caches that Redis answers; else a new
machine would compile again every graph this one compiled during a failover.
"""

from __future__ import annotations

import functools
import hashlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any, ClassVar

import redis
from torch._inductor.remote_cache import RemoteCacheBackend

from compileq import keys
from compileq._log import warn_once
from compileq.cache import meta
from compileq.cache.counters import Counter, Reason, fallback
from compileq.cache.store import Entry, RedisStore
from compileq.errors import CompileqError
from compileq.fingerprint import host_identity
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.scheduler import boundary, outage, remote_mark
from compileq.scheduler.leases import Leases
from compileq.scheduler.progress import progress

#: When this process missed a graph key (it then compiles it); popped when it puts the entry.
_missed_at: dict[str, float] = {}


class _StoreBackend(RemoteCacheBackend[bytes]):  # type: ignore[misc]
    """``RemoteCacheBackend[bytes]`` over the installed store; Redis trouble reads as a miss."""

    kind: ClassVar[str]
    on_hit: ClassVar[Counter | None] = None
    on_miss: ClassVar[Counter | None] = None
    on_put: ClassVar[Counter | None] = None
    #: One compile per key cluster-wide: a second process that misses waits for the first.
    single_flight: ClassVar[bool] = False
    #: Counted in the client's progress line (graphs; kernels are counted by the pool).
    shows_progress: ClassVar[bool] = False

    def _key(self, key: str) -> str:
        return keys.artifact(self.kind, hashlib.sha256(key.encode()).hexdigest())

    def _miss(self, key: str) -> bytes | None:
        return None

    def _skip(self, key: str, data: bytes) -> None:
        return None

    @boundary.guard("the graph cache", instead=_miss)
    def _get(self, key: str) -> bytes | None:
        store = FEATURE.store
        if store is None:
            return None
        name = self._key(key)
        if self.shows_progress:
            progress.start()
        try:
            entry = store.get_many([name])[0]
            if entry is None and self.single_flight and FEATURE.leases is not None:
                entry = self._wait_for_other_compile(name)
            counter = self.on_hit if entry is not None else self.on_miss
            if counter is not None:
                store.count({counter: 1})
            if entry is None:
                _missed_at[name] = time.monotonic()  # this process compiles it: time it
            elif self.shows_progress:
                progress.graph(hit=True)
        except redis.RedisError as e:
            warn_once("graph-cache", "compileq: graph cache unavailable (%s); compiling locally", e)
            return None
        outage.store_entries(store)  # Redis answers: store what was built while it did not
        return None if entry is None else entry.payload()

    def _wait_for_other_compile(self, name: str) -> Entry | None:
        """None once this process holds the key's lease (it compiles); else the other's entry."""
        store, leases, deadline_s = FEATURE.store, FEATURE.leases, FEATURE.deadline_s
        assert store is not None and leases is not None
        deadline = time.monotonic() + deadline_s
        delay = 0.05
        while not leases.acquire(name):
            if time.monotonic() >= deadline:
                warn_once(
                    "graph-deadline",
                    "compileq: waited %.0fs for a graph another process compiles; compiling locally",
                    deadline_s,
                )
                store.count({Counter.FALLBACKS: 1}, None, [fallback(Reason.DEADLINE)])
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
            entry = store.get_many([name])[0]
            if entry is not None:
                return entry
        # The lease is ours, but the process that held it may have put the entry and freed it
        # between this process's last look and the take: look once more, else that graph is
        # compiled twice (CI saw it with four processes). Rejected: putting and releasing in
        # one script on the compiler's side, which would not close the window on this side.
        entry = store.get_many([name])[0]
        if entry is not None:
            leases.release(name)
        return entry

    def _put_counter(self) -> Counter | None:
        return self.on_put

    @boundary.guard("the graph cache", instead=_skip)
    def _put(self, key: str, data: bytes) -> None:
        store, leases = FEATURE.store, FEATURE.leases
        if store is None:
            return
        name = self._key(key)
        counter = self._put_counter()
        try:
            # Counted whether or not this put wins the first-writer race: each put follows
            # work done here, and a counter of winners alone would hide duplicate compiles.
            wrote = owed = False
            counts = {counter: 1} if counter is not None else {}
            timed = self._build_time(name, key)
            try:
                wrote = store.put(name, data)
            except redis.RedisError as e:
                # Redis away: kept, then stored and counted (all of it) once it answers.
                late = outage.Owed(counts, timed, self._entry_records(name, key))
                owed = outage.unreachable(e) and outage.entries.add(name, data, late)
                raise
            finally:  # also when too large to store: the compile happened all the same
                if not owed:
                    store.count(counts, None, timed + self._entry_records(name, key, wrote))
            if self.shows_progress:  # no counter: a worker generated it (see _put_counter)
                progress.graph(hit=False, remote=counter is None)
            if leases is not None:
                leases.release(name)
            outage.store_entries(store)  # Redis answers: store what was built while it did not
        except redis.RedisError as e:
            warn_once("graph-cache", "compileq: graph cache unavailable (%s); compiling locally", e)
        except CompileqError as e:  # EntryTooLarge: this graph stays in the local cache only
            warn_once("graph-cache-put", "compileq: graph not cached: %s", e)

    def _build_time(self, name: str, key: str) -> list[meta.Record]:
        """The graph's build time (miss to put), if this process timed its miss."""
        missed = _missed_at.pop(name, None)
        if missed is None:
            return []
        by = f"{socket.gethostname()}:{os.getpid()}"
        seconds = time.monotonic() - missed
        return [meta.record_build_time(self.kind, name, key[:64], seconds, by)]

    def _entry_records(self, name: str, key: str, wrote: bool = True) -> list[meta.Record]:
        """For a new entry (``wrote``), what explain can say about a graph."""
        if not wrote:
            return []
        material = {"kind": self.kind, "inductor_key": key}
        record = meta.entry_record(material, host_identity())
        store = FEATURE.store
        return [meta.record_entry(name, record, store.ttl_s if store else None)]


class FxGraphBackend(_StoreBackend):
    kind = "fx"
    single_flight = True
    shows_progress = True
    on_hit, on_miss = Counter.FX_HITS, Counter.FX_MISSES
    # Inductor puts right after it generated the graph's code in this process.
    on_put = Counter.FX_LOCAL_COMPILES

    def _put_counter(self) -> Counter | None:
        # A graph a worker generated was counted there (fx_remote_compiles), once, by the
        # process that ran the codegen; this put only shares its result.
        return None if remote_mark.generated_remotely() else self.on_put


class AOTAutogradBackend(_StoreBackend):
    kind = "aot"
    on_hit, on_miss = Counter.AOT_HITS, Counter.AOT_MISSES


class AutotuneBackend(_StoreBackend):
    kind = "autotune"


_OVERRIDES = {
    "RemoteFxGraphCache": FxGraphBackend,
    "RemoteAOTAutogradCache": AOTAutogradBackend,
    "RemoteAutotuneCache": AutotuneBackend,
    "RemoteBundledAutotuneCache": AutotuneBackend,
}
# Switched on by install(). bundled_autotune_remote_cache stays as configured: with it on, torch
# 2.11 asserts in AutotuneCacheBundler.begin_compile on every FX-graph cache hit (seen on the
# GPU device); its backend is still compileq's if a user turns it on.
_CONFIG = (
    ("torch._inductor.config", "fx_graph_remote_cache"),
    ("torch._inductor.config", "autotune_remote_cache"),
    ("torch._functorch.config", "enable_remote_autograd_cache"),
)
_COMPILE_FX = "torch._inductor.compile_fx"
_REMOTE_CACHE = "torch._inductor.remote_cache"


class GraphCache(Feature):
    """Inductor's remote caches backed by the store, and graph leases released after each
    compile however it ends."""

    name = "graph-cache"
    # Each of _OVERRIDES' caches and _CONFIG's flags is set only where this torch has it.
    targets = (
        Target(_REMOTE_CACHE, "RemoteCache.backend_override_cls"),
        Target(_REMOTE_CACHE, "RemoteCacheBackend._get", ("self", "key")),
        Target(_REMOTE_CACHE, "RemoteCacheBackend._put", ("self", "key", "data")),
        Target(_COMPILE_FX, "_compile_fx_inner"),
        # Set where this torch has them: each a cache (or its switch) compileq serves.
        *(
            Target(_REMOTE_CACHE, f"{name}.backend_override_cls", optional=True)
            for name in _OVERRIDES
        ),
        *(Target(module, attr, optional=True) for module, attr in _CONFIG),
    )

    def __init__(self) -> None:
        super().__init__()
        self.store: RedisStore | None = None
        self.leases: Leases | None = None
        self.deadline_s = 60.0

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache

    def imports(self) -> dict[str, Callable[[Any], None]]:
        # Now or once ``compile_fx`` has loaded: install()'s second call comes for ``compileq
        # run``, which installs while ``compile_fx`` is still loading.
        return {_COMPILE_FX: self._release_leases_after_each_compile}

    def enable(self, ctx: Context) -> None:
        self.start(ctx.store, ctx.settings.deadline_s)

    def start(self, store: RedisStore, deadline_s: float) -> None:
        """``enable`` with only what it needs (tests call it so)."""
        import importlib

        import torch
        from torch._inductor import remote_cache

        self.store, self.deadline_s = store, deadline_s
        self.leases = Leases(
            store.client,
            max_hold_s=deadline_s,
            on_stale=lambda n: store.count({Counter.STALE_LEASES: n}),
            secret=store.secret,
        )
        self.hook()
        for name, backend in _OVERRIDES.items():
            cls = getattr(remote_cache, name, None)
            if cls is not None:
                self.patches.set(cls, "backend_override_cls", backend)
        # The autotune caches serve Triton autotuning only; on a machine without a GPU Inductor
        # asserts a GPU backend hash as soon as they are on, so they stay as configured there.
        gpu = torch.cuda.is_available()
        for module_name, attr in _CONFIG:
            if "autotune" in attr and not gpu:
                continue
            module = importlib.import_module(module_name)
            if hasattr(module, attr):
                self.patches.set(module, attr, True)

    def disable(self) -> None:
        super().disable()
        self.store = self.leases = None

    def _release_leases_after_each_compile(self, module: Any) -> None:
        """Wrap ``compile_fx._compile_fx_inner`` (looked up at each call by
        ``compile_fx_inner``): the graph leases a compile takes are released when it ends,
        however it ends. Only the FX-graph cache's put releases them otherwise, and Inductor
        skips the put when the compile raises or the graph is not cacheable; waiters then
        waited out the deadline."""
        if hasattr(module, "_compile_fx_inner"):  # else compile_fx is still loading
            self.patches.wrap(module, "_compile_fx_inner", _releasing_leases)


def _releasing_leases(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile_and_release(*args: Any, **kwargs: Any) -> Any:
        leases = FEATURE.leases
        if leases is None:
            return original(*args, **kwargs)
        with leases.released_after():
            return original(*args, **kwargs)

    return compile_and_release


FEATURE = GraphCache()


def enable(store: RedisStore, deadline_s: float) -> None:
    """The feature on by itself, outside ``install()`` (for tests)."""
    FEATURE.start(store, deadline_s)


def disable() -> None:
    FEATURE.disable()
