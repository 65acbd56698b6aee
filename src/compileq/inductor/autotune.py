"""max-autotune's candidate timings: taken once per cluster, and shared through the store.

With ``mode="max-autotune"`` Inductor writes every candidate config of a GEMM (or other Triton
template) as a module, precompiles them all (through the Triton pool: compileq's workers), then
times them one after another in the compiling process and keeps the fastest. Stock times each
candidate in every process that meets the GEMM, and on a machine whose Triton cache lacks the
candidates (any process whose kernels a worker built) compiles each one again first, in turn.

Every timing is stored under the candidate's content key (``tasks/tune_jobs.py``: source,
sizes, config, GPU model, toolchain), so every later rank, job or machine with that GPU model
finds it and times nothing. What the store lacks is timed:

- in a client (the training process generating a graph itself), by the GPU workers of its GPU
  model: sent to their tune queue, where each worker takes some, timing on its own GPU (taking
  turns with the other workers on that GPU). A lease makes ranks meeting the same GEMM at once
  wait for one timing instead of taking their own;
- in a worker's graph codegen, in that process, as stock does, and then stored: its siblings
  built every candidate into its Triton cache, and on the H100 timing 120 candidates there
  took 1.9 s against 9.5 s for sending them to two workers sharing that GPU
  (docs/BENCHMARKS.md, "max-autotune").

ATen's candidates (and anything compileq cannot send: inputs Inductor generates itself,
collectives, no live worker of this GPU model, Redis down, a deadline passed) are timed here
exactly as stock does. Once every choice of a GEMM has a time, the GEMM's whole table is
stored too (``TABLE_KIND``: every choice's time, ATen's included, keyed by all the choices'
identities): a later process meeting that GEMM finds it and times nothing at all, and every
rank and machine then picks from the same numbers, so alike. Rejected: storing only the pick:
Inductor's hooks return timings, not a pick, and it keeps them for later decisions (a
``MultiTemplateBuffer``'s ``choice_timings`` when it weighs fusions).

Inductor's choice stays Inductor's: compileq only supplies timings.
Timings from another GPU of the same model compare as stock's own autotuning subprocess does
(``autotune_in_subproc``), which also times Triton candidates in another process.

Hooked: ``AlgorithmSelectorCache.benchmark_in_current_process`` and
``autotune_process.benchmark_in_sub_process``, the two ways Inductor 2.11 to 2.13 times
candidates (``make_benchmark_fn``); both take the candidates and return ``{choice: ms}``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from compileq._log import warn_once
from compileq.cache.counters import Counter
from compileq.fingerprint import Toolchain
from compileq.hooks.feature import Context, Feature
from compileq.hooks.targets import Target
from compileq.scheduler import boundary, roundtrip
from compileq.scheduler.client import KernelClient
from compileq.scheduler.progress import progress
from compileq.tasks import device_index
from compileq.tasks.queues import tune_queue
from compileq.tasks.tune_jobs import (
    TuneJob,
    table_key,
    table_of,
    table_payload,
    timing_of,
    timing_payload,
)

_SELECT = "torch._inductor.select_algorithm"


@dataclass
class Table:
    """Where a GEMM's whole table goes once every choice has a time: its key, and each
    choice's identity in it."""

    key: str
    identities: dict[Any, str]


@dataclass
class Tuned:
    """What the cluster answered for one GEMM's candidates."""

    #: Timings found in the store or taken by GPU workers just now.
    timings: dict[Any, float] = field(default_factory=dict)
    #: Inside a worker's codegen: the keys of the candidates it times itself, to store.
    share: dict[Any, str] = field(default_factory=dict)
    #: The GEMM's table to store once every choice is timed; None when it was found (then
    #: ``timings`` holds every choice) or cannot be keyed.
    table: Table | None = None


def tune(client: KernelClient, choices: Sequence[Any], gpu: str | None = None) -> Tuned:
    """The timings of those ``choices`` the cluster has or GPU workers took; the rest are left
    to the caller. ``gpu``: the model to time on (default: the candidates' own GPU's). Never
    raises for compileq's own reasons."""
    try:
        return _tune(client, choices, gpu)
    except Exception as e:  # the one rule: time them here instead
        boundary.internal_error("autotuning on workers", e)
        return Tuned()


