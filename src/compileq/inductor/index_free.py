"""Inductor's FX-graph and AOTAutograd cache entries, one per graph whatever its GPU index.

Stock keys both caches on the device index (the example inputs' ``cuda:k``, and ``index=k``
in the graph's code), so rank k of a node misses the entries rank 0 wrote for the same
graph, and a job placed on other GPUs misses them all. compileq already generates a graph once
for every index (``tasks/device_index.py``); here the entries follow:

* **Keys.** ``compiled_fx_graph_hash`` and ``autograd_cache_key`` run with Inductor's cache
  pickler writing ``cuda:k`` as ``cuda:0`` (devices, and the code of the graph modules), and
  the key gets :data:`SUFFIX`. Only graphs on one CUDA device that an example input is on
  (:func:`graph_index`), where the output code's index is in places compileq rewrites.
* **Stored for cuda:0.** An FX entry under a marked key is stored with its code rewritten for
  ``cuda:0``, on the copy Inductor's ``_save_graph`` serializes (``prepare_for_serialization``:
  the graph that runs here is never touched); an AOTAutograd entry under a marked key is stored only if
  every FX key it names is marked too (else a rank would load code for another GPU).
* **Loaded for cuda:k.** An FX entry found under a marked key has its code rewritten for the
  example inputs' GPU before Inductor writes and loads it (``cache_hit_post_compile``);
  without one GPU among the inputs it reads as a miss. The kernels bundled in the entry follow
  the code both ways (``bundled_kernels``), so ``cuda:k`` loads them from the entry as
  ``cuda:0`` does, with no fetch per kernel.

Why a marked key, and not the key stock would compute for ``cuda:0``: under that key a stock
process may have stored a graph that also names another GPU, and rewriting its ``cuda:0``
would move those tensors. Every entry under a marked key was written by compileq for
``cuda:0``, whoever wrote it. Rejected too: storing per index and copying on a miss (one
entry per index still, and a miss to pay per index).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from compileq._log import log
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.inductor import bundled_kernels
from compileq.tasks import device_index

#: Ends every FX-graph and AOTAutograd key computed as for ``cuda:0``.
SUFFIX = "-cuda0"

_CODECACHE = "torch._inductor.codecache"
_OUTPUT_CODE = "torch._inductor.output_code"
_AOT_CACHE = "torch._functorch._aot_autograd.autograd_cache"
_HOOKS = (
    "torch._inductor.codecache.compiled_fx_graph_hash",
    "FxGraphCachePickler.__init__",
    "FxGraphCache._save_graph",
    "FxGraphCache._lookup_graph",
    "FxGraphCache.cache_hit_post_compile",
    "CompiledFxGraph.prepare_for_serialization",
    "torch._functorch._aot_autograd.autograd_cache.autograd_cache_key",
    "AOTAutogradCache.save",
)


@dataclass
class _Load:
    index: int
    #: Set by ``cache_hit_post_compile`` once the found graph's code is moved to ``index``.
    moved: bool = False


#: The index of the graph whose key is being computed (set around the two key functions).
_keying: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "compileq_keying", default=None
)
#: The index of the graph whose FX entry is being stored (set around ``_save_graph``).
_storing: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "compileq_storing", default=None
)
#: The FX entry being looked up under a marked key (set around ``_lookup_graph``).
_loading: contextvars.ContextVar[_Load | None] = contextvars.ContextVar(
    "compileq_loading", default=None
)


class IndexFree(Feature):
    """Key, store and load FX-graph and AOTAutograd entries for every GPU index at once (in a
    client: a worker's codegen keys nothing, the client that sent the graph does)."""

    name = "index-free"
    without = "cache entries stay one per GPU index"
    targets = (
        Target(_CODECACHE, "compiled_fx_graph_hash", ("gm", "example_inputs")),
        Target(_CODECACHE, "FxGraphCachePickler.__init__", ("self", "gm")),
        Target(_CODECACHE, "FxGraphCache._save_graph", ("key", "compiled_graph", "example_inputs")),
        Target(_CODECACHE, "FxGraphCache._lookup_graph", ("key", "example_inputs")),
        Target(_CODECACHE, "FxGraphCache.cache_hit_post_compile", ("graph",)),
        Target(_CODECACHE, "PyCodeCache.write", ("cls", "source_code")),
        Target(_OUTPUT_CODE, "CompiledFxGraph.prepare_for_serialization", ("self",)),
        # Its first two parameters are (gm, example_inputs) in 2.11, (mod, example_inputs) since.
        Target(_AOT_CACHE, "autograd_cache_key"),
        Target(_AOT_CACHE, "AOTAutogradCache.save", ("key", "entry")),
        Target("torch._inductor.async_compile", "CompiledTritonKernels.key", ("kernel_src",)),
    )

    def wanted(self, ctx: Context) -> bool:
        settings = ctx.settings
        return settings.graph_cache and settings.index_free_keys and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {
            _CODECACHE: self._patch_codecache,
            _OUTPUT_CODE: self._patch_output_code,
            _AOT_CACHE: self._patch_aot_cache,
        }

    def _patch_codecache(self, module: Any) -> None:
        cache, pickler = (
            getattr(module, "FxGraphCache", None),
            getattr(module, "FxGraphCachePickler", None),
        )
        if cache is None or pickler is None or not hasattr(module, "compiled_fx_graph_hash"):
            return  # still loading (see import_hooks.after_import)
        self.patches.wrap(module, "compiled_fx_graph_hash", _keyed)
        self.patches.wrap(pickler, "__init__", _pickler_init)
        self.patches.wrap_static(cache, "_save_graph", _save_graph)
        self.patches.wrap_static(cache, "_lookup_graph", _lookup_graph)
        self.patches.wrap_static(cache, "cache_hit_post_compile", _hit_post_compile)

    def _patch_output_code(self, module: Any) -> None:
        graph = getattr(module, "CompiledFxGraph", None)
        if graph is not None:
            self.patches.wrap(graph, "prepare_for_serialization", _for_storage)

    def _patch_aot_cache(self, module: Any) -> None:
        cache = getattr(module, "AOTAutogradCache", None)
        if cache is None or not hasattr(module, "autograd_cache_key"):
            return
        self.patches.wrap(module, "autograd_cache_key", _keyed)
        self.patches.wrap_static(cache, "save", _aot_save)


FEATURE = IndexFree()


def enable() -> None:
    """The feature on by itself, outside ``install()`` (for tests)."""
    FEATURE.hook()


def disable() -> None:
    FEATURE.disable()


def active() -> bool:
    """Whether keys are marked (every hook in place: a marked key with an entry stored for
    its own index would be as wrong as none)."""
    return FEATURE.patches.all_of(_HOOKS)


def marked(key: str | None) -> bool:
    return bool(key) and key.endswith(SUFFIX)  # type: ignore[union-attr]


# -- which graphs ------------------------------------------------------------------------------


def cuda_indices(values: Sequence[Any]) -> set[int | None]:
    """The CUDA indices of the tensors among ``values``."""
    import torch

    return {
        value.device.index
        for value in values
        if isinstance(value, torch.Tensor) and value.device.type == "cuda"
    }


def inputs_index(example_inputs: Sequence[Any]) -> int | None:
    """The one CUDA index of the example inputs' tensors; None for none, or for several."""
    found = cuda_indices(example_inputs)
    return next(iter(found)) if len(found) == 1 else None


def graph_index(gm: Any, example_inputs: Sequence[Any]) -> int | None:
    """The CUDA index a graph's keys may be computed for ``cuda:0`` from, or None (keys as
    stock's): every device of the graph (its inputs and each node's value) the CPU or that
    one ``cuda:k``, which an example input is on; no HIP, C++ wrapper, user Triton kernel or
    wrapped compiled region (code compileq does not rewrite, or that names devices itself)."""
    import torch
    from torch._inductor import config

    index = inputs_index(example_inputs)
    if index is None or torch.version.hip:
        return None
    if config.cpp_wrapper or getattr(config, "wrap_inductor_compiled_regions", False):
        return None
    graph_module = _graph_module(gm)
    if graph_module is None or _calls_user_triton(graph_module):
        return None
    meta = ("val", "example_value")
    devices = device_index.tensor_devices(graph_module, example_inputs, meta)
    gpus = {device for device in devices if device.type != "cpu"}
    return index if gpus == {torch.device("cuda", index)} else None


def _graph_module(gm: Any) -> Any:
    """The graph module itself, or the one in torch 2.13's ``GmWrapper``; None for neither."""
    import torch

    if not isinstance(gm, torch.fx.GraphModule):
        gm = getattr(gm, "gm", None)
    return gm if isinstance(gm, torch.fx.GraphModule) else None


def _calls_user_triton(graph_module: Any) -> bool:
    import torch

    return any(
        "triton_kernel_wrapper" in str(node.target)
        for module in graph_module.modules()
        if isinstance(module, torch.fx.GraphModule)
        for node in module.graph.nodes
    )


# -- keys --------------------------------------------------------------------------------------


def normalise_pickler(pickler: Any, gm: Any, index: int | None) -> None:
    """Make an ``FxGraphCachePickler`` (or subclass) write ``cuda:index`` as ``cuda:0``:
    devices, and the code of every graph module of ``gm`` (``device(type='cuda',
    index=k)`` in calls that make tensors)."""
    import torch

    if not index:
        return
    pickler.dispatch_table[torch.device] = functools.partial(_reduce_device, index)
    graph_module = _graph_module(gm)
    for module in graph_module.modules() if graph_module is not None else ():
        if isinstance(module, torch.fx.GraphModule):
            base = pickler.dispatch_table.get(module.__class__) or _default_reduce
            if isinstance(base, functools.partial) and base.func is _normalised_reduce:
                continue  # a class seen already
            pickler.dispatch_table[module.__class__] = functools.partial(
                _normalised_reduce, base, index
            )
    # torch 2.13's AOTAutograd pickler reduces graph modules in reducer_override, which
    # comes before the dispatch table; it calls this method by name.
    own = getattr(pickler, "_reduce_graph_module_for_cache_key", None)
    if own is not None:
        pickler._reduce_graph_module_for_cache_key = functools.partial(
            _normalised_reduce, own, index
        )


def _default_reduce(gm: Any) -> Any:
    return gm.__reduce__()


def _reduce_device(index: int, device: Any) -> Any:
    import torch

    if device.type == "cuda" and device.index == index:
        return torch.device, ("cuda", 0)
    return device.__reduce__()


def _normalised_reduce(base: Callable[[Any], Any], index: int, gm: Any) -> Any:
    fn, args, *rest = base(gm)
    return (fn, _normalised(args, index), *rest)


def _normalised(value: Any, index: int) -> Any:
    """A graph module's reduce arguments with the ``_code`` in them written for cuda:0."""
    if isinstance(value, tuple):
        return tuple(_normalised(item, index) for item in value)
    if isinstance(value, dict) and isinstance(value.get("_code"), str):
        return {**value, "_code": device_index.normalise_code(value["_code"], index)}
    return value


def _keyed(original: Callable[..., Any]) -> Callable[..., Any]:
    """A key function (graph module, example inputs, ...) -> (key, debug lines) that computes
    the key as for cuda:0, marked, where ``graph_index`` allows."""

    @functools.wraps(original)
    def key_function(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        index = graph_index(gm, example_inputs) if active() else None
        if index is None:
            return original(gm, example_inputs, *args, **kwargs)
        token = _keying.set(index)
        try:
            key, lines = original(gm, example_inputs, *args, **kwargs)
        finally:
            _keying.reset(token)
        return key + SUFFIX, lines

    return key_function


def _pickler_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, gm: Any, *args: Any, **kwargs: Any) -> None:
        original(self, gm, *args, **kwargs)
        index = _keying.get()
        if index is not None:
            normalise_pickler(self, gm, index)

    return __init__


# -- entries -----------------------------------------------------------------------------------


def _save_graph(original: Callable[..., Any]) -> Callable[..., Any]:
    def save_graph(key: str, compiled_graph: Any, example_inputs: Any, *args: Any) -> Any:
        if not marked(key):
            return original(key, compiled_graph, example_inputs, *args)
        index = inputs_index(example_inputs)
        if index is None:
            return None  # not the graph the key was computed for: nothing stored
        # Moved for cuda:0 on the copy Inductor's save serializes (``_for_storage``), never
        # on the graph that runs here.
        token = _storing.set(index)
        try:
            return original(key, compiled_graph, example_inputs, *args)
        finally:
            _storing.reset(token)

    return save_graph


def _for_storage(original: Callable[..., Any]) -> Callable[..., Any]:
    """``CompiledFxGraph.prepare_for_serialization``, which every torch's ``_save_graph``
    calls on its own copy of the graph: within a marked save, that copy is moved to cuda:0."""

    @functools.wraps(original)
    def prepare_for_serialization(self: Any) -> None:
        original(self)
        index = _storing.get()
        if index:
            bundled_kernels.move_bundle(self, self.source_code, index, 0)
            device_index.move_graph(self, index, 0)

    return prepare_for_serialization


def _lookup_graph(original: Callable[..., Any]) -> Callable[..., Any]:
    def lookup_graph(key: str, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not marked(key):
            return original(key, example_inputs, *args, **kwargs)
        index = inputs_index(example_inputs)
        if index is None:
            log.debug("compileq: FX entry %s found for no one GPU; compiling", key)
            return None, {}
        load = _Load(index)
        token = _loading.set(load)
        try:
            graph, info = original(key, example_inputs, *args, **kwargs)
        finally:
            _loading.reset(token)
        if graph is not None and not load.moved:
            # Loaded without passing the hook below (another torch's call order): its code
            # may be for another GPU, so it is not run.
            log.debug("compileq: FX entry %s not moved to cuda:%d; compiling", key, index)
            return None, info
        return graph, info

    return lookup_graph


def _hit_post_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    def cache_hit_post_compile(graph: Any, *args: Any, **kwargs: Any) -> Any:
        load = _loading.get()
        if load is not None:
            # The bundle first, while the code still reads as stored: its kernels' keys are
            # the hashes of the sources in it.
            bundled_kernels.move_bundle(graph, graph.source_code, 0, load.index)
            device_index.move_graph(graph, 0, load.index)
            load.moved = True
        return original(graph, *args, **kwargs)

    return cache_hit_post_compile


def _aot_save(original: Callable[..., Any]) -> Callable[..., Any]:
    def save(key: str, entry: Any, *args: Any, **kwargs: Any) -> Any:
        if marked(key) and not _loads_anywhere(entry):
            log.debug("compileq: AOTAutograd entry %s not stored: it names another GPU", key)
            return None
        return original(key, entry, *args, **kwargs)

    return save


def _loads_anywhere(entry: Any) -> bool:
    """Whether each graph the entry names is an FX entry stored for cuda:0 (a marked key),
    and nothing else in it names a GPU index (graph-safe RNG states do)."""
    meta = getattr(entry, "runtime_metadata", None)
    if meta is None:
        return False
    if getattr(meta, "num_graphsafe_rng_states", 0):
        return False
    for part in (entry.compiled_fw, getattr(entry, "compiled_bw", None)):
        if part is None:
            continue
        info = getattr(part, "fx_graph_cache_info", None)
        if not (isinstance(info, tuple) and marked(info[0])):
            return False
    return True
