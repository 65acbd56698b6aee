"""Building on this machine when the cluster cannot: in stock Inductor's own process pool."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from compileq.build.triton import build_triton_payload
from compileq.tasks.jobs import TritonJob


class LocalBuilder:
    """Runs compileq's build in the pool stock Inductor would have used.

    Reusing stock's pool (rather than a ProcessPoolExecutor of our own) keeps local builds
    where users expect them: same worker count, same subprocess start method (no re-import of
    the training script's ``__main__``), same logs.
    """

    def __init__(self, stock_pool: Callable[[], Any], cross_compile: bool | None = None) -> None:
        """``cross_compile=None`` decides at the first build: cross-compile iff no GPU here."""
        self._stock_pool = stock_pool
        self._cross_compile = cross_compile
        self._pid = os.getpid()

    def submit(self, job: TritonJob, extra_env: dict[str, str]) -> Future[tuple[bytes, float]]:
        """A future of ``(payload, build seconds)``."""
        if self._pid != os.getpid():
            # A forked child must not use its parent's pool (its pipes belong to the parent).
            # Inductor's own after-fork hook clears only the patched process_pool, not this.
            self._pid = os.getpid()
            clear = getattr(self._stock_pool, "cache_clear", None)
            if clear is not None:
                clear()
        if self._cross_compile is None:
            import torch

            # Asked only when a local build is needed: the hit path never touches CUDA.
            self._cross_compile = not torch.cuda.is_available()
        future: Future[tuple[bytes, float]] = self._stock_pool().submit(
            build_triton_payload, job.to_json(), extra_env, self._cross_compile
        )
        return future
