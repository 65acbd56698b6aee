"""Cross-process single-flight leases: ``SET compileq:lock:<key> <owner> NX PX ttl``.

Every lease compileq takes has an expiry, and its value names its owner. So:

- release and refresh compare the owner inside Redis (Lua), and never touch a lease that
  expired and was taken by somebody else meanwhile;
- a lock found *without* an expiry was not set by compileq (a crash cannot leave one: the
  expiry is set in the same command), so it is stale: it is taken over in the same script
  that found it (atomic, so a live owner's lease is never replaced) and counted. Rejected
  alternative: waiting it out, which made every process wait the whole deadline for each
  graph in turn.

:class:`Leases` holds FX-graph leases (built in process) and refreshes them on one daemon
thread, so a slow compile keeps its lease and a process that dies loses it within ``ttl``.
Each lease is released on every path out of the compile that took it (``released_after``),
errors included; ``max_hold_s`` is the last resort.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import redis

from compileq import keys

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

_REFRESH = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

# Take the lease; if held by a lock with no expiry, that lock is stale: replace it. Returns
# 1 taken, 0 held by a live owner, 2 taken over a stale lock.
_TAKE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
if redis.call('PTTL', KEYS[1]) == -1 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def take_many(
    client: redis.Redis,
    names: Sequence[str],
    owner: str,
    ttl_ms: int,
    on_stale: Callable[[int], None] = lambda _: None,
) -> list[bool]:
    """Take the lease of each artifact key in ``names``; which ones this owner now holds.
    ``on_stale(n)`` is told how many were stale locks taken over."""
    if not names:
        return []
    script = client.register_script(_TAKE)
    pipe = client.pipeline(transaction=False)
    for name in names:
        script(keys=[keys.lock(name)], args=[owner, ttl_ms], client=pipe)
    results = [int(r) for r in cast("list[int]", pipe.execute())]
    stale = sum(r == 2 for r in results)
    if stale:
        on_stale(stale)
    return [r != 0 for r in results]


def release(client: redis.Redis, name: str, owner: str) -> bool:
    """Drop ``name``'s lease if ``owner`` still holds it."""
    return bool(client.register_script(_RELEASE)(keys=[keys.lock(name)], args=[owner]))


class Leases:
    def __init__(
        self,
        client: redis.Redis,
        ttl_s: float = 10.0,
        max_hold_s: float = 600.0,
        on_stale: Callable[[int], None] = lambda _: None,
    ) -> None:
        self._client = client
        self._ttl_ms = int(ttl_s * 1000)
        self._max_hold_s = max_hold_s
        self._on_stale = on_stale
        self.owner = new_owner()
        self._held: dict[str, float] = {}
        self._by_thread = threading.local()
        self._lock = threading.Lock()
        self._release = client.register_script(_RELEASE)
        self._refresh_one = client.register_script(_REFRESH)
        self._thread: threading.Thread | None = None

    def acquire(self, key: str) -> bool:
        # A lease this process holds already is its own to use again, as long as Redis says
        # it is still ours (one that expired and was taken meanwhile is not). Inductor looks
        # a graph up twice when AOTAutograd's entry is found but the FX graph it names is not
        # (lost in a Redis failover, or evicted): the second lookup, inside the compile the
        # first one's lease stands for, must not wait out the deadline for itself.
        with self._lock:
            ours = key in self._held
        if (
            not (ours and self._refresh_one(keys=[keys.lock(key)], args=[self.owner, self._ttl_ms]))
            and not take_many(self._client, [key], self.owner, self._ttl_ms, self._on_stale)[0]
        ):
            return False
        with self._lock:
            self._held.setdefault(key, time.monotonic())
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._refresh, name="compileq-leases", daemon=True
                )
                self._thread.start()
        self._mine().append(key)
        return True

    def release(self, key: str) -> None:
        with self._lock:
            held = self._held.pop(key, None)
        if held is not None:
            self._release(keys=[keys.lock(key)], args=[self.owner])

    def _mine(self) -> list[str]:
        mine: list[str] | None = getattr(self._by_thread, "keys", None)
        if mine is None:
            mine = self._by_thread.keys = []
        return mine

    @contextlib.contextmanager
    def released_after(self) -> Iterator[None]:
        """Release every lease this thread takes inside the block when it ends, however it
        ends: a compile that raised, or whose result Inductor chose not to cache, never
        puts, and a put is what releases a lease otherwise."""
        mine = self._mine()
        mark = len(mine)
        try:
            yield
        finally:
            taken, mine[mark:] = mine[mark:], []
            for key in taken:
                with contextlib.suppress(redis.RedisError):
                    self.release(key)

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
                    self._refresh_one(keys=[keys.lock(key)], args=[self.owner, self._ttl_ms])
