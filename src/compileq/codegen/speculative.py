"""Speculative backward codegen: a training graph's backward goes to the workers with its forward.

Stock AOTAutograd partitions a joint graph into a forward and a backward, compiles the forward,
and compiles the backward lazily, at its first backward call (see torch's Note: [Backward graph
lazy lowering]). With codegen on workers the two codegens then run one after the other, and a
DDP job's backwards run one bucket after another at its first ``loss.backward()``. So when the
forward misses every cache and its job has gone to a worker, compileq runs the backward compile
Inductor will run later, with the same module and example inputs, as far as sending its codegen
job (:func:`roundtrip.send_ahead`), and then stops it (:class:`Sent`); only then does the client
wait for the forward. The worker generates both at once; the lazy compile later finds the
backward's output in the store, or this process's lease on its job, and waits for the worker
instead of sending it again. Cold time becomes the longer of the two codegens, not their sum.

When: only after the forward missed and its job went to a worker (a warm cache, a new machine
or a missing worker pays nothing: no copy, no hash), and under DDPOptimizer once the subgraph
has been run on fake inputs (see ``_hold``).

What keeps this safe:

- The speculative compile stops before Inductor lowers anything here: at a local FX-cache entry
  (nothing to send), at the job (sent or found), or at any error (the lazy compile then does
  exactly what it would have done; nothing is counted as a fallback).
- The job key is Inductor's FX-graph hash of the backward as the lazy compile will see it, plus
  the codegen state (donated buffers) read from the same tracing context. If the lazy compile
  sees another graph (``retain_graph`` turned donation off, a recompile), its key differs and it
  sends its own job: only the worker's time is lost.
- Saved activations whose strides the compiled forward changed (Inductor's layout optimization
  of a convolution net, its padding): AOTAutograd restrides the backward's inputs once the
  forward is compiled. The worker stores the forward's output strides as soon as it has
  lowered it (``workers/fx_lowered.py``), early in its codegen; the waiting client then
  restrides the backward's inputs as AOTAutograd will (``_Pending.lowered``) and sends it, or
  sends it again, beside the rest of the forward's codegen. Where those strides are foreseen
  to differ (a layout Inductor chooses, a padding ``padding.may_pad`` sees coming), the
  backward is not sent before them: a backward sent with the traced ones would be a codegen
  nobody loads, beside the two that count. Should that early output not come
  (a worker of an older compileq, a Redis hiccup), the backward is sent once the forward is
  compiled, with AOTAutograd's own inputs (:func:`_prepared_then_send_backward`).
- No FX-graph lease is taken: the job's own lease gives single flight across ranks, and a lease
  held until a backward that may never run would make other processes wait for nothing.
- Run inside the forward's compile, it sets aside what Inductor keeps per compile
  (``TritonBundler``'s lists, AOTAutograd's graph name) and puts it back.

Rejected alternatives: compiling the backward in a thread beside the forward (Inductor's compile
state is per process: ``TritonBundler``, ``V.graph``, the compile lock); sending it when the
graph is partitioned (every warm start would pay a copy and a hash per backward: measured +1.4 s
on a new machine's 8-graph step); ``force_non_lazy_backward_lowering`` (compiles the backward in
this process, after the forward: the sum of both, not the longer).
"""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.codegen import padding
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.tasks import fx_strides

_GRAPH_COMPILE = "torch._functorch._aot_autograd.graph_compile"
_COMPILE_FX = "torch._inductor.compile_fx"
_DISTRIBUTED = "torch._dynamo.backends.distributed"
_AOT = "torch._functorch._aot_autograd"
_CODECACHE = "torch._inductor.codecache"
_thread = threading.local()
#: DDP backwards sent lately, by the identity of their inputs list, which a deferred forward's
#: check may restride in place (:func:`restrided`): a few frames' worth per thread.
_RESTRIDABLE = 64


