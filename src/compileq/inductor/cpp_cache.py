"""C++ kernels: built shared objects, content-addressed in the store.

Inductor builds each C++ kernel into ``<cache dir>/<xx>/<key>.so`` through
``codecache._worker_compile_cpp`` (looked up at call time, so it can be wrapped). The file name
already carries Inductor's own hash of the source, optimized source and compiler flags (vector
ISA included), computed without paths; compileq adds the compiler's version, torch's
identity and this CPU's feature flags, then stores the ``.so`` bytes. The flags because
Inductor compiles with ``-march=native``: an object built on a CPU with more features than
this one may use an instruction this one lacks, and a training process killed by SIGILL is a
failed compile (the rejected alternative, the vector ISA alone, is what the name covers). A
new machine writes the object where the build would have, atomically, and Inductor loads it
as if it had built it. Stock's remote FX cache does
not do this, so a stock "warm" start still runs the C++ compiler for every kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
from collections.abc import Callable, Sequence
from typing import Any

import redis

from compileq import keys
from compileq._files import write_atomically
from compileq._log import warn_once
from compileq.cache.counters import Counter
from compileq.cache.store import RedisStore
from compileq.errors import CompileqError
from compileq.fingerprint import compiler_identity, cpu_flags
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.inductor import cpp_fanout
from compileq.scheduler import boundary, outage
from compileq.scheduler.progress import progress


def cpp_key(target: str) -> str:
    from compileq.fingerprint import torch_identity

    material = {
        "kind": "cpp",
        "format": 2,
        "object": os.path.basename(target),
        "compiler": compiler_identity(),
        "machine": platform.machine(),
        "torch": torch_identity(),
        "cpu_flags": cpu_flags(),
    }
    return keys.artifact_of("cpp", material)


#: A C++ object as Inductor writes one: loadable by its owner, readable by others.
_EXECUTABLE = 0o755


#: ``_look_up``'s answer when the object was written from the store: nothing to build.
_SERVED = ("served", "")


def _compile_cpp(original: Callable[[str, Sequence[Any]], None]) -> Callable[..., None]:
    """Inductor's ``_worker_compile_cpp``, served from the store or built by a worker."""

    def compile_cpp(lock_path: str, cpp_builders: Sequence[Any]) -> None:
        if cpp_fanout.precompiled_header(cpp_builders) and cpp_fanout.sends_builds(cpp_builders):
            # Inductor's precompiled header is read only by this machine's own builds: while
            # workers build its objects (each with a header of its own, workers/cpp.py), it is
            # neither made here (4.3 s on the 2-core CI machine, on the thread generating the
            # graph, and before even a new machine's first hit) nor fetched (155 MB, 21 MB
            # compressed). A build that still happens here reads the header's text instead:
            # slower, and the same object. Without such workers it is served and shared below.
            return
        plan = _look_up(cpp_builders)
        if plan is _SERVED:
            progress.cpp("hit")
            return
        if plan is not None and plan[0]:  # a miss: a worker builds it, if one can
            built = cpp_fanout.built_remotely(plan[0], cpp_builders)
            if built is not None:
                write_atomically(plan[1], built, mode=_EXECUTABLE)
                progress.cpp("remote")
                return
        # Inductor's build, under Inductor's own file lock (which skips an object already there)
        built_here = not os.path.exists(cpp_builders[-1].get_target_file_path())
        original(lock_path, cpp_builders)
        if built_here:
            progress.cpp("local")
        _share(plan)

    return compile_cpp


def _not_looked_up(cpp_builders: Sequence[Any]) -> tuple[str, str] | None:
    return None


