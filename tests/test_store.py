"""The artifact store against a real redis-server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from compileq import keys
from compileq.cache.counters import read_counters
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.connect import redis_client
from compileq.errors import ConfigError, EntryTooLarge
from compileq.localstack import stop
from tests.conftest import start_redis
from tests.reliability import Recorder


def key(n: int) -> str:
    return keys.artifact("triton", f"{n:064x}")


@pytest.fixture
def store(settings: Settings, empty_cache: redis.Redis) -> RedisStore:
    return RedisStore(redis_client(settings.redis_url, settings), settings)


def _lookup_calls(client: redis.Redis) -> int:
    """Commands a client sent for lookups: the bounded read is one script call (EVALSHA)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("mget", "evalsha"))


@pytest.fixture
def quiet_store(settings: Settings, tmp_path: Path) -> Iterator[RedisStore]:
    """A store on a redis-server of its own: its command counts are this test's alone (the
    session's server also serves workers and clients left from other tests)."""
    server = start_redis(tmp_path / "redis")
    yield RedisStore(redis_client(server.url(), settings), settings)
    stop(server.process)


def test_a_batched_lookup_is_one_round_trip_with_misses_as_none(quiet_store: RedisStore) -> None:
    store = quiet_store
    for n in range(0, 1000, 2):
        store.put(key(n), f"payload-{n}".encode())
    store.get_many([key(0)])  # the first call of a process also loads the script into Redis
    before = _lookup_calls(store.client)
    found = store.get_many([key(n) for n in range(1000)])
    assert _lookup_calls(store.client) == before + 1
    assert found[1] is None
    first, last = found[0], found[998]
    assert first is not None and last is not None
    assert (first.payload(), last.payload()) == (b"payload-0", b"payload-998")
    assert sum(p is not None for p in found) == 500


def test_the_first_writer_wins(store: RedisStore) -> None:
    assert store.put(key(1), b"first") is True
    assert store.put(key(1), b"second") is False
    assert store.get(key(1)) == b"first"


def test_an_oversized_entry_is_refused_with_a_clear_error(
    settings: Settings, clean_cache: redis.Redis, reliability: Recorder
) -> None:
    small = RedisStore(clean_cache, settings.model_copy(update={"max_entry_bytes": 1000}))
    with pytest.raises(EntryTooLarge, match="COMPILEQ_MAX_ENTRY_BYTES") as refused:
        small.put(key(2), os.urandom(5000))
    assert clean_cache.get(key(2)) is None
    reliability.record(
        "a payload over the size cap (COMPILEQ_MAX_ENTRY_BYTES)",
        "refused with a clear error naming the setting; nothing stored",
        f"EntryTooLarge: {refused.value.size} bytes over the cap of {refused.value.limit}; "
        f"stored: {clean_cache.exists(key(2))}",
        0,
    )


def test_a_payload_that_fits_the_cap_only_compressed_is_refused_since_no_reader_could_inflate_it(
    settings: Settings, clean_cache: redis.Redis
) -> None:
    small = RedisStore(clean_cache, settings.model_copy(update={"max_entry_bytes": 1000}))
    with pytest.raises(EntryTooLarge):
        small.put(key(4), bytes(5000))  # zeros: compresses far below 1000 bytes
    assert clean_cache.get(key(4)) is None


def test_a_corrupt_entry_is_deleted_counted_and_treated_as_a_miss(store: RedisStore) -> None:
    store.put(key(3), b"good")
    raw = bytearray(store.client.get(key(3)))
    raw[-1] ^= 0xFF
    store.client.set(key(3), bytes(raw))
    assert store.get(key(3)) is None
    assert store.client.exists(key(3)) == 0
    assert read_counters(store.client)["integrity_failures"] == 1


def test_a_node_with_another_secret_reads_good_entries_as_misses_and_deletes_none(
    store: RedisStore, settings: Settings, reliability: Recorder
) -> None:
    for n in range(10, 20):
        store.put(key(n), f"good-{n}".encode())
    from pydantic import SecretStr

    wrong = RedisStore(store.client, settings.model_copy(update={"secret": SecretStr("wrong")}))
    assert wrong.get_many([key(n) for n in range(10, 20)]) == [None] * 10
    assert wrong.put(key(10), b"theirs") is False  # first writer wins: ours stays
    counters = read_counters(store.client)
    assert counters["foreign_secret_entries"] == 10 and counters["integrity_failures"] == 0
    # Every good entry is still there and still good for the nodes sharing the right secret.
    kept = [e.payload() if e else None for e in store.get_many([key(n) for n in range(10, 20)])]
    assert kept == [f"good-{n}".encode() for n in range(10, 20)]
    reliability.record(
        "a node started with a wrong COMPILEQ_SECRET reading the cluster's cache",
        "every entry reads as a miss there, counted as foreign_secret_entries; none deleted "
        "or overwritten",
        f"10 entries read: {counters['foreign_secret_entries']} foreign, "
        f"{counters['integrity_failures']} judged damaged; afterwards "
        f"{sum(k is not None for k in kept)}/10 intact",
        10 - sum(k is not None for k in kept),
    )


def test_a_rejected_entry_replaced_meanwhile_by_a_good_one_is_kept(store: RedisStore) -> None:
    store.put(key(4), b"good")
    good = store.client.get(key(4))
    # Another client rewrote it between our read and our delete: compare-and-delete keeps it.
    assert (
        store._delete_if_equal(keys=[key(4), keys.STATS], args=[b"bad bytes", "integrity_failures"])
        == 0
    )
    assert store.client.get(key(4)) == good


def test_entries_expire_when_a_ttl_is_set(settings: Settings, clean_cache: redis.Redis) -> None:
    expiring = RedisStore(clean_cache, settings.model_copy(update={"ttl_s": 100}))
    expiring.put(key(5), b"x")
    assert 0 < clean_cache.ttl(key(5)) <= 100
    RedisStore(clean_cache, settings).put(key(6), b"x")
    assert clean_cache.ttl(key(6)) == -1


def test_usage_counts_entries_and_bytes(store: RedisStore) -> None:
    for n in range(10):
        store.put(key(100 + n), b"x" * 100)
    entries, size = store.usage()
    assert entries == 10
    assert size == sum(store.client.strlen(key(100 + n)) for n in range(10))


def test_a_store_without_a_secret_refuses_to_start(clean_cache: redis.Redis) -> None:
    with pytest.raises(ConfigError, match="COMPILEQ_SECRET"):
        RedisStore(clean_cache, Settings(secret=None))
