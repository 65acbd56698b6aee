"""One GPU index on the wire: graphs and kernels of ``cuda:k`` travel as ``cuda:0``.

Rank k of a torchrun job compiles for ``cuda:k``, and Inductor writes k into everything it
generates: the device guard and stream of the output code, and the ``DeviceProperties`` inside
every kernel source. A worker pinned to one GPU sees it as ``cuda:0``, so a graph for
``cuda:1`` failed there (``invalid device ordinal``); and because kernel keys hash the source,
every rank built its own copy of every kernel. So compileq normalises on the way out and
retargets on the way back:

* a graph's compile input is pickled with ``cuda:k`` written as ``cuda:0`` (``fx_wire``), so
  the ranks of a node send one job, generated once by any worker of the GPU type;
* its output code comes back for ``cuda:0`` and :func:`retarget_code` rewrites the few places
  Inductor's Python wrapper writes an index: the result is the code the client would have
  generated itself (the GPU test compares them byte for byte);
* a kernel is keyed and built from its source with ``index=0`` (:func:`normalise_kernel`),
  and the built ``CachingAutotuner`` is pointed at ``cuda:k`` before Inductor loads it
  (:func:`retarget_kernel`): a cubin does not depend on the index, only where it is loaded.

Rejected alternative: a worker that sees every GPU of its node and generates for ``cuda:k``
as is. It would be byte-identical with no rewriting, but each index would still be its own
job and its own kernels: eight codegens of one graph on an eight-GPU node.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

#: Where Inductor's Python wrapper and kernel sources write a CUDA device index (torch 2.11 to
#: 2.13): ``torch.cuda._DeviceGuard(k)``, ``torch.cuda.set_device(k)``, ``streamk =
#: get_raw_stream(k)``, ``DeviceProperties(type='cuda', index=k, ...)``, ``device(type='cuda',
#: index=k)`` (a torch.device's repr), the strings ``'cuda:k'`` / ``"cuda:k"``, and the graph
#: fragments quoted in comments (``Tensor "f32[4, 64][64, 1]cuda:k"``, and a node's keyword
#: ``device: cuda:k``, as in ``aten.full.default(..., kwargs = {..., device: cuda:k})``).
_CODE = re.compile(
    r"(?P<pre>torch\.cuda\._DeviceGuard\(|torch\.cuda\.set_device\(|get_raw_stream\("
    r"|DeviceProperties\(type='cuda', index=|device\(type='cuda', index=|\bstream"
    r"|['\"\]]cuda:|\bdevice: cuda:)(?P<index>\d+)\b"
)
_KERNEL = re.compile(r"(?P<pre>DeviceProperties\(type='cuda', index=)(?P<index>\d+)\b")


def tensor_devices(
    gm: Any, example_inputs: Sequence[Any], meta: tuple[str, ...] = ("val",)
) -> set[Any]:
    """The devices of a graph's tensors: its example inputs', and each node's value (under the
    ``meta`` keys: Inductor's graphs keep it as ``val``, Dynamo's as ``example_value``) in
    every graph module of ``gm``. A graph that makes GPU tensors from CPU inputs has them."""
    import torch

    values = list(example_inputs)
    for module in gm.modules():
        if isinstance(module, torch.fx.GraphModule):
            for node in module.graph.nodes:
                values.extend(node.meta.get(key) for key in meta)
    devices = set()
    for value in values:
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, torch.Tensor):
                devices.add(item.device)
    return devices


def kernel_index(source: str) -> int | None:
    """The CUDA index a kernel source was generated for (None: not a CUDA kernel)."""
    match = _KERNEL.search(source)
    return int(match.group("index")) if match else None


def normalise_kernel(source: str) -> str:
    """The kernel source as generated for ``cuda:0``."""
    return kernel_for(source, 0)


def kernel_for(source: str, index: int) -> str:
    """The kernel source as generated for ``cuda:index``."""
    return _KERNEL.sub(lambda m: m.group("pre") + str(index), source)


def retarget_code(code: str, index: int) -> str:
    """Output code generated for ``cuda:0``, as generated for ``cuda:index``."""
    return _swap(code, 0, index)


def normalise_code(code: str, index: int) -> str:
    """Code written for ``cuda:index`` (a graph module's own code), as if for ``cuda:0``."""
    return _swap(code, index, 0)


def move_graph(graph: Any, old: int, new: int) -> None:
    """A ``CompiledFxGraph`` generated for ``cuda:old``, as generated for ``cuda:new``."""
    from torch._inductor.codecache import PyCodeCache

    if old == new:
        return
    graph.source_code = _swap(graph.source_code, old, new)
    # The code's key names the file it is loaded from: another index is another module.
    graph.cache_key = PyCodeCache.write(graph.source_code)[0]
    if graph.device_idxs:
        graph.device_idxs = type(graph.device_idxs)(
            new if i == old else i for i in graph.device_idxs
        )


def _swap(code: str, old: int, new: int) -> str:
    if old == new:
        return code
    before, after = str(old), str(new)
    return _CODE.sub(
        lambda m: m.group("pre") + (after if m.group("index") == before else m.group("index")),
        code,
    )


def retarget_kernel(kernel: Any, index: int) -> None:
    """Point a ``CachingAutotuner`` built from a normalised source at ``cuda:index``.

    Inductor reads the index from ``device_props`` and ``triton_meta["device"]`` (which GPU
    loads the cubins: ``_make_launchers`` guards on it) and, once compiled, from each result's
    ``compile_meta``; nothing else in it names the device.
    """
    props = getattr(kernel, "device_props", None)
    if props is not None and hasattr(props, "_replace"):
        kernel.device_props = props._replace(index=index)
    meta = getattr(kernel, "triton_meta", None)
    if isinstance(meta, dict) and isinstance(meta.get("device"), int):
        meta["device"] = index
    for result in getattr(kernel, "compile_results", None) or ():
        compile_meta = getattr(result, "compile_meta", None)
        if isinstance(compile_meta, dict) and isinstance(compile_meta.get("device"), int):
            compile_meta["device"] = index
