"""Building one Triton kernel, shared by workers and by clients' local fallback.

Both run Inductor's own job, ``_worker_compile_triton``, and keep its return value pickled:
that is exactly what stock Inductor's process pool sends back to the parent, so a client can
hand it to Inductor unchanged whichever machine built it.
"""

from __future__ import annotations

import functools
import os
import pickle
import time

from compileq.hooks.ledger import Patches
from compileq.tasks.jobs import TritonJob

_CROSS_COMPILE = Patches("cross-compile")


def _no_gpu_driver() -> None:
    """Replacement for ``triton_helpers.set_driver_to_gpu`` in processes that have no GPU."""


def enable_cross_compile() -> None:
    """Let this process build GPU kernels without a GPU.

    Kernel sources call ``triton_helpers.set_driver_to_gpu()`` at import, which fails with no
    active GPU backend. Nothing else needs the device: the target (arch, warp size) comes from
    the ``DeviceProperties`` written into the source, so the cubin is the one the GPU would get.
    """
    from torch._inductor.runtime import triton_helpers

    # In the ledger like every replacement of torch's; never undone: the process builds only.
    _CROSS_COMPILE.set(triton_helpers, "set_driver_to_gpu", _no_gpu_driver)
    # No CUDA context can be made here; make sure nothing tries on a machine that has a GPU.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def build_triton(job: TritonJob, extra_env: dict[str, str] | None = None) -> bytes:
    """Compile ``job`` to cubins; return the pickled ``(CachingAutotuner, elapsed_us)``."""
    from torch._inductor.codecache import _load_triton_kernel_from_source
    from torch._inductor.runtime.compile_tasks import _worker_compile_triton

    load = functools.partial(_load_triton_kernel_from_source, job.name, job.source)
    result = _worker_compile_triton(load, dict(extra_env or {}), dict(job.extra_config))
    return pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)


def build_triton_payload(
    job_json: bytes, extra_env: dict[str, str], cross_compile: bool
) -> tuple[bytes, float]:
    """Entry point for a local build in stock Inductor's subprocess pool (picklable by name).

    Returns the payload and the build's seconds, timed here rather than by the parent: the
    parent only sees submit-to-done, which includes waiting for a free pool process and would
    make the last kernels of a batch look like the slowest.
    """
    if cross_compile:
        enable_cross_compile()
    started = time.perf_counter()
    payload = build_triton(TritonJob.from_json(job_json), extra_env)
    return payload, time.perf_counter() - started
