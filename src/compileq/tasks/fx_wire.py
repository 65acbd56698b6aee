"""How a graph's compile input travels to a worker, and its output code back.

Inductor pickles both with ``GraphPickler``. On compileq's wire its pickler differs in three
ways, each for a reason found running ordinary training scripts:

* **ops**: torch's own ``prims`` travel too (``fx_ops``);
* **portable**: classes and functions of the user's code travel as named stand-ins
  (``portable``), so a model defined in the training script is generated on a worker;
* **one device index**: ``cuda:k`` is written as ``cuda:0`` (``device_index``).

The job's *key* is not a hash of these bytes: two processes pickling the same graph write
different bytes (object ids in node metadata, the iteration order of sets of classes), so it
is derived from Inductor's own FX-graph hash instead (``fx_key``).

Inductor calls ``GraphPickler.dumps`` deep inside ``serialize()`` with no way to pass a
pickler, so :func:`wire` swaps the classmethod for the duration (one compile at a time per
process: Inductor's codegen and a prefork worker's task both run on one thread).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

from compileq.tasks import portable
from compileq.tasks.fx_ops import carries


@functools.cache
def _pickler_class() -> type:
    from torch.fx._graph_pickler import GraphPickler

    class WirePickler(GraphPickler):  # type: ignore[misc,valid-type]
        device_index: int | None = None

        def reducer_override(self, obj: object) -> Any:
            import torch

            if portable.needs_stand_in(obj):
                return portable.reduce(obj)
            if isinstance(obj, torch.device):
                if obj.type == "cuda" and obj.index is not None and obj.index == self.device_index:
                    return torch.device, ("cuda", 0)
                return NotImplemented
            return super().reducer_override(obj)

    return WirePickler


@contextlib.contextmanager
def wire(device_index: int | None = None) -> Iterator[None]:
    """Within: ``GraphPickler.dumps`` pickles with compileq's wire pickler.

    ``device_index``: the graph's CUDA index, written as 0 (None: leave devices as they are).
    """
    from torch.fx import _graph_pickler

    base = _graph_pickler.GraphPickler
    original = base.__dict__["dumps"]
    pickler = type("WirePickler", (_pickler_class(),), {"device_index": device_index})
    fields = {f.name for f in dataclasses.fields(_graph_pickler.Options)}

    def dumps(cls: Any, obj: object, options: Any = None) -> bytes:
        if options is None:
            # Inductor's default filters guard its caches, read by any torch; a worker runs
            # this very torch (routing guarantees it), so torch's own prims may travel too.
            options = (
                _graph_pickler.Options(ops_filter=carries)
                if "ops_filter" in fields
                else _graph_pickler.Options()
            )
        return original.__func__(pickler, obj, options)  # type: ignore[no-any-return]

    base.dumps = classmethod(dumps)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        base.dumps = original  # type: ignore[method-assign]
