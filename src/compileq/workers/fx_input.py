"""A graph's pickled input as a worker's codegen reads it: Inductor's own wire input, with the
one virtualized value the wire leaves out set as the client had it.

Inductor's child side of an out-of-process compile (``compile_fx_ext._run_in_child``) enters
the virtualized values the input carries (``_VirtualizedSerializer``: ``ops``, ``kernel``,
``current_node``, ...) and poisons every other one for the whole compile, so that a read the
wire did not foresee raises. ``V.interpreter`` is among them; in process it is Inductor's
default ``NullHandler`` for the whole compile (only a loop body's run sets it, and puts it back),
and ``CSEProxy._bound_variable`` reads it on every ops call, asking ``isinstance(V.interpreter,
NullHandler)``. Inside a loop body that is the body's interpreter either way; outside one, the
read raises on the worker. Triton's mix-order reduction, which fuses a LayerNorm backward's row
gradient with its weight and bias sums (channels-last convnets and transformers, rows x columns
over about five million), generates its accumulation outside any loop body: timm's
convnext_tiny failed on the worker with "Attempt to use poisoned virtualized value
'interpreter'" and compiled again in the training process. Stock's own
``TORCHINDUCTOR_FX_COMPILE_MODE=SERIALIZE`` fails the same way.

So the input here sets ``interpreter`` to a ``NullHandler``: what any client had when it
serialized its graph (serialization runs outside every loop body). The rejected alternatives:
the ``GraphLowering`` as the interpreter (``_bound_variable`` would then read its current node,
and the code would differ from the client's); and leaving the read poisoned with the mix-order
reduction switched off on workers (the kernels would differ from the ones the client would
have generated). The other poisoned values stay poisoned until a read of one shows up: a
guessed value there could change the code silently.
"""

from __future__ import annotations

from typing import Any

from torch._inductor.compile_fx_ext import _WireProtocolPickledInput


def as_in_process(virtualized: Any) -> Any:
    """``virtualized`` (a ``_VirtualizedSerializer``) with ``interpreter`` as a client's own
    compile has it, Inductor's ``NullHandler``."""
    from torch._inductor.virtualized import NullHandler

    virtualized.interpreter = NullHandler()
    return virtualized


class ClientsInput(_WireProtocolPickledInput):  # type: ignore[misc]
    """The job's pickled input, deserialized with ``as_in_process`` applied."""

    def deserialize(self) -> Any:
        result = super().deserialize()
        as_in_process(result.virtualized)
        return result
