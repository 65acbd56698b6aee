"""Inductor's cache keys computed as for ``cuda:0`` (inductor/index_free.py), and DDP subgraph
records under such keys, checked on fake CUDA tensors, which need no GPU (and a real
redis-server). Loading and running such entries on another index is tested on two GPUs
(tests/test_gpu_ranks.py)."""

from __future__ import annotations

import gc
import json
import pickle
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
import torch
import torch._functorch._aot_autograd.autograd_cache as aot_cache  # hooked: call through it
import torch.fx
from torch._functorch._aot_autograd.schemas import AOTConfig
from torch._inductor import codecache
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from compileq.cache.store import RedisStore
from compileq.codegen import ddp_aot
from compileq.config import Settings
from compileq.inductor import index_free


@pytest.fixture
def hooked() -> Iterator[None]:
    index_free.enable()
    assert index_free.active()
    yield
    index_free.disable()


#: One fake mode for every graph here, with a shape env: AOTAutograd's key wants one.
MODE = FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv())


def graph(index: int, ones_on: int | None = None) -> tuple[torch.fx.GraphModule, list[Any]]:
    """``x + torch.ones(8, device=...)`` with ``x`` on ``cuda:index`` (``ones`` on the same
    GPU unless ``ones_on``), as Inductor gets it: fake values on every node."""
    ones_index = index if ones_on is None else ones_on
    g = torch.fx.Graph()
    x = g.placeholder("x")
    ones = g.call_function(torch.ones, (8,), {"device": torch.device("cuda", ones_index)})
    out = g.call_function(torch.add, (x, ones))
    g.output(out)
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    with MODE:
        x.meta["val"] = torch.empty(8, device=f"cuda:{index}")
        ones.meta["val"] = torch.empty(8, device=f"cuda:{ones_index}")
        out.meta["val"] = torch.empty(8, device=f"cuda:{index}")
    return gm, [x.meta["val"]]


def fx_key(gm: torch.fx.GraphModule, inputs: list[Any]) -> str:
    key, _ = codecache.compiled_fx_graph_hash(gm, inputs, {}, [])
    return str(key)


def test_a_graph_on_any_gpu_index_has_the_key_of_the_same_graph_on_cuda_0(hooked: None) -> None:
    keys = [fx_key(*graph(index)) for index in (0, 1, 3)]
    assert keys[0] == keys[1] == keys[2]
    assert keys[0].endswith(index_free.SUFFIX)
    # The index is in the graph's code too (torch.ones(..., device=device(type='cuda',
    # index=1))): written as 0 for the key, not left out of it.
    assert "index=1" in graph(1)[0].code


def aot_key(gm: torch.fx.GraphModule, inputs: list[Any]) -> str:
    config = AOTConfig(
        fw_compiler=None,
        bw_compiler=None,
        partition_fn=None,
        decompositions={},
        num_params_buffers=0,
        aot_id=0,
        keep_inference_input_mutations=False,
    )
    with torch._guards.tracing(torch._guards.TracingContext(MODE)):
        key, _ = aot_cache.autograd_cache_key(gm, inputs, config, None)
    return str(key)


def test_an_aot_autograd_key_on_any_gpu_index_is_the_key_on_cuda_0(hooked: None) -> None:
    # Its pickler reduces graph modules itself (torch 2.13): their code names the index too.
    assert aot_key(*graph(0)) == aot_key(*graph(2))
    assert aot_key(*graph(2)).endswith(index_free.SUFFIX)
    index_free.disable()
    assert aot_key(*graph(0)) != aot_key(*graph(2))


def test_the_same_graph_keyed_by_stock_differs_per_index() -> None:
    assert not index_free.active()
    assert fx_key(*graph(0)) != fx_key(*graph(1))
    assert not fx_key(*graph(1)).endswith(index_free.SUFFIX)


def test_a_graph_naming_two_gpus_keeps_the_key_stock_gives_it(hooked: None) -> None:
    mixed = graph(1, ones_on=0)
    assert index_free.graph_index(*mixed) is None
    ours = fx_key(*mixed)
    index_free.disable()
    assert ours == fx_key(*mixed) and not ours.endswith(index_free.SUFFIX)
    # and a graph with its tensors on cuda:0 and cuda:1 never meets the cuda:0 graph's key
    assert ours != fx_key(*graph(0))


