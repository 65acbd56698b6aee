"""Artifact stores: a small interface and its Redis implementation."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from compileq import keys
from compileq._log import log
from compileq.cache.counters import Counter, incr, incr_queues
from compileq.cache.envelope import decompress, seal, verify
from compileq.config import Settings
from compileq.errors import EntryTooLarge, IntegrityError

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
    """A client with bounded timeouts: a dead Redis must cost seconds, never a hang."""
    return redis.Redis.from_url(
        url,
        socket_connect_timeout=settings.connect_timeout_s,
        socket_timeout=max(settings.connect_timeout_s, 5.0),
        health_check_interval=30,
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
        except IntegrityError as e:
            removed = self._delete_if_equal(
                keys=[key, keys.STATS], args=[blob, Counter.INTEGRITY_FAILURES.value]
            )
            log.warning("compileq: rejected cache entry (%s)%s", e, "; removed" if removed else "")
            return None

    def seal(self, key: str, payload: bytes) -> bytes:
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
