"""The boundary's rule (scheduler/boundary.py) and the leases' owner checks, on their own:
compileq's errors turn into the stock path; the compile's own errors still reach the user.
Leases run against the session's real redis-server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future

import pytest
import redis

from compileq import keys
from compileq.cache.counters import Counter, Reason
from compileq.scheduler import boundary
from compileq.scheduler.leases import Leases, release, server_ms, signed_value, take_many
from tests.conftest import RedisServer


@pytest.fixture
def counted() -> Iterator[list[dict[Counter, int]]]:
    seen: list[dict[Counter, int]] = []
    boundary.count_with(lambda counts, records: seen.append(counts))
    yield seen
    boundary.count_with(None)


def _stock(x: int) -> str:
    return f"stock {x}"


def test_an_error_in_compileq_code_runs_the_stock_path_instead_and_is_counted(
    counted: list[dict[Counter, int]],
) -> None:
    @boundary.guard("a test entry", instead=_stock)
    def entry(x: int) -> str:
        raise AttributeError("'int' object has no attribute 'get'")

    assert entry(3) == "stock 3"
    assert counted == [{Counter.FALLBACKS: 1}]
    assert Reason.INTERNAL.value == "compileq-error"


def test_an_error_of_the_compile_itself_reaches_the_caller_unchanged(
    counted: list[dict[Counter, int]],
) -> None:
    ran_stock = []

    @boundary.guard("a test entry", instead=_stock, genuine=lambda x: True)
    def entry(x: int) -> str:
        ran_stock.append(x)
        raise ValueError("the graph does not lower")

    with pytest.raises(ValueError, match="does not lower"):
        entry(1)
    assert ran_stock == [1] and counted == []


def test_a_failed_build_future_is_rebuilt_the_stock_way() -> None:
    failed: Future[str] = Future()
    out = boundary.or_else("a test build", failed, lambda: _done("stock"))
    failed.set_exception(RuntimeError("a worker's output that does not load here"))
    assert out.result(timeout=5) == "stock"
    # And the stock build's own error is the one the caller sees.
    failing: Future[str] = Future()
    out = boundary.or_else("a test build", failing, lambda: _error(SyntaxError("bad kernel")))
    failing.set_exception(RuntimeError("first"))
    with pytest.raises(SyntaxError, match="bad kernel"):
        out.result(timeout=5)


def _done(value: str) -> Future[str]:
    f: Future[str] = Future()
    f.set_result(value)
    return f


def _error(error: Exception) -> Future[str]:
    f: Future[str] = Future()
    f.set_exception(error)
    return f


_SECRET = b"test-lease-secret"


def _another_owners(db: redis.Redis, name: str) -> bytes:
    """A live lease of another process on ``name``: signed, taken now, for a minute."""
    return signed_value(_SECRET, name, "another owner", server_ms(db), 60_000).encode()


@pytest.fixture
def db(redis_server: RedisServer) -> redis.Redis:
    client = redis_server.client(7)
    client.flushdb()
    return client


def test_a_lease_is_released_when_the_compile_that_took_it_raises(db: redis.Redis) -> None:
    leases = Leases(db, ttl_s=30, secret=_SECRET)
    with pytest.raises(RuntimeError), leases.released_after():
        assert leases.acquire("graph-a")
        raise RuntimeError("the compile failed before it could put")
    assert db.get(keys.lock("graph-a")) is None


def test_release_and_refresh_never_touch_a_lease_someone_else_holds(db: redis.Redis) -> None:
    leases = Leases(db, ttl_s=0.3, secret=_SECRET)
    assert leases.acquire("graph-b")
    # Ours expired, and another process took the key meanwhile.
    theirs = _another_owners(db, "graph-b")
    db.set(keys.lock("graph-b"), theirs, px=60_000)
    time.sleep(0.3)  # a refresh round passes: it must not extend theirs to ours
    leases.release("graph-b")
    assert db.get(keys.lock("graph-b")) == theirs
    assert 0 < db.pttl(keys.lock("graph-b")) <= 60_000
    assert release(db, "graph-b", "not the owner") is False


def test_a_lease_this_process_holds_is_taken_again_at_once_unless_it_was_lost(
    db: redis.Redis,
) -> None:
    # Inductor looks a graph up a second time inside the compile the first lookup's lease
    # stands for (AOTAutograd's entry found, its FX graph's gone): that must not wait for itself.
    leases = Leases(db, ttl_s=30, secret=_SECRET)
    assert leases.acquire("graph-c") and leases.acquire("graph-c")
    # Expired and taken by another process meanwhile: no longer ours to take.
    theirs = _another_owners(db, "graph-c")
    db.set(keys.lock("graph-c"), theirs, px=60_000)
    assert not leases.acquire("graph-c")
    leases.release("graph-c")
    assert db.get(keys.lock("graph-c")) == theirs


def test_a_lock_without_an_expiry_is_taken_over_and_reported(db: redis.Redis) -> None:
    db.set(keys.lock("k1"), b"planted")  # no expiry: no compileq lease is ever like this
    db.set(keys.lock("k2"), _another_owners(db, "k2"), px=60_000)
    stale: list[int] = []
    taken = take_many(db, ["k1", "k2", "k3"], "me", 5_000, stale.append, secret=_SECRET)
    assert taken == [True, False, True]
    assert stale == [1]
    assert (db.get(keys.lock("k1")) or b"").startswith(b"me|")
    assert 0 < db.pttl(keys.lock("k1")) <= 5_000
