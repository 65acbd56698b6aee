"""Whether a graph's failed codegen on this worker was the graph's, and its verdict written.

A verdict (``cache/verdicts.py``) makes every later process compile the graph in process at
once, for a week. So only an error of the graph's own earns one: what Inductor's lowering,
codegen or kernel builds raised for this graph (a ``LoweringException``, a C++ or Triton
compile error, a stand-in of the client's code called: ``unimportable``). Not what says
nothing of the graph but of this worker or its moment: Redis or the broker failing
(``RedisError``), the disk, a socket or a file (``OSError``), memory (``MemoryError``, CUDA's
``OutOfMemoryError``), Celery's time limits, an output over the size cap, compileq's own
refusals (``CompileqError``): the graph is tried again by the next process that needs it.
The exception and the ones it was raised from or during are looked at, as
``lifecycle.failure_reason`` does, since Inductor wraps what a lowering raised in its own.

In doubt, no verdict: one written wrongly costs a graph its codegen on workers until it
expires, one not written costs one more try. Rejected: a list of the exceptions that are the
graph's, which Inductor's many error types (and the user code a graph calls) would outgrow.
"""

from __future__ import annotations

import time

import redis

from compileq._log import log
from compileq.cache import verdicts
from compileq.errors import CompileqError
from compileq.workers.lifecycle import WorkerContext, failure_reason


def _infrastructure() -> tuple[type[BaseException], ...]:
    """The exception types that say a try failed for this worker's sake, not the graph's."""
    from billiard.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

    found: list[type[BaseException]] = [
        redis.RedisError,
        OSError,
        MemoryError,
        SoftTimeLimitExceeded,
        TimeLimitExceeded,
        CompileqError,
    ]
    import torch

    oom = getattr(torch, "OutOfMemoryError", None)
    if isinstance(oom, type) and issubclass(oom, BaseException):
        found.append(oom)
    return tuple(found)


def the_graphs(error: BaseException) -> bool:
    """Whether ``error``, raised by a graph's codegen here, is the graph's own (see above)."""
    infrastructure = _infrastructure()
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        # A stand-in called (StandInCalled) is a RuntimeError, never an infrastructure type.
        if isinstance(current, infrastructure):
            return False
        current = current.__cause__ or current.__context__
    return True


def remember(ctx: WorkerContext, key: str, error: BaseException) -> bool:
    """Write the verdict on the graph of job ``key`` whose codegen raised ``error``, if the
    error is the graph's and verdicts are kept (``COMPILEQ_FX_FAILURE_TTL_S``); whether one
    was written. Before the failure is announced, so whoever asks next finds it; never
    raises: the announcement must go out whatever happens here."""
    ttl_s = ctx.settings.fx_failure_ttl_s
    if not ttl_s or not the_graphs(error):
        return False
    verdict = verdicts.Verdict(
        key, failure_reason(error), verdicts.first_line(error), ctx.worker_id, time.time()
    )
    try:
        verdicts.remember(ctx.store, verdict, ttl_s)
    except Exception as e:  # Redis away, or a bug of ours: the graph is only tried again
        log.warning("compileq worker: the failure of %s was not remembered: %s", key, e)
        return False
    log.info("compileq worker: remembered that %s fails codegen (%s)", key, verdict.error)
    return True
