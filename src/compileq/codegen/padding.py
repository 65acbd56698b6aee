"""Whether Inductor may pad an activation that a training graph's forward saves for its backward.

Inductor pads the strides of a buffer whose layout it chooses (``comprehensive_padding``, on
for GPU graphs): a stride over ``padding_stride_threshold`` elements (1024) that is not a
multiple of ``padding_alignment_bytes`` (128 bytes: 64 bf16 or 32 float32 values) is rounded
up to one. A forward's saved activations are such buffers, so they come back from its compile
with strides the partition did not trace, and AOTAutograd restrides the backward's inputs to
them. A backward sent ahead with the traced strides (``speculative``) is then another graph:
it is sent again with the real ones once the forward's worker has lowered it, and the first
codegen is lost on a worker that is generating the forward and the real backward beside it.
On one H200, 4-core lanes, torch 2.11: 3 codegens for 2 graphs in swin_base (its windows'
49 x 49 attention bias, a 2,401-element stride), MobileBertForMaskedLM (its logits, a bias
added to a 30,522-wide matmul apart from it), beit_base and visformer_small, one extra in
AllenaiLongformerBase; swin's worker ran three codegens of 36-45 s at once on 4 CPUs and the
model was the one left slower than stock cold (1.08x).

So a backward whose forward may pad waits, as one whose forward Inductor lays out anew
(``speculative._lays_out_anew``), for the strides the forward's worker stores once it has
lowered it, and is sent once, with them, beside the rest of the forward's codegen.

The rule, over each saved tensor that the forward does not also hand on as an output of its
own (a user-visible output keeps its traced strides: a DDP bucket's activations for the
next) and that no convolution reads densely (directly or through operators other than
reductions: Inductor's ``dislike_padding``): the buffer that holds it (through views) is one whose layout Inductor chooses, that
is, not a graph input, not the output of a matmul or a convolution on a GPU (extern kernels:
their layout is fixed), not of an attention kernel nor of an operator Inductor runs from
ATen (a fallback); and walking its dimensions from the innermost as Inductor does, some
product of the sizes below a dimension is over the threshold and not aligned. Padding is off
on the CPU unless ``disable_padding_cpu`` is off (Inductor's own check: no GPU input), and
off for symbolic sizes.

Wrong either way costs what it cost before: a "may" that Inductor did not pad holds the
backward for its forward's lowering (a few seconds of overlap), a padding not foreseen
sends it twice. ``compileq stats`` counts both: ``fx_held_for_padding`` and, of those,
``fx_held_not_padded``.

Rejected alternatives: sending the backward with the padded strides predicted (which buffers
end up padded is decided during lowering: a bias add unfused from its matmul, a view that
needs a copy; a wrong guess costs a codegen, where a held send costs only its head start);
cancelling the codegen sent with the traced strides (another rank may be waiting on that
job's lease, and an aborted codegen would read as a failed one); holding every backward for
its forward's lowering (the overlap of a forward's lowering with its backward's codegen is
most of what speculation saves on a model that pads nothing).
"""

from __future__ import annotations

import operator
from typing import Any

#: Operators whose output Inductor lays out as the kernel gives it (extern kernels), so no
#: padding: by overload packet name, in ``torch.ops.aten``.
_FIXED = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_scaled_mm",
    "convolution",
    "convolution_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
)


#: Reductions: they write a buffer of their own, which Inductor may pad whoever reads it.
_REDUCTIONS = (
    "var_mean",
    "sum",
    "mean",
    "prod",
    "any",
    "amin",
    "amax",
    "min",
    "max",
    "argmin",
    "argmax",
    "scatter_reduce",
)

#: Of those, the matmuls, whose output Inductor lays out itself on the CPU.
_CPU_LAID_OUT = ("mm", "addmm", "bmm", "baddbmm")


def may_pad(fw_module: Any, saved: slice) -> bool:
    """Whether Inductor may pad one of the activations that the partition's forward graph
    ``fw_module`` saves (its outputs in ``saved``, AOTAutograd's
    ``tensors_saved_for_backwards_slice``)."""
    import torch
    from torch._inductor import config

    if not getattr(config, "comprehensive_padding", False):
        return False
    graph = getattr(fw_module, "graph", None)
    output = next((n for n in reversed(graph.nodes) if n.op == "output"), None) if graph else None
    if output is None or not output.args or not isinstance(output.args[0], (tuple, list)):
        return False
    gpu = _on_gpu(graph)
    if not gpu and getattr(config, "disable_padding_cpu", True):
        return False
    fixed = _fixed_targets(torch, gpu)
    threshold = int(config.padding_stride_threshold)
    align_bytes = int(config.padding_alignment_bytes)
    outputs = list(output.args[0])
    start = saved.indices(len(outputs))[0]
    visible = {id(n) for n in outputs[:start]}  # handed on by the forward: kept as traced
    dense = _read_dense(graph, torch)
    for node in outputs[saved]:
        if id(node) in visible or id(node) in dense or not isinstance(node, torch.fx.Node):
            continue
        held = _buffer(node, fixed)
        if held is None or id(held) in dense:
            continue
        value = held.meta.get("val")
        if isinstance(value, torch.Tensor) and pads(
            value, threshold, align_bytes, bool(config.pad_channels_last)
        ):
            return True
    return False


