"""Cross-process single-flight leases for work without a queue (FX graphs built in process).

A lease is ``SET compileq:lock:<key> <owner> NX PX ttl``. While held it is refreshed by one
daemon thread, so a slow compile keeps it, and a process that dies loses it within ``ttl``
(a fixed long lease would make everybody wait out a dead owner). A lease is given up after
``max_hold_s`` even if never released: the owner may have failed without storing anything.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid

import redis

from compileq import keys

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Leases:
    def __init__(self, client: redis.Redis, ttl_s: float = 10.0, max_hold_s: float = 600.0) -> None:
        self._client = client
        self._ttl_ms = int(ttl_s * 1000)
        self._max_hold_s = max_hold_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._held: dict[str, float] = {}
        self._lock = threading.Lock()
        self._release = client.register_script(_RELEASE)
        self._thread: threading.Thread | None = None

    def acquire(self, key: str) -> bool:
        if not self._client.set(keys.lock(key), self.owner, nx=True, px=self._ttl_ms):
            return False
        with self._lock:
            self._held[key] = time.monotonic()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._refresh, name="compileq-leases", daemon=True
                )
                self._thread.start()
        return True

    def release(self, key: str) -> None:
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            self._release(keys=[keys.lock(key)], args=[self.owner])

    def _refresh(self) -> None:
        while True:
            time.sleep(self._ttl_ms / 3000)
            now = time.monotonic()
            with self._lock:
                for key, since in list(self._held.items()):
                    if now - since > self._max_hold_s:
                        del self._held[key]
                live = list(self._held)
            for key in live:
                with contextlib.suppress(redis.RedisError):
                    self._client.pexpire(keys.lock(key), self._ttl_ms)
