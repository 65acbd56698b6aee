"""Which queue a kernel goes to, and whether anyone is listening there."""

from __future__ import annotations

import threading
import time

import redis

from compileq.config import Settings
from compileq.fingerprint import Target, Toolchain, local_toolchain
from compileq.tasks import liveness
from compileq.tasks.queues import triton_queue

#: How long a liveness answer is trusted. Asking per kernel would add a round trip to every
#: miss; a worker that dies inside this window is covered by the deadline.
_LIVENESS_CACHE_S = 2.0


class Router:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._client = client
        self._ttl = settings.heartbeat_ttl_s
        self._toolchains: dict[Target, Toolchain] = {}
        self._live: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def toolchain(self, target: Target) -> Toolchain:
        with self._lock:
            if target not in self._toolchains:
                self._toolchains[target] = local_toolchain(target)
            return self._toolchains[target]

    def queue(self, target: Target) -> str:
        return triton_queue(self.toolchain(target), target)

    def has_worker(self, queue: str) -> bool:
        now = time.monotonic()
        cached = self._live.get(queue)
        if cached and now - cached[0] < _LIVENESS_CACHE_S:
            return cached[1]
        live = liveness.live_count(self._client, queue, self._ttl) > 0
        self._live[queue] = (now, live)
        return live
