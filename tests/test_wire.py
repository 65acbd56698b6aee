"""compileq's FX wire in isolation: stand-ins for the user's code, one device index, the
reasons fallbacks are counted under. (End to end: tests/test_user_scripts.py and
tests/test_gpu_ranks.py.)"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

from compileq import keys
from compileq.cache.counters import Reason
from compileq.codegen import remote
from compileq.errors import EntryTooLarge
from compileq.scheduler import roundtrip
from compileq.scheduler.fallback import Fallback
from compileq.tasks import device_index, events, fx_strides, portable
from compileq.tasks.fx_wire import unpicklable, wire
from compileq.tasks.portable import StandInCalled
from compileq.workers.lifecycle import failure_reason


class ScriptModule(torch.nn.Module):  # stands for a class of the user's script
    pass


def test_user_classes_and_functions_travel_as_stand_ins_and_torch_objects_by_reference() -> None:
    assert portable.needs_stand_in(ScriptModule)  # tests.* is no package a worker has
    assert portable.needs_stand_in(lambda x: x)
    assert not portable.needs_stand_in(torch.nn.Linear)
    assert not portable.needs_stand_in(torch.add)
    assert not portable.needs_stand_in(len)
    assert not portable.needs_stand_in(ScriptModule())  # instances travel by their class


def test_a_stand_in_keeps_the_names_codegen_reads_and_refuses_to_be_called() -> None:
    cls = portable.stand_in(portable.CLASS, "__main__", "Model.Block")
    assert (cls.__module__, cls.__qualname__, cls.__name__) == ("__main__", "Model.Block", "Block")
    assert portable.stand_in(portable.CLASS, "__main__", "Model.Block") is cls  # one per name
    assert isinstance(cls(1, key=2), portable.StandIn)  # whatever a pickle hands it
    fn = portable.stand_in(portable.FUNCTION, "models.llama", "rotary.<locals>.<lambda>")
    assert fn.__name__ == "<lambda>" and fn.__module__ == "models.llama"
    try:
        fn(1)
    except portable.StandInCalled as e:
        assert "models.llama.rotary.<locals>.<lambda>" in str(e)
    else:
        raise AssertionError("calling a stand-in function must raise")


def test_the_client_reads_its_own_classes_back_where_it_can_import_them() -> None:
    with portable.resolving():
        assert portable.stand_in(portable.CLASS, __name__, "ScriptModule") is ScriptModule
    assert portable.stand_in(portable.CLASS, __name__, "ScriptModule") is not ScriptModule


def test_a_pickle_naming_main_classes_loads_in_a_process_that_never_saw_them() -> None:
    from torch.fx._graph_pickler import GraphPickler

    meta = {"fwd_nn_module_stack": {"140": ("L['self'].block", ScriptModule)}, "f": lambda: 1}
    with wire():
        data = GraphPickler.dumps(meta)
    # A fresh interpreter: no tests.test_wire, no lambda, only compileq and torch.
    code = textwrap.dedent(
        """
        import pickle, sys
        meta = pickle.loads(sys.stdin.buffer.read())
        cls = meta["fwd_nn_module_stack"]["140"][1]
        print(cls.__module__, cls.__qualname__, meta["f"].__qualname__)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=data, capture_output=True, check=True
    ).stdout.decode()
    module, qualname, function = out.split()
    assert (module, qualname) == ("tests.test_wire", "ScriptModule")
    assert function.endswith(".<locals>.<lambda>")
    with wire():
        assert pickle.loads(data)["fwd_nn_module_stack"]["140"][0] == "L['self'].block"


def test_the_wire_writes_the_graphs_gpu_as_cuda_0_and_leaves_other_devices() -> None:
    from torch.fx._graph_pickler import GraphPickler

    devices = [torch.device("cuda", 3), torch.device("cpu"), torch.device("cuda", 1)]
    with wire(device_index=3):
        assert pickle.loads(GraphPickler.dumps(devices)) == [
            torch.device("cuda", 0),
            torch.device("cpu"),
            torch.device("cuda", 1),
        ]
    with wire():
        assert pickle.loads(GraphPickler.dumps(devices)) == devices


