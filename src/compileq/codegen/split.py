"""A big graph compiled in parts: the workers generate one graph's parts side by side.

One graph's codegen is one worker process's work from start to end: lowering, fusion and kernel
code are Inductor's own single-threaded Python (timm's ResNet on an H200 worker: 8.7 s for its
forward, 10.9 s for its backward, 136 and 127 kernels). A job on one GPU waits for all of it,
while under DDP the same model's cold start took half as long: DDPOptimizer splits a frame's
graph at its gradient buckets, and compileq generates the subgraphs' forwards side by side
(``codegen.deferred``) and their backwards beside them (``codegen.speculative``).

So a graph outside DDP that is big enough is split the same way: cut into at most
``split_parts`` runs of operations in graph order, at least ``split_min_nodes`` each, each cut
placed near an even share where the fewest values cross it; then each part is compiled by
Inductor as DDPOptimizer compiles a bucket (``SubmodCompiler``: its first call fake, its
forward deferred, its AOTAutograd entry cached by ``codegen.ddp_aot``), and the frame is
checked as a DDP frame is (``deferred.frame``; a part that fails its check compiles the
graph whole, as stock, and nothing is split after in this process). What runs is what DDPOptimizer would have
made with those cuts: the parts' compiled forwards one after another, each part's backward
its own autograd node.

When: FX codegen on workers with deferred forwards on, a training graph (grad enabled, an
input that requires grad) with static shapes, no CUDA graphs, no C++ wrapper, no bundled
AOTAutograd cache, no higher-order op, no convolution (``has_convolution``), compiled by ``torch.compile``'s Inductor backend as it
comes (no inner compiler or decompositions of another caller), not already a DDPOptimizer
subgraph; on a GPU unless ``split_graphs=all``. Any error while splitting or compiling the
parts compiles the graph whole, as stock: slower, never failed.

Costs: no fusion across a cut (one or a few tensors go through memory at each), and one
autograd node and runtime wrapper per part; ``python -m bench matrix`` reports the step time
beside the first step's.

Rejected alternatives: splitting inside the worker after lowering (the parts' kernel code
would need one wrapper stitched from several processes' outputs, and Inductor's scheduler
state does not cross processes); cuts at parameter-size buckets as DDP's (a ResNet's
parameters sit in its last stages, its operations in its first: the first part would take most
of the codegen); threads (Inductor's compile state is per process).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.codegen import deferred
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target

if TYPE_CHECKING:
    from compileq.config import Settings

_COMPILE_FX = "torch._inductor.compile_fx"
_DISTRIBUTED = "torch._dynamo.backends.distributed"
#: Inductor settings under which a part's forward cannot be deferred (``deferred.assumed``),
#: so that splitting would only add cuts: checked with ``config_patches`` applied.
_WHOLE_IF = ("triton.cudagraphs", "cpp_wrapper", "fx_wrapper")
#: What ``torch.compile``'s Inductor backend passes (2.13 names the region, None by default).
_OWN_CALL = {"config_patches", "compile_region_name"}
_NOT_OURS = "not torch.compile's own call"
_thread = threading.local()


class Split(Feature):
    """Compile big graphs outside DDP in parts that the workers generate side by side."""

    name = "split"
    without = "big graphs compile whole"
    # DDP's propagate_* and Dynamo's saved-tensor hooks switch are used where torch has them.
    targets = (
        Target(_COMPILE_FX, "compile_fx", ("model_", "example_inputs_")),
        Target(
            _DISTRIBUTED, "SubmodCompiler.__init__", ("self", "module", "compiler", "fake_mode")
        ),
        Target(_DISTRIBUTED, "has_higher_order_op", ("gm",)),
        Target("torch.fx.passes.split_module", "split_module", ("m", "root_m", "split_callback")),
        Target("torch._guards", "TracingContext.try_get"),
        Target("torch._guards", "detect_fake_mode"),
    )

    def wanted(self, ctx: Context) -> bool:
        settings = ctx.settings
        return (
            ctx.fx
            and settings.defer_forwards
            and settings.split_graphs != "off"
            and not ctx.in_worker
        )

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_COMPILE_FX: self._patch}

    def _patch(self, module: Any) -> None:
        if callable(getattr(module, "compile_fx", None)):
            self.patches.wrap(module, "compile_fx", _compile_fx)


FEATURE = Split()


def cuts(
    ends: Sequence[int], parts: int, min_nodes: int, awkward: Sequence[bool] = ()
) -> list[int]:
    """Where to cut a graph of ``len(ends)`` operations in graph order, ``ends[i]`` the last
    operation that reads operation i's value (``len(ends)`` for the graph's output): the
    indices each later part starts at, at most ``parts - 1``, every part at least
    ``min_nodes`` long. Each cut is near an even share, where no ``awkward`` value crosses if
    it can be, then where the fewest values cross (they go through memory, unfused); none
    where no value crosses (a part that hands nothing on)."""
    n = len(ends)
    parts = min(parts, n // max(1, min_nodes))
    if parts < 2:
        return []
    crossing, odd = _crossing(ends, n), _crossing(ends, n, awkward)
    share = n / parts
    window = max(1, int(share // 4))
    chosen: list[int] = []
    for j in range(1, parts):
        target = round(j * share)
        low = max(target - window, (chosen[-1] if chosen else 0) + min_nodes)
        high = min(target + window, n - min_nodes * (parts - j))
        candidates = [p for p in range(low, high + 1) if crossing[p] > 0]
        if candidates:
            chosen.append(min(candidates, key=lambda p: (odd[p] > 0, crossing[p], abs(p - target))))
    return chosen


def _crossing(ends: Sequence[int], n: int, only: Sequence[bool] = ()) -> list[int]:
    """For each cut p: how many values made before operation p are read at p or after (of
    those ``only`` flags, where given)."""
    crossing = [0] * (n + 2)
    for i, end in enumerate(ends):
        if end > i and (not only or only[i]):
            crossing[i + 1] += 1
            crossing[min(end, n) + 1] -= 1
    for p in range(1, n + 1):
        crossing[p] += crossing[p - 1]
    return crossing


def awkward(value: Any) -> bool:
    """Whether a value should not cross a cut if another cut will do: not a tensor of
    static shape, or a tensor with a dimension of size 1, whose stride Inductor may choose
    otherwise than traced (insignificant, yet the part's check compares it: a ResNet's
    pooled features, [N, C, 1, 1], made its frame compile again on an H200)."""
    import torch

    if not isinstance(value, torch.Tensor):
        return True
    shape = tuple(value.shape)
    return not all(type(d) is int for d in shape) or (len(shape) > 1 and 1 in shape)


def plan(gm: Any, parts: int, min_nodes: int) -> dict[Any, int] | None:
    """Each of ``gm``'s operations' part (``cuts``); None where it stays whole."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    index = {node: i for i, node in enumerate(nodes)}
    ends = []
    for i, node in enumerate(nodes):
        reads = [index.get(user, len(nodes)) for user in node.users]
        ends.append(max(reads, default=i))
    odd = [awkward(node.meta.get("example_value", node.meta.get("val"))) for node in nodes]
    starts = cuts(ends, parts, min_nodes, odd)
    if not starts:
        return None
    part, bounds = 0, [*starts, len(nodes)]
    partition = {}
    for i, node in enumerate(nodes):
        while i >= bounds[part]:
            part += 1
        partition[node] = part
    return partition