def _tune(client: KernelClient, choices: Sequence[Any], gpu: str | None) -> Tuned:
    if client.redis_down():
        return Tuned()
    jobs = {c: job for c in choices if (job := job_of(c, gpu)) is not None}
    if not jobs:
        return Tuned()
    first = next(iter(jobs.values()))
    target = first.target
    assert target is not None  # job_of checked it
    toolchain = client.router.toolchain(target)
    queue = tune_queue(toolchain, first.gpu)
    store = client.store
    keyed = {c: job.key(toolchain) for c, job in jobs.items()}
    table = _table(choices, keyed, first.gpu, toolchain)
    # A worker's codegen times what the store lacks itself, on its own GPU, and stores it: it
    # has every candidate built in its Triton cache already (its siblings built them), and on
    # the H100 timing 120 candidates there took 1.9 s against 9.5 s for sending them to two
    # workers sharing that GPU (docs/BENCHMARKS.md). A client has neither: it sends them.
    here = client.in_worker
    try:
        by_key = {keyed[c]: job for c, job in jobs.items()}
        whole, timings = _read_with_table(client, table, list(by_key))
        if whole is not None:
            store.count({Counter.TUNE_TABLE_HITS: 1, Counter.TUNE_HITS: len(jobs)})
            progress.tuned(hits=len(jobs))
            return Tuned(whole)
        hits = set(timings)
        pending = {k: j for k, j in by_key.items() if k not in timings}
        if pending and not here:
            if client.router.has_worker(queue):
                timings.update(_send_and_wait(client, pending, queue))
            else:
                warn_once(
                    f"tune-no-worker:{queue}",
                    "compileq: no live worker of GPU %r serves %s: autotuning times candidates "
                    "in this process",
                    first.gpu,
                    queue,
                )
    except redis.RedisError as e:
        client.redis_failed(e)
        return Tuned()
    out = {c: timings[k] for c, k in keyed.items() if k in timings}
    found = sum(1 for k in keyed.values() if k in hits)
    store.count({Counter.TUNE_HITS: found, Counter.TUNE_LOCAL: len(jobs) - len(out)})
    progress.tuned(hits=found, remote=len(out) - found, local=len(jobs) - len(out))
    share = {c: k for c, k in keyed.items() if k not in timings} if here else {}
    return Tuned(out, share, table)


def _table(
    choices: Sequence[Any], keyed: dict[Any, str], gpu: str, toolchain: Toolchain
) -> Table | None:
    """The GEMM's table, keyed by every choice's identity: a Triton candidate's timing key,
    another choice's (ATen's) ``hash_key()``, which names its op and arguments; the sizes come
    with the Triton candidates' keys. None if some choice has no stable identity."""
    identities: dict[Any, str] = {}
    for choice in choices:
        if choice in keyed:
            identities[choice] = keyed[choice]
            continue
        try:
            identities[choice] = f"{type(choice).__name__}:{choice.hash_key()}"
        except Exception:  # no hash_key, or one that fails: this GEMM keeps no table
            return None
    if len(set(identities.values())) != len(identities):
        return None  # two choices Inductor tells apart that would share a time here
    return Table(table_key(list(identities.values()), gpu, toolchain), identities)


def _read_with_table(
    client: KernelClient, table: Table | None, names: list[str]
) -> tuple[dict[Any, float] | None, dict[str, float]]:
    """In one round trip: the GEMM's whole table (every choice's time) if stored, else the
    Triton candidates' stored timings."""
    if table is None:
        return None, _read(client, names)
    entries = client.store.get_many([table.key, *names])
    if entries[0] is not None:
        found = table_of(entries[0].payload(), list(table.identities.values()))
        if found is not None:
            return {c: found[i] for c, i in table.identities.items()}, {}
    return None, _timings(names, entries[1:])


def remember(client: KernelClient, table: Table, timings: dict[Any, float]) -> None:
    """Store the GEMM's table once every choice has a time: a later process, on any rank or
    machine with this GPU model, then times none of them, ATen's included, and picks alike."""

    def entries() -> dict[str, bytes]:
        if not all(c in timings for c in table.identities):
            return {}
        by_identity = {i: float(timings[c]) for c, i in table.identities.items()}
        return {table.key: table_payload(by_identity, client.client_id)}

    _put(client, entries)


