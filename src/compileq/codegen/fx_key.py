"""The key of a graph's codegen job: Inductor's FX-graph hash, written for ``cuda:0``.

Equal graphs must give equal job keys, in every rank and on every node, so that one worker
generates a graph once and every other process that sends it waits for that build (the job's
lease) or finds its output. The pickled compile input cannot serve: two processes pickling the
same graph write different bytes (object ids keying ``fwd_nn_module_stack``, provenance graph
ids, sets of classes iterated in id order). Inductor's FX-graph cache key is built to be stable
across processes and already decides, in stock Inductor, that two compiles may share one output:
compileq computes it again with a pickler that also writes every ``cuda:k`` as ``cuda:0``, so
the ranks of a node, each on its own GPU, agree too.

Rejected alternatives: canonicalising the wire bytes (each new kind of process-specific value
became another miss, and Python's pickler offers no hook for sets), and the FX cache key as
Inductor computed it (it names the device index, and is not handed to codegen).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from typing import Any

from compileq._log import log
from compileq.inductor import index_free


def graph_key(
    gm: Any,
    example_inputs: Sequence[Any],
    graph_kwargs: Any,
    inputs_to_check: Sequence[int],
    index: int | None,
) -> str | None:
    """sha256 of Inductor's hash details of the graph with ``cuda:index`` as ``cuda:0``; None
    where Inductor would not cache the graph (then the job is keyed by its bytes)."""
    from torch._inductor.codecache import FxGraphCachePickler, FxGraphHashDetails

    try:
        details = FxGraphHashDetails(gm, example_inputs, graph_kwargs, inputs_to_check)
        pickler = FxGraphCachePickler(gm, len(details.user_defined_triton_source) != 0)
        index_free.normalise_pickler(pickler, gm, index)
        key = hashlib.sha256(pickler.dumps(details)).hexdigest()
        if log.isEnabledFor(logging.DEBUG):  # which part of two graphs' keys differs
            lines: list[str] = getattr(pickler, "debug_lines", lambda _: [])(details)
            log.debug("compileq: graph %s hashes:\n  %s", key, "\n  ".join(lines))
        return key
    except Exception:  # BypassFxGraphCache and anything that refuses to pickle
        return None
