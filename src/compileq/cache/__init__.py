"""The content-addressed artifact store: signed, compressed entries in Redis."""

from compileq.cache.counters import Counter, read_counters, reset_counters
from compileq.cache.envelope import open_sealed, seal
from compileq.cache.store import RedisStore, Store

__all__ = [
    "Counter",
    "RedisStore",
    "Store",
    "open_sealed",
    "read_counters",
    "reset_counters",
    "seal",
]
