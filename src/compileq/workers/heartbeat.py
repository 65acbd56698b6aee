"""A worker's heartbeat thread: keeps its queues' liveness entries fresh."""

from __future__ import annotations

import threading
from typing import Any

import redis

from compileq._log import log, warn_once
from compileq.tasks import liveness


class Heartbeat:
    def __init__(
        self,
        client: redis.Redis,
        worker_id: str,
        queues: list[str],
        info: dict[str, Any],
        interval_s: float,
        ttl_s: float,
    ) -> None:
        self._client, self.worker_id, self._queues, self._info = client, worker_id, queues, info
        self._interval, self._ttl = interval_s, ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="compileq-heartbeat", daemon=True)

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        try:
            liveness.beat(self._client, self.worker_id, self._queues, self._ttl, self._info)
        except redis.RedisError as e:
            warn_once("heartbeat", "compileq worker: heartbeat to Redis failed (%s); retrying", e)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        try:
            liveness.leave(self._client, self.worker_id, self._queues)
        except redis.RedisError as e:
            log.warning("compileq worker: could not remove heartbeat: %s", e)
