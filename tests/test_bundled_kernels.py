"""The kernels bundled in an FX entry follow its code to another GPU index (inductor/bundled_kernels.py).

Built for real on this CPU-only machine through the cross-compile path (a real cubin for sm_90
inside a real ``CachingAutotuner``), bundled in torch's own ``TritonBundle``, then moved.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from torch._inductor.async_compile import CompiledTritonKernels
from torch._inductor.triton_bundler import StaticallyLaunchedAutotuner, TritonBundle

from compileq.inductor import bundled_kernels
from compileq.tasks import device_index
from tests.conftest import FIXTURES, manifest_rows
from tests.scripts import build_kernel

ROW = manifest_rows(FIXTURES / "gpt_head.jsonl")[0]


def output_code(source: str, name: str) -> str:
    """An output-code module as Inductor writes one: each kernel's source a literal argument."""
    return (
        "from torch._inductor.async_compile import AsyncCompile\n"
        "async_compile = AsyncCompile()\n"
        f"{name} = async_compile.triton({name!r}, '''{source}''', device_str='cuda')\n"
        "async_compile.wait(globals())\n"
    )


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real ``CachingAutotuner`` for the fixture's kernel, built in a process of its own (the
    cross-compile switch is process-wide)."""
    return build_kernel(ROW, tmp_path_factory.mktemp("built") / "payload.pickle")


def test_output_code_names_each_kernels_source_exactly() -> None:
    code = output_code(ROW["source"], ROW["name"])
    assert bundled_kernels.kernel_sources(code) == [ROW["source"]]
    assert bundled_kernels.kernel_sources("def call(args): pass\n") == []
    assert bundled_kernels.kernel_sources("not python (") == []


def test_an_entry_stored_for_cuda_0_loads_its_bundled_kernels_on_cuda_1_and_back(
    kernel: Any,
) -> None:
    source0 = ROW["source"]
    assert device_index.kernel_index(source0) == 0
    source1 = device_index.kernel_for(source0, 1)
    bundled = StaticallyLaunchedAutotuner(
        cache_key=CompiledTritonKernels.key(source0), kernel_name=ROW["name"], kernel=kernel
    )
    stored = TritonBundle(kernel_artifacts=[], static_autotuners=[bundled])
    graph = SimpleNamespace(_triton_bundle=stored)

    moved = bundled_kernels.move_bundle(graph, output_code(source0, ROW["name"]), 0, 1)

    assert moved == 1
    (loaded,) = graph._triton_bundle.static_autotuners
    # Keyed by the source the moved code passes to async_compile.triton, so Inductor finds it.
    assert loaded.cache_key == CompiledTritonKernels.key(source1)
    assert loaded.kernel.triton_meta["device"] == 1
    assert all(r.compile_meta["device"] == 1 for r in loaded.kernel.compile_results)
    # The stored bundle and its kernel are untouched: another graph may be running them.
    assert stored.static_autotuners[0] is bundled and kernel.triton_meta["device"] == 0
    assert all(r.compile_meta["device"] == 0 for r in kernel.compile_results)

    # Stored from cuda:1, the bundle reads as stored from cuda:0 again.
    assert bundled_kernels.move_bundle(graph, output_code(source1, ROW["name"]), 1, 0) == 1
    (back,) = graph._triton_bundle.static_autotuners
    assert back.cache_key == bundled.cache_key and back.kernel.triton_meta["device"] == 0


def test_a_bundle_whose_kernels_the_code_does_not_name_is_left_as_it_was(kernel: Any) -> None:
    bundled = StaticallyLaunchedAutotuner(cache_key="other", kernel_name="k", kernel=kernel)
    graph = SimpleNamespace(_triton_bundle=TritonBundle([], [bundled]))
    assert bundled_kernels.move_bundle(graph, output_code(ROW["source"], ROW["name"]), 0, 1) == 0
    assert graph._triton_bundle.static_autotuners == [bundled]
