"""AOTAutograd's cache for DDPOptimizer's subgraphs, which stock torch never uses.

Under DDP, Dynamo's DDPOptimizer splits a frame's graph at the gradient buckets and compiles
each subgraph in turn, then runs it on fake tensors to make the next one's inputs. Its
``fakify_first_call`` flag makes the subgraph's first call return fake outputs with the strides
Inductor chose, and AOTAutograd's cache bypasses every graph compiled with that flag set
(``check_cacheable``: "Won't cache a graph with fakify_first_call enabled"); its cached path
has no such first call ("Notably absent from the cached path are: ... FakifiedOutWrapper",
``aot_autograd_result.py``). So every warm start of a DDP job, stock or not, traces and
partitions every subgraph again: 4.3-8.1 s of a 8-16 s first step on two H200s
(docs/BENCHMARKS.md), more than all the rest of a warm compile.

compileq adds what is absent, only for compileq's store:

- When a subgraph misses, it is compiled as stock compiles it, and the fake outputs its first
  call returns (shapes, Inductor's strides, dtypes, devices) are stored, signed, under the
  subgraph's AOTAutograd cache key (``compileq:a:aotddp:<sha256>``).
- When a subgraph's AOTAutograd entry is found and those outputs are stored too, the entry is
  loaded and its first call returns them, made in the subgraph's fake mode; the entry's
  metadata becomes the tracing context's, as a compile would have left it. Found without them,
  the entry is read as a miss: the subgraph compiles, and its outputs are stored this time.
- A loaded subgraph's backward is compiled already; at its first call it moves DDPOptimizer's
  bucket counter on, as the lazy backward compile of a missed one does, so that the buckets
  that did miss compile their backwards with their own metadata.

Sizes that are symbolic (a length that changes, under DDP: the frame recompiled with dynamic
sizes) are recorded as expressions over the subgraph's inputs (``symbolic_sizes``), since
another process's symbols have other names (``s0`` here, ``s1`` there) but the same key means
the same inputs. At a lookup they are evaluated on the lookup's own inputs, so the outputs
carry that process's symbols, as its compile would have made them; a record that does not fit
them is a miss. An output whose sizes use a symbol no input holds (a size known only at run
time) is not recorded: that subgraph compiles. Rejected: leaving symbolic subgraphs to stock's
path (a new machine traced 2.3 s of joint graphs in a 6.3 s first step, transformers' Llama
on CPU).

Only plain subgraphs: no effect tokens, tensor subclasses or functionalized RNG between the
compiled forward and its first call (where the cached and uncached wrapper stacks differ).
Anything unexpected (another torch's layout, a malformed record) leaves the subgraph to
stock's path: compiled, never failed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from compileq import keys
from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.codegen import deferred
from compileq.codegen.symbolic_sizes import (
    Place,
    Unsaid,
    evaluated,
    expression,
    symbols_of,
    valid,
)
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.inductor import index_free

KIND = "aotddp"
_CACHE = "torch._functorch._aot_autograd.autograd_cache"
_WRAPPERS = "torch._functorch._aot_autograd.runtime_wrappers"
_RESULT = "torch._functorch._aot_autograd.aot_autograd_result"
#: A record larger than this is not read: a subgraph returns tens of tensors, not thousands.
_MAX_RECORD = 256 * 1024

#: Every function wrapped, as ``module.Class.name``: a lookup is changed only once all are.
_HOOKS = (
    "AOTAutogradCache.try_load",
    "AOTAutogradCache._lookup",
    "FakifiedOutWrapper.post_compile",
)

_thread = threading.local()
#: For a subgraph that missed (its key): the symbols of its inputs, as ``_symbols`` gives
#: them, read when its outputs are recorded. At most a frame's subgraphs are pending at once.
_pending: OrderedDict[str, dict[Any, Place]] = OrderedDict()
_PENDING_MAX = 256
#: Records read here, signed by the cluster, that could not be used (malformed, or not fitting
#: their subgraph's inputs): the compile that follows replaces each, where a first-writer put
#: would keep it and every machine would miss that subgraph for as long as it lives.
_unfit: set[str] = set()
_lock = threading.Lock()


@dataclass
class _Subgraph:
    """The DDPOptimizer subgraph whose AOTAutograd cache lookup is under way."""

    context: Any  # torch._guards.TracingContext
    key: str | None = None
    #: The AOTAutograd entry found, once its forward's first outputs are known too.
    entry: Any = None


class DdpAot(Feature):
    """Serve DDPOptimizer's subgraphs from AOTAutograd's cache (in a client: a worker's own
    codegen compiles no DDP frame)."""

    name = "ddp-aot"
    without = "DDP subgraphs stay uncached"
    targets = (
        Target(_CACHE, "AOTAutogradCache.try_load"),
        Target(_CACHE, "AOTAutogradCache._lookup", ("key", "local", "remote", "args")),
        Target(_WRAPPERS, "FakifiedOutWrapper.post_compile", ("self", "compiled_fn", "aot_config")),
        # What _Loadable stands in for: an entry's compiled forward or backward.
        Target(_RESULT, "InductorOutput.load", ("self", "example_inputs")),
        Target(_RESULT, "InductorOutput.post_compile", ("self", "result", "fx_config")),
        Target("torch._guards", "TracingContext.try_get"),
        Target("torch._guards", "detect_fake_mode"),
    )

    def __init__(self) -> None:
        super().__init__()
        self.store: Any = None

    def wanted(self, ctx: Context) -> bool:
        settings = ctx.settings
        return settings.graph_cache and settings.ddp_aot_cache and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_CACHE: self._patch_cache, _WRAPPERS: self._patch_wrappers}

    def enable(self, ctx: Context) -> None:
        self.start(ctx.store)

    def start(self, store: Any) -> None:
        """``enable`` with only what it needs (tests call it so)."""
        self.store = store
        self.hook()

    def disable(self) -> None:
        super().disable()
        self.store = None

    def complete(self) -> bool:
        """Whether every function is wrapped: a lookup is changed only then."""
        return self.patches.all_of(_HOOKS)

    def _patch_cache(self, module: Any) -> None:
        cache = getattr(module, "AOTAutogradCache", None)
        if cache is None:
            return  # still loading (see import_hooks.after_import), or another layout
        self.patches.wrap_static(cache, "try_load", _try_load)
        self.patches.wrap_static(cache, "_lookup", _lookup)

    def _patch_wrappers(self, module: Any) -> None:
        fakified = getattr(module, "FakifiedOutWrapper", None)
        if fakified is not None:
            self.patches.wrap(fakified, "post_compile", _post_compile)


FEATURE = DdpAot()


def enable(store: Any) -> None:
    """The feature on by itself, outside ``install()`` (for tests)."""
    FEATURE.start(store)


def disable() -> None:
    FEATURE.disable()


def _try_load(original: Callable[..., Any]) -> Callable[..., Any]:
    """Look a DDPOptimizer subgraph up as any graph (its flag off for the lookup only: the
    compile that follows a miss must still fakify its first call)."""

    def try_load(*args: Any, **kwargs: Any) -> Any:
        context = _ddp_subgraph_context()
        if context is None or FEATURE.store is None or not FEATURE.complete():
            # All or nothing: a subgraph loaded without its first call's fake outputs would
            # run its kernels on fake tensors.
            return original(*args, **kwargs)
        outer = getattr(_thread, "subgraph", None)
        subgraph = _thread.subgraph = _Subgraph(context)
        context.fakify_first_call = False
        try:
            found = original(*args, **kwargs)
        finally:
            context.fakify_first_call = True
            _thread.subgraph = outer
        compiled = found[0] if isinstance(found, tuple) else found  # torch 2.13 / 2.11
        if compiled is not None and subgraph.entry is not None:
            # As a compile would have left it: DDPOptimizer keeps it for this bucket.
            context.fw_metadata = subgraph.entry.runtime_metadata
            _count(Counter.DDP_SUBGRAPH_LOADS)
            log.debug("compileq: DDP subgraph %s loaded from AOTAutograd's cache", subgraph.key)
        return found

    return try_load


def _ddp_subgraph_context() -> Any:
    import torch

    context = torch._guards.TracingContext.try_get()
    if context is None or not getattr(context, "fakify_first_call", False):
        return None
    if getattr(context, "ddp_optimizer_ctx", None) is None:
        return None
    return context


def _lookup(original: Callable[..., Any]) -> Callable[..., Any]:
    def lookup(key: str, *args: Any, **kwargs: Any) -> Any:
        found = original(key, *args, **kwargs)
        subgraph = getattr(_thread, "subgraph", None)
        if subgraph is None:
            return found
        # (local, remote, args, cache_info, aot_config) in torch 2.11 and 2.13
        example = kwargs.get("args", args[2] if len(args) > 2 else ())
        if found is None:
            _remember_inputs(key, example)
            return found
        subgraph.key = key
        entry = found[0]
        outputs = _outputs(key, example) if _plain(entry) else None
        if outputs is None:
            # A miss, not a bypass: the subgraph compiles, and its first call's outputs are
            # stored under the key this lookup computed. Returned as a miss (no entry): 2.11
            # to 2.14 also counted an FXGraphCacheMiss raised here as one, but 2.15 catches
            # it around the lookup as a bypass, which drops the key, so nothing was recorded
            # and every new machine compiled that subgraph again.
            _remember_inputs(key, example)
            return None
        # This entry object is this lookup's own (unpickled just now): torch loads it through
        # these two, in 2.11 and 2.13 alike. Never wrapped twice (a second bucket counter
        # step would be as wrong as none).
        if isinstance(entry.compiled_fw, _Forward):
            return found
        entry.compiled_fw = _Forward(entry.compiled_fw, outputs)
        if entry.compiled_bw is not None:
            entry.compiled_bw = _Backward(entry.compiled_bw, subgraph.context.ddp_optimizer_ctx)
        subgraph.entry = entry
        return found

    return lookup


class _Loadable:
    """An entry's compiled forward or backward, loaded by torch as before, its loaded
    function then wrapped (``post_compile`` is the last step torch takes on it)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def load(self, example_inputs: Any) -> Any:
        return self._inner.load(example_inputs)

    def post_compile(self, result: Any, fx_config: Any) -> Any:
        return self.wrap(self._inner.post_compile(result, fx_config))

    def wrap(self, loaded: Any) -> Any:
        raise NotImplementedError


