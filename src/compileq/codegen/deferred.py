"""A DDP subgraph's forward does not wait for its worker: all of a frame's forwards generate at once.

Under DDP, Dynamo's DDPOptimizer compiles a frame's subgraphs one after another: it compiles
bucket k, then runs the compiled bucket on fake tensors to make bucket k + 1's inputs
(``SubmodCompiler.run_node``). That first call is fake (``fakify_first_call``): it returns the
forward graph's traced outputs restrided to the strides Inductor chose, read from the compiled
graph (``FakifiedOutWrapper``). So the next bucket waits for the whole of this one's codegen,
although all it needs are its outputs' strides, and with codegen on workers the forwards of a
frame generate one after another while the cluster could generate them all at once.

compileq sends such a forward's job and lets the compile go on as if Inductor had kept every
output's traced stride (user-visible outputs are kept so, ``keep_output_stride``; the others in
practice, as checked below). The compile gets a stand-in (:class:`Forward`) whose first real
call would fetch the worker's output; at the end of DDPOptimizer's compile, before anything
runs, every stand-in of the frame is fetched and loaded, and each graph's real output strides
are compared with the ones assumed:

- All equal (the rule): the frame is exactly what stock would have compiled, its forwards'
  codegens overlapped. What waited for the output (the FX-cache put, the DDP subgraph record
  of ``ddp_aot``) is done then.
- Only saved activations different (Inductor pads a saved activation's strides where a row is
  over 1024 elements and not a multiple of 128 bytes; ``comprehensive_padding``): they go
  only to the backward, which is not compiled yet. Its example inputs are restrided to the real
  strides, exactly as AOTAutograd restrides them after a forward it waited for
  (``_aot_stage2b_bw_compile``), and the frame stands. (The backward sent ahead with the
  traced strides, ``speculative``, is then another graph: it is sent again with the real
  ones, ``speculative.restrided``.)
- Any other different, or a fetch failed: the frame's compile runs again with nothing
  deferred, as stock would run it (graphs the workers generated are FX-cache hits then), and
  nothing is deferred again in this process (``ddp_forward_mispredictions``). Slower, never
  wrong: the stand-ins of the first attempt never run, and no record of a differing graph is
  stored.

Only where the first call is fake and nothing else reads the compiled forward before its
first real call: static shapes, no CUDA graphs, no C++ wrapper, no bundled AOTAutograd cache.

Rejected alternatives: generating bucket k + 1 from Inductor's strides of bucket k obtained
early (a worker now stores a forward's strides once lowered, ``workers/fx_lowered.py``, but
the client would still wait for the lowering of each bucket in turn); a thread per bucket
(Inductor's and AOTAutograd's compile state is per process); deferring graphs outside DDPOptimizer (a single graph has no chain, and
nothing would check its strides before its first call).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from compileq._log import log, warn_once
from compileq.cache.counters import Counter
from compileq.codegen import speculative
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.tasks import fx_strides

if TYPE_CHECKING:  # the round trip imports Celery's app: not at install
    from compileq.scheduler.roundtrip import Early

_DISTRIBUTED = "torch._dynamo.backends.distributed"
_CODECACHE = "torch._inductor.codecache"
_GRAPH_COMPILE = "torch._functorch._aot_autograd.graph_compile"
_OUTPUT_CODE = "torch._inductor.output_code"
_BUNDLER = "torch._inductor.triton_bundler"
_thread = threading.local()


class Saved:
    """A deferred forward's saved activations, as its backward's compile will read them: the
    backward's example inputs (AOTAutograd's ``placeholder_list``, restrided in place) and
    where the saved tensors sit among the forward's outputs."""

    def __init__(self, placeholders: list[Any], outputs: slice, symints: int) -> None:
        self.placeholders, self.outputs, self.symints = placeholders, outputs, symints

    def restride(self, differ: list[tuple[int, tuple[int, ...]]]) -> bool:
        """Give the backward's inputs these forward outputs' real strides (all or none);
        False where any is not a saved tensor (then the next bucket saw a wrong stride)."""
        restrided = speculative.saved_restrided(
            self.placeholders, self.outputs, self.symints, dict(differ)
        )
        if restrided is None:
            return False
        self.placeholders[:] = restrided  # in place: AOTAutograd's lazy compile reads this list
        return True