def share(client: KernelClient, names: dict[Any, str], measured: dict[Any, float]) -> None:
    """Store the timings this worker's codegen took of candidates the store lacked."""
    _put(
        client,
        lambda: {
            name: timing_payload(float(measured[choice]), client.client_id)
            for choice, name in names.items()
            if choice in measured
        },
    )


def _put(client: KernelClient, entries: Callable[[], dict[str, bytes]]) -> None:
    """Store what ``entries`` makes; any failure, making them included, costs the cluster
    these timings, never the compile."""
    try:
        for name, payload in entries().items():
            client.store.put(name, payload)
    except redis.RedisError as e:
        client.redis_failed(e)
    except Exception as e:
        boundary.internal_error("storing autotuning timings", e)


def job_of(choice: Any, gpu: str | None = None) -> TuneJob | None:
    """The job that times ``choice`` on a worker; None for what stays here: anything but a
    Triton template on a CUDA GPU. ``gpu``: the GPU model (default: asked of CUDA)."""
    request: Any = getattr(choice, "bmreq", None)
    if type(request).__name__ != "TritonGPUBenchmarkRequest":
        return None
    outputs = request.output_tensor_meta
    device = (outputs[0] if isinstance(outputs, list) else outputs).device
    if device.type != "cuda":
        return None
    with open(request.module_path) as f:
        source = f.read()
    portable = copy.copy(request)
    # Written for cuda:0, where a pinned worker sees its one GPU: every index shares a timing.
    source = device_index.normalise_kernel(source)
    portable.module_path = portable.module_cache_key = ""
    for name in ("input_tensor_meta", "output_tensor_meta"):
        value = getattr(request, name)
        metas = [_on_cuda0(m) for m in (value if isinstance(value, list) else [value])]
        setattr(portable, name, metas if isinstance(value, list) else metas[0])
    for name in ("_benchmark_module", "n_regs"):
        portable.__dict__.pop(name, None)
    if gpu is None:
        import torch

        gpu = torch.cuda.get_device_name(device)
    job = TuneJob(request.kernel_name, source, portable, gpu)
    return job if job.target is not None else None


def _on_cuda0(meta: Any) -> Any:
    import torch

    return dataclasses.replace(meta, device=torch.device("cuda", 0))


def _read(client: KernelClient, names: list[str]) -> dict[str, float]:
    return _timings(names, client.store.get_many(names))


def _timings(names: list[str], entries: Sequence[Any]) -> dict[str, float]:
    """The readable timings among the store's ``entries`` of ``names``."""
    found: dict[str, float] = {}
    for name, entry in zip(names, entries, strict=True):
        if entry is not None and (ms := timing_of(entry.payload())) is not None:
            found[name] = ms
    return found


def _send_and_wait(
    client: KernelClient, pending: dict[str, TuneJob], queue: str
) -> dict[str, float]:
    """The timings GPU workers take of ``pending`` (through the round trip: the jobs whose
    lease this process takes are sent; the others are being timed already, another rank met
    the same GEMM, and are waited for alike). What could not be sent, failed or was refused,
    or is not back by the deadline, is left to time here."""
    jobs = [roundtrip.Job(roundtrip.TUNE, name, queue, j.to_bytes) for name, j in pending.items()]
    sent, waited = roundtrip.send_and_wait(client, jobs, roundtrip.deadline(client.settings))
    if sent.too_large:
        warn_once(
            "tune-too-large",
            "compileq: %s; timing it here",
            next(iter(sent.too_large.values())),
        )
    if waited.late:
        warn_once(
            "tune-deadline",
            "compileq: %d autotuning timings not back within %.0fs; timing them here",
            len(waited.late),
            client.settings.deadline_s,
        )
    names = list(waited.found)
    return _timings(names, [waited.found[name] for name in names])


# -- install ----------------------------------------------------------------------------------


_AUTOTUNE_PROCESS = "torch._inductor.autotune_process"
#: Both ways Inductor times candidates, as the ledger names them: both wrapped, or neither.
_HOOKS = (
    "AlgorithmSelectorCache.benchmark_in_current_process",
    f"{_AUTOTUNE_PROCESS}.benchmark_in_sub_process",
)


