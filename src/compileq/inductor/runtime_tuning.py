"""The timings a kernel's first launch takes, taken once per cluster and shared through the store.

A Triton kernel with several candidate configs (max-autotune's pointwise and reduction kernels,
any reduction) times them all at its first launch (``CachingAutotuner.benchmark_all_configs``),
and under the max-autotune modes then walks to better configs by coordinate descent
(``coordinate_descent_tuning``), compiling and timing each neighbour. That happens in the
training process, on its GPU, after every compile is done, so neither the pool nor the FX cache
sees it. Inductor's own autotune cache should spare a later process the work, but it is keyed by
the hash of the config list the kernel was built with, and on an H100 a process loading a warm
graph still spent 4.5 s (stock, warm local cache) and 6.0 s (a compileq new machine) in
coordinate descent in its first step (docs/BENCHMARKS.md, max-autotune).

Here the timings themselves travel, as compileq's GEMM autotuning does (``autotune.py``):

- the pick among a kernel's configs: the first process to time them stores every config's time
  under the kernel's content key; a later one finds a time for each of its launchers and
  returns them instead of timing (Inductor then picks, prunes and saves as it always does);
- coordinate descent: every time the walk took is stored (the tuner's own cache of results);
  a later process seeds the tuner's cache with them before the walk, so the walk replays the
  same steps, from the same start, over known times, and benchmarks nothing. Its winner is
  compiled as stock compiles it: from Triton's cache, which ``triton_binaries`` fills from the
  store.

A kernel's content key: its Triton function's source, its size hints, heuristic, signature and
constants, the configs it picks among (or the config a walk starts from), its
``inductor_meta`` (the tuning settings are there) less what names a process or machine, and
the GPU model with torch's and Triton's versions. Not the GPU index: every rank of every node
with that GPU model shares one set of times, as workers' timings of GEMM candidates are shared.

Counted: ``runtime_tune_hits`` (a pick or a walk answered by the store) and
``runtime_autotunes`` (one that benchmarked on this client: expected once per kernel per
cluster; on a machine whose graphs all hit it means timings are not reaching it, and ``compileq
doctor`` says so).

Rejected: storing only the winners (Inductor's autotune cache already does, and its key is what
missed); a lease so that one rank times for all (ranks would wait on each other's GPU inside a
training step; two ranks timing the same kernel once on a cold cluster cost what stock costs).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
from collections.abc import Callable
from typing import Any

import redis

from compileq import keys
from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.errors import CompileqError
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.scheduler import boundary

KIND = "runtime-tune"
#: Bump when the payload format or key derivation changes: old entries then simply miss.
FORMAT = 1
_HEURISTICS = "torch._inductor.runtime.triton_heuristics"
_RUNTIME = "torch._inductor.runtime"
#: ``inductor_meta`` keys that name a process, a machine or a cache setting, not a kernel.
_VOLATILE = frozenset(
    {
        "backend_hash",
        "compile_id",
        "kernel_name",
        "is_fbcode",
        "autotune_local_cache",
        "autotune_remote_cache",
        "bundled_autotune_remote_cache",
        "is_hip",
    }
)
#: At most this many timings in one entry (a coordinate-descent walk times tens).
_MAX_TIMINGS = 4096


def hashable(config: Any) -> Any:
    """A Triton config as Inductor's tuners key it: Inductor's own function, so a seeded
    coordinate-descent cache is keyed exactly as the tuner looks it up."""
    from torch._inductor.runtime.runtime_utils import triton_config_to_hashable

    return triton_config_to_hashable(config)


def _gpu(tuner: Any) -> str:
    import torch

    index = getattr(getattr(tuner, "device_props", None), "index", None)
    return _gpu_name(index if isinstance(index, int) else torch.cuda.current_device())


@functools.cache
def _gpu_name(index: int) -> str:
    import torch

    return str(torch.cuda.get_device_name(index))


def kernel_material(
    tuner: Any,
    phase: str,
    candidates: list[Any] | None = None,
    start: Any = None,
    gpu: str | None = None,
) -> dict[str, Any] | None:
    """What decides a kernel's timings at ``phase``: "pick" among ``candidates`` (the configs
    its launchers were built with: Inductor drops ``tuner.configs`` once they are), or
    "coordesc" from ``start``. None for a kernel compileq cannot key (its timings are then taken
    as stock takes them). ``gpu``: the GPU model (default: the kernel's GPU's)."""
    import torch
    import triton

    src = getattr(getattr(tuner, "fn", None), "src", None)
    triton_meta = getattr(tuner, "triton_meta", None)
    inductor_meta = getattr(tuner, "inductor_meta", None)
    if not isinstance(src, str) or not isinstance(triton_meta, dict):
        return None
    meta = {k: v for k, v in (inductor_meta or {}).items() if k not in _VOLATILE}
    return {
        "kind": KIND,
        "format": FORMAT,
        "phase": phase,
        "start": repr(hashable(start)) if start is not None else None,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "gpu": gpu or _gpu(tuner),
        "source": hashlib.sha256(src.encode()).hexdigest(),
        "size_hints": repr(getattr(tuner, "size_hints", None)),
        "heuristic": repr(getattr(tuner, "heuristic_type", None)),
        "candidates": sorted(repr(hashable(c)) for c in candidates or ()),
        "signature": repr(triton_meta.get("signature")),
        "constants": repr(triton_meta.get("constants")),
        "inductor_meta": json.dumps(meta, sort_keys=True, default=repr),
    }


def tune_key(
    tuner: Any,
    phase: str,
    candidates: list[Any] | None = None,
    start: Any = None,
    gpu: str | None = None,
) -> str | None:
    """The store key of ``tuner``'s timings at ``phase`` (see :func:`kernel_material`)."""
    material = kernel_material(tuner, phase, candidates, start, gpu)
    if material is None:
        return None
    key = keys.artifact_of(KIND, material)
    if log.isEnabledFor(logging.DEBUG):  # what differs when a later process misses
        parts = {k: hashlib.sha256(str(v).encode()).hexdigest()[:8] for k, v in material.items()}
        log.debug("compileq: runtime timings key %s of %s: %s", key[-12:], _name(tuner), parts)
    return key