OUTPUT_CODE = """\
with torch.cuda._DeviceGuard(0):
    torch.cuda.set_device(0)
    buf0 = empty_strided_cuda((4, ), (1, ), torch.float32)
    stream0 = get_raw_stream(0)
    triton_poi_fused_0.run(arg0_1, buf0, 4, stream=stream0)
    buf1 = torch.empty((4,), device='cuda:0')
    x = torch.ones(2, device=device(type='cuda', index=0))
# %mm : Tensor "f32[4, 4][4, 1]cuda:0" = PlaceHolder[target=mm]
# %full : ... = call_function[target=torch.ops.aten.full.default](args = ([4], 0), kwargs = {device: cuda:0})
    triton_meta={'device': DeviceProperties(type='cuda', index=0, multi_processor_count=132, cc=90)}
    buf10 = stream10  # names that merely contain the digits stay
"""


def test_output_code_for_cuda_0_is_retargeted_to_cuda_k_and_back() -> None:
    retargeted = device_index.retarget_code(OUTPUT_CODE, 5)
    assert "_DeviceGuard(5)" in retargeted and "set_device(5)" in retargeted
    assert "stream5 = get_raw_stream(5)" in retargeted and "stream=stream5" in retargeted
    assert "device='cuda:5'" in retargeted and "index=5)" in retargeted
    assert "{device: cuda:5}" in retargeted
    assert 'cuda:5"' in retargeted and "DeviceProperties(type='cuda', index=5," in retargeted
    assert "buf10 = stream10" in retargeted and "buf0 = " in retargeted
    assert device_index.normalise_code(retargeted, 5) == OUTPUT_CODE
    assert device_index.retarget_code(OUTPUT_CODE, 0) == OUTPUT_CODE


def test_a_kernel_of_cuda_k_is_keyed_as_cuda_0() -> None:
    source = "@triton_heuristics.pointwise(triton_meta={'device': DeviceProperties(type='cuda', index=2, cc=90)})"
    assert device_index.kernel_index(source) == 2
    assert device_index.kernel_index(device_index.normalise_kernel(source)) == 0
    assert device_index.kernel_index("def cpu_kernel(): pass") is None


def test_fallbacks_are_counted_under_the_reason_an_operator_acts_on() -> None:
    # Each reason is set where the fallback is raised (routing, the round trip's end, the
    # worker's failure announcement), never read back from a message.
    from types import SimpleNamespace

    from compileq.fingerprint import fx_target, local_fx_toolchain
    from compileq.tasks.queues import fx_queue

    def reason(error: Callable[[], object]) -> Reason:
        with pytest.raises(Fallback) as caught:
            error()
        return caught.value.reason

    queue = fx_queue(local_fx_toolchain(None), fx_target(None, True))
    unserved = SimpleNamespace(
        redis_down=lambda: False,
        release_orphans=lambda: None,
        router=SimpleNamespace(
            has_worker=lambda q, fresh=False: False,
            live_count=lambda q, listed_in="queues": 0,  # nobody about to join either
            why_unserved_fx=lambda t, c: "none",
        ),
        settings=SimpleNamespace(deadline_s=60.0),
    )
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises(Fallback) as caught:
        remote.choose_route(unserved, gm, [torch.randn(2)])
    assert caught.value.reason is Reason.NO_WORKER
    assert caught.value.topic == f"no-worker:{queue}"  # said once per queue
    key = keys.artifact("fx", "0" * 64)
    job = roundtrip.Job(roundtrip.FX, key, queue, lambda: b"")
    sent = roundtrip.Sent(sent=[key])
    late = roundtrip.Waited(late=[key])
    assert reason(lambda: roundtrip.output(job, sent, late, 60)) is Reason.DEADLINE
    too_large = roundtrip.Sent(too_large={key: EntryTooLarge(key, 2, 1)})
    nothing = roundtrip.Waited()
    assert reason(lambda: roundtrip.output(job, too_large, nothing, 60)) is Reason.SIZE_CAP
    on_meta = [torch.empty(2, device="meta")]
    assert reason(lambda: remote.graph_devices(gm, on_meta)) is Reason.DEVICE
    assert remote.unserializable("a lock").reason is Reason.UNSERIALIZABLE

    def failed(error: BaseException) -> Reason:
        # What a worker announces for a build that raised (workers/lifecycle.failed), read
        # back from the channel as a client reads it.
        announced = events.Done(
            key, False, f"{type(error).__name__}: {error}", failure_reason(error)
        )
        done = events.parse(events.encode(announced))
        assert done is not None
        waited = roundtrip.Waited(failed={key: done})
        return reason(lambda: roundtrip.output(job, sent, waited, 60))

    assert failed(RuntimeError("CUDA out of memory")) is Reason.WORKER_ERROR
    assert failed(StandInCalled("codegen called __main__.f")) is Reason.UNIMPORTABLE
    wrapped = RuntimeError("lowering failed")  # as Inductor wraps what a lowering raised
    wrapped.__cause__ = ModuleNotFoundError("No module named 'user_models'")
    assert failed(wrapped) is Reason.UNIMPORTABLE
    # An unknown or forged reason on the channel counts as the worker's own error.
    forged = events.parse(json.dumps({"key": key, "ok": False, "error": "x", "reason": "nope"}))
    assert forged is not None and forged.reason is Reason.WORKER_ERROR