@boundary.guard("the C++ cache", instead=_not_looked_up)
def _look_up(cpp_builders: Sequence[Any]) -> tuple[str, str] | None:
    """Write the object from the store (``_SERVED``), or say what to share once it is built:
    ``(key, path)`` for a miss, ``("", path)`` for an object already on a worker's disk."""
    store, target = FEATURE.store, str(cpp_builders[-1].get_target_file_path())
    if store is None:
        return None
    if os.path.exists(target):
        return ("", target) if FEATURE.built is Counter.CPP_REMOTE_COMPILES else None
    key = cpp_key(target)
    try:
        entry = store.get_many([key])[0]
        if entry is not None:
            write_atomically(target, entry.payload(), mode=_EXECUTABLE)
            store.count({Counter.CPP_HITS: 1})
            return _SERVED
        store.count({Counter.CPP_MISSES: 1})
    except redis.RedisError as e:
        warn_once("cpp-cache", "compileq: C++ kernel cache unavailable (%s); building locally", e)
        if not outage.unreachable(e):
            return None
        # Redis away: built here (no worker asked: the client stops asking Redis for now),
        # and kept to be stored once it answers (``_store_built``).
        store.on_unreachable(e)
        return key, target
    outage.store_entries(store)  # Redis answers: store what was built while it did not
    return key, target


def _not_shared(plan: tuple[str, str] | None) -> None:
    return None


@boundary.guard("the C++ cache", instead=_not_shared)
def _share(plan: tuple[str, str] | None) -> None:
    store = FEATURE.store
    if plan is None or store is None:
        return
    key, path = plan
    if key:
        _store_built(store, key, path)
    else:
        _share_existing(store, path)


def _store_built(store: RedisStore, key: str, path: str) -> None:
    """Count a build done here and share its object; failing to share only costs others.
    With Redis away the object is kept, then stored and counted once it answers
    (``scheduler/outage.py``)."""
    counts: dict[Counter, int] = {FEATURE.built: 1}
    try:
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            store.count(counts)  # unreadable: the build happened all the same
            raise
        _put_or_keep(store, key, data, counts)
    except (OSError, redis.RedisError, CompileqError) as e:
        warn_once("cpp-cache-put", "compileq: C++ object not cached: %s", e)


def _put_or_keep(
    store: RedisStore, key: str, data: bytes, counts: dict[Counter, int] | None = None
) -> None:
    """``store.put`` and count ``counts``; with Redis away, both once it answers again."""
    counts = counts or {}
    try:
        store.put(key, data)
    except redis.RedisError as e:
        if outage.unreachable(e) and outage.entries.add(key, data, outage.Owed(counts, [], [])):
            counts = {}  # counted when stored
        raise
    finally:
        store.count(counts)
    outage.store_entries(store)  # Redis answers: store what was built while it did not


def _share_existing(store: RedisStore, path: str) -> None:
    """On a worker, an object its own disk cache already held must still reach the store:
    the client that asked for this codegen looks it up there, and would build it otherwise.
    Put unless the key holds an entry that verifies: one that merely exists may be planted
    (empty, foreign, truncated), and ``put`` replaces it."""
    key = cpp_key(path)
    try:
        if not store.holds(key):
            with open(path, "rb") as f:
                store.put(key, f.read())
    except (OSError, redis.RedisError, CompileqError) as e:
        warn_once("cpp-cache-put", "compileq: C++ object not cached: %s", e)


def _isa_probe_object(isa: Any, code: str) -> str:
    """Where Inductor's ``VecISA.check_build`` puts its compiled probe (same calls, same path)."""
    from torch._inductor import cpu_vec_isa
    from torch._inductor.codecache import write
    from torch._inductor.cpp_builder import CppBuilder, CppTorchOptions

    extra = cpu_vec_isa._get_isa_dry_compile_fingerprint(isa.build_arch_flags())
    key, input_path = write(code, "cpp", extra=extra)
    options = CppTorchOptions(vec_isa=isa, warning_all=False)
    builder = CppBuilder(key, [input_path], options, os.path.dirname(input_path))
    return str(builder.get_target_file_path())


def _isa_verdict_key(isa: Any, code: str) -> str | None:
    """The key of a probe's verdict: everything that decides whether it compiles and loads."""
    from compileq.fingerprint import torch_identity

    cpu = cpu_flags()
    if cpu is None:
        return None
    material = {
        "kind": "isa",
        "format": 1,
        "isa": str(isa),
        "arch_flags": isa.build_arch_flags(),
        "probe": hashlib.sha256(code.encode()).hexdigest(),
        "compiler": compiler_identity(),
        "machine": platform.machine(),
        "torch": torch_identity(),
        "cpu_flags": cpu,
    }
    return keys.artifact_of("isa", material)