def _name(tuner: Any) -> str:
    return str(getattr(tuner, "inductor_meta", {}).get("kernel_name") or "?")


def encode(timings: dict[Any, float]) -> bytes:
    rows = [[[list(item) for item in config], ms] for config, ms in timings.items()]
    return json.dumps({"timings": rows}).encode()


def decode(payload: bytes) -> dict[Any, float]:
    """The timings :func:`encode` wrote; ValueError for anything else."""
    rows = json.loads(payload)["timings"]
    if not isinstance(rows, list) or len(rows) > _MAX_TIMINGS:
        raise ValueError("not a list of timings")
    out: dict[Any, float] = {}
    for config, ms in rows:
        if not isinstance(ms, int | float) or math.isnan(ms) or ms < 0:
            raise ValueError(f"timing {ms!r}")
        items = []
        for name, value in config:
            if not isinstance(name, str) or not isinstance(value, int | float | str | bool | None):
                raise ValueError(f"config item {name!r}")
            items.append((name, value))
        out[tuple(items)] = float(ms)
    return out


class RuntimeTuning(Feature):
    """Kernels' first-launch timings read from and written to the store, in clients."""

    name = "runtime-tuning"
    without = "kernels time their configs at first launch as stock does"
    targets = (
        Target(_HEURISTICS, "CachingAutotuner.benchmark_all_configs", ("self",)),
        Target(_HEURISTICS, "CachingAutotuner.coordinate_descent_tuning", ("self", "launcher")),
        Target(f"{_RUNTIME}.runtime_utils", "triton_config_to_hashable", ("cfg",)),
        Target(
            f"{_RUNTIME}.coordinate_descent_tuner",
            "CoordescTuner.cache_benchmark_result",
            ("self", "config", "timing"),
        ),
    )

    def __init__(self) -> None:
        super().__init__()
        #: Keys whose signed entry was not timings: the next save here replaces them.
        self.bad: set[str] = set()

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_HEURISTICS: self._wrap}

    def _wrap(self, module: Any) -> None:
        tuner = getattr(module, "CachingAutotuner", None)
        if tuner is None:  # still loading
            return
        self.patches.wrap(tuner, "benchmark_all_configs", _pick)
        self.patches.wrap(tuner, "coordinate_descent_tuning", _walk)

    # -- the store ---------------------------------------------------------------------------

    def lookup(self, key: str | None) -> dict[Any, float] | None:
        if key is None:
            return None
        entry = self.entry(key, "runtime tuning cache")
        if entry is None:
            log.debug("compileq: runtime timings %s not in the store", key[-12:])
            return None
        try:
            return decode(entry.payload())
        except (ValueError, KeyError, TypeError) as e:
            # Signed with our secret, yet not timings: counted, never used, and replaced by
            # this process's own timings (a plain put would keep it: the key holds a signed
            # value), so it costs one benchmark, not one per process.
            log.warning("compileq: runtime tuning entry rejected: %s", e)
            self.bad.add(key)
            self.count(Counter.INTEGRITY_FAILURES)
            return None

    def save(self, key: str | None, timings: dict[Any, float], replace: bool) -> None:
        client = self.client
        if key is None or client is None or client.redis_down() or not timings:
            return
        log.debug("compileq: runtime timings %s stored (%d)", key[-12:], len(timings))
        try:
            payload = encode(timings)
            # A walk that went further than the stored one (its times are a superset), or an
            # entry that was not timings.
            if replace or key in self.bad:
                self.bad.discard(key)
                client.store.replace(key, payload)
            else:
                client.store.put(key, payload)
        except (redis.RedisError, CompileqError, TypeError, ValueError) as e:
            warn_once("runtime-tuning-put", "compileq: runtime timings not cached: %s", e)


