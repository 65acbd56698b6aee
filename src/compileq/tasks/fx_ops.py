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

#: ``torch.ops`` namespaces that ship inside torch itself (stock's ``aten`` and ``fbgemm``,
#: plus ``prims``).
WIRE_NAMESPACES = frozenset({"aten", "fbgemm", "prims"})


def carries(op_name: str) -> bool:
    """True for an op the wire may carry; names come as ``torch.ops.ns.op`` or ``ns.op``."""
    return op_name.removeprefix("torch.ops.").split(".", 1)[0] in WIRE_NAMESPACES
