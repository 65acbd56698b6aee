"""A client waits for a live worker's CPU FX queues that are about to join, not falling back.

A worker adds its CPU FX queues (``compileq.fx.<digest>.cpu-<isas>``) only once its vector-ISA
probes are done (workers/late_fx.py): 46 s after it was ready on a node whose 2 cores other
jobs saturated, with the worker at nice 10 (issue 34, finding 9). Its heartbeat was on time
all along; a client that asked meanwhile found no live worker on the FX queue and compiled the
graph in process ("no live worker for FX queue").

So a worker that is still probing says so in its signed heartbeat: it beats into a *joining*
set per CPU FX queue it will serve (``pending_queue``: the queue's toolchain digest and GPU,
and a digest of this CPU's feature flags in place of the ISAs it does not know yet), its
record lists those names under ``pending_fx``, and the beat that adds the real queues takes it
out of them (cache/liveness.py, in one script). A client that finds no live worker on its FX
queue but a verified one joining it waits, polling, until the queue is served (then it sends
the graph), or nobody is joining any more (the worker died, or its probes found other ISAs:
then it falls back as before), or its deadline passes. The verification is the liveness
census's own, so a writer without the secret can make no client wait.

Rejected alternatives: running the probes before or beside the worker's start, so that every
queue joins at once, holds the kernel queues back for as long as the probes take (the kernels
then fall back instead) and makes a starved probe no faster; taking the verdicts from the
store (inductor/cpp_cache.py already does) saves nothing for the first worker of a CPU, whose
probes started before any client stored a verdict.
"""

from __future__ import annotations

import hashlib
import time

from compileq._log import log, warn_once
from compileq.fingerprint import FxToolchain, Target, cpu_flags
from compileq.scheduler.routing import Router
from compileq.tasks.queues import fx_queue

#: How often a waiting client asks whether the queue is served yet.
POLL_S = 0.25


def pending_queue(toolchain: FxToolchain, gpu: Target | None) -> str:
    """The joining set of the CPU FX queue a worker (or client) of this toolchain, GPU and CPU
    serves (or routes to) once the CPU's vector ISAs are known: named without them."""
    cpu = hashlib.sha256((cpu_flags() or "").encode()).hexdigest()[:16]
    return fx_queue(toolchain, f"{gpu}.cpu-joining-{cpu}" if gpu else f"cpu-joining-{cpu}")


def joined_in_time(router: Router, queue: str, pending: str, wait_s: float) -> bool:
    """Whether a live worker serves ``queue`` within ``wait_s``, waiting only while a verified
    worker says it is about to join it (its probes are running). Raises Redis's errors."""
    if router.live_count(pending, listed_in="pending_fx") == 0:
        return False
    warn_once(
        f"fx-join:{queue}",
        "compileq: no worker serves FX queue %s yet, but a live worker is finding its CPU's "
        "vector ISAs to join it; waiting for it (up to %.0fs) instead of compiling in process",
        queue,
        wait_s,
    )
    started = time.monotonic()
    end = started + wait_s
    while time.monotonic() < end:
        if router.has_worker(queue, fresh=True):
            log.info("compileq: FX queue %s joined after %.1fs", queue, time.monotonic() - started)
            return True
        if router.live_count(pending, listed_in="pending_fx") == 0:
            return router.has_worker(queue, fresh=True)
        time.sleep(POLL_S)
    return False
