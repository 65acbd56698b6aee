"""Artifact stores: a small interface and its Redis implementation."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis

from compileq import keys
from compileq._log import log, warn_once
from compileq.cache.counters import Counter, incr, incr_queues
from compileq.cache.envelope import decompress, seal, verify
from compileq.config import Settings
from compileq.errors import EntryTooLarge, ForeignSecret, IntegrityError

T = TypeVar("T")

# Delete an entry only if it still holds the bytes we judged bad: between our read and the
# delete another client may have replaced it with a good one, and a plain DEL would lose it.
_DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# Read a batch with a size bound before anything leaves Redis: a value over the cap comes back
# as its length (never its bytes), a value of another type as -1, a miss as nil. Rejected
# alternative: MGET, which hands over a multi-GB value planted by anyone who can write.
_GET_BOUNDED = """
local out = {}
local cap = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  local n = redis.pcall('STRLEN', key)
  if type(n) ~= 'number' then out[i] = -1
  elseif n == 0 then out[i] = false
  elseif n > cap then out[i] = n
  else out[i] = redis.call('GET', key) end
end
return out
"""

# Replace what a key holds only while it is still the bad value this process judged: the very
# bytes (ARGV[5] 'equal', ARGV[1]); a value over the cap or of another type ('unreadable'); an
# empty string or nothing at all ('empty': a miss to the bounded read, and SET NX refuses an
# empty string). A good entry written by someone else meanwhile is never clobbered. Returns
# 1 replaced, 2 written where nothing was, 0 left alone.
_REPLACE_BAD = """
local kind = redis.call('TYPE', KEYS[1])['ok']
local mode = ARGV[5]
local bad
if kind == 'none' then bad = mode == 'empty'
elseif kind ~= 'string' then bad = mode == 'unreadable'
elseif mode == 'empty' then bad = redis.call('STRLEN', KEYS[1]) == 0
elseif mode == 'unreadable' then bad = redis.call('STRLEN', KEYS[1]) > tonumber(ARGV[3])
else bad = redis.call('GET', KEYS[1]) == ARGV[1] end
if not bad then return 0 end
if kind ~= 'none' and kind ~= 'string' then redis.call('DEL', KEYS[1]) end
if tonumber(ARGV[4]) > 0 then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[4])
else
  redis.call('SET', KEYS[1], ARGV[2])
end
if kind == 'none' then return 2 end
return 1
"""


# Delete each key whose type is not the expected one (ARGV[i]); a missing key is fine.
_DROP_WRONG_TYPE = """
local n = 0
for i, key in ipairs(KEYS) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= ARGV[i] then
    redis.call('DEL', key)
    n = n + 1
  end
