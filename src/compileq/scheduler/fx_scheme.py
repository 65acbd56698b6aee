"""The FX compile scheme Inductor runs when compileq routes codegen to workers.

Kept apart from fx_remote because it subclasses ``compile_fx_ext._OutOfProcessFxCompile``,
which can be imported only once ``compile_fx`` has finished loading (see fx_remote.enable).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from torch._inductor.compile_fx_ext import (
    _OutOfProcessFxCompile,
    _WireProtocolPickledInput,
    _WireProtocolPickledOutput,
)

from compileq.scheduler import fx_remote
from compileq.scheduler.fx_remote import Fallback, Route
from compileq.tasks.fx_jobs import FxJob
from compileq.tasks.fx_ops import wire_ops


class RemoteFxCompile(_OutOfProcessFxCompile):  # type: ignore[misc]
    """Inductor's out-of-process FX compile, with a compileq worker as the child."""

    _route: Route | None = None

    def codegen_and_compile(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> Any:
        fx_remote.mark_remote(False)
        try:
            self._route = fx_remote.choose_route(gm, example_inputs)
            return super().codegen_and_compile(gm, example_inputs, inputs_to_check, graph_kwargs)
        except Fallback as e:
            # Raised before Inductor touched anything of the graph's (routing, or waiting
            # for the worker): compiling it here now is the same compile stock would run.
            fx_remote.fell_back(e)
        return self._in_process(gm, example_inputs, inputs_to_check, graph_kwargs)

    def _in_process(
        self, gm: Any, example_inputs: Sequence[Any], inputs_to_check: Sequence[int], kwargs: Any
    ) -> Any:
        """What stock runs in its default mode, with the region name stock would give it."""
        from torch._inductor.compile_fx import _InProcessFxCompile

        local = _InProcessFxCompile()
        if hasattr(self, "compile_region_name"):  # set by 2.13's fx_codegen_and_compile
            local.compile_region_name = self.compile_region_name
        return local.codegen_and_compile(gm, example_inputs, inputs_to_check, kwargs)

    def serialize_compile(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> Any:
        import torch
        from torch._inductor import config

        # CPU codegen writes this machine's thread count into the kernels when cpp.threads is
        # unset (-1): pin it in the config that travels, or a worker with other cores would
        # write code for its own machine. It is the value stock would use here.
        pinned = {"cpp.threads": torch.get_num_threads()} if config.cpp.threads < 1 else {}
        with config.patch(pinned), wire_ops():
            serialized = super().serialize_compile(
                gm, example_inputs, inputs_to_check, graph_kwargs
            )
        if serialized is None:  # the base class now compiles in process, exactly as stock
            fx_remote.fell_back(
                Fallback(
                    "fx-unserializable",
                    "Inductor will not serialize a graph (its debug log says why)",
                )
            )
        return serialized

    def _send_to_child_async(
        self, pickled_input: _WireProtocolPickledInput
    ) -> Future[_WireProtocolPickledOutput]:
        # Resolved before it is returned: Inductor's _send_to_child waits on it at once, and
        # compileq stays out of Inductor's async FX modes (fx_remote._activate), the only
        # callers that would use the time in between.
        route, client = self._route, fx_remote.client()
        if route is None or client is None:
            raise Fallback("fx-off", "remote FX codegen is not set up in this process")
        job = FxJob(
            route.target, route.toolchain.digest, pickled_input.value, fx_remote.codegen_env()
        )
        output = fx_remote.run_remote(client, job, route.queue)
        fx_remote.mark_remote(True)
        future: Future[_WireProtocolPickledOutput] = Future()
        future.set_result(_WireProtocolPickledOutput(output))
        return future
