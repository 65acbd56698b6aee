"""A worker's Prometheus metrics, right across Celery's prefork pool.

Tasks run in pool children, so counters live in prometheus-client's multiprocess mode: each
process writes its own memory-mapped files under one directory per worker process, and the
parent's HTTP endpoint sums them. The directory is private to the worker process (named by
its metrics port, unique on a host) and emptied at start, so a restarted worker never adds a
dead predecessor's counts. Rejected alternative: a registry per child, which would expose
whichever child the scrape happened to reach.

Off unless ``compileq worker --metrics-port PORT`` is given: then ``observe`` costs a dict
lookup and a file-backed add per task.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from compileq._log import log

#: Build latencies run from ~0.1 s (a small pointwise kernel) to minutes (autotuned matmuls).
_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

_tasks: Any = None
_seconds: Any = None


def directory_for(port: int) -> Path:
    return Path(tempfile.gettempdir()) / f"compileq-metrics-{port}"


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Start the endpoint in this (the pool's parent) process; call before the pool forks."""
    global _tasks, _seconds
    directory = directory_for(port)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    # Read by prometheus-client when a metric value is created; children inherit it.
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    from prometheus_client import (
        CollectorRegistry,
        Counter,
        Histogram,
        multiprocess,
        start_http_server,
        values,
    )

    # The value class is chosen when prometheus_client is first imported; choose again in case
    # something imported it before the directory was set.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    _tasks = Counter(
        "compileq_worker_tasks",
        "Tasks handled, by kind, queue and outcome (built, failed, rejected, cached).",
        ["kind", "queue", "outcome"],
        registry=None,
    )
    _seconds = Histogram(
        "compileq_worker_task_seconds",
        "Seconds per task (outcome=built is the build latency), by kind, queue and outcome.",
        ["kind", "queue", "outcome"],
        buckets=_BUCKETS,
        registry=None,
    )
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    start_http_server(port, addr=addr, registry=registry)
    log.info("compileq worker: Prometheus metrics on :%d/metrics", port)


def observe(kind: str, queue: str, outcome: str, seconds: float) -> None:
    if _tasks is None:
        return
    _tasks.labels(kind, queue, outcome).inc()
    _seconds.labels(kind, queue, outcome).observe(seconds)