def _whole(
    settings: Settings,
    model: Any,
    inputs: Sequence[Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> str:
    """Why this ``compile_fx`` call compiles its graph whole ("" where it may be split)."""
    import torch
    from torch._dynamo.backends.distributed import has_higher_order_op
    from torch._inductor import config

    if getattr(_thread, "inside", False) or args or set(kwargs) - _OWN_CALL:
        return _NOT_OURS
    if kwargs.get("compile_region_name") is not None:
        return "a named compile region"
    if deferred.FEATURE.ctx is None or deferred.FEATURE.off:
        return "forwards are not deferred"
    if not isinstance(model, torch.fx.GraphModule):
        return "not a graph"
    context = torch._guards.TracingContext.try_get()
    if context is None or getattr(context, "ddp_optimizer_ctx", None) is not None:
        return "no Dynamo frame, or a DDP subgraph"
    if not torch.is_grad_enabled() or torch._functorch.config.bundled_autograd_cache:
        return "not a training graph AOTAutograd caches per part"
    patches = kwargs.get("config_patches") or {}
    for name in _WHOLE_IF:
        if patches.get(name, functools.reduce(getattr, name.split("."), config)):
            return name
    if not deferred.static_shapes(inputs):
        return "dynamic shapes"
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    if not any(t.requires_grad for t in tensors):
        return "no input requires grad"
    if settings.split_graphs == "gpu" and all(t.device.type == "cpu" for t in tensors):
        return "not on a GPU"
    if has_higher_order_op(model):
        return "a higher-order operation"
    if has_convolution(model):
        return "a convolution"
    return ""


def has_convolution(gm: Any) -> bool:
    """Whether the graph convolves. Inductor lays a convolution net's activations out
    channels-last and hands a part's outputs on so, not as traced (timm's ResNet on an H200:
    (32768, 1, 2048, 128) for the traced (32768, 256, 16, 1)): every split frame compiled
    again, slower than whole."""
    for node in gm.graph.nodes:
        target = node.target if node.op == "call_function" else None
        if node.op == "call_module":
            target = type(gm.get_submodule(node.target))
        name = getattr(target, "__name__", "")
        if name.lower().lstrip("_").startswith("conv"):
            return True
    return False


def _partition(model: Any, inputs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``plan`` for this ``compile_fx`` call; None where the graph compiles whole."""
    ctx = FEATURE.ctx
    if ctx is None:
        return None
    settings = ctx.settings
    try:
        why = _whole(settings, model, inputs, args, kwargs)
        if why:
            if why != _NOT_OURS:
                log.debug("compileq: graph compiled whole (%s)", why)
            return None
        return plan(model, settings.split_parts, settings.split_min_nodes)
    except Exception as e:  # another torch's layout: as stock
        log.debug("compileq: graph not split (%s)", e)
        return None


def _compile_fx(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile_fx(model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        partition = _partition(model, inputs, args, kwargs)
        if partition is None:
            return original(model, inputs, *args, **kwargs)

        wholly: list[bool] = []

        def whole() -> Any:  # a part failed its check: as stock, not the parts one by one
            wholly.append(True)
            _forget_parts()
            return original(model, inputs, *args, **kwargs)

        try:
            compiled = deferred.frame(
                lambda: _compile_parts(original, model, inputs, partition, kwargs), whole
            )
        except Exception as e:  # as stock: the whole graph (its parts' codegen is not reused)
            warn_once(
                "split",
                "compileq: a graph's parts did not compile (%s: %s); compiling it whole",
                type(e).__name__,
                e,
            )
            _forget_parts()
            return original(model, inputs, *args, **kwargs)
        if wholly:
            return compiled
        FEATURE.count(Counter.GRAPHS_SPLIT)
        log.debug(
            "compileq: a graph of %d operations compiled in %d parts",
            len(partition),
            max(partition.values()) + 1,
        )
        return compiled

    return compile_fx


def _compile_parts(
    compile_fx: Callable[..., Any],
    gm: Any,
    inputs: Sequence[Any],
    partition: dict[Any, int],
    kwargs: dict[str, Any],
) -> Any:
    """``gm`` split at ``partition``, each part compiled as DDPOptimizer compiles a bucket;
    the split module, its parts replaced by their compiled code (what DDPOptimizer returns)."""
    import torch
    from torch._dynamo import utils
    from torch._dynamo.backends import distributed
    from torch._guards import detect_fake_mode
    from torch.fx.passes.split_module import split_module

    split_gm = split_module(gm, None, lambda node: partition[node])  # type: ignore[arg-type]
    for propagate in ("propagate_dynamo_source", "propagate_metadata"):
        if hasattr(distributed, propagate):  # torch 2.11 and 2.13
            getattr(distributed, propagate)(gm, split_gm)
    fake_mode = detect_fake_mode(inputs) or torch._subclasses.fake_tensor.FakeTensorMode()
    backend = functools.partial(compile_fx, **kwargs)
    _thread.inside = True
    try:
        compiler = distributed.SubmodCompiler(split_gm, backend, fake_mode)
        hooks_off = getattr(utils, "_disable_saved_tensors_hooks_during_tracing", None)
        with hooks_off() if hooks_off is not None else contextlib.nullcontext():
            compiler.run(*inputs)
    finally:
        _thread.inside = False
    split_gm.recompile()
    return split_gm


def _forget_parts() -> None:
    """What the parts' compile left in Dynamo's tracing context (``SubmodCompiler``'s DDP
    record, a fake first call): the whole graph's compile must not read it."""
    import torch

    context = torch._guards.TracingContext.try_get()
    if context is not None:
        context.ddp_optimizer_ctx = None
        context.fakify_first_call = False