def test_a_cpu_graph_keeps_the_key_stock_gives_it(hooked: None) -> None:
    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output(g.call_function(torch.mul, (x, 2)))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    inputs = [torch.ones(4)]
    ours = fx_key(gm, inputs)
    index_free.disable()
    assert ours == fx_key(gm, inputs)


def test_disabling_gives_torch_its_own_functions_back() -> None:
    stock = (
        codecache.compiled_fx_graph_hash,
        codecache.FxGraphCachePickler.__init__,
        codecache.FxGraphCache.__dict__["_save_graph"],
    )
    index_free.enable()
    assert codecache.compiled_fx_graph_hash is not stock[0]
    index_free.disable()
    assert not index_free.active()
    now = (
        codecache.compiled_fx_graph_hash,
        codecache.FxGraphCachePickler.__init__,
        codecache.FxGraphCache.__dict__["_save_graph"],
    )
    assert now == stock


def test_a_subgraph_record_under_a_marked_key_is_stored_for_cuda_0_and_read_for_any_gpu(
    clean_cache: redis.Redis, settings: Settings
) -> None:
    store = RedisStore(clean_cache, settings)
    ddp_aot.enable(store)
    try:
        with FakeTensorMode():
            outputs = [torch.empty(4, 8, device="cuda:1"), None, 3]
            on_gpu_2 = [torch.empty(2, device="cuda:2")]
        marked, plain = "asubgraph" + index_free.SUFFIX, "asubgraph"
        for key in (marked, plain):
            ddp_aot._record(SimpleNamespace(cache_info=SimpleNamespace(cache_key=key)), outputs)
        stored = json.loads(store.get(ddp_aot._record_key(marked)) or b"null")
        assert stored[0]["device"] == "cuda:0" and stored[1:] == [None, 3]
        assert stored[0]["shape"] == [4, 8] and stored[0]["stride"] == [8, 1]
        loaded = ddp_aot._outputs(marked, on_gpu_2)
        assert loaded is not None and loaded[0]["device"] == "cuda:2"
        # Inputs on no one GPU: the record cannot be placed, so the subgraph compiles.
        assert ddp_aot._outputs(marked, []) is None
        # A key as stock computes it keeps its devices as they are.
        unmoved = ddp_aot._outputs(plain, on_gpu_2)
        assert unmoved is not None and unmoved[0]["device"] == "cuda:1"
    finally:
        ddp_aot.disable()


def test_storing_a_graph_for_cuda_0_leaves_the_graph_that_runs_on_cuda_1_whole(
    hooked: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._inductor.output_code import CompiledFxGraph
    from torch.utils._ordered_set import OrderedSet

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    class Runner:  # what Inductor's output code defines (graph partitions)
        def __init__(self) -> None:
            self.partitions = [print]

    code = "with torch.cuda._DeviceGuard(1):\n    stream1 = get_raw_stream(1)\n"
    graph = object.__new__(CompiledFxGraph)  # as compiled: only what the save reads
    graph.__dict__.update(
        source_code=code,
        cache_key="k",
        device_idxs=OrderedSet([1]),
        compiled_fn_runner=Runner(),
        guards_expr=None,
    )
    key = "fgraph" + index_free.SUFFIX
    with MODE:
        inputs = [torch.empty(2, device="cuda:1")]
    # Inductor's own save, on its local cache dir (no remote cache).
    with torch._guards.tracing(torch._guards.TracingContext(MODE)):
        codecache.FxGraphCache._save_graph(key, graph, inputs, True, None)
    gc.collect()
    entries = list(Path(codecache.FxGraphCache._get_tmp_dir_for_key(key)).iterdir())
    stored = [pickle.loads(entry.read_bytes()).source_code for entry in entries]
    assert stored == ["with torch.cuda._DeviceGuard(0):\n    stream0 = get_raw_stream(0)\n"]
    assert graph.source_code == code and graph.device_idxs == OrderedSet([1])
    # The copy stored was freed: the runner the graph calls keeps its partitions.
    assert graph.compiled_fn_runner.partitions == [print]
