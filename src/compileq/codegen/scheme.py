"""The FX compile scheme Inductor runs when compileq routes codegen to workers.

Kept apart from ``remote`` because it subclasses ``compile_fx_ext._OutOfProcessFxCompile``,
which can be imported only once ``compile_fx`` has finished loading (see ``remote.RemoteFx``).
It imports ``remote`` (routing, what travels with a job, fallbacks) and the round trip
(``scheduler/roundtrip.py``); neither imports it: ``features.py`` hands it to ``RemoteFx``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any, NoReturn

from torch._inductor.compile_fx_ext import (
    _OutOfProcessFxCompile,
    _WireProtocolPickledInput,
    _WireProtocolPickledOutput,
)

from compileq import keys
from compileq._log import log
from compileq.cache.counters import Counter, Reason
from compileq.codegen import deferred, fx_key, remote, speculative
from compileq.codegen.remote import Route
from compileq.scheduler import boundary, remote_mark, roundtrip
from compileq.scheduler.client import KernelClient
from compileq.scheduler.fallback import Fallback
from compileq.tasks import device_index, portable
from compileq.tasks.fx_jobs import FxJob
from compileq.tasks.fx_wire import unpicklable, wire


class RemoteFxCompile(_OutOfProcessFxCompile):  # type: ignore[misc]
    """Inductor's out-of-process FX compile, with a compileq worker as the child."""

    _route: Route | None = None
    _graph_key: str | None = None
    #: Set once Inductor's own in-process compile of this graph has begun: an error from
    #: then on is the graph's, not compileq's (see ``boundary.guard``).
    _stock_ran: bool = False

    def _in_process(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> Any:
        """What stock runs in its default mode, with the region name stock would give it."""
        from torch._inductor.compile_fx import _InProcessFxCompile

        self._stock_ran = True
        local = _InProcessFxCompile()
        if hasattr(self, "compile_region_name"):  # set by 2.13's fx_codegen_and_compile
            local.compile_region_name = self.compile_region_name
        return local.codegen_and_compile(gm, example_inputs, inputs_to_check, graph_kwargs)

    @boundary.guard(
        "FX codegen", instead=_in_process, genuine=lambda self, *_, **__: self._stock_ran
    )
    def codegen_and_compile(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> Any:
        if speculative.speculating():
            self._send_ahead(gm, example_inputs, inputs_to_check, graph_kwargs)
        remote_mark.mark_remote(False)
        self._stock_ran = False
        try:
            _, graph_key = self._route_and_key(gm, example_inputs, inputs_to_check, graph_kwargs)
            log.debug(
                "compileq: graph %s (backward: %s)", graph_key, graph_kwargs.get("is_backward")
            )
            strides = deferred.assumed(gm, example_inputs, graph_kwargs)
            if strides is None:
                return super().codegen_and_compile(
                    gm, example_inputs, inputs_to_check, graph_kwargs
                )
            serialized = self.serialize_compile(gm, example_inputs, inputs_to_check, graph_kwargs)
            if serialized:  # else counted as a fallback by serialize_compile
                pickled, constants = serialized
                return self._send_and_defer(pickled, constants, strides)
        except Fallback as e:
            # Raised before Inductor touched anything of the graph's (routing, or waiting
            # for the worker): compiling it here now is the same compile stock would run.
            remote.fell_back(e)
        return self._in_process(gm, example_inputs, inputs_to_check, graph_kwargs)

    def _send_and_defer(
        self,
        pickled: _WireProtocolPickledInput,
        constants: Any,
        strides: list[tuple[int, ...] | None],
    ) -> Any:
        """Send this DDP subgraph's forward and let the compile go on without its output, with
        ``strides`` (see ``deferred``); an output already in the store is loaded at once."""
        client, route, job = self._routed_job(pickled)
        output = roundtrip.found_or_sent(client, job, speculative.forward_sent)
        remote_mark.mark_remote(True)
        if output is not None:
            return self._loaded(output, route.device_index, constants)

        def fetch(others: Mapping[str, roundtrip.Early]) -> Any:
            output = roundtrip.fetch(client, job, others=others)
            return self._loaded(output, route.device_index, constants)

        return deferred.defer(fetch, strides, keys.early(job.key))

    def _loaded(self, output: bytes, index: int | None, constants: Any) -> Any:
        """The worker's output as Inductor's own out-of-process compile loads it."""
        from torch._inductor.output_code import CompiledFxGraph

        loaded = _ClientOutput(output, index).deserialize(constants)
        if isinstance(loaded.graph, CompiledFxGraph):
            loaded.graph.compile_region_name = getattr(self, "compile_region_name", None)
        self._postprocess(loaded)
        return loaded.graph

    def _send_ahead(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> NoReturn:
        """Send this graph's job without waiting for it (see ``speculative``); then stop the
        compile. Anything in the way only means nothing is sent: the real compile decides."""
        try:
            route, graph_key = self._route_and_key(
                gm, example_inputs, inputs_to_check, graph_kwargs
            )
            client = remote.client()
            # Without Inductor's hash the key is the pickled bytes, which differ from process
            # to process and call to call: the real compile would never find the job.
            if graph_key is not None and client is not None:
                serialized = self._serialize(gm, example_inputs, inputs_to_check, graph_kwargs)
                job = None if serialized is None else self._job(route, serialized[0], graph_key)
                if job is not None and roundtrip.send_ahead(client, job):
                    client.store.count({Counter.FX_SENT_AHEAD: 1})
                    log.debug("compileq: backward %s sent ahead", graph_key)
        except Exception as e:
            log.debug("compileq: backward not sent ahead: %s: %s", type(e).__name__, e)
        raise speculative.Sent

    def _route_and_key(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> tuple[Route, str | None]:
        """Where this graph's job goes, and its key (Inductor's hash for ``cuda:0``): kept for
        ``serialize_compile`` and ``_send_to_child_async``, which Inductor calls in between."""
        self._route = remote.choose_route(remote.client(), gm, example_inputs)
        self._graph_key = fx_key.graph_key(
            gm, example_inputs, graph_kwargs, inputs_to_check, self._route.device_index
        )
        return self._route, self._graph_key

    def _serialize(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> Any:
        """Inductor's pickled input, written for compileq's wire (see ``fx_wire``)."""
        route = self._route
        with wire(route.device_index if route else None):
            return super().serialize_compile(gm, example_inputs, inputs_to_check, graph_kwargs)

    def _job(
        self, route: Route, pickled: _WireProtocolPickledInput, graph_key: str | None
    ) -> roundtrip.Job:
        """The graph's job, as the round trip sends it to ``route``'s queue."""
        job = FxJob(
            route.target,
            route.toolchain.digest,
            pickled.value,
            remote.forwarded_env(),
            graph_key,
            remote.codegen_state(),
        )
        return remote.fx_job(route, job)

    def serialize_compile(
        self,
        gm: Any,
        example_inputs: Sequence[Any],
        inputs_to_check: Sequence[int],
        graph_kwargs: Any,
    ) -> Any:
        serialized = self._serialize(gm, example_inputs, inputs_to_check, graph_kwargs)
        if serialized is None:  # the base class now compiles in process, exactly as stock
            self._stock_ran = True
            route = self._route
            what = unpicklable(
                gm, example_inputs, graph_kwargs, route.device_index if route else None
            )
            remote.fell_back(remote.unserializable(what))
        return serialized

    def _routed_job(
        self, pickled: _WireProtocolPickledInput
    ) -> tuple[KernelClient, Route, roundtrip.Job]:
        """The client, this graph's route (``_route_and_key``) and its job."""
        route, client = self._route, remote.client()
        if route is None or client is None:
            raise Fallback(Reason.NO_WORKER, "remote FX codegen is not set up in this process")
        return client, route, self._job(route, pickled, self._graph_key)

    def _send_to_child_async(
        self, pickled_input: _WireProtocolPickledInput
    ) -> Future[_WireProtocolPickledOutput]:
        # Resolved before it is returned: Inductor's _send_to_child waits on it at once, and
        # compileq stays out of Inductor's async FX modes (RemoteFx._activate), the only
        # callers that would use the time in between.
        client, route, job = self._routed_job(pickled_input)
        # While the worker generates this graph, its backward (if it is a forward that
        # AOTAutograd partitioned just now) goes to the workers too.
        output = roundtrip.fetch(client, job, speculative.forward_sent)
        remote_mark.mark_remote(True)
        future: Future[_WireProtocolPickledOutput] = Future()
        future.set_result(_ClientOutput(output, route.device_index))
        return future


class _ClientOutput(_WireProtocolPickledOutput):  # type: ignore[misc]
    """A worker's output read back in the client: Inductor's ``deserialize``, with the code
    retargeted from ``cuda:0`` to the graph's own GPU before Inductor writes and loads it,
    and the client's own classes in place of their stand-ins."""

    def __init__(self, value: bytes, index: int | None) -> None:
        super().__init__(value)
        self.index = index

    def deserialize(self, constants: Any) -> Any:
        from torch._inductor.compile_fx_ext import _current_fake_mode
        from torch._inductor.output_code import CompiledFxGraph
        from torch.fx._graph_pickler import GraphPickler

        with portable.resolving():
            result = GraphPickler.loads(self.value, _current_fake_mode())
        graph = getattr(result, "graph", None)
        if isinstance(graph, CompiledFxGraph):
            if self.index:
                device_index.move_graph(graph, 0, self.index)
            graph.after_deserialization(constants)
        return result
