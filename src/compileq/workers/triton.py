"""What a worker does with one ``compile_triton`` message."""

from __future__ import annotations

import time

from compileq._log import log
from compileq.build.triton import build_triton
from compileq.cache import meta
from compileq.cache.counters import Counter
from compileq.errors import ToolchainMismatch
from compileq.tasks.jobs import TRITON, TritonJob
from compileq.tasks.queues import triton_queue
from compileq.workers.lifecycle import WorkerContext, admit, failed, open_job, settle


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
        failed(client, key, e)
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


def _load_job(ctx: WorkerContext, key: str) -> TritonJob:
    job = TritonJob.from_json(open_job(ctx, key))
    target = job.target
    toolchain = ctx.toolchain(target)
    assert target is not None  # toolchain() refuses a job without one
    if job.key(toolchain, target) != key:
        raise ToolchainMismatch("job key does not match this worker's toolchain; not building it")
    return job
