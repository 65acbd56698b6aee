"""Keeping CUDA out of a worker's main process, which forks Celery's pool.

Once a process has asked CUDA anything through torch (``torch.cuda.is_available()`` is enough:
it calls ``cudaGetDeviceCount`` and arms torch's fork poison), every child it forks fails its
first CUDA call with "Cannot re-initialize CUDA in forked subprocess". Triton builds never need
torch's CUDA state, so kernels are unaffected; FX codegen of a GPU graph does need it, and on
the H100 every such job failed in 30 ms and fell back to the client.

So the main process asks torch through NVML (``PYTORCH_NVML_BASED_CUDA_CHECK``), which arms
nothing, and before Celery forks, :func:`forks_cleanly` checks in a throwaway child that the
pool will be healthy. If it will not, the worker leaves the GPU FX queues alone (clients then
generate those graphs themselves, as stock does) and logs the first call that touched CUDA.

Rejected alternative: a spawned helper process per pool process for FX codegen. It works
whatever the main process did, but every pool process would pay a fresh torch import (seconds)
on its first graph, and the helper's lifetime would need managing; the poison has one cause,
which is cheaper to keep out.
"""

from __future__ import annotations

import functools
import os
import traceback
from typing import Any

from compileq.hooks.ledger import Patches

_first_touch: list[str] = []
_WATCH = Patches("cuda-first-touch", "the worker's log does not say where CUDA was first asked")


def prefer_nvml() -> None:
    """Make ``torch.cuda.is_available()`` and ``device_count()`` answer from NVML."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")


def watch() -> None:
    """Remember where this process first asks torch's CUDA runtime anything (for the log)."""
    import torch

    def recording(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not _first_touch:
                _first_touch.append("".join(traceback.format_stack(limit=16)[:-1]))
            return fn(*args, **kwargs)

        return wrapper

    # In the ledger like every replacement of torch's; kept for the worker's life.
    if hasattr(torch._C, "_cuda_getDeviceCount"):
        _WATCH.wrap(torch._C, "_cuda_getDeviceCount", recording)
    _WATCH.wrap(torch.cuda, "_lazy_init", recording)


def first_touch() -> str | None:
    return _first_touch[0] if _first_touch else None


def forks_cleanly() -> bool:
    """True when a child forked now could initialise CUDA (always, on a torch without CUDA)."""
    import torch

    if not torch.cuda._is_compiled():
        return True
    pid = os.fork()
    if pid == 0:  # the child only reads a flag, then leaves without running any cleanup
        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0
