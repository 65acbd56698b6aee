"""A forward graph's output strides, as a worker stores them once its lowering fixed them.

Inductor knows the strides a graph's outputs will have once it has lowered the graph, early
in its codegen, and AOTAutograd restrides a backward's inputs to the strides of the
activations its forward saved (a convolution net's channels-last layout, padding). A worker
stores them under ``keys.early(job key)`` as soon as lowering ends, so the client waiting for
the forward can send the backward with its real inputs then, not after the whole codegen
(``codegen/speculative.py``). Only static strides travel; a symbolic one is sent as ``None``.

``parse`` reads a payload that came out of Redis: anything but a list of lists of
non-negative ints (or nulls), within bounds, is refused. A wrong value that verifies can only
send a backward nobody loads (a worker's codegen lost), never change what the client runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

#: Strides of one output each: None where the output is not a tensor or its strides symbolic.
Strides = list[tuple[int, ...] | None]

#: Bounds on what is read back: a graph's outputs, a tensor's dimensions.
_MAX_OUTPUTS = 100_000
_MAX_DIMS = 64


def encode(strides: Sequence[Sequence[int] | None]) -> bytes:
    return json.dumps([None if s is None else [int(x) for x in s] for s in strides]).encode()


def parse(payload: bytes) -> Strides | None:
    """The strides in ``payload``, or None for anything that is not a stride list."""
    try:
        obj = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    if not isinstance(obj, list) or len(obj) > _MAX_OUTPUTS:
        return None
    out: Strides = []
    for each in obj:
        if each is None:
            out.append(None)
            continue
        if not isinstance(each, list) or len(each) > _MAX_DIMS:
            return None
        # bool is an int to Python, and is no stride.
        if not all(type(x) is int and x >= 0 for x in each):
            return None
        out.append(tuple(each))
    return out