FEATURE = RuntimeTuning()


# -- the pick among a kernel's configs --------------------------------------------------------


def _not_known(tuner: Any) -> tuple[str | None, dict[Any, float] | None]:
    return None, None


@boundary.guard("runtime tuning", instead=_not_known)
def _known_pick(tuner: Any) -> tuple[str | None, dict[Any, float] | None]:
    """The pick's key, and each of ``tuner``'s launchers with its stored time where the store
    has a time for every one (else None: they are timed here)."""
    launchers = list(getattr(tuner, "launchers", None) or ())
    key = tune_key(tuner, "pick", candidates=[ln.config for ln in launchers])
    known = FEATURE.lookup(key)
    if not known or not launchers or any(hashable(ln.config) not in known for ln in launchers):
        return key, None
    timings = {ln: known[hashable(ln.config)] for ln in launchers}
    for launcher, ms in timings.items():  # as Inductor's own timing seeds coordinate descent
        tuner.coordesc_tuner.cache_benchmark_result(launcher.config, ms)
    return key, timings


def _pick(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def benchmark_all_configs(self: Any, *args: Any, **kwargs: Any) -> Any:
        key, known = _known_pick(self)
        if known is not None:
            FEATURE.count(Counter.RUNTIME_TUNE_HITS)
            return known
        timings = original(self, *args, **kwargs)
        FEATURE.count(Counter.RUNTIME_AUTOTUNES)
        _share(key, timings, by_launcher=True, replace=False)
        return timings

    return benchmark_all_configs


# -- coordinate descent -----------------------------------------------------------------------


def _walk_not_known(tuner: Any, start: Any) -> tuple[str | None, dict[Any, float] | None]:
    return None, None


@boundary.guard("runtime tuning", instead=_walk_not_known)
def _known_walk(tuner: Any, start: Any) -> tuple[str | None, dict[Any, float] | None]:
    key = tune_key(tuner, "coordesc", start=start)
    return key, FEATURE.lookup(key)


def _walk(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def coordinate_descent_tuning(self: Any, launcher: Any, *args: Any, **kwargs: Any) -> Any:
        key, known = _known_walk(self, launcher.config)
        cache = getattr(getattr(self, "coordesc_tuner", None), "cached_benchmark_results", None)
        if not isinstance(cache, dict):
            return original(self, launcher, *args, **kwargs)
        for config, ms in (known or {}).items():
            cache.setdefault(config, ms)
        before = set(cache)
        result = original(self, launcher, *args, **kwargs)
        timed = set(cache) - before
        if timed:  # it benchmarked: a walk the store did not have, or went further
            FEATURE.count(Counter.RUNTIME_AUTOTUNES)
            _share(key, dict(cache), by_launcher=False, replace=known is not None)
        elif known:
            FEATURE.count(Counter.RUNTIME_TUNE_HITS)
        return result

    return coordinate_descent_tuning


def _not_shared(
    key: str | None, timings: dict[Any, float], by_launcher: bool, replace: bool
) -> None:
    return None


@boundary.guard("runtime tuning", instead=_not_shared)
def _share(key: str | None, timings: dict[Any, float], by_launcher: bool, replace: bool) -> None:
    """Store ``timings`` (by launcher, or by config as the tuner keys them) under ``key``."""
    if by_launcher:
        timings = {hashable(launcher.config): ms for launcher, ms in timings.items()}
    FEATURE.save(key, timings, replace)
