"""Faults a test asks a worker to inject: how the suite makes a worker's build fail for real.

``COMPILEQ_TEST_WORKER_FAULT`` is a comma-separated list of fault names, read by the job bodies
of a worker (``workers/``), never by a client, which does not import this layer; nothing sets
it in use. ``fx-codegen``: the codegen of every graph raises ``InjectedCodegenFault`` (a
``RuntimeError``, as Inductor's own lowering errors are) inside the codegen's own context, so
that the worker treats it exactly as a genuine codegen error of the graph's: logged, announced
as ``worker-error`` and remembered as a verdict (``workers/fx_verdict.py``). ``fx-slow=S``:
the codegen of every graph first sleeps S seconds, as a big graph's on a loaded worker takes
that long (the wait past the deadline for a job a live worker builds: cache/building.py).

Rejected alternatives: a graph that fails Inductor on the worker alone (the same graph is then
compiled by the client's Inductor, which would fail it too); a test patching the worker's code
(it runs in other processes, Celery's pool, which a test cannot reach into).
"""

from __future__ import annotations

import os
import time

#: The variable a test sets in a worker's environment.
VARIABLE = "COMPILEQ_TEST_WORKER_FAULT"
#: The fault that fails every graph's codegen.
FX_CODEGEN = "fx-codegen"
#: The fault that makes every graph's codegen slow: ``fx-slow=SECONDS``.
FX_SLOW = "fx-slow"


class InjectedCodegenFault(RuntimeError):
    """The codegen failure a test asked this worker for (``COMPILEQ_TEST_WORKER_FAULT``)."""


def injected(name: str) -> bool:
    """Whether this worker was started with the fault ``name``."""
    return name in {f.strip() for f in os.environ.get(VARIABLE, "").split(",")}


def _seconds(name: str) -> float:
    """The seconds of a fault given as ``name=SECONDS``; 0 if it was not asked for."""
    for fault in os.environ.get(VARIABLE, "").split(","):
        given, _, seconds = fault.strip().partition("=")
        if given == name:
            return float(seconds)
    return 0.0


def codegen() -> None:
    """Sleep, then raise the injected codegen fault, where a test asked for either."""
    if (pause := _seconds(FX_SLOW)) > 0:
        time.sleep(pause)
    if injected(FX_CODEGEN):
        raise InjectedCodegenFault(f"graph codegen failed on purpose ({VARIABLE}={FX_CODEGEN})")