def _check_build(original: Callable[[Any, str], bool]) -> Callable[[Any, str], bool]:
    """Inductor's vector-ISA check, its verdict and its compile served from the store
    (``_check_build_with``)."""

    def check_build(isa: Any, code: str) -> bool:
        return _check_build_with(original, isa, code)

    return check_build


def _check_build_with(original: Callable[[Any, str], bool], isa: Any, code: str) -> bool:
    """Inductor's vector-ISA check ``original``, its verdict and its compile served from the
    store.

    Inductor compiles a probe per ISA and loads it in a fresh Python subprocess: about a
    second per ISA on a new machine, the largest cost left in a new machine's first call. The
    verdict is keyed by everything that decides it (the ISA, the probe and its flags, the
    compiler, torch, and this CPU's exact feature flags), so only a machine with the same CPU
    and toolchain skips the probe. The rejected alternative, sharing only the probe's build
    and always loading it here, kept that second per ISA on every new machine.
    """
    store = FEATURE.store
    target = key = verdict = None
    away = False  # Redis unreachable: the probe and its verdict are kept to be stored later
    if store is not None:
        try:
            verdict = _isa_verdict_key(isa, code)
            known = store.get_many([verdict])[0] if verdict is not None else None
            if known is not None:
                return known.payload() == b"1"
        except Exception as e:  # Redis, or another torch's internals: probe as Inductor does
            warn_once("isa-cache", "compileq: ISA probe not cached: %s", e)
            away = isinstance(e, redis.RedisError) and outage.unreachable(e)
            verdict = verdict if away else None
    if store is not None:
        try:
            target = _isa_probe_object(isa, code)
            if not os.path.exists(target):
                key = cpp_key(target)
                entry = None if away else store.get_many([key])[0]
                if entry is not None:
                    write_atomically(target, entry.payload(), mode=_EXECUTABLE)
                    store.count({Counter.CPP_HITS: 1})
                    progress.cpp("hit")
                    key = None
                elif not away:
                    store.count({Counter.CPP_MISSES: 1})
        except Exception as e:  # another torch's internals, or Redis: Inductor does it alone
            warn_once("isa-cache", "compileq: ISA probe not cached: %s", e)
            if not (isinstance(e, redis.RedisError) and outage.unreachable(e)):
                target = key = None
    ok = bool(original(isa, code))
    if ok and store is not None and key is not None and target is not None:
        progress.cpp("local")
        _store_built(store, key, target)
    if store is not None and verdict is not None:
        with contextlib.suppress(Exception):  # sharing the verdict only saves others time
            _put_or_keep(store, verdict, b"1" if ok else b"0")
    return ok


class CppCache(Feature):
    """Serve C++ builds (and vector-ISA probes) from the store."""

    name = "cpp-cache"
    # What finds an ISA probe's object (_isa_probe_object) is tried, and skipped if it fails.
    targets = (
        Target("torch._inductor.codecache", "_worker_compile_cpp", ("lock_path", "cpp_builders")),
        Target("torch._inductor.cpu_vec_isa", "VecISA.check_build", ("self", "code")),
        Target("torch._inductor.cpp_builder", "CppBuilder.get_target_file_path"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.store: RedisStore | None = None
        #: What a build here counts as: local in a client, remote inside a worker's FX codegen.
        self.built = Counter.CPP_LOCAL_COMPILES

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache

    def enable(self, ctx: Context) -> None:
        built = Counter.CPP_REMOTE_COMPILES if ctx.in_worker else Counter.CPP_LOCAL_COMPILES
        self.start(ctx.store, built)

    def start(self, store: RedisStore, built: Counter = Counter.CPP_LOCAL_COMPILES) -> None:
        """Serve C++ builds from ``store``; a build done here counts as ``built``. Also for
        a worker's own process, which has no ``install()`` (``workers/process.py``)."""
        from torch._inductor import codecache
        from torch._inductor.cpu_vec_isa import VecISA

        self.store, self.built = store, built
        self.patches.wrap(codecache, "_worker_compile_cpp", _compile_cpp)
        self.patches.wrap(VecISA, "check_build", _check_build)

    def disable(self) -> None:
        super().disable()
        self.store, self.built = None, Counter.CPP_LOCAL_COMPILES


FEATURE = CppCache()
