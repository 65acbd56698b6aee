"""What a GPU worker does with one ``tune_triton`` message: time one autotuning candidate.

The candidate's module is written into this process's Inductor cache and timed by Inductor's
own ``TritonBenchmarkRequest.benchmark`` (random inputs of the recorded sizes and strides, as
stock's autotuning subprocess does). Its kernel is built by Triton here, usually a hit in the
worker's Triton cache: the client's precompile sent the same source to the kernel queue, which
the same workers serve.

Timings from one GPU are only comparable while nothing else runs on it, so every pool process
of every worker on this machine pinned to the same GPU takes that GPU's lock (``flock`` on a
file named after ``CUDA_VISIBLE_DEVICES``, ``build/gpu_lock.py``) around a benchmark. Rejected:
one benchmark per worker through Celery's concurrency, which leaves two workers started on one
GPU (a supervisor restarting a child while its old pool drains) timing each other's kernels.
"""

from __future__ import annotations

import math
import os
import time

from compileq._log import log
from compileq.build.gpu_lock import gpu_lock
from compileq.cache.counters import Counter
from compileq.errors import ToolchainMismatch
from compileq.tasks.tune_jobs import KIND, TuneJob, timing_payload
from compileq.workers.lifecycle import WorkerContext, admit, failed, open_job, settle


def execute_tune_triton(task_key: object) -> str:
    admitted = admit(task_key, KIND, _load_job)
    if isinstance(admitted, str):
        return admitted
    ctx, key, job = admitted
    started = time.perf_counter()
    error: str | None = None
    try:
        with gpu_lock():
            ms = benchmark(job)
    except Exception as e:  # the candidate's own failure: stock scores it inf and moves on
        ms, error = math.inf, f"{type(e).__name__}: {e}"
        log.warning("compileq worker: timing %s (%s) failed: %s", job.name, key, error)
    seconds = time.perf_counter() - started
    try:
        ctx.store.put(key, timing_payload(ms, ctx.worker_id, error))
    except Exception as e:  # EntryTooLarge cannot happen for a few bytes; Redis errors can
        failed(ctx.store.client, key, e)
        return "failed"
    ctx.store.count({Counter.TUNE_REMOTE: 1})
    settle(ctx.store.client, key)
    log.info(
        "compileq worker: timed %s %s: %.4f ms (%.2fs on GPU %s)",
        job.name,
        key,
        ms,
        seconds,
        os.environ.get("CUDA_VISIBLE_DEVICES", "?"),
    )
    return "built"


def benchmark(job: TuneJob) -> float:
    """Inductor's own benchmark of the candidate, its module written into this cache dir."""
    from torch._inductor.codecache import PyCodeCache

    request = job.request
    request.module_cache_key, request.module_path = PyCodeCache.write(job.source)
    return float(request.benchmark())


def _load_job(ctx: WorkerContext, key: str) -> TuneJob:
    job = TuneJob.from_bytes(open_job(ctx, key))
    toolchain = ctx.toolchain(job.target)
    if ctx.gpu_name != job.gpu:
        raise ToolchainMismatch(f"this worker's GPU is {ctx.gpu_name!r}, not {job.gpu!r}")
    if job.key(toolchain) != key:
        raise ToolchainMismatch("job key does not match this worker's toolchain; not timing it")
    return job