class Autotune(Feature):
    """Send autotuning timings to GPU workers from now on (once select_algorithm is loaded)."""

    name = "autotune"
    targets = (
        Target(
            _SELECT,
            "AlgorithmSelectorCache.benchmark_in_current_process",
            ("cls", "choices", "input_nodes", "layout", "input_gen_fns"),
        ),
        Target(_AUTOTUNE_PROCESS, "benchmark_in_sub_process", ("choices",)),
    )

    def wanted(self, ctx: Context) -> bool:
        return ctx.settings.tune_on_workers

    def imports(self) -> dict[str, Callable[[Any], None]]:
        return {_SELECT: self._activate}

    @property
    def active(self) -> bool:
        return self.patches.all_of(_HOOKS)

    def _activate(self, module: Any) -> None:
        cls = getattr(module, "AlgorithmSelectorCache", None)
        autotune_process: Any = sys.modules.get(_AUTOTUNE_PROCESS)
        if self.client is None or cls is None or autotune_process is None:
            return
        current = cls.__dict__.get("benchmark_in_current_process")
        sub = getattr(autotune_process, "benchmark_in_sub_process", None)
        if not isinstance(current, classmethod) or sub is None:
            warn_once(
                "tune-hooks",
                "compileq: this torch times autotuning candidates differently; they stay in "
                "process",
            )
            return
        self.patches.wrap(
            cls,
            "benchmark_in_current_process",
            lambda method: classmethod(_in_current_process(method.__func__)),
        )
        self.patches.wrap(autotune_process, "benchmark_in_sub_process", _in_sub_process)


FEATURE = Autotune()


def client() -> KernelClient | None:
    """The client timings go to workers through; None while the feature is off."""
    return cast("KernelClient | None", FEATURE.client)


def timed(
    client: KernelClient | None,
    choices: Sequence[Any],
    measure: Callable[[list[Any]], dict[Any, float]],
    shareable: bool = True,
    gpu: str | None = None,
) -> dict[Any, float]:
    """Timings of ``choices``: what the cluster answers (if ``shareable``), and ``measure``'s
    for the rest, which a worker's codegen then stores for everyone; and the GEMM's whole
    table, stored once complete. ``gpu``: as for ``tune``."""
    tuned = tune(client, choices, gpu) if client is not None and shareable else Tuned()
    rest = [c for c in choices if c not in tuned.timings]
    timings = dict(tuned.timings)
    if rest:
        measured = measure(rest)
        timings.update(measured)
        if client is not None and tuned.share:
            share(client, tuned.share, measured)
    if client is not None and tuned.table is not None:
        remember(client, tuned.table, timings)
    return {c: timings[c] for c in choices if c in timings}


def _in_current_process(
    original: Callable[..., dict[Any, float]],
) -> Callable[..., dict[Any, float]]:
    @functools.wraps(original)
    def benchmark_in_current_process(
        cls: Any,
        choices: Sequence[Any],
        input_nodes: Any,
        layout: Any,
        input_gen_fns: Any,
        *args: Any,
        **kwargs: Any,
    ) -> dict[Any, float]:
        def measure(rest: list[Any]) -> dict[Any, float]:
            with _this_gpu(client(), layout):
                return original(cls, rest, input_nodes, layout, input_gen_fns, *args, **kwargs)

        # Inputs Inductor makes itself (indices that must stay in range) cannot be remade on a
        # worker from sizes alone; a collective needs every rank in this very process.
        shareable = not input_gen_fns and not kwargs.get("is_collective")
        return timed(client(), choices, measure, shareable)

    return benchmark_in_current_process


def _this_gpu(client: KernelClient | None, layout: Any) -> contextlib.AbstractContextManager[None]:
    """Inside a worker's codegen, the GPU's lock while timing a GPU op here: the worker's
    siblings may be timing candidates of other graphs on the same GPU (see workers/tune.py)."""
    on_gpu = getattr(getattr(layout, "device", None), "type", None) == "cuda"
    if client is None or not client.in_worker or not on_gpu:
        return contextlib.nullcontext()
    from compileq.build.gpu_lock import gpu_lock

    return gpu_lock()


def _in_sub_process(original: Callable[..., dict[Any, float]]) -> Callable[..., dict[Any, float]]:
    @functools.wraps(original)
    def benchmark_in_sub_process(
        choices: Sequence[Any], *args: Any, **kwargs: Any
    ) -> dict[Any, float]:
        return timed(client(), choices, lambda rest: original(rest, *args, **kwargs))

    return benchmark_in_sub_process


def active() -> bool:
    """Whether Inductor's timings go through the cluster now."""
    return FEATURE.active
