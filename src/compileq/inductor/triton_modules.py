"""Triton's C helper modules, content-addressed in the store.

Triton builds small C extension modules with the C compiler the first time a process needs
them and its ``TRITON_CACHE_DIR`` does not hold them: ``cuda_utils`` (its CUDA driver's
utilities, needed to load any kernel) and a ``__triton_launcher`` per kernel signature where
Inductor's static launcher does not serve. On a new machine that is a C compile inside the first
compile: on an H100 ``triton.runtime.driver.active.utils`` took 0.60 s on an empty cache dir,
0.012 s on a warm one, and it was most of what a new machine's graph load cost over a warm local
cache's (``bench/device_profile_new.sh``, docs/BENCHMARKS.md). Stock's remote caches do not
carry these files.

compileq puts a cache manager where Triton looks for one (``triton.knobs.cache.manager_class``):
Triton's own file cache, except that a C module missing from it is looked up in the store and
written into place through Triton's own ``put`` (a temporary dir, then ``os.replace``: no reader
sees half a file), and a module Triton built here is stored. Every other file (cubins, kernel
metadata) is Triton's file cache untouched. A manager the user configured is left alone.

Rejected: wrapping ``compile_module_from_src``. Triton's driver binds that name at its import,
and Triton 3.9 builds ``cuda_utils`` through ``compile_module_from_file`` instead; the cache
manager's interface and the file names are the same in 3.6 and 3.9.
"""

from __future__ import annotations

import platform
import sysconfig
from typing import Any

import redis

from compileq import keys
from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.cache.store import RedisStore
from compileq.errors import CompileqError
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.inductor import triton_binaries
from compileq.scheduler import boundary

KIND = "triton-so"
_CACHE = "triton.runtime.cache"


def module_key(cache_key: str, filename: str) -> str:
    """The store key of one C module: Triton's own cache key (a hash of the module's C source
    and the platform; in 3.9 also its build flags and dirs) and file name (with Python's
    extension suffix), with what decides whether another machine can load it: Triton's
    version, the C library, the CPU architecture. Not the C compiler: another one builds a
    module that works alike, and keying on it would split the cluster's entries by compiler
    patch release for nothing."""
    import triton

    material = {
        "kind": KIND,
        "format": 1,
        "triton_key": cache_key,
        "file": filename,
        "triton": triton.__version__,
        "libc": list(platform.libc_ver()),
        "machine": platform.machine(),
    }
    return keys.artifact_of(KIND, material)


#: What a C extension module's file name ends with for this Python (``.cpython-312-...so``).
_MODULE_SUFFIX: str = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def is_module(filename: str) -> bool:
    return filename.endswith(_MODULE_SUFFIX)


def _not_fetched(cache: Any, filename: str) -> str | None:
    return None


@boundary.guard("the Triton module cache", instead=_not_fetched)
def fetch(cache: Any, filename: str) -> str | None:
    """Write ``filename`` into ``cache`` (a Triton file cache manager) from the store; its path,
    or None where the store has no verified entry (Triton then builds it)."""
    store = FEATURE.store
    if store is None:
        return None
    from triton.runtime.cache import FileCacheManager

    try:
        entry = store.get_many([module_key(cache.key, filename)])[0]
        if entry is None:
            store.count({Counter.TRITON_MODULE_MISSES: 1})
            return None
        path = FileCacheManager.put(cache, entry.payload(), filename, binary=True)
        store.count({Counter.TRITON_MODULE_HITS: 1})
    except redis.RedisError as e:
        warn_once("triton-modules", "compileq: Triton module cache unavailable (%s)", e)
        return None
    log.debug("compileq: Triton module %s from the store", filename)
    return str(path)


def _not_shared(cache_key: str, filename: str, data: bytes) -> None:
    return None


@boundary.guard("the Triton module cache", instead=_not_shared)
def share(cache_key: str, filename: str, data: bytes) -> None:
    """Store a module Triton built here; failing to only costs other machines a build."""
    store = FEATURE.store
    if store is None:
        return
    try:
        store.count({Counter.TRITON_MODULE_BUILDS: 1})
        store.put(module_key(cache_key, filename), data)
    except (redis.RedisError, CompileqError) as e:
        warn_once("triton-modules-put", "compileq: Triton module not cached: %s", e)


