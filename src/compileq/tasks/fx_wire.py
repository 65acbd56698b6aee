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

from compileq.hooks.ledger import Patches
from compileq.tasks import portable
from compileq.tasks.fx_ops import carries


@functools.cache
def _pickler_class() -> type:
    from torch._subclasses.fake_tensor import FakeTensor
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
            if isinstance(obj, FakeTensor) and obj._is_view():
                return _view_reduced(self, obj)
            return super().reducer_override(obj)

    return WirePickler


def _view_reduced(pickler: Any, view: Any) -> Any:
    """A fake view as torch's pickler writes any fake tensor, less its base's fake mode.

    Torch's ``_TensorPickleData`` drops the tensor's own fake mode (the unpickling side puts
    its own on the tensor and on its base) but keeps the base's, which does not pickle
    (torch 2.11 and 2.13): every graph with a view among its example inputs fell back to an
    in-process compile. On two H200s, a DDP frame compiled again after a misprediction had
    eight such graphs on rank 1.
    """
    from torch.fx._graph_pickler import _TensorPickleData

    data = _TensorPickleData(pickler._meta_tensor_describer, view)
    base = data.metadata.base
    if base is not None:
        data.metadata = dataclasses.replace(
            data.metadata, base=dataclasses.replace(base, fake_mode=None)
        )
    return _TensorPickleData.unpickle, (data, pickler._unpickle_state)


#: ``GraphPickler.dumps`` as compileq's wire writes it, for the length of ``wire()``.
_WIRE = Patches("fx-wire")


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

    with _WIRE.swapped(base, "dumps", classmethod(dumps)):
        yield


def unpicklable(gm: Any, example_inputs: Any, graph_kwargs: Any, device_index: int | None) -> str:
    """What of a compile's input Inductor could not pickle, named for the fallback's message:
    the first part (the tracing context's fields, the example inputs, the compile's keywords,
    each node's metadata) that fails on its own, with its error. Asked only after a failure,
    so its cost is a failed compile's; empty where every part pickles alone."""
    try:
        return _first_unpicklable(gm, example_inputs, graph_kwargs, device_index)
    except Exception as e:  # naming the culprit must never fail what falls back anyway
        return f"(not found: {type(e).__name__}: {e})"


def _first_unpicklable(
    gm: Any, example_inputs: Any, graph_kwargs: Any, device_index: int | None
) -> str:
    import torch
    from torch.fx._graph_pickler import GraphPickler

    context = torch._guards.TracingContext.try_get()
    fields = (
        "module_context",
        "frame_summary_stack",
        "params_flat",
        "output_strides",
        "params_flat_unwrap_subclasses",
        "params_unwrapped_to_flat_index",
    )
    parts: list[tuple[str, object]] = [
        (f"the tracing context's {name}", getattr(context, name, None)) for name in fields
    ]
    parts += [(f"example input {i}", value) for i, value in enumerate(example_inputs)]
    parts += [(f"compile keyword {name!r}", value) for name, value in graph_kwargs.items()]
    for node in getattr(getattr(gm, "graph", None), "nodes", ()):
        parts += [(f"node {node.name}'s meta[{key!r}]", value) for key, value in node.meta.items()]
    with wire(device_index):
        for what, value in parts:
            try:
                GraphPickler.dumps(value)
            except Exception as e:
                return f"{what} ({type(value).__name__}: {type(e).__name__}: {e})"
    return ""
