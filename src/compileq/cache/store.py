"""Artifact stores: a small interface and its Redis implementation."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from compileq import keys
from compileq._log import log, warn_once
from compileq.cache.counters import Counter, incr, incr_queues
from compileq.cache.envelope import decompress, seal, verify
from compileq.config import Settings
from compileq.errors import EntryTooLarge, ForeignSecret, IntegrityError

# Delete an entry only if it still holds the bytes we judged bad: between our read and the
# delete another client may have replaced it with a good one, and a plain DEL would lose it.
_DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
  return 1
end
return 0
"""


def redis_client(url: str, settings: Settings) -> redis.Redis:
    """A client with bounded timeouts: a dead Redis must cost seconds, never a hang.

    redis-py's default retries every timeout three times with backoff, which turned one
    partitioned call into ~30 s (measured on the black-holed link that
    tests/test_partition.py makes): the timeouts configured here would have been a quarter
    of the truth. One immediate retry on a connection error still heals a connection that a
    Redis restart closed; a timeout is not retried, since against a partition a second wait
    only doubles the stall.
    """
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=max(settings.connect_timeout_s, 5.0),
        health_check_interval=30,
        retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)),
    )


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

    def get_many(self, keys: Sequence[str]) -> list[Entry | None]:
        if not keys:
            return []
        blobs = cast("list[bytes | None]", self.client.mget(list(keys)))
        return [
            None if blob is None else self._verify(key, blob)
            for key, blob in zip(keys, blobs, strict=True)
        ]

    def get(self, key: str) -> bytes | None:
        """The payload stored under ``key``, or None."""
        entry = self.get_many([key])[0]
        return None if entry is None else entry.payload()

    def _verify(self, key: str, blob: bytes) -> Entry | None:
        try:
            return Entry(key, verify(self._secret, key, blob), self._max_bytes)
        except ForeignSecret as e:
            # Left in place: this process cannot tell whose secret is the right one, and
            # deleting would let one misconfigured node empty the whole cache.
            warn_once("foreign-secret", "compileq: cache entry not ours (%s); treated as a miss", e)
            self.count({Counter.FOREIGN_SECRET_ENTRIES: 1})
            return None
        except IntegrityError as e:
            removed = self._delete_if_equal(
                keys=[key, keys.STATS], args=[blob, Counter.INTEGRITY_FAILURES.value]
            )
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
        return bool(self.client.set(key, blob, nx=True, ex=self._ttl))

    @property
    def ttl_s(self) -> int | None:
        return self._ttl

    def count(
        self,
        counts: dict[Counter, int],
        per_queue: dict[str, dict[Counter, int]] | None = None,
        records: Sequence[Callable[[Any], None]] = (),
    ) -> None:
        """Counters, per-queue counters and ``records`` (see cache/meta.py) in one round trip."""
        if any(counts.values()) or records:
            pipe = self.client.pipeline(transaction=False)
            incr(pipe, counts)
            if per_queue:
                incr_queues(pipe, per_queue)
            for record in records:
                record(pipe)
            pipe.execute()

    def usage(self) -> tuple[int, int]:
        # Counted by SCAN rather than kept as counters: TTLs and LRU eviction remove entries
        # without telling anyone, so maintained counters would drift. O(entries), admin-only.
        entries = size = 0
        for batch in _batched(self.client.scan_iter(match=keys.ARTIFACT + "*", count=1000), 1000):
            pipe = self.client.pipeline(transaction=False)
            for key in batch:
                pipe.strlen(key)
            lengths = pipe.execute()
            entries += len(batch)
            size += sum(lengths)
        return entries, size


def _batched(items: Iterable[bytes], n: int) -> Iterator[list[bytes]]:
    batch: list[bytes] = []
    for item in items:
        batch.append(item)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch
