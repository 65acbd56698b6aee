"""Inductor's cache keys computed as for ``cuda:0`` (scheduler/index_free.py), checked on fake
CUDA tensors, which need no GPU. Loading and running such entries on another index is tested
on two GPUs (tests/test_gpu_ranks.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch._functorch._aot_autograd.autograd_cache  # hooked on import, like codecache
import torch.fx
from torch._inductor import codecache
from torch._subclasses.fake_tensor import FakeTensorMode

from compileq.scheduler import index_free


@pytest.fixture
def hooked() -> Iterator[None]:
    index_free.enable()
    assert index_free.active()
    yield
    index_free.disable()


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
    with FakeTensorMode(allow_non_fake_inputs=True):
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
