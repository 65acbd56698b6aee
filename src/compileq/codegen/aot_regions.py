"""AOTAutograd's cache for graphs with an autocast or SDPA-backend region, which stock never uses.

A model that turns autocast off (or on) for a few lines inside its forward, as transformers'
Llama computes its rotary angles in float32 (``with torch.autocast(..., enabled=False)``), has
Dynamo put ``_enter_autocast`` and ``_exit_autocast`` calls in its graph; one that picks its
attention kernel (``with torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``) has it
put ``_backend_from_string`` and ``_sdpa_kernel`` calls there, for the region's entry and for
the restore at its exit. AOTAutograd's cache refuses every graph holding a function it does
not know (``check_node_safe``: "Bypassing autograd cache due to: Unsupported call_function
target <function _enter_autocast>"). So every start of such a job, stock or compileq, new
machine or warm local cache, traces the joint graph and partitions it again, though
Inductor's FX graph cache then finds each graph: on the 2-core CPU machine 2.5 s of a
transformers Llama's 5.2 s compile at its first step (docs/BENCHMARKS.md).

These functions do what their arguments say (device type, dtype, enabled, cache flag; a
backend's name, a list of backends and whether it orders them: all constants in the graph,
or made from constants there, so in its cache key) and leave nothing behind once AOTAutograd
has traced them: the compiled forward and backward it caches carry the casts and the chosen
attention kernels. compileq lets ``check_node_safe`` pass them, in clients (AOTAutograd runs
there); any other node is checked as before. ``COMPILEQ_AOT_REGIONS=0`` turns it off.
Rejected alternatives: adding their names to Inductor's ``unsafe_marked_cacheable_functions``
(a config in every FX graph's cache key: compileq's processes and stock's would stop sharing
keys, and workers would have to agree on it too); tracing the region away (the user's code);
one feature per context manager (the same check, the same reasoning, two settings to know).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target

_CACHE = "torch._functorch._aot_autograd.autograd_cache"
#: The functions Dynamo calls in a graph to enter and leave an autocast region, and to set the
#: attention backends a ``sdpa_kernel`` region allows (and to restore them at its end).
_REGIONS = frozenset(
    (
        "torch.amp.autocast_mode._enter_autocast",
        "torch.amp.autocast_mode._exit_autocast",
        "torch.nn.attention._backend_from_string",
        "torch.nn.attention._sdpa_kernel",
    )
)


class AotRegions(Feature):
    """Let AOTAutograd's cache take graphs with an autocast or SDPA-backend region (clients)."""

    name = "aot-regions"
    without = "a graph with an autocast or sdpa_kernel region is traced again at every start"
    targets = (Target(_CACHE, "check_node_safe", ("node",)),)

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.graph_cache and ctx.settings.aot_regions and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_CACHE: self._wrap}

    def _wrap(self, module: Any) -> None:
        if hasattr(module, "check_node_safe"):  # else still loading, or another layout
            self.patches.wrap(module, "check_node_safe", _region_safe)


FEATURE = AotRegions()


#: Their bare names: most nodes are told apart by these alone, without building a string.
_NAMES = frozenset(name.rpartition(".")[2] for name in _REGIONS)


def is_region_call(target: object) -> bool:
    """Whether ``target`` (a node's) enters or leaves an autocast or SDPA-backend region.
    Runs for every node of every graph AOTAutograd looks up, cache hits included."""
    name = getattr(target, "__name__", None)
    return name in _NAMES and f"{getattr(target, '__module__', '')}.{name}" in _REGIONS


def _region_safe(original: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(original)
    def check_node_safe(node: Any) -> None:
        if getattr(node, "op", None) == "call_function" and is_region_call(node.target):
            return None
        return original(node)

    return check_node_safe
