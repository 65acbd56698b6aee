"""Remote FX codegen: Inductor's out-of-process compile, with a worker as the other process.

Inductor already knows how to lower and generate a graph in another process: with
``fx_compile_mode`` SUBPROCESS, ``fx_codegen_and_compile`` builds the ``_SubprocessFxCompile``
it imports from ``compile_fx_subproc`` at call time, pickles the graph
(``serialize_compile``), hands the bytes to ``_send_to_child_async`` and loads the output code
that comes back. compileq sets that mode and puts ``fx_scheme.RemoteFxCompile`` where the
class is imported from, so the "subprocess" is a worker whose toolchain, CPU vector ISAs and
GPU target equal this machine's. The rejected alternative, wrapping ``fx_codegen_and_compile``
itself, would copy Inductor's choice of scheme and its signature, which changes between
releases (2.13 added ``compile_region_name``); the two names patched here, and the
``_OutOfProcessFxCompile`` interface, are the same in every release that has them.

Whatever stands in the way (a graph Inductor will not pickle, no live worker, Redis or the
broker down, the worker's compile failing, the deadline passing) the graph is compiled in this
process by Inductor's own ``_InProcessFxCompile``, exactly as without compileq, and the reason
is logged once. The client loading the output code then asks for its kernels again; the worker
stored them under the same keys, so they are cache hits. A graph whose codegen failed on a
worker before (same graph, toolchain and compileq) is compiled in process at once, without
another try: the worker left a verdict that the round trip reads with the output
(``cache/verdicts.py``, ``known-failure``).

Here: where a graph's job goes (``choose_route``), what travels with it besides the pickled
graph (``forwarded_env``, ``codegen_state``), and how a fallback is counted (``fell_back``).
The round trip itself (single flight on the job's key, the signed job, the wait for the
worker's announcement) is every job kind's: ``scheduler/roundtrip.py``. ``scheme.py`` imports
this module, never the other way round: the installing below is handed its class
(``RemoteFx.using``, by ``features.py``).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis

from compileq._log import log, warn_once
from compileq.cache import verdicts
from compileq.cache.counters import Counter, Reason, fallback
from compileq.fingerprint import FxToolchain, Target, fx_target, local_fx_toolchain
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target as TorchTarget  # fingerprint's is a GPU target
from compileq.scheduler import fx_join, roundtrip
from compileq.scheduler.client import KernelClient
from compileq.scheduler.fallback import Fallback
from compileq.tasks.device_index import tensor_devices
from compileq.tasks.fx_jobs import CODEGEN_ENV, CodegenState, FxJob
from compileq.tasks.queues import fx_queue

_COMPILE_FX = "torch._inductor.compile_fx"

_toolchains: dict[Target | None, FxToolchain] = {}


class Route:
    def __init__(
        self, queue: str, target: str, toolchain: FxToolchain, device_index: int | None = None
    ) -> None:
        self.queue, self.target, self.toolchain = queue, target, toolchain
        #: The graph's CUDA index; it travels as 0 (see tasks/device_index.py).
        self.device_index = device_index


def forwarded_env() -> dict[str, str]:
    """The Inductor variables set here that change what codegen writes (``CODEGEN_ENV``): they
    travel with the graph's job and are set around the worker's codegen."""
    return {name: os.environ[name] for name in CODEGEN_ENV if name in os.environ}


def codegen_state() -> CodegenState:
    """What codegen reads of this process beyond the pickled input (see ``CodegenState``)."""
    import torch
    from torch._inductor import utils

    read = getattr(utils, "get_donated_idxs", None)
    donated = read() if read is not None else None
    return CodegenState(torch.get_num_threads(), None if donated is None else tuple(donated))


def unserializable(what: str) -> Fallback:
    """The fallback of a graph Inductor will not pickle (``what``: the part that fails)."""
    return Fallback(
        Reason.UNSERIALIZABLE,
        "Inductor will not serialize a graph"
        + (f": {what} cannot be pickled" if what else " (its debug log says why)"),
    )


def fell_back(error: Fallback) -> None:
    """Say once per reason (and scope) that a graph compiles in process; count it."""
    warn_once(f"fx-{error.topic}", "compileq: %s; compiling the graph in process", error)
    installed = client()
    if installed is not None and not installed.redis_down():
        counts = {Counter.FALLBACKS: 1}
        if error.reason is Reason.KNOWN_FAILURE:
            counts[Counter.FX_KNOWN_FAILURES] = 1
        with contextlib.suppress(redis.RedisError):
            installed.store.count(counts, None, [fallback(error.reason)])


def fx_job(route: Route, job: FxJob) -> roundtrip.Job:
    """``job`` as the round trip sends it, to ``route``'s queue, with the key where a worker
    whose codegen of the graph failed left its verdict (``cache/verdicts.py``)."""
    key = job.key()
    return roundtrip.Job(roundtrip.FX, key, route.queue, job.to_bytes, verdicts.key(key))


# -- routing ----------------------------------------------------------------------------------


def graph_devices(gm: Any, example_inputs: Sequence[Any]) -> tuple[Target | None, bool, int | None]:
    """The GPU a graph's code is generated for (None for a CPU-only graph), whether any
    of its tensors is on the CPU (then C++ may be generated too), and the GPU's index.

    Read from the example inputs and every node's fake value, so a graph that creates GPU
    tensors from CPU inputs still counts as a GPU graph.
    """
    import torch

    devices = tensor_devices(gm, example_inputs)
    gpus = {d for d in devices if d.type != "cpu"}
    cpu = any(d.type == "cpu" for d in devices)
    if not gpus:
        return None, True, None
    if len(gpus) > 1 or next(iter(gpus)).type != "cuda":
        raise Fallback(
            Reason.DEVICE, f"graph on devices compileq does not route ({sorted(map(str, gpus))})"
        )
    index = next(iter(gpus)).index
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        # Not normalised: the index rewriting knows CUDA's code only.
        return Target("hip", props.gcnArchName.split(":")[0], props.warp_size), cpu, None
    return Target("cuda", str(props.major * 10 + props.minor), props.warp_size), cpu, index


def choose_route(client: KernelClient | None, gm: Any, example_inputs: Sequence[Any]) -> Route:
    """Where the graph's job goes (through ``client``, None while remote FX codegen is off);
    raises ``Fallback`` where it cannot go."""
    if client is None:
        raise Fallback(Reason.NO_WORKER, "remote FX codegen is not set up in this process")
    if client.redis_down():
        raise Fallback(Reason.REDIS, f"Redis at {client.settings.redis_display} is down")
    client.release_orphans()  # Redis may be back from a failure that kept us from releasing
    gpu, cpu, index = graph_devices(gm, example_inputs)
    if index:
        from torch._inductor import config

        if config.cpp_wrapper:
            raise Fallback(
                Reason.DEVICE,
                f"C++ wrapper code for cuda:{index} (only cuda:0 travels)",
                scope="cpp-wrapper",
            )
    toolchain = _toolchains.get(gpu)
    if toolchain is None:
        toolchain = _toolchains[gpu] = local_fx_toolchain(gpu)
    target = fx_target(gpu, cpu)
    queue = fx_queue(toolchain, target)
    try:
        live = client.router.has_worker(queue)
        if not live and (gpu is None or cpu):  # a CPU FX queue may be about to join
            joining = fx_join.pending_queue(toolchain, gpu)
            live = fx_join.joined_in_time(client.router, queue, joining, client.settings.deadline_s)
        if not live:
            why = client.router.why_unserved_fx(target, toolchain)
    except redis.RedisError as e:
        client.redis_failed(e)
        raise Fallback(Reason.REDIS, f"Redis failed ({e})") from e
    if not live:
        raise Fallback(
            Reason.NO_WORKER, f"no live worker for FX queue {queue} ({why})", scope=queue
        )
    return Route(queue, target, toolchain, index)


# -- install ----------------------------------------------------------------------------------


_COMPILE_FX_EXT = "torch._inductor.compile_fx_ext"
_PICKLER = "torch.fx._graph_pickler"
#: What ``scheme.RemoteFxCompile`` overrides and calls of Inductor's out-of-process compile.
_GRAPH = ("self", "gm", "example_inputs", "inputs_to_check", "graph_kwargs")


class RemoteFx(Feature):
    """Route FX codegen to workers, now or as soon as ``compile_fx`` has finished loading.

    ``compileq run`` installs compileq while ``compile_fx`` is still importing
    ``async_compile``: patching its globals then would be undone by the rest of its module
    body, and ``compile_fx_ext`` cannot be imported yet. So the patch waits until the module
    defines ``fx_codegen_and_compile`` (the only later assignment of ``fx_compile_mode`` is
    above it); ``compileq run`` calls install() again once ``compile_fx`` has loaded.
    """

    name = "remote-fx"
    # Used where torch has them: compile_fx's fx_compile_async and fx_compile_progressive,
    # utils.get_donated_idxs, the compile's compile_region_name (2.13).
    targets = (
        TorchTarget(_COMPILE_FX, "fx_codegen_and_compile"),
        TorchTarget(_COMPILE_FX, "fx_compile_mode"),
        TorchTarget(_COMPILE_FX, "FxCompileMode.NORMAL"),
        TorchTarget(_COMPILE_FX, "FxCompileMode.SUBPROCESS"),
        TorchTarget(_COMPILE_FX, "_InProcessFxCompile.codegen_and_compile", _GRAPH),
        TorchTarget("torch._inductor.compile_fx_subproc", "_SubprocessFxCompile"),
        TorchTarget(_COMPILE_FX_EXT, "_OutOfProcessFxCompile.codegen_and_compile", _GRAPH),
        TorchTarget(_COMPILE_FX_EXT, "_OutOfProcessFxCompile.serialize_compile", _GRAPH),
        TorchTarget(
            _COMPILE_FX_EXT,
            "_OutOfProcessFxCompile._send_to_child_async",
            ("self", "pickled_input"),
        ),
        TorchTarget(_COMPILE_FX_EXT, "_OutOfProcessFxCompile._postprocess", ("self", "output")),
        TorchTarget(_COMPILE_FX_EXT, "_WireProtocolPickledInput"),
        TorchTarget(_COMPILE_FX_EXT, "_WireProtocolPickledOutput.__init__", ("self", "value")),
        TorchTarget(
            _COMPILE_FX_EXT, "_WireProtocolPickledOutput.deserialize", ("self", "constants")
        ),
        TorchTarget(_COMPILE_FX_EXT, "_current_fake_mode"),
        TorchTarget(
            "torch._inductor.output_code",
            "CompiledFxGraph.after_deserialization",
            ("self", "constants"),
        ),
        # The job's key (codegen/fx_key.py).
        TorchTarget(
            "torch._inductor.codecache",
            "FxGraphHashDetails.__init__",
            ("self", "gm", "example_inputs", "fx_kwargs", "inputs_to_check"),
        ),
        TorchTarget(
            "torch._inductor.codecache",
            "FxGraphCachePickler.__init__",
            ("self", "gm", "has_user_defined_triton_kernels"),
        ),
        # compileq's wire (tasks/fx_wire.py).
        TorchTarget(_PICKLER, "GraphPickler.dumps", ("cls", "obj", "options")),
        TorchTarget(_PICKLER, "GraphPickler.loads", ("data", "fake_mode")),
        TorchTarget(_PICKLER, "GraphPickler.reducer_override", ("self", "obj")),
        TorchTarget(_PICKLER, "Options"),
        TorchTarget(_PICKLER, "_TensorPickleData.__init__", ("self", "describer", "t")),
        TorchTarget(_PICKLER, "_TensorPickleData.unpickle", ("self", "unpickle_state")),
    )

    def __init__(self) -> None:
        super().__init__()
        #: Makes the class put where Inductor imports ``_SubprocessFxCompile`` from
        #: (``scheme.RemoteFxCompile``), handed over by ``features.py``: ``scheme`` imports
        #: this module, so this one may not import it (the layers contract), and it can be
        #: imported only once ``compile_fx`` has loaded.
        self.scheme: Callable[[], type] | None = None

    def using(self, scheme: Callable[[], type]) -> RemoteFx:
        """This feature, installing the class ``scheme()`` makes."""
        self.scheme = scheme
        return self

    def wanted(self, ctx: Context) -> bool:
        return ctx.fx and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_COMPILE_FX: self._activate}

    @property
    def active(self) -> bool:
        return self.patches.wrapped(sys.modules.get(_COMPILE_FX), "fx_compile_mode")

    def _activate(self, module: Any) -> None:
        if self.client is None or self.active or not hasattr(module, "fx_codegen_and_compile"):
            return
        ext = sys.modules.get(_COMPILE_FX_EXT)
        if ext is not None and not hasattr(ext, "_OutOfProcessFxCompile"):
            # A script that imports compile_fx_ext first loads compile_fx from inside it:
            # importing compile_fx_subproc now would import the half-made compile_fx_ext and
            # fail the script's own import. So activate at the first graph codegen, which looks
            # fx_codegen_and_compile up in compile_fx's globals at each call.
            self.patches.before_first_call(
                module, "fx_codegen_and_compile", lambda: self._activate(module)
            )
            return
        try:
            self._patch(module)
        except Exception as e:  # compileq may leave codegen where it is, never fail an import
            warn_once("fx-activate", "compileq: FX codegen stays in process (%s)", e)

    def _patch(self, module: Any) -> None:
        from torch._inductor import compile_fx_subproc

        if self.scheme is None:
            raise RuntimeError("no FX compile scheme given (see features.py)")
        remote_fx_compile = self.scheme()
        if module.fx_compile_mode != module.FxCompileMode.NORMAL or any(
            getattr(module, flag, False) for flag in ("fx_compile_async", "fx_compile_progressive")
        ):
            warn_once(
                "fx-mode",
                "compileq: TORCHINDUCTOR_FX_COMPILE_MODE is set; leaving FX codegen to Inductor",
            )
            return
        self.patches.set(compile_fx_subproc, "_SubprocessFxCompile", remote_fx_compile)
        self.patches.set(module, "fx_compile_mode", module.FxCompileMode.SUBPROCESS)
        log.info("compileq: FX codegen goes to workers")


FEATURE = RemoteFx()


def client() -> KernelClient | None:
    """The client FX codegen goes to workers through; None while the feature is off."""
    return cast("KernelClient | None", FEATURE.client)


def active() -> bool:
    """Whether Inductor's FX codegen is routed to workers now."""
    return FEATURE.active