def pads(value: Any, threshold: int, align_bytes: int, channels_last: bool = False) -> bool:
    """Whether a buffer of ``value``'s sizes, strides and dtype gets a padded stride: filled
    from its innermost dimension (smallest stride first, as its strides order them), some
    stride above ``threshold`` that is not a multiple of ``align_bytes``' worth of elements.
    A channels-last tensor keeps its strides unless ``channels_last``; a symbolic size or
    stride is never padded."""
    sizes, strides = _ints(value.shape), _ints(value.stride())
    if sizes is None or strides is None or len(sizes) < 2:
        return False
    if not channels_last and len(sizes) in (4, 5) and _channels_last(sizes, strides):
        return False
    align = max(1, align_bytes // value.element_size())
    order = sorted(range(len(sizes)), key=strides.__getitem__)
    stride = 1
    for inner in order[:-1]:
        stride *= sizes[inner]
        if stride > threshold and stride % align:
            return True
    return False


def _read_dense(graph: Any, torch: Any) -> set[int]:
    """The nodes (by id) whose buffers Inductor leaves unpadded because a convolution (or a
    scaled matmul) reads them densely: those operators, and walking back from each, every
    producer that is no reduction, and so on (Inductor's ``dislike_padding`` marks: a padded
    input there costs a copy)."""
    aten = torch.ops.aten
    readers = {getattr(aten, n, None) for n in ("convolution", "convolution_backward")}
    readers |= {getattr(aten, n, None) for n in ("_scaled_mm", "_scaled_mm_v2")}
    reductions = {getattr(aten, n, None) for n in _REDUCTIONS}
    marked: set[int] = set()
    for node in reversed(graph.nodes):
        packet = _packet(node)
        if packet is None:
            continue
        if packet in readers:
            marked.add(id(node))
        if id(node) in marked:
            for prior in node.all_input_nodes:
                before = _packet(prior)
                if before is not None and before not in reductions:
                    marked.add(id(prior))
    return marked


def _packet(node: Any) -> Any | None:
    """An ATen-style call's overload packet; None for anything else."""
    if getattr(node, "op", None) != "call_function":
        return None
    return getattr(node.target, "overloadpacket", None)


def _buffer(node: Any, fixed: frozenset[Any]) -> Any | None:
    """The node whose value is the buffer holding ``node``'s (through views), if Inductor
    chooses that buffer's layout; None where it does not (an input, an extern kernel's
    output, an ATen fallback's, an operator of another namespace)."""
    for _ in range(64):  # a chain of views; deeper is left alone (sent as before)
        if node.op != "call_function":
            return None  # an input, or a submodule's output
        target = node.target
        if target is operator.getitem:  # one output of several: laid out as its producer's
            producer = node.args[0] if node.args else None
            return None if producer is None or _is_fixed(producer, fixed) else node
        if _is_view(target) and node.args and hasattr(node.args[0], "op"):
            node = node.args[0]
            continue
        return None if _is_fixed(node, fixed) else node
    return None


def _is_view(target: Any) -> bool:
    """An aliasing operator by its schema, or ``_unsafe_view`` (not one by its schema, but
    lowered as a view of its input)."""
    if getattr(target, "is_view", False):
        return True
    return getattr(getattr(target, "overloadpacket", None), "__name__", "") == "_unsafe_view"


def _is_fixed(node: Any, fixed: frozenset[Any]) -> bool:
    target = getattr(node, "target", None)
    if getattr(node, "op", None) != "call_function":
        return True
    if getattr(target, "namespace", None) not in ("aten", "prims"):
        return True  # a custom op, a higher-order op or a Python function: not Inductor's
    return getattr(target, "overloadpacket", None) in fixed or target in fixed


def _fixed_targets(torch: Any, gpu: bool = True) -> frozenset[Any]:
    """``_FIXED``'s packets this torch has, and the operators Inductor falls back to ATen for
    (``lowering.fallbacks``, where this torch keeps that set). On the CPU a matmul's output
    is not among them: there Inductor lays it out itself, and pads it (torch 2.15, with
    padding turned on for the CPU: examples/llama_script.py's bias-free linears)."""
    names = _FIXED if gpu else [n for n in _FIXED if n not in _CPU_LAID_OUT]
    packets = [getattr(torch.ops.aten, name, None) for name in names]
    try:
        from torch._inductor import lowering

        fallbacks = list(getattr(lowering, "fallbacks", ()))
    except Exception:  # another torch's Inductor: the listed extern kernels only
        fallbacks = []
    return frozenset(p for p in [*packets, *fallbacks] if p is not None)


def _on_gpu(graph: Any) -> bool:
    """Whether any of the graph's inputs lives on a device other than the CPU (Inductor
    turns padding off for a graph with none, unless told not to)."""
    for node in graph.nodes:
        if node.op != "placeholder":
            break
        device = getattr(node.meta.get("val"), "device", None)
        if device is not None and getattr(device, "type", "cpu") not in ("cpu", "meta"):
            return True
    return False


def _channels_last(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether ``strides`` are the channels-last contiguous ones for ``sizes`` (NHWC or
    NDHWC: channels innermost, then the spatial dimensions from the last, then batch)."""
    order = [1, *range(len(sizes) - 1, 1, -1), 0]
    expected, step = [0] * len(sizes), 1
    for dim in order:
        expected[dim] = step
        step *= sizes[dim]
    pairs = enumerate(zip(strides, expected, strict=True))
    return all(s == e or sizes[d] == 1 for d, (s, e) in pairs)


def _ints(values: Any) -> tuple[int, ...] | None:
    out = tuple(values)
    return out if all(type(v) is int for v in out) else None
