"""Big entries (issue 36, item 4): what Inductor really makes, up to Redis's largest value.

Inductor's precompiled C++ header is ~155 MB; under the old 64 MiB default it was refused with
a warning, and every new machine built it again. Real redis-server, real store, no mocks.
"""

from __future__ import annotations

import os

import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings


def test_a_160_mb_entry_is_stored_and_read_back_whole_under_the_default_cap(
    settings: Settings, clean_cache: redis.Redis
) -> None:
    store = RedisStore(clean_cache, settings)
    key = keys.artifact("cpp", "b" * 64)
    payload = os.urandom(160 * 10**6)  # random: zstd cannot shrink it, the worst case
    try:
        assert store.put(key, payload)
        assert clean_cache.strlen(key) > len(payload)  # stored whole, in one value
        assert store.get(key) == payload
    finally:
        clean_cache.delete(key)


def test_the_default_cap_sealed_still_fits_one_redis_value(
    settings: Settings, clean_cache: redis.Redis
) -> None:
    """The largest payload the default admits, sealed at zstd's worst (incompressible bytes),
    is no longer than the biggest value the real redis-server accepts."""
    store = RedisStore(clean_cache, settings)
    sample = os.urandom(8 * 2**20)
    sealed = store.seal(keys.artifact("cpp", "c" * 64), sample)
    growth = (len(sealed) - len(sample)) / len(sample)  # block headers, frame, tag
    largest = settings.max_entry_bytes * (1 + growth) + 4096
    limit = int(str(clean_cache.config_get("proto-max-bulk-len")["proto-max-bulk-len"]))
    assert settings.max_entry_bytes >= 160 * 10**6
    assert largest < limit, (largest, limit)