end
return n
"""
#: The commands ``count`` queues that a key of another type refuses (WRONGTYPE), and the
#: type each writes: counters (hashes) and the records of cache/meta.py (sibling sets, the
#: slowest builds' sorted sets, the misses list). SET and EXPIRE take a key of any type.
_WRITES = {
    "HINCRBY": "hash",
    "SADD": "set",
    "ZADD": "zset",
    "ZREMRANGEBYRANK": "zset",
    "LPUSH": "list",
    "LTRIM": "list",
}


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class Entry:
    """An authenticated entry, decompressed when its payload is first read."""

    key: str
    body: bytes
    max_bytes: int

    def payload(self) -> bytes:
        return decompress(self.key, self.body, self.max_bytes)


class Store(abc.ABC):
    """Where built artifacts live, by content key."""

    @abc.abstractmethod
    def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        """Verified entries for ``keys`` in order; ``None`` for a miss or a rejected entry."""

    @abc.abstractmethod
    def put(self, key: str, payload: bytes) -> bool:
        """Store ``payload`` unless the key already holds an entry; True if this call wrote it."""

    @abc.abstractmethod
    def usage(self) -> tuple[int, int]:
        """``(entries, bytes)`` currently stored."""


class RedisStore(Store):
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self.client = client
        self._secret = settings.secret_bytes()
        self._max_bytes = settings.max_entry_bytes
        self._ttl = settings.ttl_s
        self._delete_if_equal = client.register_script(_DELETE_IF_EQUAL)
        self._get_bounded = client.register_script(_GET_BOUNDED)
        self._replace_bad = client.register_script(_REPLACE_BAD)
        self._repair = client.register_script(_DROP_WRONG_TYPE)
        #: Whether an entry sealed with another secret may be replaced by a build of ours.
        #: Only while the cluster proves it shares our secret (a live worker's signed
        #: heartbeat): then that entry is left from before a key rotation, or planted. A node
        #: alone with a wrong secret must not overwrite the cluster's good entries.
        self.replace_foreign: Callable[[], bool] = lambda: False
        #: Told when a counter write finds Redis unreachable (the client then builds locally).
        self.on_unreachable: Callable[[Exception], None] = lambda _: None

    def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        if not keys:
            return []
        blobs = self.read_bounded(keys)
        return [
            None if blob is None else self.verified(key, blob)
            for key, blob in zip(keys, blobs, strict=True)
        ]

    def read_bounded(self, keys: Sequence[str]) -> list[bytes | int | None]:
        """Raw values, each at most ``max_entry_bytes``: a larger one comes back as its
        length, one of another type as -1, a miss as None."""
        return cast(
            "list[bytes | int | None]", self._get_bounded(keys=list(keys), args=[self._max_bytes])
        )

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None."""
        entry = self.get_many([key])[0]
        return None if entry is None else entry.payload()

    def verified(self, key: str, blob: bytes | int) -> Entry | None:
        """The entry ``blob`` (a value of ``read_bounded``) holds if it verifies; else None,
        counted (and a corrupt one removed)."""
        if isinstance(blob, int):  # over the cap, or not a string: never read, never ours
            what = "not a string" if blob < 0 else f"{blob} bytes, over the cap"
            warn_once("oversized", "compileq: cache entry %s is %s; treated as a miss", key, what)
            self.count({Counter.INTEGRITY_FAILURES: 1})
            return None
        try:
            return Entry(key, verify(self._secret, key, blob), self._max_bytes)
        except ForeignSecret as e:
            # Left in place: this process cannot tell whose secret is the right one, and
            # deleting would let one misconfigured node empty the whole cache. A build of
            # ours may still replace it (see ``replace_foreign``).
            warn_once("foreign-secret", "compileq: cache entry not ours (%s); treated as a miss", e)
            self.count({Counter.FOREIGN_SECRET_ENTRIES: 1})
            return None
        except IntegrityError as e:
            removed = self._delete_if_equal(keys=[key], args=[blob])
            self.count({Counter.INTEGRITY_FAILURES: 1})
            log.warning("compileq: rejected cache entry (%s)%s", e, "; removed" if removed else "")
            return None

    def seal(self, key: str, payload: bytes) -> bytes:
        # The cap is on the payload, not only its compressed form: readers refuse to inflate
        # past it, so a payload that fit only once compressed would be stored but unreadable.
        if len(payload) > self._max_bytes:
            raise EntryTooLarge(key, len(payload), self._max_bytes)
        blob = seal(self._secret, key, payload)
        if len(blob) > self._max_bytes:
            raise EntryTooLarge(key, len(blob), self._max_bytes)
        return blob

    def put(self, key: str, payload: bytes) -> bool:
        blob = self.seal(key, payload)
        # SET NX: the first writer wins. Entries are content-addressed, so any later writer
        # holds the same artifact and overwriting would only add traffic (and a window where a
        # reader sees a half-replaced value on a replica).
        if self.client.set(key, blob, nx=True, ex=self._ttl):
            return True
        return self._replace_if_bad(key, blob)

    def replace(self, key: str, payload: bytes, ttl_s: int | None = None) -> None:
        """Store ``payload`` whatever the key holds: for entries that are not content-addressed
        (a job's profile, replaced each time the job saves it; a graph's failure verdict).
        ``ttl_s``: its expiry, where not the store's own (``COMPILEQ_TTL_S``)."""
        self.client.set(key, self.seal(key, payload), ex=ttl_s or self._ttl)

    def _replace_if_bad(self, key: str, blob: bytes) -> bool:
        """Put ``blob`` in place of whatever ``key`` holds that does not verify as ours, so no
        bad value (empty, truncated, a flipped key id, a rotated secret's entry, an oversized
        plant, another Redis type) is a permanent miss: each costs one rebuild."""
        current = self.read_bounded([key])[0]
        if isinstance(current, bytes):
            try:
                verify(self._secret, key, current)
                return False  # a good entry: the first writer won
            except ForeignSecret:
                if not self.replace_foreign():
                    return False
            except IntegrityError:
                pass
            mode, expected = "equal", current
        else:  # None: empty, or gone meanwhile; an int: over the cap, or not a string
            mode, expected = ("empty" if current is None else "unreadable"), b""
        done = int(
            self._replace_bad(
                keys=[key], args=[expected, blob, self._max_bytes, self._ttl or 0, mode]
            )
        )
        if done == 1:
            self.count({Counter.REPLACED_ENTRIES: 1})
        return done > 0

    def holds(self, key: str) -> bool:
        """Whether ``key`` holds an entry that verifies as ours (a put would change nothing).
        Rejected alternative: ``EXISTS``, which an empty or planted value also passes."""
        blob = self.read_bounded([key])[0]
        if not isinstance(blob, bytes):
            return False
        try:
            verify(self._secret, key, blob)
        except IntegrityError:
            return False
        return True

    @property
    def secret(self) -> bytes:
        """The shared secret, for what is signed beside entries (leases)."""
        return self._secret

    @property
    def ttl_s(self) -> int | None:
        return self._ttl

    def count(
        self,
        counts: dict[Counter, int],
        per_queue: dict[str, dict[Counter, int]] | None = None,
        records: Sequence[Callable[[Any], None]] = (),
    ) -> None:
        """Counters, per-queue counters and ``records`` (see cache/meta.py) in one round trip.

        Telemetry, kept apart from work: it never raises. A counter key of the wrong type
        (``SET compileq:stats x``) or a Redis refusing writes must not turn a hit into a miss
        or a build into a failure, nor make a client think Redis is down.
        """
        if not (any(counts.values()) or records):
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            incr(pipe, counts)
            if per_queue:
                incr_queues(pipe, per_queue)
            for record in records:
                record(pipe)
            # What each command wrote (the stack is emptied by execute()).
            commands = [args for args, _ in pipe.command_stack]
            results = pipe.execute(raise_on_error=False)
            failed = [r for r in results if isinstance(r, Exception)]
            if failed:
                warn_once("telemetry", "compileq: counters not written (%s)", failed[0])
                wrong = {
                    _text(args[1]): _WRITES[_text(args[0]).upper()]
                    for args, result in zip(commands, results, strict=False)
                    if isinstance(result, Exception)
                    and "WRONGTYPE" in str(result)
                    and len(args) > 1
                    and _text(args[0]).upper() in _WRITES
                    and not _text(args[1]).startswith(keys.ARTIFACT)  # never an entry
                }
                if wrong:
                    self._repair_written(wrong)
        except (redis.ConnectionError, redis.TimeoutError) as e:
            # Redis itself is gone, not just a counter: tell the owner, who stops asking it
            # for a while (the next lookups would each wait out a timeout otherwise).
            warn_once("telemetry", "compileq: counters not written (%s)", e)
            self.on_unreachable(e)
        except Exception as e:  # telemetry: whatever it is, the work goes on
            warn_once("telemetry", "compileq: counters not written (%s)", e)

    def _repair_written(self, wrong: dict[str, str]) -> None:
        """Drop each telemetry key a write found holding another type (``SET compileq:stats
        x``, ``SET compileq:misses x``, a hash where the slowest builds' sorted set goes), if
        it still does, so the next write recreates it: telemetry, and a lost record beats none
        for ever. Rejected: repairing only the counter hashes, which left ``explain`` and
        ``stats`` reading nothing new after one planted key."""
        dropped = self._repair(keys=list(wrong), args=list(wrong.values()))
        if dropped:
            log.warning("compileq: removed %d telemetry keys of the wrong type", int(dropped))

    def usage(self) -> tuple[int, int]:
        # Counted by SCAN rather than kept as counters: TTLs and LRU eviction remove entries
        # without telling anyone, so maintained counters would drift. O(entries), admin-only.
        entries = size = 0
        for batch in batched(self.client.scan_iter(match=keys.ARTIFACT + "*", count=1000), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in batch:
                pipe.strlen(key)
            lengths = pipe.execute()
            entries += len(batch)
            size += sum(lengths)
        return entries, size


def batched(items: Iterable[T], n: int) -> Iterator[list[T]]:
    """``items`` in lists of ``n`` (the last one shorter): SCAN results, pipelined per list."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
