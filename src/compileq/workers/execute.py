"""What a worker does with one ``compile_triton`` message."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis

from compileq import keys
from compileq._log import log
from compileq.cache import meta
from compileq.cache.counters import Counter
from compileq.cache.envelope import open_sealed
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.errors import CompileqError, IntegrityError, ToolchainMismatch
from compileq.fingerprint import FxToolchain, Target, Toolchain
from compileq.tasks.events import Done, announce
from compileq.tasks.jobs import TRITON, TritonJob
from compileq.tasks.queues import triton_queue
from compileq.workers.build import build_triton
from compileq.workers.fx_slots import FxSlots


@dataclass
class WorkerContext:
    settings: Settings
    store: RedisStore
    toolchains: dict[Target, Toolchain]
    #: FX targets (fingerprint.fx_target) this worker generates code for, with its toolchain.
    fx_toolchains: dict[str, FxToolchain] = field(default_factory=dict)
    worker_id: str = "worker"
    #: Which pool processes are generating graphs. The default, one slot, is a worker of one
    #: process: no sibling is ever free, so codegen builds its kernels in place.
    fx_slots: FxSlots = field(default_factory=lambda: FxSlots(1))
    #: The FX toolchains the main process found after the pool forked (workers.late_fx): a pool
    #: process finds them itself, once, when it first meets a target it does not know.
    late_fx: Callable[[], dict[str, FxToolchain]] | None = None
    #: The model of the one GPU this worker is pinned to (it times autotuning candidates on
    #: it, see workers/tune.py); None for a --cpu-only worker.
    gpu_name: str | None = None

    def toolchain(self, target: Target | None) -> Toolchain:
        """This worker's toolchain for a job's kernel ``target``; refuses a target it lacks."""
        toolchain = self.toolchains.get(target) if target else None
        if target is None or toolchain is None:
            raise ToolchainMismatch(f"this worker does not build for target {target}")
        return toolchain

    def fx_toolchain(self, target: str) -> FxToolchain | None:
        if target not in self.fx_toolchains and self.late_fx is not None:
            late, self.late_fx = self.late_fx, None
            self.fx_toolchains.update(late())
        return self.fx_toolchains.get(target)


_context: WorkerContext | None = None


def configure(context: WorkerContext) -> None:
    """Set by the worker process before Celery forks its pool (children inherit it)."""
    global _context
    _context = context


def context() -> WorkerContext:
    if _context is None:
        raise CompileqError("worker context not configured (run through `compileq worker`)")
    return _context


def already_done(ctx: WorkerContext, key: object, kind: str) -> str | None:
    """The outcome of a task that needs no build: a malformed key (rejected), or an entry
    already stored (a duplicate delivery, or a client that built it while this waited)."""
    if not isinstance(key, str) or not key.startswith(keys.artifact(kind, "")):
        return reject(ctx, repr(key)[:200], f"malformed task message: expected a {kind} key")
    if ctx.store.get_many([key])[0] is not None:
        settle(ctx.store.client, key)
        return "cached"
    return None


J = TypeVar("J")


def admit(
    key: object, kind: str, load: Callable[[WorkerContext, str], J]
) -> tuple[WorkerContext, str, J] | str:
    """``(context, key, job)`` for a task this worker must run, or the outcome of one it need
    not (malformed, already stored, or a job it refuses: see ``already_done`` and ``reject``).
    ``load`` opens and checks the job; it raises CompileqError or ValueError to refuse it."""
    ctx = context()
    if (outcome := already_done(ctx, key, kind)) is not None:
        return outcome
    assert isinstance(key, str)
    try:
        return ctx, key, load(ctx, key)
    except (CompileqError, ValueError) as e:
        return reject(ctx, key, str(e))


def execute_compile_triton(task_key: object) -> str:
    admitted = admit(task_key, TRITON, _load_job)
    if isinstance(admitted, str):
        return admitted
    ctx, key, job = admitted
    client = ctx.store.client

    target = job.target
    assert target is not None  # _load_job checked it
    toolchain = ctx.toolchains[target]
    queue = triton_queue(toolchain, target)
    started = time.perf_counter()
    try:
        payload = build_triton(job)
        seconds = time.perf_counter() - started
        wrote = ctx.store.put(key, payload)
    except Exception as e:  # the kernel's own error, or EntryTooLarge; never cached as a success
        ctx.store.count(
            {Counter.KERNEL_REMOTE_FAILURES: 1}, {queue: {Counter.KERNEL_REMOTE_FAILURES: 1}}
        )
        log.warning("compileq worker: build of %s (%s) failed: %s", job.name, key, e)
        settle(client, key, f"{type(e).__name__}: {e}")
        return "failed"
    records = [meta.record_build_time(TRITON, key, job.name, seconds, ctx.worker_id)]
    if wrote:
        material = job.key_material(toolchain, target)
        record = meta.entry_record(
            material,
            toolchain.describe(),
            name=job.name,
            by=ctx.worker_id,
            seconds=round(seconds, 4),
        )
        records.append(meta.record_entry(key, record, ctx.settings.ttl_s))
    ctx.store.count(
        {Counter.KERNEL_REMOTE_COMPILES: 1}, {queue: {Counter.KERNEL_REMOTE_COMPILES: 1}}, records
    )
    settle(client, key)
    log.info("compileq worker: built %s in %.2fs", job.name, seconds)
    return "built"


def open_job(ctx: WorkerContext, key: str) -> bytes:
    """The verified bytes of the job stored for ``key`` (any kind); counted and refused if its
    signature fails, since building it means running what it contains."""
    raw = ctx.store.read_bounded([keys.job(key)])[0]
    if raw is None:
        raise CompileqError("job spec missing (expired, or never written by a client)")
    if isinstance(raw, int):  # never read: a client's jobs are sealed under the cap
        ctx.store.count({Counter.INTEGRITY_FAILURES: 1})
        raise CompileqError("job spec rejected: over the size cap, or not a string")
    try:
        return open_sealed(
            ctx.settings.secret_bytes(), keys.job(key), raw, ctx.settings.max_entry_bytes
        )
    except IntegrityError as e:
        ctx.store.count({Counter.INTEGRITY_FAILURES: 1})
        raise CompileqError(f"job spec rejected: {e}") from e


def _load_job(ctx: WorkerContext, key: str) -> TritonJob:
    job = TritonJob.from_json(open_job(ctx, key))
    target = job.target
    toolchain = ctx.toolchain(target)
    assert target is not None  # toolchain() refuses a job without one
    if job.key(toolchain, target) != key:
        raise ToolchainMismatch("job key does not match this worker's toolchain; not building it")
    return job


def reject(ctx: WorkerContext, key: str, reason: str) -> str:
    """Refuse a task that is malformed or not ours; whoever waits on it is told at once."""
    log.error("compileq worker: rejected task %s: %s", key, reason)
    ctx.store.count({Counter.REJECTED_TASKS: 1})
    if key.startswith(keys.ARTIFACT):
        with contextlib.suppress(redis.RedisError):
            settle(ctx.store.client, key, reason)
    return "rejected"


def settle(client: redis.Redis, key: str, error: str | None = None) -> None:
    """End a task (built, failed or rejected): drop its job and lease, then tell every waiting
    client how it went."""
    client.delete(keys.lock(key), keys.job(key))
    announce(client, Done(key, error is None, error))