class _Forward(_Loadable):
    def __init__(self, inner: Any, outputs: list[Any]) -> None:
        super().__init__(inner)
        self._outputs = outputs

    def wrap(self, loaded: Any) -> Any:
        return _first_call_returns(loaded, self._outputs)


class _Backward(_Loadable):
    def __init__(self, inner: Any, ddp: Any) -> None:
        super().__init__(inner)
        self._ddp = ddp

    def wrap(self, loaded: Any) -> Any:
        return _first_call_moves_bucket(loaded, self._ddp)


def _plain(result: Any) -> bool:
    """Whether the cached wrapper stack passes the forward's outputs through unchanged."""
    import torch

    meta = getattr(result, "runtime_metadata", None)
    return (
        meta is not None
        and getattr(result, "maybe_subclass_meta", None) is None
        and not getattr(meta, "tokens", None)
        and not getattr(meta, "num_graphsafe_rng_states", 0)
        and not torch._functorch.config.functionalize_rng_ops
    )


def _first_call_returns(fw: Callable[..., Any], outputs: list[Any]) -> Callable[..., Any]:
    """``fw``, whose first call under a fake mode returns ``outputs`` made in that mode, as
    the uncached path's first call returns its graph's fake outputs."""
    pending = [outputs]
    boxed = getattr(fw, "_boxed_call", False)

    def forward(runtime_args: Any) -> Any:
        if pending:
            described = pending.pop()
            from torch._guards import detect_fake_mode

            mode = detect_fake_mode(runtime_args)
            if mode is not None:
                return _make(described, mode)
        return fw(runtime_args) if boxed else fw(*runtime_args)

    forward._boxed_call = True  # type: ignore[attr-defined]
    return forward


