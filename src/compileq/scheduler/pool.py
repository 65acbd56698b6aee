"""The pool Inductor submits to once compileq is installed."""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from compileq.scheduler import boundary
from compileq.scheduler.client import Built, KernelClient
from compileq.scheduler.recognise import recognise, relocate_to_this_machine
from compileq.tasks import device_index


class CompileqPool:
    """Stands in for ``AsyncCompile.process_pool()``.

    Triton jobs go through the cluster; the future resolves to exactly what the stock pool's
    would (the ``(CachingAutotuner, elapsed_us)`` of ``_worker_compile_triton``), so Inductor
    continues unchanged. Every other job is handed to the stock pool, created only if needed.
    """

    def __init__(self, client: KernelClient, stock_pool: Callable[[], Any]) -> None:
        self.client = client
        self._stock_pool = stock_pool

    def _stock(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = self._stock_pool().submit(fn, *args, **kwargs)
        return future

    @boundary.guard("the Triton pool", instead=_stock)
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        from torch._inductor.async_compile import AsyncCompile

        if fn is AsyncCompile._get_ready:
            # Inductor's readiness probe: there is no pool to warm up, so we are ready now.
            ready: Future[Any] = Future()
            ready.set_result(fn())
            return ready
        recognised = recognise(fn, args, kwargs)
        if recognised is None:
            return self._stock(fn, *args, **kwargs)
        job, extra_env = recognised
        # Keyed and built as for cuda:0, so every rank of a node shares one build; loaded on
        # this kernel's own GPU (see tasks/device_index.py).
        index = device_index.kernel_index(job.source)
        if index:
            job = dataclasses.replace(job, source=device_index.normalise_kernel(job.source))
        built = _then(self.client.submit(job, extra_env), functools.partial(_unpickle, index))
        return boundary.or_else(
            "a Triton build", built, functools.partial(self._stock, fn, *args, **kwargs)
        )

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.client.close()


def _unpickle(index: int | None, built: Built) -> Any:
    # Safe to unpickle: the payload passed the HMAC check in the store (or was built here).
    result = pickle.loads(built.payload)
    relocate_to_this_machine(result[0])
    if index:
        device_index.retarget_kernel(result[0], index)
    return result


def _then(source: Future[Built], fn: Callable[[Built], Any]) -> Future[Any]:
    out: Future[Any] = Future()

    def relay(done: Future[Built]) -> None:
        error = done.exception()
        if error is not None:
            out.set_exception(error)
            return
        try:
            out.set_result(fn(done.result()))
        except Exception as e:
            out.set_exception(e)

    source.add_done_callback(relay)
    return out