@dataclass
class _Pending:
    """A partitioned graph's backward, to send once its forward has gone to a worker."""

    bw_module: Any
    compiler: Callable[..., Any]
    aot_config: Any
    #: What the forward compile sets in the tracing context and the lazy backward compile
    #: finds there (DDPOptimizer restores it per bucket): codegen reads the donated buffers.
    fw_metadata: Any
    #: Under DDPOptimizer: sent when the subgraph's fake run ends, not inside the forward.
    ddp: bool = False
    #: The partition's forward graph: whether Inductor will lay its activations out anew.
    fw_module: Any = None
    #: The forward missed every cache and its job went to a worker: the backward is worth
    #: sending (a forward compiled here, with no worker, makes speculation pure cost).
    forward_sent: bool = False
    #: The backward's example inputs as the lazy compile will take them (AOTAutograd's
    #: ``placeholder_list``, restrided to the forward's real strides), once the forward is
    #: compiled or its worker has lowered it; until then the partition's traced ones.
    inputs: list[Any] | None = None
    #: The inputs it was last sent with (None: never sent): sent again only if the strides
    #: differ.
    sent_inputs: list[Any] | None = None
    #: Symbolic sizes the forward saves for it: those come first among its inputs (and make
    #: AOTAutograd compile the backward at once, after the forward: nothing to speculate).
    num_symints: int = 0
    #: Held for its forward's lowered strides because Inductor may pad an activation it reads
    #: (``padding.may_pad``), not sent with the traced ones.
    held_for_padding: bool = False

    def send(self, inputs: list[Any] | None = None) -> bool:
        """Run the backward compile as the lazy one will (grad and autocast off, named
        "backward", on a copy, with its example inputs, or ``inputs`` where given) until its
        job is sent; unless it was sent with those strides already (the same key: every
        caller may ask, only a restride sends it again). Inside the forward's compile or
        not, with Inductor's per-compile state set aside; any error only means nothing was
        sent. Whether it was tried."""
        import torch
        from torch._functorch._aot_autograd.logging_utils import track_graph_compiling

        if inputs is None:
            inputs = self.inputs if self.inputs is not None else _traced_inputs(self.bw_module)
        if inputs is None or _same_strides(self.sent_inputs, inputs):
            return False
        self.sent_inputs = inputs
        started = time.perf_counter()
        try:
            FEATURE.patch_cache_lookup()
            with torch._subclasses.fake_tensor.unset_fake_temporarily():
                module_copy = copy.deepcopy(self.bw_module)
            with (
                _outside_the_forward_compile(),
                _forward_metadata(self.fw_metadata),
                _speculation(),
                torch.no_grad(),
                torch._C._DisableAutocast(),
                track_graph_compiling(self.aot_config, "backward"),
                suppress(Sent),
            ):
                self.compiler(module_copy, inputs)
            log.debug("compileq: backward sent ahead in %.3fs", time.perf_counter() - started)
        except Exception as e:  # speculation may be lost, never the compile it rides on
            warn_once(
                "speculate", "compileq: backward not sent ahead (%s: %s)", type(e).__name__, e
            )
        return True

    def lowered(self, payload: bytes) -> None:
        """The forward's output strides, stored by its worker once it lowered the forward
        (``tasks/fx_strides.py``), while this process waits for the rest: the backward's
        inputs restrided as AOTAutograd will restride them, and the backward sent with
        them unless it was sent with those strides already."""
        strides = fx_strides.parse(payload)
        inputs = None if strides is None else _restrided(self, strides)
        if inputs is not None and self.held_for_padding:
            self.padded(_same_strides(_traced_inputs(self.bw_module), inputs))
        if inputs is not None and self.send(inputs):
            self.inputs = inputs

    def padded(self, as_traced: bool) -> None:
        """A backward held for padding learns its forward's strides: count a hold for
        nothing (they came back ``as_traced``), once."""
        if self.held_for_padding and as_traced:
            FEATURE.count(Counter.FX_HELD_NOT_PADDED)
        self.held_for_padding = False


def _restrided(pending: _Pending, strides: fx_strides.Strides) -> list[Any] | None:
    """The backward's traced inputs with the saved activations' strides in ``strides`` (the
    forward's outputs), as ``_aot_stage2b_bw_compile`` makes them; None where the strides do
    not fit this graph."""
    import torch

    meta = pending.fw_metadata
    if meta is None or len(strides) != _outputs(pending.fw_module):
        return None  # not this forward's outputs: nothing to restride by
    traced = _traced_inputs(pending.bw_module)
    if traced is None:
        return None
    start, stop, _ = meta.tensors_saved_for_backwards_slice.indices(len(strides))
    saved = {o: s for o, s in enumerate(strides) if start <= o < stop and s is not None}
    with torch.no_grad():
        return saved_restrided(
            traced,
            meta.tensors_saved_for_backwards_slice,
            pending.num_symints,
            saved,
        )


