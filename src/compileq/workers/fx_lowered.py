"""A training forward's output strides, stored the moment Inductor has lowered it.

While a worker generates a forward, its client waits, and the backward it will send next
needs the strides of the activations the forward saves (a convolution net's channels-last
layout, padding: ``codegen/speculative.py``). Those are fixed once ``GraphLowering.run``
returns (about a fifth of a graph's compile in stock's cold runs of timm's ResNet); the rest
(scheduling, kernel code, the C++ and Triton builds) changes no output's layout. So for one codegen ``GraphLowering.run`` is wrapped (a
``Patches.swapped`` block, as the codegen state is), and when the outermost lowering of a
training forward returns, its static output strides are stored under ``keys.early(job key)``
(``tasks/fx_strides.py``) and announced on the completion channel.

Rejected alternatives: waiting for the output (the backward then starts after the whole
codegen, the wait this removes); lowering the forward a second time in the client to learn
them (Inductor's per-compile state there is the forward compile's own, and it costs the
client's critical path that part of a compile again); storing them for every graph (a
backward or an inference graph has no backward to send: one Redis write each for nothing).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from compileq import keys
from compileq._log import log
from compileq.cache.store import RedisStore
from compileq.hooks.ledger import Patches
from compileq.tasks import fx_strides
from compileq.tasks.events import Done, announce

_LOWERING = Patches("fx-lowered")


@dataclass
class Lowered:
    """When, after the block began, the strides were stored (for the graph's log line)."""

    after_s: float | None = None

    def describe(self) -> str:
        return "" if self.after_s is None else f"strides stored at {self.after_s:.2f}s"


@contextlib.contextmanager
def announced(store: RedisStore, key: str) -> Iterator[Lowered]:
    """Within the block, the first training forward lowered to its end has its output
    strides stored under ``keys.early(key)``; any error only means nothing is stored."""
    from torch._inductor.graph import GraphLowering

    original = GraphLowering.run
    began, lowered = time.perf_counter(), Lowered()
    depth = 0
    tried = False

    def run(graph: Any, *args: Any) -> Any:
        nonlocal depth, tried
        depth += 1  # a subgraph's lowering runs inside its parent's
        try:
            result = original(graph, *args)
        finally:
            depth -= 1
        if depth == 0 and not tried and _training_forward(graph):
            tried = True
            if _store(store, key, graph):
                lowered.after_s = time.perf_counter() - began
        return result

    with _LOWERING.swapped(GraphLowering, "run", run):
        yield lowered


def _training_forward(graph: Any) -> bool:
    return not (
        getattr(graph, "is_backward", True)
        or getattr(graph, "is_inference", True)
        or getattr(graph, "is_const_graph", False)
    )


def _store(store: RedisStore, key: str, graph: Any) -> bool:
    """Store and announce ``graph``'s output strides; whether that was done."""
    try:
        strides = output_strides(graph)
        if strides is None:
            return False
        early = keys.early(key)
        store.put(early, fx_strides.encode(strides))
        announce(store.client, Done(early, True))
        return True
    except Exception as e:  # the client then sends the backward once the output is in
        log.debug("compileq worker: output strides of %s not stored: %s", key, e)
        return False


def output_strides(graph: Any) -> list[tuple[int, ...] | None] | None:
    """The strides Inductor will report for each of ``graph``'s outputs (the ones
    ``compile_fx`` puts in the compiled graph), where they are plain numbers."""
    from torch._inductor.ir import IRNode

    outputs = getattr(graph, "graph_outputs", None)
    if outputs is None:
        return None
    strides: list[tuple[int, ...] | None] = []
    for out in outputs:
        static = None
        if isinstance(out, IRNode) and out.has_tensor_output():
            with contextlib.suppress(Exception):  # symbolic (TypeError), or no layout
                static = tuple(int(s) for s in out.get_layout().stride)
        strides.append(static)
    return strides