def test_what_a_graph_could_not_pickle_is_named_part_by_part() -> None:
    import threading

    gm = torch.fx.symbolic_trace(lambda x: (x + 1).relu())
    inputs = [torch.randn(3)]
    assert unpicklable(gm, inputs, {"is_backward": False}, None) == ""
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["held"] = threading.Lock()  # what no pickler writes
    found = unpicklable(gm, inputs, {}, None)
    assert found.startswith(f"node {node.name}'s meta['held'] (lock: TypeError")
    del node.meta["held"]
    assert unpicklable(gm, inputs, {"callback": threading.Lock()}, None).startswith(
        "compile keyword 'callback'"
    )


def test_a_fake_view_travels_with_its_base_in_the_other_sides_fake_mode() -> None:
    # Torch's own pickler keeps the base's fake mode, which does not pickle: a graph with a
    # view among its example inputs then compiled in process (rank 1 of a DDP job on H200s).
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler

    with FakeTensorMode():
        base = torch.empty(4, 6)
        view = base[:, 1:3]
    with wire():
        data = GraphPickler.dumps([view, base])
    there = FakeTensorMode()
    got_view, got_base = GraphPickler.loads(data, there)
    assert isinstance(got_view, FakeTensor) and got_view.fake_mode is there
    assert got_view._base is got_base
    assert (got_view.shape, got_view.stride(), got_view.storage_offset()) == ((4, 2), (6, 1), 1)


def test_a_forwards_early_strides_read_back_are_refused_unless_they_are_stride_lists() -> None:
    # What a worker stores once it lowered a forward (workers/fx_lowered.py), read back by the
    # waiting client (codegen/speculative.py): a stride list per output, None where symbolic.
    strides = [(8, 1, 64, 8), None, (4, 1)]
    assert fx_strides.parse(fx_strides.encode(strides)) == strides
    assert fx_strides.parse(b"[]") == []
    # Anything else that verified (a worker's bug, another version) sends nothing.
    for junk in (
        b"",
        b"not json",
        b'{"strides": []}',
        b"[[1, -2]]",
        b"[[1, true]]",
        b"[[1.5]]",
        b'[["1"]]',
        b"[1, 2]",
        json.dumps([[1] * 65]).encode(),
        b"[" * 100_000 + b"]" * 100_000,
    ):
        assert fx_strides.parse(junk) is None, junk[:40]
