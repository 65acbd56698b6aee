"""Redis clients for every compileq process, from a plain Redis URL or from Redis Sentinel.

One function builds them all (the store, the kernel client, workers, doctor, the broker's
check), so a Sentinel deployment gets the same timeouts, retries, TLS and credentials on
every path. With Sentinel the client asks the Sentinels where the master is whenever it
opens a connection; after a failover the connections to the dead master fail, and the next
one goes to whichever replica the Sentinels promoted, without a restart (redis-py's
``SentinelConnectionPool``).
"""

from __future__ import annotations

from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from compileq.config import Settings
from compileq.errors import ConfigError
from compileq.sentinel_url import SentinelUrl, is_sentinel, parse_sentinel_url


def redis_client(
    url: str, settings: Settings, *, retries: int = 1, socket_timeout_s: float | None = None
) -> redis.Redis:
    """A client with bounded timeouts: a dead Redis must cost seconds, never a hang.

    redis-py's default retries every timeout three times with backoff, which turned one
    partitioned call into ~30 s (measured on the black-holed link that
    tests/test_partition.py makes): the timeouts configured here would have been a quarter
    of the truth. One immediate retry on a connection error (``retries``) still heals a
    connection that a Redis restart closed, or one a failover left pointing at the old
    master; a timeout is not retried, since against a partition a second wait only doubles
    the stall. ``socket_timeout_s``: the reply timeout, by default the connect timeout but
    at least 5 s (a large batch may take that long to answer).
    """
    timeouts = _timeouts(settings, socket_timeout_s)
    retry = Retry(NoBackoff(), retries, supported_errors=(redis.ConnectionError,))
    if not is_sentinel(url):
        return redis.Redis.from_url(url, health_check_interval=30, retry=retry, **timeouts)
    target = parse_sentinel_url(url)
    sentinel = sentinels(target, settings)
    # One dict of Any: redis-py 8 types master_for's positional classes, which a
    # ``**dict[str, float]`` could fill as far as mypy knows.
    options: dict[str, Any] = {
        "username": target.username,
        "password": target.password,
        **timeouts,
        **tls_options(target),
    }
    client: redis.Redis = sentinel.master_for(  # type: ignore[no-untyped-call]  # untyped in redis-py
        master_name(settings), db=target.db, health_check_interval=30, retry=retry, **options
    )
    return client


def sentinels(target: SentinelUrl, settings: Settings) -> Sentinel:
    """A ``Sentinel`` asking ``target``'s Sentinels, each with compileq's timeouts and TLS."""
    options = sentinel_options(target, settings)
    return Sentinel(list(target.sentinels), sentinel_kwargs=options)  # type: ignore[no-untyped-call]


def sentinel_options(target: SentinelUrl, settings: Settings) -> dict[str, Any]:
    """How to talk to the Sentinels themselves (redis-py's and kombu's ``sentinel_kwargs``).

    No retry: each lookup already asks every Sentinel in turn, so one that is down costs one
    connection attempt, not four. No password: the URL's credentials are the Redis servers'.
    """
    return {**_timeouts(settings, None), **tls_options(target), "retry": Retry(NoBackoff(), 0)}


def tls_options(target: SentinelUrl) -> dict[str, Any]:
    """redis-py's TLS keywords for a sentinel:// URL with TLS parameters; none without."""
    if not target.tls:
        return {}
    return {"ssl": True, **dict(target.tls)}


def master_name(settings: Settings) -> str:
    if not settings.sentinel_master:  # Settings' validator makes this unreachable in practice
        raise ConfigError("COMPILEQ_SENTINEL_MASTER is not set (a sentinel:// URL needs it)")
    return settings.sentinel_master


def _timeouts(settings: Settings, socket_timeout_s: float | None) -> dict[str, float]:
    reply = (
        socket_timeout_s if socket_timeout_s is not None else max(settings.connect_timeout_s, 5.0)
    )
    return {"socket_connect_timeout": settings.connect_timeout_s, "socket_timeout": reply}
