"""Cross-process single-flight leases: ``SET compileq:lock:<key> <signed value> NX PX ttl``.

A lease's value names its owner, the Redis server time it was taken or last renewed and its
lifetime, under an HMAC with the shared secret and the lock's own key
(``owner|taken_ms|ttl_ms|tag``). A lease is honoured only while that value verifies and its
signed lifetime has not run out on Redis's clock; anything else under a lock key (no expiry,
an unsigned or foreign value, a genuine value copied back with an hour's TTL, a value of
another Redis type) was not set by a live compileq owner, and the next taker replaces it at
once, with a compare-and-set on the value it judged (a live owner's lease is never replaced),
and counts it in ``stale_leases``. Rejected alternatives: honouring any value while its Redis
TTL lasts, which let one ``SET compileq:lock:<key> x PX 3600000`` make every build of that
key wait the whole deadline for an hour; and judging only TTL-less locks, which caught the
crash case but not a planted one.

So:

- release and refresh compare the owner inside Redis (Lua), and never touch a lease that
  expired and was taken by somebody else meanwhile;
- a refresh signs the value again with the server's time, so a lease lives exactly as long
  as its holder keeps proving it is alive.

:class:`Leases` holds FX-graph leases (built in process) and refreshes them on one daemon
thread, so a slow compile keeps its lease and a process that dies loses it within ``ttl``.
Each lease is released on every path out of the compile that took it (``released_after``),
errors included; ``max_hold_s`` is the last resort. A client keeps the leases of the jobs it
sent the same way (``keep``, from ``KernelClient.keep_lease``) until their worker drops them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import cast

import redis

from compileq import keys

#: Domain separation: a lease's tag is never an entry's, a job's or a heartbeat's.
_DOMAIN = b"compileq-lease-v1\0"
#: A lease value is a few dozen bytes; anything longer is not one, and is never read.
_MAX_VALUE_BYTES = 512

# Drop the lease if ``owner`` (ARGV[1]) still holds it: its signed value starts "owner|".
_RELEASE = """
local v = redis.call('GET', KEYS[1])
if v and (v == ARGV[1] or string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|') then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Renew the lease with a value signed now (ARGV[2], ARGV[3] ms) if ``owner`` still holds it.
_REFRESH = """
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""

# Take the lease: 1 taken; 2 taken over a lock no compileq owner can have set (no expiry, not
# a string, longer than any lease value); else the value holding it, for the taker to judge.
_TAKE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'string' or redis.call('PTTL', KEYS[1]) == -1
    or redis.call('STRLEN', KEYS[1]) > tonumber(ARGV[3]) then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return redis.call('GET', KEYS[1])
"""

# Replace a lock judged stale (ARGV[1], the value judged) unless it changed meanwhile.
_TAKE_OVER = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
"""


def server_ms(client: redis.Redis) -> int:
    """Redis's own clock in milliseconds: leases are judged on it, never on a node's."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _tag(secret: bytes, name: str, owner: str, taken_ms: int, ttl_ms: int) -> str:
    material = f"{keys.lock(name)}\0{owner}\0{taken_ms}\0{ttl_ms}".encode()
    return hmac.new(secret, _DOMAIN + material, hashlib.sha256).hexdigest()[:32]


def signed_value(secret: bytes, name: str, owner: str, taken_ms: int, ttl_ms: int) -> str:
    """The value of ``name``'s lease held by ``owner``, taken (or renewed) at ``taken_ms``."""
    return f"{owner}|{taken_ms}|{ttl_ms}|{_tag(secret, name, owner, taken_ms, ttl_ms)}"


def _live(secret: bytes, name: str, value: bytes | str, now_ms: int) -> tuple[str, int] | None:
    """``(owner, lifetime ms)`` of ``value`` found under ``name``'s lock if it is a live
    owner's lease: signed with ``secret`` for this very key, its signed lifetime not over at
    Redis's ``now_ms``; else None."""
    text = value.decode(errors="replace") if isinstance(value, bytes) else value
    parts = text.rsplit("|", 3)
    if len(parts) != 4 or not all(p.isascii() and p.isdigit() for p in parts[1:3]):
        return None
    owner, taken, ttl, tag = parts[0], int(parts[1]), int(parts[2]), parts[3]
    if not hmac.compare_digest(tag.encode(), _tag(secret, name, owner, taken, ttl).encode()):
        return None
    return (owner, ttl) if taken - 1000 <= now_ms < taken + ttl else None


def honoured(secret: bytes, name: str, value: bytes | str, now_ms: int) -> bool:
    """Whether ``value``, found under ``name``'s lock, is a live owner's lease."""
    return _live(secret, name, value, now_ms) is not None


def extend(client: redis.Redis, name: str, secret: bytes) -> int:
    """Sign ``name``'s lease again with Redis's time now, for whichever owner holds it, if its
    value is a live owner's lease; its lifetime in ms, or 0 if none was renewed.

    What a worker building ``name`` calls (workers/lifecycle.keeping_lease): the sender's
    lease is kept as the sender's (same owner, same lifetime), so the sender's release and
    orphan handling, keyed on its owner id, still find it. Compare-and-set on the value read
    (``_TAKE_OVER``): a lease that changed meanwhile (released, taken over) is left alone."""
    lock = keys.lock(name)
    value = client.get(lock)
    if not isinstance(value, bytes) or len(value) > _MAX_VALUE_BYTES:
        return 0
    now = server_ms(client)
    if (live := _live(secret, name, value, now)) is None:
        return 0
    owner, ttl = live
    renewed = signed_value(secret, name, owner, now, ttl)
    swapped = client.register_script(_TAKE_OVER)(keys=[lock], args=[value, renewed, ttl])
    return ttl if swapped else 0


def new_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def take_many(
    client: redis.Redis,
    names: Sequence[str],
    owner: str,
    ttl_ms: int,
    on_stale: Callable[[int], None] = lambda _: None,
    *,
    secret: bytes,
) -> list[bool]:
    """Take the lease of each artifact key in ``names``; which ones this owner now holds.
    A lock that is not a live owner's signed lease (see ``honoured``) is taken over;
    ``on_stale(n)`` is told how many were."""
    if not names:
        return []
    now = server_ms(client)
    values = [signed_value(secret, name, owner, now, ttl_ms) for name in names]
    script = client.register_script(_TAKE)
    pipe = client.pipeline(transaction=False)
    for name, value in zip(names, values, strict=True):
        script(keys=[keys.lock(name)], args=[value, ttl_ms, _MAX_VALUE_BYTES], client=pipe)
    results = cast("list[int | bytes]", pipe.execute())
    taken = [r in (1, 2) for r in results]
    stale = sum(r == 2 for r in results)
    judged = [
        i
        for i, r in enumerate(results)
        if isinstance(r, bytes) and not honoured(secret, names[i], r, now)
    ]
    if judged:
        over = client.register_script(_TAKE_OVER)
        pipe = client.pipeline(transaction=False)
        for i in judged:
            over(keys=[keys.lock(names[i])], args=[results[i], values[i], ttl_ms], client=pipe)
        for i, replaced in zip(judged, pipe.execute(), strict=True):
            taken[i] = bool(replaced)
            stale += bool(replaced)
    if stale:
        on_stale(stale)
    return taken


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
        *,
        secret: bytes,
        owner: str | None = None,
    ) -> None:
        self._client = client
        self._secret = secret
        self._ttl_ms = int(ttl_s * 1000)
        self._max_hold_s = max_hold_s
        self._on_stale = on_stale
        self.owner = owner or new_owner()
        self._held: dict[str, float] = {}
        self._by_thread = threading.local()
        self._lock = threading.Lock()
        self._release = client.register_script(_RELEASE)
        self._refresh_one = client.register_script(_REFRESH)
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def held(self) -> list[str]:
        """The keys whose leases are refreshed now."""
        with self._lock:
            return list(self._held)

    def acquire(self, key: str) -> bool:
        # A lease this process holds already is its own to use again, as long as Redis says
        # it is still ours (one that expired and was taken meanwhile is not). Inductor looks
        # a graph up twice when AOTAutograd's entry is found but the FX graph it names is not
        # (lost in a Redis failover, or evicted): the second lookup, inside the compile the
        # first one's lease stands for, must not wait out the deadline for itself.
        with self._lock:
            ours = key in self._held
        if (
            not (ours and self._renew(key))
            and not take_many(
                self._client, [key], self.owner, self._ttl_ms, self._on_stale, secret=self._secret
            )[0]
        ):
            return False
        self._hold(key)
        self._mine().append(key)
        return True

    def keep(self, key: str) -> None:
        """Refresh ``key``'s lease, taken by this owner elsewhere (``take_many``), until it is
        gone (released, dropped by the worker that settled its job, taken over after a lapse)
        or ``max_hold_s`` has passed. Never released here: whoever took it hands it back."""
        self._hold(key)

    def _hold(self, key: str) -> None:
        with self._lock:
            self._held.setdefault(key, time.monotonic())
            if self._thread is None or self._pid != os.getpid():  # none yet, or forked since
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._refresh, name="compileq-leases", daemon=True
                )
                self._thread.start()

    def release(self, key: str) -> None:
        """Hand ``key``'s lease back if this owner holds it (owner-checked in Redis), whether
        or not it is still refreshed: a lease held past ``max_hold_s`` is refreshed no longer
        but is ours until its TTL. Releasing only leases still refreshed left one behind for
        its whole TTL after every compile longer than the deadline (a graph compiled here
        once the wait for its worker ran out), and other processes asking for that graph
        waited on it; the suite's lease-keeper test caught one."""
        with self._lock:
            self._held.pop(key, None)
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
            with contextlib.suppress(redis.RedisError):
                renewed = self._renew_many(live)
                with self._lock:  # gone, or another's since a lapse: not ours to keep
                    for key, ours in zip(live, renewed, strict=True):
                        if not ours:
                            self._held.pop(key, None)

    def _renew(self, key: str) -> bool:
        """Sign ``key``'s lease again with Redis's time now, if this owner still holds it:
        the proof of life that keeps a waiter from taking it over."""
        return self._renew_many([key])[0]

    def _renew_many(self, names: Sequence[str]) -> list[bool]:
        """``_renew`` for each of ``names``, in one round trip after Redis's time: a client
        keeps every job it sent (hundreds of kernels in a cold job) on this one thread."""
        if not names:
            return []
        now = server_ms(self._client)
        pipe = self._client.pipeline(transaction=False)
        for name in names:
            value = signed_value(self._secret, name, self.owner, now, self._ttl_ms)
            self._refresh_one(
                keys=[keys.lock(name)], args=[self.owner, value, self._ttl_ms], client=pipe
            )
        return [bool(r) for r in pipe.execute()]
