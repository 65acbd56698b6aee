"""What a worker does with one ``compile_fx`` message: generate a graph's code for a client.

It runs Inductor's own child side of an out-of-process compile (``_run_in_child``, after
``clear_caches()`` as Inductor's subprocess scheme does), so the output is exactly what a
subprocess of the client would return. The kernels codegen builds go to the store under the
keys the client computes when it loads the output code: Triton kernels through compileq's pool
installed ``on_worker`` (sent to the worker's queue while a sibling pool process is free to
build them, else built here: see ``fx_slots``), C++ objects through the C++ cache. A codegen
that raises an error of the graph's own leaves a verdict before its failure is announced
(``fx_verdict``), so no other process sends the graph again.
"""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Iterator
from typing import Any

from compileq import keys
from compileq._laps import Laps
from compileq._log import log
from compileq.cache import meta
from compileq.cache.counters import Counter
from compileq.errors import ToolchainMismatch
from compileq.hooks.ledger import Patches
from compileq.tasks.fx_jobs import CODEGEN_ENV, FX, CodegenState, FxJob
from compileq.tasks.fx_wire import wire
from compileq.workers import faults, fx_debug, fx_lowered, fx_verdict
from compileq.workers.lifecycle import WorkerContext, admit, failed, open_job, settle

_installed_pid: int | None = None


def execute_compile_fx(task_key: object) -> str:
    admitted = admit(task_key, FX, _load_job)
    if isinstance(admitted, str):
        return admitted
    ctx, key, job = admitted
    client = ctx.store.client

    started_at = time.time()
    laps = Laps()  # a pool process's first graph also pays its one-time set-up: logged
    try:
        output, within = generate(ctx, job, laps, key)
        ctx.store.put(key, output)
        laps.lap("store")
    except Exception as e:  # Inductor's own error, or EntryTooLarge: the client compiles it
        log.warning("compileq worker: FX codegen of %s failed: %s", key, e)
        # Before the announcement: a process asking once the lease is gone finds the verdict.
        fx_verdict.remember(ctx, key, e)
        failed(client, key, e)
        return "failed"
    seconds = laps.total()
    ctx.store.count(
        {Counter.FX_REMOTE_COMPILES: 1},
        None,
        [
            meta.record_build_time(
                FX, key, key[len(keys.ARTIFACT) :][:48], seconds, ctx.worker_id, started_at
            )
        ],
    )
    settle(client, key)
    log.info(
        "compileq worker: generated graph %s in %.2fs (%s; in codegen: %s)",
        key,
        seconds,
        laps.describe(),
        within,
    )
    # The full collections postponed during codegen, now that the client has its output.
    gc.collect()
    return "built"


def _load_job(ctx: WorkerContext, key: str) -> FxJob:
    job = FxJob.from_bytes(open_job(ctx, key))
    toolchain = ctx.fx_toolchain(job.target)
    if toolchain is None:
        raise ToolchainMismatch(f"this worker does not generate code for {job.target}")
    if job.toolchain != toolchain.digest:
        raise ToolchainMismatch("the job's FX toolchain is not this worker's; not generating it")
    if job.key() != key:
        raise ToolchainMismatch("job content does not match its key; not generating it")
    return job


#: How many of Inductor's own timed phases a graph's log line names, the longest first.
_TOP_PHASES = 5
#: The client's donated buffers, swapped in for one codegen (``_codegen_state``).
_CODEGEN_STATE = Patches("fx-codegen-state")


def _inductor_events() -> dict[str, int]:
    """How many times each of Inductor's timed phases (``dynamo_timed``) has run here."""
    from torch._dynamo.utils import compilation_time_metrics

    return {name: len(times) for name, times in compilation_time_metrics.items()}


def _inductor_phases(since: dict[str, int]) -> str:
    """The longest of Inductor's timed phases run after ``since`` was taken: only the new
    entries are read (the lists grow with every graph this pool process generates)."""
    from torch._dynamo.utils import compilation_time_metrics

    grown = {
        name: sum(times[since.get(name, 0) :]) for name, times in compilation_time_metrics.items()
    }
    top = sorted(grown.items(), key=lambda item: -item[1])[:_TOP_PHASES]
    return ", ".join(f"{name} {s:.2f}s" for name, s in top if s >= 0.01)


def generate(ctx: WorkerContext, job: FxJob, laps: Laps, key: str) -> tuple[bytes, str]:
    """Inductor's ``_run_in_child`` on the job's input: the pickled output's bytes, and the
    longest of Inductor's own phases in it. A forward's output strides are stored for its
    client as soon as it is lowered (``fx_lowered``)."""
    import torch
    from torch._inductor.compile_fx_ext import _OutOfProcessFxCompile
    from torch._inductor.utils import clear_caches

    from compileq.workers.fx_input import ClientsInput

    _install_in_this_process(ctx)
    laps.lap("set-up")
    before = _inductor_events()
    # As Inductor's subprocess scheme: a previous graph's in-memory caches (and the temp
    # dirs they point at) must not leak into this one.
    clear_caches()
    torch._inductor.metrics.reset()
    # The output carries the graph's ops (and the stand-ins of the client's classes) back:
    # the wire admits the same ones both ways.
    with (
        ctx.fx_slots.generating(),
        _codegen_env(job.env),
        _codegen_state(job.state),
        fx_lowered.announced(ctx.store, key) as lowered,
        wire(),
        _full_collections_postponed(),
        _collections() as collected,
        fx_debug.profiled(ctx.settings.codegen_profile_dir, key),
        fx_debug.dumped(ctx.settings.codegen_dump_dir, key, job),
    ):
        faults.codegen()  # a test's injected codegen error, where Inductor's would be raised
        output = _OutOfProcessFxCompile._run_in_child(ClientsInput(job.pickled_input))
    laps.lap("codegen")
    phases = _inductor_phases(before)
    within = (lowered.describe(), phases, collected.describe())
    return bytes(output.value), ", ".join(p for p in within if p)


