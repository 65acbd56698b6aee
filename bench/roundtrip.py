"""No-op compile round trips: the queue's own cost, with no compiler in it.

A task is sent for a key whose artifact is already stored, so the worker does everything a
build does (take the message, check the store, release the lease, announce on
``compileq:done``, ack) except compiling. Measured from the client: one task at a time
(latency p50/p99) and a burst of ``tasks`` at once (tasks per second).
"""

from __future__ import annotations

import hashlib
import statistics
import time
from typing import Any

import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.connect import redis_client
from compileq.tasks import events
from compileq.tasks.app import COMPILE_TRITON, client_app


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _queue(client: redis.Redis) -> str:
    names = sorted(
        k.decode() for k in client.scan_iter(match=keys.WORKERS + keys.QUEUE_PREFIX + "*")
    )
    if not names:
        raise RuntimeError("no live worker queue for the round-trip benchmark")
    return names[0][len(keys.WORKERS) :]


def noop_round_trips(settings: Settings, tasks: int, sequential: int = 50) -> dict[str, Any]:
    client = redis_client(settings.redis_url, settings)
    store = RedisStore(client, settings)
    queue = _queue(client)
    app = client_app(settings)
    run = hashlib.sha256(str(time.time()).encode()).hexdigest()[:8]
    names = [
        keys.artifact("triton", hashlib.sha256(f"noop-{run}-{i}".encode()).hexdigest())
        for i in range(tasks + sequential)
    ]
    for name in names:
        store.put(name, b"noop")
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(keys.DONE_CHANNEL)
    pubsub.get_message(timeout=2)

    def wait_for(pending: set[str], deadline: float) -> dict[str, float]:
        seen: dict[str, float] = {}
        while pending - seen.keys() and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.5)
            if message and (done := events.parse(message["data"])) and done.key in pending:
                seen[done.key] = time.perf_counter()
        return seen

    latencies = []
    for name in names[:sequential]:
        sent = time.perf_counter()
        app.send_task(COMPILE_TRITON, args=[name], queue=queue, task_id=name)
        got = wait_for({name}, time.monotonic() + 30)
        if name in got:
            latencies.append(got[name] - sent)
    burst = names[sequential:]
    started = time.perf_counter()
    for name in burst:
        app.send_task(COMPILE_TRITON, args=[name], queue=queue, task_id=name)
    got = wait_for(set(burst), time.monotonic() + 120)
    elapsed = (max(got.values()) - started) if got else float("nan")
    client.delete(*names)
    return {
        "queue": queue,
        "sequential": len(latencies),
        # The first round trip also opens the producer's connection and wakes a pool process
        # (47 ms against 2-5 ms on CPU): reported on its own, not as the tail of the rest.
        "first_ms": latencies[0] * 1000 if latencies else None,
        "latency_ms": [_pct(latencies[1:], 0.5) * 1000, _pct(latencies[1:], 0.99) * 1000]
        if len(latencies) > 1
        else None,
        "latency_ms_mean": statistics.mean(latencies) * 1000 if latencies else None,
        # In order sent: shows whether the slow ones are a pool process's first task.
        "latency_ms_each": [round(v * 1000, 2) for v in latencies],
        "burst": len(burst),
        "burst_done": len(got),
        "tasks_per_s": len(got) / elapsed if got else 0.0,
    }