def _traced_inputs(bw_module: Any) -> list[Any] | None:
    """A partitioned backward's example inputs as traced (its placeholders' values); None
    where one has none: a DDP subgraph's symbolic size under dynamic shapes, whose backward
    then goes unsent (it failed the job when this raised: the twenty-first session)."""
    from torch.fx.experimental.symbolic_shapes import fx_placeholder_vals

    try:
        values: list[Any] = fx_placeholder_vals(bw_module)
    except KeyError as e:
        log.debug("compileq: backward not sent ahead (no example value for %s)", e)
        return None
    return values


def saved_restrided(
    inputs: list[Any], saved: slice, symints: int, strides: dict[int, tuple[int, ...]]
) -> list[Any] | None:
    """A backward's ``inputs`` with the activations its forward saved given ``strides`` (by
    forward output), as AOTAutograd restrides them after the forward's compile: the saved
    tensors are the forward's outputs in ``saved``, found among the inputs after the
    ``symints`` sizes saved first; only those whose strides differ are replaced
    (``as_strided``). None where an output is no saved tensor of that many static
    dimensions. For the speculative send and for a deferred DDP forward (``deferred.Saved``)."""
    import torch

    start, stop, _ = saved.indices(1 << 30)
    out = list(inputs)
    for output, stride in strides.items():
        i = output - start + symints
        if not (start <= output < stop and 0 <= i < len(out)):
            return None
        value = out[i]
        if not isinstance(value, torch.Tensor) or value.dim() != len(stride):
            return None
        now = _static(value.stride())
        if now is None:
            return None
        if now != stride:
            out[i] = value.as_strided(value.shape, stride)
    return out


def _outputs(fw_module: Any) -> int:
    """How many outputs the partition's forward graph has (-1 if it cannot be told)."""
    for node in reversed(getattr(getattr(fw_module, "graph", None), "nodes", ())):
        if node.op == "output":
            args = node.args[0] if node.args else ()
            return len(args) if isinstance(args, (tuple, list)) else 1
    return -1


def _static(values: Any) -> tuple[int, ...] | None:
    """``values`` (a size or stride) as ints, or None if any is symbolic."""
    out = tuple(values)
    return out if all(type(v) is int for v in out) else None


def _same_strides(sent: list[Any] | None, inputs: list[Any]) -> bool:
    """Whether a backward sent with ``sent`` has ``inputs``' strides (so its key): the
    same tensors, or tensors restrided alike (static sizes and strides only)."""
    import torch

    if sent is None or len(sent) != len(inputs):
        return False
    for a, b in zip(sent, inputs, strict=True):
        if a is b:
            continue
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        shape = _static(a.size()), _static(a.stride())
        if None in shape or shape != (_static(b.size()), _static(b.stride())):
            return False
    return True


class Sent(BaseException):  # a signal through Inductor, not an error
    """Ends a speculative compile once its job is sent, found, or cannot be sent.

    A BaseException so that it passes through Inductor's ``except Exception`` (which wraps
    every error of ``compile_fx_inner`` in ``InductorError``) and compileq's own
    ``boundary.guard`` (which would compile the graph in process).
    """


def speculating() -> bool:
    """Whether this thread is inside a speculative backward compile."""
    return bool(getattr(_thread, "active", False))


@contextmanager
def _speculation() -> Iterator[None]:
    _thread.active = True
    try:
        yield
    finally:
        _thread.active = False