class _Collections:
    """Python's garbage collections during one codegen: how many full ones, and their time."""

    def __init__(self) -> None:
        self.full = 0
        self.seconds = 0.0
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.full += info.get("generation") == 2

    def describe(self) -> str:
        return f"gc {self.seconds:.2f}s ({self.full} full)" if self.seconds >= 0.01 else ""


@contextlib.contextmanager
def _collections() -> Iterator[_Collections]:
    """Time the collections a codegen triggers, for its log line: a codegen allocates millions
    of objects, and each full collection walks every live one of this pool process."""
    seen = _Collections()
    gc.callbacks.append(seen.callback)
    try:
        yield seen
    finally:
        gc.callbacks.remove(seen.callback)


#: Generation 2's threshold during a codegen: no full collection starts on its own in one.
_NO_FULL_COLLECTION = 1_000_000_000


@contextlib.contextmanager
def _full_collections_postponed() -> Iterator[None]:
    """No full collection during a codegen; the job runs one once its client has the output.

    A pool process keeps what each graph leaves (loaded modules, kernels, Inductor's
    memos), so a full collection walks more with every graph it generates: on an H100 worker
    (docs/BENCHMARKS.md) 2-4 of them took 0.11 s of a process's first codegen and 0.46 s of
    a later one, inside the time a client waits. Young collections still run, so a long
    codegen's short-lived garbage is freed as before; only what survives into the oldest
    generation waits, for one codegen. Rejected: the client's window (``gc.freeze()`` and
    ``gc.unfreeze()``, see inductor/gc_window.py), because ``unfreeze`` has no partial form
    and would thaw what the worker froze before forking its pool: each process would then
    write to the pages it shares with its parent (copy on write) at its next full collection.
    """
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], _NO_FULL_COLLECTION)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


@contextlib.contextmanager
def _codegen_state(state: CodegenState) -> Iterator[None]:
    """The client's thread count and donated buffers, as codegen reads them (``CodegenState``).

    Donated buffers are read through ``get_donated_idxs`` in ``torch._inductor.graph``, which
    looks in a tracing context that Inductor's pickler leaves without ``fw_metadata``; that
    one name is swapped, not a stand-in ``fw_metadata`` whose other fields would be missing.
    """
    import torch
    from torch._inductor import graph

    threads = torch.get_num_threads()
    if state.threads:
        torch.set_num_threads(state.threads)
    donated = None if state.donated is None else list(state.donated)
    swap = (
        _CODEGEN_STATE.swapped(graph, "get_donated_idxs", lambda: donated)
        if hasattr(graph, "get_donated_idxs")
        else contextlib.nullcontext()
    )
    try:
        with swap:
            yield
    finally:
        torch.set_num_threads(threads)


def _install_in_this_process(ctx: WorkerContext) -> None:
    """compileq's pool and C++ cache, once per pool process (Celery forks them)."""
    global _installed_pid
    if _installed_pid == os.getpid():
        return
    from compileq.features import install

    install(
        ctx.settings,
        fx=False,
        on_worker=ctx.fx_slots.sibling_free,
        send_slot=ctx.fx_slots.sending,
        kernel_share=ctx.fx_slots.kernel_share,
    )
    _deprecated_config_said()
    _installed_pid = os.getpid()


def _deprecated_config_said() -> None:
    """Inductor's deprecated config keys (2.15: ``use_mixed_mm``, ``mixed_mm_choice``) marked
    as warned about in this process. The job carries every key of the client's config
    (``save_config_portable``), the child side sets them all (``config.patch``), which warns
    once per deprecated key, and it records its warnings for the client to replay: every
    client printed two FutureWarnings for keys nobody had set. The rejected alternative,
    dropping those keys from the job, would edit Inductor's pickled input."""
    from torch._inductor import config

    for entry in getattr(config, "_config", {}).values():
        if getattr(entry, "deprecated", False):
            entry._deprecation_warned = True


@contextlib.contextmanager
def _codegen_env(env: dict[str, str]) -> Iterator[None]:
    """The client's values of the variables codegen reads, set or unset alike."""
    saved = {name: os.environ.get(name) for name in CODEGEN_ENV}
    try:
        for name in CODEGEN_ENV:
            if name in env:
                os.environ[name] = env[name]
            else:
                os.environ.pop(name, None)
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
