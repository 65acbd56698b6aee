"""Whether to pad a matmul's shapes: decided once per cluster and shared through the store.

Inductor's joint-graph pass ``pad_mm`` pads a matmul whose size is not a multiple of the GPU's
alignment (timm's ResNet head: 2,048 by 1,000 classes) when padding times faster. It times
both on the GPU of the process tracing the graph (``should_pad``: ``do_bench`` of each, the
padded one winning past 1.1x), and keeps the answer in the process's local cache
(``get_cached_should_pad``). Two ranks of one job time the same matmul at the same moment on
two GPUs; where the two times are near, one rank pads and the other does not, and the two
trace two different graphs: each then generates its own forward and backward, where one pair
would have served both. Seen on two H200s (timm's ResNet under DDP, docs/BENCHMARKS.md): 8, 7
and 6 codegens for 6 graphs in three cold runs, the extra pairs differing only by
``constant_pad_nd``, a padded ``mm`` and a ``slice``.

Here a decision travels as timings do (``runtime_tuning.py``): the first process to time a
matmul stores its answer under the matmul's key (Inductor's own ``should_pad_bench_key``: shapes,
strides, dtypes, the op and its padding settings) with the GPU model and torch's version; the
store keeps the first writer's. A process that finds an answer takes it and times nothing, and
one that timed and finds another answer already stored takes the stored one: every rank traces
the same graph. The decision is Inductor's either way (its own timing, by some rank of this
GPU model), so the graphs are ones stock could have traced.

Untrusted until verified: an entry that is not signed with the cluster's secret is absent to
the store, and a signed one that is no decision is counted and ignored. Either costs one
timing here, never a compile's failure. Redis away: the local decision, as stock.

Rejected: a lease so that one rank times for all (the ranks would wait on each other's GPU
inside their compile; both timing once costs what stock costs); turning the pass off
(``shape_padding``), which changes what users' graphs run.
"""

from __future__ import annotations

import functools
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

KIND = "pad-mm"
#: Bump when the payload format or key derivation changes: old entries then simply miss.
FORMAT = 1
_PAD_MM = "torch._inductor.fx_passes.pad_mm"
_YES, _NO = b"pad", b"keep"


class PadDecisions(Feature):
    """Matmul padding decisions read from and written to the store, in clients."""

    name = "pad-decisions"
    without = "each process times matmul padding itself, as stock does"
    targets = (
        Target(_PAD_MM, "get_cached_should_pad", ("key",)),
        Target(_PAD_MM, "set_cached_should_pad", ("key", "value")),
        Target(_PAD_MM, "is_padded_faster", ("key", "ori_time", "pad_time")),
    )

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_PAD_MM: self._wrap}

    def _wrap(self, module: Any) -> None:
        self.patches.wrap(module, "get_cached_should_pad", _cached)
        self.patches.wrap(module, "is_padded_faster", _faster)

    def lookup(self, key: str) -> bool | None:
        """The stored decision for ``key``; None where there is none, or none to trust."""
        entry = self.entry(key, "shared padding decisions")
        if entry is None:
            return None
        decision = decode(entry.payload())
        if decision is None:  # signed with our secret, yet no decision: counted, not used
            log.warning("compileq: padding decision %s rejected: not a decision", key[-12:])
            self.count(Counter.INTEGRITY_FAILURES)
        return decision

    def offer(self, key: str, decision: bool) -> bool:
        """Store ``decision`` unless one is stored already; the decision that stands. A
        stored value that is no decision to trust (unsigned, or signed and junk) is replaced
        by this one: it costs this timing, not one in every later process."""
        client = self.client
        if client is None or client.redis_down():
            return decision
        try:
            if client.store.put(key, encode(decision)):
                return decision
            stored = self.lookup(key)
            if stored is not None:
                return stored
            client.store.replace(key, encode(decision))
        except (redis.RedisError, CompileqError) as e:
            warn_once("pad-decisions-put", "compileq: padding decision not shared: %s", e)
        return decision


FEATURE = PadDecisions()


def encode(decision: bool) -> bytes:
    return _YES if decision else _NO


def decode(payload: bytes) -> bool | None:
    return {_YES: True, _NO: False}.get(payload)


@functools.cache
def _gpu_name() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    return str(torch.cuda.get_device_name(torch.cuda.current_device()))


def store_key(key: str) -> str:
    """The store key of Inductor's padding key ``key`` on this process's GPU model, with the
    margin a padded matmul must win by (``shape_padding_multiplier``: it decides, and
    Inductor's key leaves it out)."""
    import torch
    from torch._inductor import config

    options = config.post_grad_fusion_options
    material = {
        "kind": KIND,
        "format": FORMAT,
        "torch": torch.__version__,
        "gpu": _gpu_name(),
        "multiplier": repr(options.get("shape_padding_multiplier")),
        "key": key,
    }
    return keys.artifact_of(KIND, material)


def _cached(original: Callable[[str], Any]) -> Callable[[str], Any]:
    """``get_cached_should_pad``: the local cache, then the store."""

    @functools.wraps(original)
    def get_cached_should_pad(key: str) -> Any:
        decision = original(key)
        return decision if decision is not None else _stored(key)

    return get_cached_should_pad


def _not_stored(key: str) -> bool | None:
    return None


@boundary.guard("padding decisions", instead=_not_stored)
def _stored(key: str) -> bool | None:
    """The decision another process stored for Inductor's padding key ``key``, if any."""
    stored = FEATURE.lookup(store_key(key))
    if stored is not None:
        FEATURE.count(Counter.PAD_DECISION_HITS)
    return stored


def _faster(original: Callable[..., bool]) -> Callable[..., bool]:
    """``is_padded_faster``: this process's timing decides only where no other's is stored."""

    @functools.wraps(original)
    def is_padded_faster(key: str, ori_time: float, pad_time: float) -> bool:
        decision = original(key, ori_time, pad_time)
        return _standing(key, decision)

    return is_padded_faster


def _as_timed(key: str, decision: bool) -> bool:
    return decision


@boundary.guard("padding decisions", instead=_as_timed)
def _standing(key: str, decision: bool) -> bool:
    """The decision every process keeps for ``key``: the first stored, else ``decision``."""
    FEATURE.count(Counter.PAD_DECISION_TIMINGS)
    standing = FEATURE.offer(store_key(key), decision)
    if standing != decision:
        from torch._inductor.fx_passes import pad_mm

        # The local cache keeps the decision taken, so that this process stays consistent.
        pad_mm.set_cached_should_pad(key, standing)
        log.info(
            "compileq: matmul padding %s: timed %s here, %s as stored",
            key[-12:],
            "pad" if decision else "keep",
            "pad" if standing else "keep",
        )
    return standing
