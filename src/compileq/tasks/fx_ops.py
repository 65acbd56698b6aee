"""Which ops an FX graph may carry on compileq's wire to a worker.

Inductor pickles graphs with ``GraphPickler``, whose default ops filter admits only
``torch.ops.aten`` and ``torch.ops.fbgemm``: that filter guards Inductor's *caches*, whose
entries may be unpickled by any torch. A graph holding anything else (``prims.iota``, which
every ``torch.arange`` becomes) makes ``serialize_compile`` give up, and the graph is compiled
in the client. On compileq's wire the reader is a worker whose toolchain digest names the same
torch build (routing guarantees it), so torch's own ``prims`` ops resolve there too. Ops from
user libraries (``torch.ops.mylib``) stay refused: a worker has not imported the library that
registers them, and the graph falls back to the client as before.

Rejected alternative: ``ops_filter=None`` (everything). A graph with a user op would then fail
on the worker instead of in the client, costing a round trip and a worker failure per graph.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

#: ``torch.ops`` namespaces that ship inside torch itself (stock's ``aten`` and ``fbgemm``,
#: plus ``prims``).
WIRE_NAMESPACES = frozenset({"aten", "fbgemm", "prims"})


def carries(op_name: str) -> bool:
    """True for an op the wire may carry; names come as ``torch.ops.ns.op`` or ``ns.op``."""
    return op_name.removeprefix("torch.ops.").split(".", 1)[0] in WIRE_NAMESPACES


@contextlib.contextmanager
def wire_ops() -> Iterator[None]:
    """Within: ``GraphPickler.dumps`` without explicit options uses compileq's ops filter.

    Inductor calls ``GraphPickler.dumps(self)`` deep inside ``serialize()`` with no way to pass
    options, so the default is swapped for the duration (one compile at a time per process:
    Inductor's codegen and a prefork worker's task both run on one thread).
    """
    from torch.fx import _graph_pickler

    if "ops_filter" not in {f.name for f in dataclasses.fields(_graph_pickler.Options)}:
        yield  # a torch without the filter pickles every op already
        return
    pickler = _graph_pickler.GraphPickler
    original = pickler.__dict__["dumps"]

    def dumps(cls: Any, obj: object, options: Any = None) -> bytes:
        chosen = options if options is not None else _graph_pickler.Options(ops_filter=carries)
        return original.__func__(cls, obj, chosen)  # type: ignore[no-any-return]

    pickler.dumps = classmethod(dumps)  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        pickler.dumps = original  # type: ignore[method-assign]