def _manager_class() -> type:
    """Triton's file cache manager, with C modules and the kernel binaries a client compiles
    itself (``triton_binaries``) served from and shared to the store (a class made at enable():
    importing Triton at compileq's import would cost every process that never compiles)."""
    from triton.runtime.cache import FileCacheManager

    class CompileqCacheManager(FileCacheManager):  # type: ignore[misc]
        def __init__(self, key: str, override: bool = False, dump: bool = False) -> None:
            super().__init__(key, override=override, dump=dump)
            # Override and dump dirs hold what a user put there by hand: not the cluster's.
            self._shared = not override and not dump

        def get_file(self, filename: str) -> str | None:
            path: str | None = super().get_file(filename)
            if path is None and self._shared and is_module(filename):
                path = fetch(self, filename)
            return path

        def put(self, data: Any, filename: str, binary: bool = True) -> str:
            path: str = super().put(data, filename, binary)
            if self._shared and isinstance(data, bytes) and is_module(filename):
                share(self.key, filename, data)
            return path

        def get_group(self, filename: str) -> dict[str, str] | None:
            group: dict[str, str] | None = super().get_group(filename)
            if group is None and self._shared and triton_binaries.is_kernel_group(filename):
                group = triton_binaries.fetch(self, filename)
            return group

        def put_group(self, filename: str, group: dict[str, str]) -> Any:
            path = super().put_group(filename, group)
            if self._shared and triton_binaries.is_kernel_group(filename):
                triton_binaries.share(self, filename, group)
            return path

    return CompileqCacheManager


class TritonModules(Feature):
    """Serve Triton's C modules and a client's own kernel binaries from the store, unless a
    cache manager is configured already (``TRITON_CACHE_MANAGER`` or
    ``knobs.cache.manager_class``)."""

    name = "triton-modules"
    # Checked once Triton is imported (a Triton older than its knobs is left as it is).
    targets = (
        Target("triton.knobs", "cache.manager_class"),
        Target(_CACHE, "FileCacheManager.__init__", ("self", "key", "override", "dump")),
        Target(_CACHE, "FileCacheManager.get_file", ("self", "filename")),
        Target(_CACHE, "FileCacheManager.put", ("self", "data", "filename", "binary")),
        Target(_CACHE, "FileCacheManager.get_group", ("self", "filename")),
        Target(_CACHE, "FileCacheManager.put_group", ("self", "filename", "group")),
    )

    def __init__(self) -> None:
        super().__init__()
        self.store: RedisStore | None = None
        #: The manager class, made once per process (a second class would read as a
        #: manager someone else configured).
        self.manager: type | None = None

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache

    def enable(self, ctx: Context) -> None:
        try:
            from triton import knobs
        except ImportError:  # no Triton here, or one older than its knobs: Triton as it is
            return
        if self.manager is None:
            self.manager = _manager_class()
        try:
            current = knobs.cache.manager_class  # imports what TRITON_CACHE_MANAGER names
        except Exception as e:  # a bad TRITON_CACHE_MANAGER is Triton's to report, at its use
            current = e
        if current is not None and current is not self.manager:
            warn_once(
                "triton-manager",
                "compileq: Triton cache manager %s is configured; Triton's C modules not shared",
                getattr(current, "__name__", current),
            )
            return
        # Put back by deleting it: TRITON_CACHE_MANAGER's default, none.
        self.patches.set(knobs.cache, "manager_class", self.manager)
        self.store = ctx.store
        triton_binaries.FEATURE.store = ctx.store
        # A worker's kernels travel whole as pool results: its groups are read, not stored.
        triton_binaries.FEATURE.share = not ctx.in_worker

    def disable(self) -> None:
        super().disable()
        self.store = None
        triton_binaries.FEATURE.store = None
        triton_binaries.FEATURE.share = False


FEATURE = TritonModules()