class Forward:
    """Stands in for a forward's ``OutputCode`` until its worker's output is fetched.

    Inductor sets its cache key and time on it and calls ``post_compile`` (which puts the
    assumed output strides where AOTAutograd reads Inductor's); the real graph gets them
    all once fetched. AOTAutograd calls it boxed, as a ``CompiledFxGraph``.
    """

    _boxed_call = True

    def __init__(
        self,
        fetch: Callable[[Mapping[str, Early]], Any],
        strides: list[tuple[int, ...] | None],
        early: str | None = None,
    ) -> None:
        self._fetch = fetch
        self.assumed = strides
        #: Where its worker stores its output strides once lowered (``keys.early``), until
        #: they are read (``lowered``) or the forward is loaded.
        self.early = early
        self._post: tuple[Any, ...] | None = None
        self._graph: Any = None
        self._then: list[Callable[[Any], None]] = []
        self._when_verified: list[Callable[[], None]] = []
        #: Which output's real strides were not the assumed ones (``verified``), for the log.
        self.mismatch = ""
        #: Set once AOTAutograd has made the backward's inputs (``_bw_compile``).
        self.saved: Saved | None = None
        #: The list AOTAutograd reads this compile's output strides from (``post_compile``):
        #: the backward step it hands to is this forward's, not another bucket's.
        self.reported: list[Any] | None = None
        #: What a call runs: the fetch first, then the real graph itself, so that a training
        #: step pays one call through this stand-in and no check.
        self._run: Callable[[Any], Any] = self._resolve_and_run

    def post_compile(self, example_inputs: Any, constants: Any, graph_kwargs: Any) -> None:
        import torch

        self._post = (example_inputs, constants, graph_kwargs)
        context = torch._guards.TracingContext.try_get()
        if context is not None and context.output_strides is not None:
            context.output_strides.extend(self.assumed)
            self.reported = context.output_strides

    def set_triton_bundle(self, bundle: Any) -> None:
        """Inductor's bundle of this compile's kernels: none were loaded here yet (the real
        graph gets its own, ``_bundled``)."""

    def then(self, fn: Callable[[Any], None]) -> None:
        """Run ``fn(graph)`` once the real graph is loaded (Inductor's FX-cache put)."""
        self._then.append(fn)

    def when_verified(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` once the real strides are known to equal the assumed ones."""
        self._when_verified.append(fn)

    def resolve(self, others: Mapping[str, Early] | None = None) -> Any:
        """Fetch, load and post-compile the real graph (once); it is returned. ``others``:
        early outputs read while its output is waited for (``_settled``)."""
        if self._graph is None:
            self.early = None
            graph = _bundled(functools.partial(self._load, others or {}))
            self._graph = graph
            self._run = graph
            for fn in self._then:
                fn(graph)
        return self._graph

    def _load(self, others: Mapping[str, Early]) -> Any:
        """The worker's output fetched, named and post-compiled as Inductor's own would be."""
        graph = self._fetch(others)
        for name in ("_time_taken_ns", "_fx_graph_cache_key", "_fx_graph_cache_debug_lines"):
            if name in vars(self):
                setattr(graph, name, vars(self)[name])
        if self._post is not None:
            graph.post_compile(*self._post)
        return graph

    def lowered(self, payload: bytes) -> None:
        """Its worker's early output: the strides its outputs will have, known once the
        worker lowered it. The backward goes with the saved activations' strides now
        (``speculative.lowered``), beside the rest of the frame's codegens, instead of once
        this forward is loaded: sent again where it went with the traced strides and those
        differ, sent first where its forward is laid out anew. Nothing else is decided
        here: the loaded graph's own strides are checked as before (``verified``), and a
        wrong early value that verified costs one backward's codegen."""
        self.early = None
        strides = fx_strides.parse(payload)
        saved = self.saved
        if strides is None or saved is None or len(strides) != len(self.assumed):
            return
        differ = {
            output: stride
            for output, (stride, assumed) in enumerate(zip(strides, self.assumed, strict=True))
            if stride is not None and assumed is not None and stride != assumed
        }
        restrided = (
            speculative.saved_restrided(saved.placeholders, saved.outputs, saved.symints, differ)
            if differ
            else saved.placeholders  # the traced strides: sent now if it never was
        )
        if restrided is None:  # a user output differs: the check after the load says so
            return
        if speculative.lowered(saved.placeholders, restrided) and differ:
            FEATURE.count(Counter.DDP_SAVED_RESTRIDED_EARLY)

    def _resolve_and_run(self, args: Any) -> Any:
        return self.resolve()(args)

    def verified(self) -> bool:
        """Whether the loaded graph's output strides are the ones the compile went on with,
        or differ only for saved activations, now restrided where the backward reads them
        (``Saved``); if so, what waited for that (``when_verified``) runs now."""
        real = getattr(self._graph, "output_strides", None)
        if real is None or len(real) != len(self.assumed):
            return False
        differ = []
        for output, (got, assumed) in enumerate(zip(real, self.assumed, strict=True)):
            if got is None:  # Inductor gave none: AOTAutograd keeps the traced strides too
                continue
            try:
                stride = tuple(int(str(s)) for s in got)
            except ValueError:  # a symbolic stride: not what was assumed
                return False
            if assumed is None:
                return False
            if stride != assumed:
                differ.append((output, stride))
        if differ:
            if self.saved is None or not self.saved.restride(differ):
                output, stride = differ[0]
                self.mismatch = f"output {output}: {stride} for the traced {self.assumed[output]}"
                return False
            FEATURE.count(Counter.DDP_SAVED_RESTRIDED)
        if self.saved is not None:  # its backward, unless sent with these strides already
            speculative.restrided(self.saved.placeholders)
        for fn in self._when_verified:
            fn()
        return True

    def __call__(self, args: Any) -> Any:
        return self._run(args)


def _bundled(load: Callable[[], Any]) -> Any:
    """``load()``'s graph, carrying Inductor's bundle of the kernels it loaded: what its FX
    entry stores, so that a process loading the entry finds its kernels there.

    Inductor collects a compile's kernels as it loads them (``TritonBundler``, between
    ``begin_compile`` and ``collect``, around codegen in ``compile_fx_inner``) and stores them
    in the graph's FX entry. A deferred forward's kernels load later, here, outside that
    window: its entry went out without them, and a new machine under DDP fetched every kernel
    one by one (132 fetches for timm's ResNet on two H200s, none on one GPU). Where another
    compile's window is open, its kernels are that compile's: nothing is bundled here."""
    from torch._inductor.triton_bundler import TritonBundler

    if getattr(TritonBundler, "_entries", None) is not None:
        return load()
    TritonBundler.begin_compile()
    try:
        graph = load()
        bundle = TritonBundler.collect()
    finally:
        TritonBundler.end_compile()
    with contextlib.suppress(AttributeError, NotImplementedError):  # an output without bundles
        graph.set_triton_bundle(bundle[0] if isinstance(bundle, tuple) else bundle)
    return graph


def static_shapes(example_inputs: Sequence[Any]) -> bool:
    """Whether no input is symbolic: no SymInt, no tensor of a symbolic size or stride."""
    import torch

    for value in example_inputs:
        if isinstance(value, torch.SymInt) or (
            isinstance(value, torch.Tensor)
            and not all(type(n) is int for n in (*value.shape, *value.stride()))
        ):
            return False
    return True


def assumed_strides(gm: Any, example_inputs: Sequence[Any]) -> list[tuple[int, ...] | None] | None:
    """Each output's traced strides (None for a non-tensor), as AOTAutograd's fake first call
    would return them; None where any size or stride is symbolic (then nothing is deferred)."""
    import torch

    if not static_shapes(example_inputs):
        return None
    output = next((n for n in reversed(gm.graph.nodes) if n.op == "output"), None)
    if output is None or not output.args or not isinstance(output.args[0], (list, tuple)):
        return None
    strides: list[tuple[int, ...] | None] = []
    for node in output.args[0]:
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor):
            stride = tuple(value.stride())
            if not all(type(n) is int for n in (*value.shape, *stride)):
                return None
            strides.append(stride)
        else:
            strides.append(None)
    return strides


def assumed(
    gm: Any, example_inputs: Sequence[Any], graph_kwargs: Any
) -> list[tuple[int, ...] | None] | None:
    """The output strides this graph's compile may go on with before its worker's output
    comes (``assumed_strides``); None where it must wait for it (see the module)."""
    import torch

    if FEATURE.off or getattr(_thread, "batch", None) is None:
        return None
    if graph_kwargs.get("is_backward") or graph_kwargs.get("cpp_wrapper"):
        return None
    if bool(graph_kwargs.get("cudagraphs")):
        return None
    if torch._functorch.config.bundled_autograd_cache:
        return None
    context = torch._guards.TracingContext.try_get()
    # output_strides is a list only while AOTAutograd compiles a forward and reads them back.
    if context is None or not context.fakify_first_call or context.output_strides is None:
        return None
    return assumed_strides(gm, example_inputs)


def defer(
    fetch: Callable[[Mapping[str, Early]], Any],
    strides: list[tuple[int, ...] | None],
    early: str | None = None,
) -> Forward:
    """A stand-in for the forward ``fetch`` loads, going on with ``strides`` (``assumed``);
    ``early``: where its worker stores its output strides once lowered."""
    forward = Forward(fetch, strides, early)
    _thread.batch.append(forward)
    _thread.last = forward
    _thread.awaiting_backward = forward
    FEATURE.count(Counter.DDP_FORWARDS_DEFERRED)
    return forward


def just_deferred() -> Forward | None:
    """The forward this thread deferred last, if its compile is the one finishing now (read
    once, by what AOTAutograd runs right after the forward's compile)."""
    forward: Forward | None = getattr(_thread, "last", None)
    _thread.last = None
    return forward


# -- install ----------------------------------------------------------------------------------


class Deferred(Feature):
    """Defer DDP subgraphs' forwards, from the next DDPOptimizer compile on."""

    name = "deferred"
    # _aot_stage2b_bw_compile is wrapped where torch has it: else a stride that differs for a
    # saved activation recompiles the frame.
    targets = (
        Target(_DISTRIBUTED, "DDPOptimizer.compile_fn", ("self", "gm", "example_inputs")),
        Target(_CODECACHE, "FxGraphCache._save_graph", ("key", "compiled_graph")),
        # What Forward stands in for, and what it calls on the real graph.
        Target(
            _OUTPUT_CODE,
            "OutputCode.post_compile",
            ("self", "example_inputs", "constants", "graph_kwargs"),
        ),
        Target(_OUTPUT_CODE, "OutputCode.set_triton_bundle", ("self", "triton_bundle")),
        Target(_BUNDLER, "TritonBundler.begin_compile"),
        Target(_BUNDLER, "TritonBundler.collect"),
        Target(_BUNDLER, "TritonBundler.end_compile"),
        Target("torch._guards", "TracingContext.try_get"),
        Target(_GRAPH_COMPILE, "_aot_stage2b_bw_compile", optional=True),
    )

    def __init__(self) -> None:
        super().__init__()
        #: Set after a misprediction: this process compiles its DDP forwards as stock from
        #: then on (until disabled).
        self.off = False

    def wanted(self, ctx: Context) -> bool:
        return ctx.fx and ctx.settings.defer_forwards and not ctx.in_worker

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {
            _DISTRIBUTED: self._patch_ddp,
            _CODECACHE: self._patch_save,
            _GRAPH_COMPILE: self._patch_bw_compile,
        }

    def disable(self) -> None:
        super().disable()
        self.off = False

    def _patch_ddp(self, module: Any) -> None:
        optimizer = getattr(module, "DDPOptimizer", None)
        if optimizer is not None:
            self.patches.wrap(optimizer, "compile_fn", _compile_fn)

    def _patch_save(self, module: Any) -> None:
        cache = getattr(module, "FxGraphCache", None)
        if cache is not None:
            self.patches.wrap_static(cache, "_save_graph", _save_graph)

    def _patch_bw_compile(self, module: Any) -> None:
        if hasattr(module, "_aot_stage2b_bw_compile"):
            self.patches.wrap(
                module, "_aot_stage2b_bw_compile", functools.partial(_bw_compile, module)
            )


FEATURE = Deferred()


def _bw_compile(module: Any, original: Callable[..., Any]) -> Callable[..., Any]:
    """AOTAutograd's step that makes the backward's inputs from the forward's output strides
    (torch 2.11 and 2.13: ``bw_module, maybe_subclass_meta, fw_metadata, fwd_output_strides,
    num_symints_saved_for_bw, aot_config[, bw_compiler]``): a forward deferred just before
    learns where they are, should its saved activations come back with other strides."""

    @functools.wraps(original)
    def bw_compile(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        forward: Forward | None = getattr(_thread, "awaiting_backward", None)
        if forward is not None and len(args) >= 5 and args[3] is forward.reported:
            _thread.awaiting_backward = None
            try:
                lazy, compiled = result
                if compiled is None:  # compiled already (dynamic shapes): nothing to restride
                    inner = module._get_inner_meta(args[1], args[2])
                    forward.saved = Saved(
                        lazy.placeholder_list, inner.tensors_saved_for_backwards_slice, args[4]
                    )
            except Exception as e:  # another torch's layout: a difference recompiles instead
                log.debug("compileq: saved activations not tracked (%s)", e)
        return result

    return bw_compile


def _save_graph(save: Callable[..., Any]) -> Callable[..., None]:
    """Inductor's FX-cache put; a deferred forward's happens once its graph is loaded."""

    def save_graph(key: str, graph: Any, *args: Any, **kwargs: Any) -> None:
        from compileq.scheduler import remote_mark

        if not isinstance(graph, Forward):
            save(key, graph, *args, **kwargs)
            return
        remote_mark.generated_remotely()  # the mark is for the put that now comes later

        def put(real: Any) -> None:
            remote_mark.mark_remote(True)  # generated by a worker: its put only shares it
            save(key, real, *args, **kwargs)

        graph.then(put)

    return save_graph


def _compile_fn(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def compile_fn(self: Any, gm: Any, example_inputs: Any, **configs: Any) -> Any:
        return frame(lambda: original(self, gm, example_inputs, **configs))

    return compile_fn


def frame(compile_parts: Callable[[], Any], again: Callable[[], Any] | None = None) -> Any:
    """``compile_parts()`` (a frame's subgraphs compiled one after another, by DDPOptimizer or
    ``codegen.split``) with their forwards deferred, then every one fetched and checked; where
    a check fails, ``again()`` (default: ``compile_parts`` with nothing deferred). Deferral off
    here: ``compile_parts()`` as it is."""
    if FEATURE.ctx is None or FEATURE.off or getattr(_thread, "batch", None) is not None:
        return compile_parts()
    batch: list[Forward] = []
    _thread.batch = batch
    try:
        compiled = compile_parts()
    finally:
        _thread.batch = None
        _thread.last = _thread.awaiting_backward = None
    if _settled(batch):
        return compiled
    # As stock: every forward waits for its codegen; those the workers generated are hits.
    return (again or compile_parts)()


def _settled(batch: list[Forward]) -> bool:
    """Fetch and check every deferred forward of the frame; False turns deferral off here."""
    why = ""
    for i, forward in enumerate(batch):
        # While this one is waited for, the others' workers lower theirs: each backward
        # that needs other strides is sent again as soon as its forward's are known.
        hoped = {f.early: f.lowered for f in batch[i:] if f.early and f.saved is not None}
        try:
            forward.resolve(hoped)
        except Exception as e:  # the worker's output lost or failed: compile again, as stock
            why = f"a deferred forward could not be loaded ({type(e).__name__}: {e})"
            break
        if not forward.verified():
            why = "Inductor chose other output strides than the traced ones"
            why += f" ({forward.mismatch})" if forward.mismatch else ""
            break
    if not why:
        if batch:
            log.debug("compileq: %d DDP forwards generated side by side", len(batch))
        return True
    FEATURE.off = True
    FEATURE.count(Counter.DDP_FORWARD_MISPREDICTIONS)
    warn_once(
        "deferred",
        "compileq: %s; compiling this frame again, and DDP forwards one by one from now on",
        why,
    )
    return False