class Speculative(Feature):
    """Speculate every partitioned graph's backward, now or once AOTAutograd is imported."""

    name = "speculative"
    # Wrapped where torch has them, each losing a part when it does not: compile_fx's
    # _compile_fx_inner, _aot_stage2b_bw_compile, SubmodCompiler.run_node. aot_stage2_autograd
    # passes its backward compiler fifth since 2.12; 2.11's is read off the AOTConfig.
    targets = (
        Target(_GRAPH_COMPILE, "_aot_stage2a_partition"),
        Target(_GRAPH_COMPILE, "aot_stage2_autograd"),
        Target(_GRAPH_COMPILE, "_get_inner_meta", ("maybe_subclass_meta", "fw_metadata")),
        Target(f"{_AOT}.schemas", "AOTConfig"),
        Target(f"{_AOT}.schemas", "SubclassMeta"),
        Target(f"{_AOT}.schemas", "ViewAndMutationMeta"),
        Target(f"{_AOT}.logging_utils", "track_graph_compiling", ("aot_config", "graph_name")),
        Target(f"{_AOT}.logging_utils", "graph_being_compiled"),
        Target(f"{_AOT}.logging_utils", "nth_graph"),
        Target(_CODECACHE, "FxGraphCache.load_with_key", ("key",)),
        Target(_CODECACHE, "FxGraphCache._get_tmp_dir_for_key", ("cls", "key")),
        Target("torch._inductor.triton_bundler", "TritonBundler"),
        Target("torch._inductor.cudagraph_utils", "BoxedDeviceIndex"),
        Target("torch._inductor.utils", "BoxedBool"),
        Target("torch._subclasses.fake_tensor", "unset_fake_temporarily"),
        Target("torch.fx.experimental.symbolic_shapes", "fx_placeholder_vals", ("gm",)),
        Target("torch._dynamo.compiled_autograd", "compiled_autograd_enabled"),
        Target("torch._guards", "TracingContext.try_get"),
        # What codegen/padding.py reads of Inductor's padding rule; the CPU switch and the
        # set of fallbacks are read with a default where a release lacks them.
        Target("torch._inductor.config", "comprehensive_padding"),
        Target("torch._inductor.config", "padding_stride_threshold"),
        Target("torch._inductor.config", "padding_alignment_bytes"),
        Target("torch._inductor.config", "pad_channels_last"),
        Target("torch._inductor.config", "disable_padding_cpu", optional=True),
        Target("torch._inductor.lowering", "fallbacks", optional=True),
        Target(_COMPILE_FX, "_compile_fx_inner", ("gm", "example_inputs"), optional=True),
        Target(_GRAPH_COMPILE, "_aot_stage2b_bw_compile", optional=True),
        Target(_DISTRIBUTED, "SubmodCompiler.run_node", ("self", "n"), optional=True),
    )

    def wanted(self, ctx: Context) -> bool:
        return ctx.fx and ctx.settings.speculate and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_GRAPH_COMPILE: self._patch, _COMPILE_FX: self._patch_inner}

    def _patch_inner(self, module: Any) -> None:
        if callable(getattr(module, "_compile_fx_inner", None)):
            self.patches.wrap(module, "_compile_fx_inner", _inner_as_after_the_forward)
        else:
            log.info("compileq: this torch's Inductor differs; a mode's backward may be sent twice")

    def _patch(self, module: Any) -> None:
        partition = getattr(module, "_aot_stage2a_partition", None)
        stage2 = getattr(module, "aot_stage2_autograd", None)
        if partition is None or stage2 is None:
            log.info("compileq: this torch's AOTAutograd differs; the backward stays lazy")
            return
        self.patches.wrap(module, "_aot_stage2a_partition", _partition_then_send_backward)
        self.patches.wrap(module, "aot_stage2_autograd", _stage2_with_backward_compiler)
        if callable(getattr(module, "_aot_stage2b_bw_compile", None)):
            self.patches.wrap(module, "_aot_stage2b_bw_compile", _prepared_then_send_backward)
        else:
            log.info("compileq: this torch's AOTAutograd differs; a restrided backward is lazy")
        self.patches.after_import(_DISTRIBUTED, self._patch_ddp)

    def _patch_ddp(self, module: Any) -> None:
        submod = getattr(module, "SubmodCompiler", None)
        if submod is not None:
            self.patches.wrap(submod, "run_node", _run_node_then_send)

    def patch_cache_lookup(self) -> None:
        """Wrap the FX-cache lookup at the first speculation: patching it when AOTAutograd is
        imported would import Inductor's codecache in the middle of torch's own imports."""
        from torch._inductor.codecache import FxGraphCache

        if self.patches.any:  # else disabled meanwhile: nothing to add to
            self.patches.wrap_static(FxGraphCache, "load_with_key", _load_with_key)


FEATURE = Speculative()


def _stage2_with_backward_compiler(original: Callable[..., Any]) -> Callable[..., Any]:
    """``aot_stage2_autograd``, with its backward compiler at hand for the partition that
    follows (the lazy compile calls this one; ``AOTConfig.bw_compiler`` may be None)."""

    def stage2(*args: Any, **kwargs: Any) -> Any:
        compiler = kwargs.get("bw_compiler", args[4] if len(args) > 4 else None)
        outer = getattr(_thread, "bw_compiler", None), getattr(_thread, "pending", None)
        _thread.bw_compiler, _thread.pending = compiler, None
        try:
            return original(*args, **kwargs)
        finally:
            # A backward not sent by now stays lazy (its forward hit a cache, or never reached
            # a worker): the lazy compile must not be taken for this graph's forward.
            _thread.bw_compiler, _thread.pending = outer

    return stage2


