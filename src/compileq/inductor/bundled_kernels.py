"""The kernels inside an FX entry, for the GPU index the entry is loaded on.

Inductor bundles each graph's statically launchable kernels into its FX entry
(``TritonBundle.static_autotuners``): on a hit, ``TritonBundler.load_autotuners`` puts each
``CachingAutotuner`` into ``CompiledTritonKernels`` under ``CompiledTritonKernels.key(source)``,
the hash of the kernel's source, and the output code's ``async_compile.triton(name, source)``
finds it there instead of compiling. The source names its GPU (``DeviceProperties(index=k)``),
so when ``index_free`` moves an entry stored for ``cuda:0`` to ``cuda:k`` the code asks for
keys nothing was bundled under, and every kernel went to compileq's pool one by one (a new
machine on ``cuda:1``: 157 separate fetches for a CNN where ``cuda:0`` needed none).

Here the bundle follows the code: an entry stored from ``cuda:k`` has its kernels keyed and
pointed as for ``cuda:0``; an entry loaded for ``cuda:k`` has them keyed by the sources of the
code as moved, and pointed at ``cuda:k``. The sources are read from the output code (each ``async_compile.triton(name, "source", ...)`` call, its literal read as Python
reads it), so nothing is guessed from a kernel's name.

Rejected: wrapping ``CompiledTritonKernels.key`` to hash every source as for ``cuda:0``
(one process compiling the same kernel for two GPUs would then share one future built for one
of them); and a second lookup in ``CompiledTritonKernels.get`` under the normalised key
(``get`` is a static method Inductor calls for every kernel of every compile, hits or not).
Anything unexpected in a bundle leaves it as it was: the kernels then come through the pool,
slower, never wrong.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import re
from typing import Any

from compileq._log import log
from compileq.tasks import device_index

#: Where a kernel's source starts in output code: Inductor writes each kernel as
#: ``name = async_compile.triton('name', '''<source>''', device_str='cuda')``.
_TRITON_CALL = re.compile(r"async_compile\.triton\(\s*'\w+',\s*(?P<literal>'''.*?''')", re.DOTALL)


def kernel_sources(code: str) -> list[str]:
    """The source of every Triton kernel an output-code module compiles, in order: each
    literal found where Inductor writes one, read as Python reads it (``ast.literal_eval``,
    so escapes mean what they mean to the module). Rejected: ``ast.parse`` of the whole
    module, the same answer for 0.16 s of a new machine's first step (two graphs, under
    cProfile, H100 host)."""
    sources = []
    for match in _TRITON_CALL.finditer(code):
        try:
            value = ast.literal_eval(match.group("literal"))
        except (SyntaxError, ValueError):
            continue
        if isinstance(value, str):
            sources.append(value)
    return sources


def move_bundle(graph: Any, code: str, old: int, new: int) -> int:
    """Re-key and re-point the bundled kernels of ``graph`` (a ``CompiledFxGraph`` whose
    ``code`` is written for ``cuda:old``) as if bundled on ``cuda:new``; returns how many
    moved. The graph gets a new bundle: the old one may be shared with a graph that runs."""
    bundle: Any = getattr(graph, "_triton_bundle", None)
    autotuners = list(getattr(bundle, "static_autotuners", None) or ())
    if old == new or not autotuners:
        return 0
    from torch._inductor.async_compile import CompiledTritonKernels

    renamed: dict[str, str] = {}
    for source in kernel_sources(code):
        if device_index.kernel_index(source) != old:
            continue
        moved = device_index.kernel_for(source, new)
        renamed[CompiledTritonKernels.key(source)] = CompiledTritonKernels.key(moved)
    count, kept = 0, []
    for entry in autotuners:
        key = renamed.get(getattr(entry, "cache_key", None) or "")
        if key is None:
            kept.append(entry)
            continue
        try:
            kept.append(
                dataclasses.replace(entry, cache_key=key, kernel=_pointed(entry.kernel, new))
            )
            count += 1
        except (TypeError, AttributeError) as error:  # another torch's bundle: leave it
            log.debug("compileq: bundled kernel %r not moved: %s", entry, error)
            kept.append(entry)
    artifacts = [_artifacts_on(a, old, new) for a in getattr(bundle, "kernel_artifacts", ())]
    try:
        graph._triton_bundle = dataclasses.replace(
            bundle, static_autotuners=kept, kernel_artifacts=artifacts
        )
    except (TypeError, AttributeError) as error:
        log.debug("compileq: FX entry's kernel bundle not moved: %s", error)
        return 0
    return count


def _pointed(kernel: Any, index: int) -> Any:
    """A copy of a ``CachingAutotuner`` pointed at ``cuda:index`` (the dicts it names its
    device in are copied first: the original may be running)."""
    kernel = copy.copy(kernel)
    if isinstance(getattr(kernel, "triton_meta", None), dict):
        kernel.triton_meta = dict(kernel.triton_meta)
    results = []
    for result in getattr(kernel, "compile_results", None) or ():
        result = copy.copy(result)
        if isinstance(getattr(result, "compile_meta", None), dict):
            result.compile_meta = dict(result.compile_meta)
        results.append(result)
    if hasattr(kernel, "compile_results"):
        kernel.compile_results = results
    device_index.retarget_kernel(kernel, index)
    return kernel


def _artifacts_on(artifacts: Any, old: int, new: int) -> Any:
    """A kernel's cubin files are written to ``triton_cache_dir(device)``, which the moved
    kernels look in: the files follow them."""
    if getattr(artifacts, "device", None) != old:
        return artifacts
    try:
        return dataclasses.replace(artifacts, device=new)
    except (TypeError, AttributeError):
        return artifacts
