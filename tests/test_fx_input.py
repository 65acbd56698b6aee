"""The input a worker's codegen reads (workers/fx_input.py): Inductor's wire leaves
``V.interpreter`` out and poisons it for the whole compile; the worker's input sets it as a
client's own compile has it, Inductor's ``NullHandler``. Real torch; the GPU graph that read it
(a LayerNorm backward fused as a mix-order reduction) is tests/test_gpu.py's."""

from __future__ import annotations

import pytest
from torch._inductor.compile_fx_ext import _VirtualizedSerializer
from torch._inductor.virtualized import NullHandler, V

from compileq.workers.fx_input import ClientsInput, as_in_process


def test_inductors_own_wire_leaves_the_interpreter_poisoned_for_the_compile() -> None:
    with _VirtualizedSerializer.serialize().patch(), pytest.raises(RuntimeError, match="poison"):
        _ = V.interpreter


def test_the_workers_input_gives_codegen_the_interpreter_a_client_has() -> None:
    assert isinstance(V.interpreter, NullHandler)  # what any client serializes beside
    with as_in_process(_VirtualizedSerializer.serialize()).patch():
        assert isinstance(V.interpreter, NullHandler)
        assert V.kernel is not None  # what the wire carries is entered as before
        with pytest.raises(RuntimeError, match="poison"):
            _ = V.real_inputs  # and what it does not, still poisoned


def test_the_workers_input_is_inductors_wire_input() -> None:
    from torch._inductor.compile_fx_ext import _WireProtocolPickledInput

    assert issubclass(ClientsInput, _WireProtocolPickledInput)
    assert ClientsInput(b"bytes").value == b"bytes"