def _first_call_moves_bucket(bw: Callable[..., Any], ddp: Any) -> Callable[..., Any]:
    """``bw``, whose first call counts its bucket as done, as a lazy backward compile does
    (``ddp_ctx.curr_bucket -= 1`` in torch's runtime wrappers)."""
    first = True

    def backward(*args: Any, **kwargs: Any) -> Any:
        nonlocal first
        if first:
            first = False
            ddp.curr_bucket -= 1
        return bw(*args, **kwargs)

    if getattr(bw, "_boxed_call", False):
        backward._boxed_call = True  # type: ignore[attr-defined]
    return backward


def _post_compile(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def post_compile(self: Any, compiled_fn: Any, aot_config: Any, **kwargs: Any) -> Any:
        wrapped = original(self, compiled_fn, aot_config, **kwargs)
        # A forward whose worker is still generating it: its outputs are recorded only once
        # its real strides are known to be the ones returned (see codegen/deferred.py).
        forward = deferred.just_deferred()
        if getattr(self, "needs_post_compile", False) and FEATURE.store is not None:
            record = functools.partial(_record_safely, aot_config, list(self.out_metas))
            if forward is None:
                record()
            else:
                forward.when_verified(record)
        return wrapped

    return post_compile


def _record_safely(aot_config: Any, fakes: list[Any]) -> None:
    try:
        _record(aot_config, fakes)
    except Exception as e:  # the record may be lost, never the compile
        warn_once("ddp-aot", "compileq: DDP subgraph outputs not stored (%s)", e)


def _remember_inputs(key: str, example: Any) -> None:
    """Keep the symbols of a missed subgraph's inputs until its outputs are recorded."""
    try:
        symbols = symbols_of(example)
    except Exception as e:  # another torch's layout: symbolic outputs are then not recorded
        log.debug("compileq: DDP subgraph inputs not read (%s)", e)
        return
    with _lock:
        _pending[key] = symbols
        while len(_pending) > _PENDING_MAX:
            _pending.popitem(last=False)


def _record(aot_config: Any, fakes: list[Any]) -> None:
    """Store the fake outputs under the key the lookup computed (set only after a miss);
    whether an entry is plain enough to load is decided at the lookup (``_plain``)."""
    key = getattr(getattr(aot_config, "cache_info", None), "cache_key", None)
    if not key:
        return
    with _lock:
        symbols = _pending.pop(key, None)
    described = _describe(fakes, symbols)
    if described is not None and index_free.marked(key):
        # Stored for cuda:0, as the key was computed (see index_free); loaded for any index.
        found = index_free.cuda_indices(fakes)
        if len(found) > 1 or None in found:
            return
        if found:
            described = _moved(described, found.pop() or 0, 0)
    store = FEATURE.store
    if store is None or described is None:
        return
    name, payload = _record_key(key), json.dumps(described).encode()
    with _lock:
        unfit = name in _unfit
        _unfit.discard(name)
    if unfit:
        store.replace(name, payload)
    elif not store.put(name, payload):
        return
    _count(Counter.DDP_SUBGRAPH_RECORDS)


def _count(counter: Counter) -> None:
    try:
        FEATURE.store.count({counter: 1})
    except Exception as e:  # a count may be lost, never the compile
        log.debug("compileq: not counted (%s)", e)


def _record_key(aot_key: str) -> str:
    return keys.artifact(KIND, hashlib.sha256(aot_key.encode()).hexdigest())


#: What a record says of each tensor output: written by ``_describe``, checked by ``_checked``.
_FIELDS = frozenset({"shape", "stride", "dtype", "device", "requires_grad"})


def _describe(fakes: list[Any], symbols: dict[Any, Place] | None = None) -> list[Any] | None:
    """JSON for each output: null, an int, a symbolic int (``{"symint": expression}``), or a
    tensor's shape, strides, dtype, device and requires_grad, each size and stride an int or
    an expression over the inputs' ``symbols`` (``symbolic_sizes.symbols_of``); None where an
    output is anything else (a size no input holds, a view at an offset), and then nothing is
    stored."""
    try:
        return [_described(fake, symbols or {}) for fake in fakes]
    except Unsaid:
        return None


def _described(fake: Any, symbols: dict[Any, Place]) -> Any:
    import torch

    if fake is None or (isinstance(fake, int) and not isinstance(fake, bool)):
        return fake
    if isinstance(fake, torch.SymInt):
        return {"symint": expression(fake, symbols)}
    if not isinstance(fake, torch.Tensor):
        raise Unsaid
    # Compared only once known to be ints: a comparison of a symbolic size adds a guard.
    offset = fake.storage_offset()
    if type(offset) is not int or offset != 0:
        raise Unsaid
    item = {
        "shape": [expression(n, symbols) for n in fake.shape],
        "stride": [expression(n, symbols) for n in fake.stride()],
        "dtype": str(fake.dtype).removeprefix("torch."),
        "device": str(fake.device),
        "requires_grad": bool(fake.requires_grad),
    }
    if getattr(fake, "_is_inductor_static", False):
        # Inductor marks a GPU graph's static inputs on the example tensors themselves, and
        # then keys their storage's size: a saved output the backward's compile marked goes
        # into the next subgraph's key so. Made again without the mark, the next subgraph
        # missed on every new machine (transformers' rotary tables on an H200: 3 of 4 graph
        # parts traced again).
        item["static"] = True
    return item


def _symbolic(described: list[Any]) -> bool:
    """Whether a record holds an expression (else it is made as read)."""
    for item in described:
        if isinstance(item, dict):
            sizes = [item["symint"]] if "symint" in item else [*item["shape"], *item["stride"]]
            if any(type(n) is not int for n in sizes):
                return True
    return False


def _resolved(described: list[Any], inputs: Any) -> list[Any] | None:
    """The record with its expressions evaluated on this lookup's ``inputs``; None if they
    do not fit (then the subgraph compiles)."""
    if not _symbolic(described):
        return described
    try:
        out: list[Any] = []
        for item in described:
            if isinstance(item, dict) and "symint" in item:
                out.append(evaluated(item["symint"], inputs))
            elif isinstance(item, dict):
                shape = [evaluated(n, inputs) for n in item["shape"]]
                stride = [evaluated(n, inputs) for n in item["stride"]]
                out.append({**item, "shape": shape, "stride": stride})
            else:
                out.append(item)
        return out
    except Exception as e:  # a record that does not fit costs a compile, never the job
        log.debug("compileq: DDP subgraph record does not fit its inputs (%s)", e)
        return None


def _outputs(aot_key: str, example_inputs: Any) -> list[Any] | None:
    """The stored outputs of the subgraph with this key, checked, on the example inputs' GPU
    where the key is one for every index (``index_free``); None if absent or bad."""
    store = FEATURE.store
    if store is None:
        return None
    name = _record_key(aot_key)
    try:
        entry = store.get_many([name])[0]
    except Exception as e:  # a lost record costs a compile, never the job
        warn_once("ddp-aot-read", "compileq: DDP subgraph outputs unreadable (%s)", e)
        return None
    if entry is None:
        return None
    try:
        payload = entry.payload()
        described = _checked(json.loads(payload)) if len(payload) <= _MAX_RECORD else None
    except Exception as e:  # read, but not a record: replaced by the compile that follows
        warn_once("ddp-aot-read", "compileq: DDP subgraph outputs unreadable (%s)", e)
        described = None
    if described is not None and index_free.marked(aot_key):
        index = index_free.inputs_index(example_inputs)
        if index is None:
            return None  # inputs on no one GPU: the record is not at fault
        described = _moved(described, 0, index)
    outputs = None if described is None else _resolved(described, example_inputs)
    if outputs is None:
        with _lock:
            if len(_unfit) >= _PENDING_MAX:
                _unfit.clear()
            _unfit.add(name)
    return outputs


def _moved(described: list[Any], old: int, new: int) -> list[Any]:
    """The record with its outputs on ``cuda:old`` put on ``cuda:new``."""
    before, after = f"cuda:{old}", f"cuda:{new}"
    return [
        {**item, "device": after}
        if isinstance(item, dict) and item.get("device") == before  # a symbolic int has none
        else item
        for item in described
    ]


def _checked(described: Any) -> list[Any] | None:
    """The record as written by ``_describe``, or None: read from Redis, it is checked."""
    import torch

    if not isinstance(described, list):
        return None
    for item in described:
        if item is None or (type(item) is int):
            continue
        if isinstance(item, dict) and set(item) == {"symint"}:
            if not valid(item["symint"]):
                return None
            continue
        if not isinstance(item, dict) or set(item) - {"static"} != _FIELDS:
            return None
        if item.get("static", True) is not True:
            return None
        sizes, strides = item["shape"], item["stride"]
        if not (isinstance(sizes, list) and isinstance(strides, list)):
            return None
        if len(sizes) != len(strides) or not all(
            (type(n) is int and n >= 0) or (type(n) is list and valid(n))
            for n in (*sizes, *strides)
        ):
            return None
        if not isinstance(getattr(torch, str(item["dtype"]), None), torch.dtype):
            return None
        torch.device(str(item["device"]))  # raises on a malformed name
        if type(item["requires_grad"]) is not bool:
            return None
    return described


def _make(described: list[Any], mode: Any) -> list[Any]:
    import torch

    made: list[Any] = []
    with mode:
        for item in described:
            if not isinstance(item, dict) or "symint" in item:
                made.append(item["symint"] if isinstance(item, dict) else item)
                continue
            tensor = torch.empty_strided(
                item["shape"],
                item["stride"],
                dtype=getattr(torch, item["dtype"]),
                device=torch.device(item["device"]),
            )
            if item["requires_grad"]:
                tensor.requires_grad_(True)
            if item.get("static"):
                tensor._is_inductor_static = True  # type: ignore[attr-defined]
            made.append(tensor)
    return made