def _partition_then_send_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    def partition(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        try:
            pending = _backward_of(result, [*args, *kwargs.values()])
            if pending is not None:
                _hold(pending)
        except Exception as e:  # speculation may be lost, never the compile
            warn_once(
                "speculate", "compileq: backward not sent ahead (%s: %s)", type(e).__name__, e
            )
        return result

    return partition


def _backward_of(result: Any, args: list[Any]) -> _Pending | None:
    """This partition's backward, to send later; None where nothing should be sent."""
    import torch
    from torch._functorch._aot_autograd import graph_compile
    from torch._functorch._aot_autograd.schemas import (
        AOTConfig,
        SubclassMeta,
        ViewAndMutationMeta,
    )

    from compileq.codegen import remote

    bw_module = result[1] if isinstance(result, tuple) and len(result) > 1 else None
    aot_config = next((a for a in args if isinstance(a, AOTConfig)), None)
    fw_metadata = next((a for a in args if isinstance(a, ViewAndMutationMeta)), None)
    if not isinstance(bw_module, torch.fx.GraphModule) or aot_config is None:
        return None
    compiler = getattr(_thread, "bw_compiler", None) or aot_config.bw_compiler
    if not callable(compiler) or not remote.active() or not _wanted():
        return None
    subclass_meta = next((a for a in args if isinstance(a, SubclassMeta)), None)
    inner = (
        None if fw_metadata is None else graph_compile._get_inner_meta(subclass_meta, fw_metadata)
    )
    symints = result[3] if len(result) > 3 and isinstance(result[3], int) else 0
    return _Pending(
        bw_module, compiler, aot_config, inner, fw_module=result[0], num_symints=symints
    )


def _hold(pending: _Pending) -> None:
    """Hold the send for the forward's compile (``forward_sent``); under DDPOptimizer, for
    the end of the subgraph's fake run.

    DDPOptimizer runs each compiled subgraph on fake tensors to make the next one's inputs,
    and that run gives the forward's outputs a ``grad_fn``: a backward's tangents are those
    very tensors, and ``requires_grad`` is part of Inductor's graph hash. Sent before, every
    bucket's backward but the last would be keyed (and generated) for the other value.
    """
    import torch

    _thread.pending = pending
    context = torch._guards.TracingContext.try_get()
    if context is None or getattr(context, "ddp_optimizer_ctx", None) is None:
        return
    pending.ddp = True
    after_run = getattr(_thread, "after_submodule", None)
    if after_run is not None:
        after_run.append(pending)
    # else a DDPOptimizer this torch lays out otherwise: nothing is sent, the backward stays lazy


def forward_sent() -> Callable[[bytes], None] | None:
    """Called once a graph's job is with a worker, before waiting for it. If that graph is the
    forward of a graph partitioned just now, send its backward now, inside the forward's
    compile (see ``_outside_the_forward_compile``), unless Inductor will lay the forward out
    anew; and return what the wait does with the forward's output strides once its worker
    has lowered it (``_Pending.lowered``: send it with them). Under DDPOptimizer, mark it
    for the end of the subgraph's fake run."""
    pending: _Pending | None = getattr(_thread, "pending", None)
    if pending is None or speculating():
        return None
    pending.forward_sent = True
    if pending.ddp:
        return None
    if not _held(pending):
        pending.send()
    return pending.lowered if pending.num_symints == 0 else None


def _held(pending: _Pending) -> bool:
    """Whether the backward waits for the strides its forward's worker stores once it has
    lowered the forward, rather than going now with the traced ones: where Inductor lays the
    forward out anew, or may pad an activation it saves (``padding.may_pad``, counted)."""
    if _lays_out_anew(pending.fw_module):
        return True
    meta = pending.fw_metadata
    saved = getattr(meta, "tensors_saved_for_backwards_slice", None)
    if pending.fw_module is None or not isinstance(saved, slice):
        return False
    try:
        held = padding.may_pad(pending.fw_module, saved)
    except Exception as e:  # another torch's graph: sent now, as before the rule
        log.debug("compileq: padding not predicted (%s: %s)", type(e).__name__, e)
        return False
    if held:
        pending.held_for_padding = True
        FEATURE.count(Counter.FX_HELD_FOR_PADDING)
    return held


def _lays_out_anew(fw_module: Any) -> bool:
    """Whether Inductor will choose its own layout for this forward's activations (its layout
    optimization: a convolution net's go channels-last; always so on CPU with oneDNN). The
    activations it saves for the backward then come back with strides the partition did not
    trace, AOTAutograd restrides the backward's inputs to them, and a backward sent with the
    traced ones is another graph: a worker's codegen lost (timm's ResNet on two H100s: 24
    codegens for 16 graphs, every backward generated again at its first call). Such a backward
    is sent as soon as the forward's worker has lowered it, with the strides it will save
    (``_Pending.lowered``), beside the rest of the forward's codegen; or, should those not
    come, once its forward is compiled (:func:`_prepared_then_send_backward`), while this
    process goes on to the next graph. Asked only once a forward went to a worker: a
    warm start never pays for it. Wrong either way costs one codegen or one overlap, never a
    wrong graph.
    """
    if fw_module is None:
        return False
    try:
        from torch._inductor.graph import GraphLowering

        return bool(GraphLowering.decide_layout_opt(fw_module, is_inference=False))
    except Exception as e:  # another torch's heuristic: send as for any graph
        log.debug("compileq: layout not predicted (%s: %s)", type(e).__name__, e)
        return False


def _prepared_then_send_backward(original: Callable[..., Any]) -> Callable[..., Any]:
    """AOTAutograd's backward preparation after the forward's compile: it restrides the
    backward's example inputs to the strides the compiled forward saved them with
    (``fwd_output_strides``) and keeps them for the lazy compile. Those are the inputs a
    backward must be sent with: a forward whose layout Inductor chose sends it now; one sent
    ahead with traced strides that turned out otherwise (padding) is sent again. Under
    DDPOptimizer the send stays at the end of the subgraph's fake run, with these inputs."""

    def bw_compile(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        pending: _Pending | None = getattr(_thread, "pending", None)
        if pending is None or speculating():
            return result
        try:
            _prepared(pending, result)
        except Exception as e:  # speculation may be lost, never the compile
            warn_once(
                "speculate", "compileq: backward not sent ahead (%s: %s)", type(e).__name__, e
            )
        return result

    return bw_compile


def _prepared(pending: _Pending, result: Any) -> None:
    lazy, compiled = result if isinstance(result, tuple) and len(result) == 2 else (None, None)
    inputs = getattr(lazy, "placeholder_list", None)
    if compiled is not None or not isinstance(inputs, list):
        return  # compiled already (symbolic sizes saved), or another torch's layout
    pending.inputs = inputs
    if pending.ddp or not pending.forward_sent:
        return
    # Not again if sent with these strides: beside the forward (AOTAutograd replaced no
    # input: it restrides only where strides differ), or once the worker lowered the forward.
    pending.send()


@contextmanager
def _outside_the_forward_compile() -> Iterator[None]:
    """Set aside what Inductor keeps for the compile in progress, and put it back after.

    ``TritonBundler`` collects a compile's kernels in class attributes that a nested compile
    would find taken (``begin_compile`` asserts they are free) and then clear; AOTAutograd
    names the graph being compiled in module globals; and a mode's config patch is entered
    already (``_reentrant_config_patches``).
    """
    from torch._functorch._aot_autograd import logging_utils
    from torch._inductor.triton_bundler import TritonBundler

    names = [n for n in ("_entries", "_static_autotuners", "_winners") if hasattr(TritonBundler, n)]
    bundler = {n: getattr(TritonBundler, n) for n in names}
    graph = (logging_utils.graph_being_compiled, logging_utils.nth_graph)
    for name in names:
        setattr(TritonBundler, name, None)
    try:
        with _reentrant_config_patches():
            yield
    finally:
        for name, value in bundler.items():
            setattr(TritonBundler, name, value)
        logging_utils.graph_being_compiled, logging_utils.nth_graph = graph


@contextmanager
def _reentrant_config_patches() -> Iterator[None]:
    """Let the backward's compile enter the config patch its forward's compile is inside.

    ``torch.compile(mode=...)`` (``reduce-overhead``, ``max-autotune``) decorates Inductor's
    inner compile with one ``config.patch(mode options)`` object, for the forward and the
    backward alike. torch 2.13 keeps a patch's saved values on a stack, but torch 2.11 keeps
    them in one dict of the ``patch()`` call's closure and refuses a second entry ("prior
    should be empty when entering ConfigPatch"): the backward sent ahead from inside the
    forward's compile failed there, and every such mode lost its speculation (the H100
    matrix, 2026-11-26). Here a decorated call into a patch that is entered already enters a
    new patch of the same changes instead. Rejected: compiling the backward outside the mode's
    patch: its key and code would differ from the lazy backward's, so the job sent ahead
    would be the wrong one.
    """
    import contextlib

    recreate = contextlib.ContextDecorator._recreate_cm

    def _recreate_cm(self: Any) -> Any:
        again = _second_entry(self)
        return again if again is not None else recreate(self)

    contextlib.ContextDecorator._recreate_cm = _recreate_cm  # type: ignore[method-assign]
    try:
        yield
    finally:
        contextlib.ContextDecorator._recreate_cm = recreate  # type: ignore[method-assign]


def _second_entry(patch: Any) -> Any | None:
    """A new ``config.patch`` of ``patch``'s changes if ``patch`` is torch 2.11's kind and
    entered already (its closure's ``prior`` holds the values it replaced), else None."""
    enter = getattr(type(patch), "__enter__", None)
    code, closure = getattr(enter, "__code__", None), getattr(enter, "__closure__", None)
    if code is None or not closure:
        return None
    cells = dict(zip(code.co_freevars, closure, strict=False))
    try:
        prior, config = cells["prior"].cell_contents, cells["config"].cell_contents
    except (KeyError, ValueError):  # torch 2.13 (a stack per object), or not a ConfigPatch
        return None
    changes = getattr(patch, "changes", None)
    if not (isinstance(prior, dict) and prior and isinstance(changes, dict)):
        return None
    return config.patch(dict(changes))


def _inner_as_after_the_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """Inductor's inner compile; while speculating, with the boxes the forward's post-compile
    settles as the lazy backward will find them (``_settled``)."""

    @functools.wraps(original)
    def compile_inner(gm: Any, example_inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if speculating():
            kwargs = _settled(kwargs, gm, example_inputs)
        return original(gm, example_inputs, *args, **kwargs)

    return compile_inner


def _settled(kwargs: dict[str, Any], gm: Any, example_inputs: Any) -> dict[str, Any]:
    """The backward's compile arguments as they will be once its forward's post-compile ran.

    A mode with CUDA graphs (``reduce-overhead``, ``max-autotune``) hands the forward and the
    backward two shared boxes: ``cudagraphs``, which the forward's post-compile empties when
    it will not capture the forward (a graph with no CUDA tensor), and the forward's device
    index, which it fills when it does. Both are in Inductor's key of the backward, and the
    backward sent ahead is compiled before that post-compile: with the boxes as they were,
    the lazy compile keyed another job, and the worker generated the backward twice (the CPU
    ``reduce-overhead`` run: 3 codegens for 2 graphs). So the speculative compile gets copies
    holding the values the post-compile will set; the shared boxes are never touched. A
    forward that a GPU graph's own content keeps from capture (a mutated input, a CPU op)
    still differs from the prediction, which costs a worker one codegen, as before.
    Rejected: sending the backward after the forward's post-compile, which waits for the
    forward's codegen, the very wait speculation removes.
    """
    from torch._inductor.cudagraph_utils import BoxedDeviceIndex
    from torch._inductor.utils import BoxedBool

    from compileq.codegen import remote
    from compileq.scheduler.fallback import Fallback

    cudagraphs = kwargs.get("cudagraphs")
    if not (kwargs.get("is_backward") and isinstance(cudagraphs, BoxedBool) and cudagraphs):
        return kwargs
    try:  # the devices as routing reads them (an index-less "cuda" is the current device)
        gpu, _, index = remote.graph_devices(gm, example_inputs)
    except Fallback:  # several GPUs: no prediction (a wrong one costs one codegen)
        return kwargs
    if gpu is None:
        return {**kwargs, "cudagraphs": BoxedBool(False)}
    forward = kwargs.get("boxed_forward_device_index")
    if index is not None and isinstance(forward, BoxedDeviceIndex) and forward.value is None:
        return {**kwargs, "boxed_forward_device_index": BoxedDeviceIndex(index)}
    return kwargs


def _run_node_then_send(original: Callable[..., Any]) -> Callable[..., Any]:
    def run_node(self: Any, node: Any) -> Any:
        outer = getattr(_thread, "after_submodule", None)
        pending: list[_Pending] = []
        _thread.after_submodule = pending
        try:
            out = original(self, node)
        finally:
            _thread.after_submodule = outer
        for each in pending:
            if each.forward_sent:
                # A forward Inductor will lay out anew, or may pad, saves its activations with
                # other strides: its backward goes once its worker has lowered it (``lowered``).
                if not _held(each):
                    each.send()
                _restridable(each)
        return out

    return run_node


def _restridable(pending: _Pending) -> None:
    if pending.inputs is None:
        return
    sent: OrderedDict[int, _Pending] | None = getattr(_thread, "restridable", None)
    if sent is None:
        sent = _thread.restridable = OrderedDict()
    sent[id(pending.inputs)] = pending  # the pending holds the list: its id stays its own
    while len(sent) > _RESTRIDABLE:
        sent.popitem(last=False)


def restrided(inputs: list[Any]) -> None:
    """A deferred DDP forward is loaded and checked, its backward's inputs restrided in place
    where its saved activations came back with other strides (``deferred.Saved``): a backward
    sent with other strides before, or not sent yet (a forward laid out anew whose early
    output never came), is sent now, as AOTAutograd's own restride sends one
    (:func:`_prepared`). Else its first call would find no job with its key and wait for a
    whole codegen (timm's ResNet under DDP on two H200s: 15.3 s of backward compiles in the
    first step, 3 backwards generated twice). One sent with these strides already, from its
    worker's early output (:func:`lowered`), is not sent again."""
    sent: OrderedDict[int, _Pending] | None = getattr(_thread, "restridable", None)
    pending = None if sent is None else sent.pop(id(inputs), None)
    if pending is not None and pending.inputs is inputs:
        pending.send()


def lowered(inputs: list[Any], restrided: list[Any]) -> bool:
    """A deferred DDP forward's worker has lowered it (its early output): its backward, whose
    inputs are ``inputs`` (AOTAutograd's list, not touched here), is sent now with
    ``restrided`` (copies with the strides the forward will save them with, or ``inputs``
    itself where those are the traced ones), unless it was sent with those strides already:
    sent again where it went with the traced strides, sent first where its forward is laid
    out anew (``_run_node_then_send``). The frame's check restrides ``inputs`` in place later
    (:func:`restrided`), once the forward is loaded. Whether it was sent (a backward whose
    forward this thread did not send is left to its lazy compile)."""
    sent: OrderedDict[int, _Pending] | None = getattr(_thread, "restridable", None)
    pending = None if sent is None else sent.get(id(inputs))
    if pending is None or pending.inputs is not inputs:
        return False
    pending.padded(restrided is inputs)
    return pending.send(restrided)


@contextmanager
def _forward_metadata(fw_metadata: Any) -> Iterator[None]:
    import torch

    context = torch._guards.TracingContext.try_get()
    if context is None or fw_metadata is None:
        yield
        return
    saved = context.fw_metadata
    context.fw_metadata = fw_metadata
    try:
        yield
    finally:
        context.fw_metadata = saved


def _wanted() -> bool:
    import torch

    if torch._dynamo.compiled_autograd.compiled_autograd_enabled:
        return False  # compiled autograd traces the backward itself
    # A bundled AOTAutograd cache compiles graphs without the FX cache: a speculative entry
    # would not be looked up.
    return not torch._functorch.config.bundled_autograd_cache


def _load_with_key(original: Callable[..., Any]) -> Callable[..., Any]:
    """Inductor's FX-cache lookup; while speculating, no lookup: a local entry ends the
    speculation (nothing to send), else it reads as a miss without touching the remote cache
    (whose hit would load the graph's code and kernels now, and whose miss takes a lease)."""

    def load_with_key(key: str, *args: Any, **kwargs: Any) -> Any:
        if not speculating():
            return original(key, *args, **kwargs)
        from torch._inductor.codecache import FxGraphCache

        if _has_local_entry(FxGraphCache, key):
            raise Sent
        return None, {"key": key, "cache_state": "miss", "components": []}

    return load_with_key


def _has_local_entry(cache: Any, key: str) -> bool:
    import os

    directory = cache._get_tmp_dir_for_key(key)
    return os.path.isdir(directory) and bool(os.listdir(directory))
