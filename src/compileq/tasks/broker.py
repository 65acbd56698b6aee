"""What compileq checks on the broker Redis that Celery itself does not."""

from __future__ import annotations

from typing import cast

import redis

from compileq._log import log, warn_once
from compileq.config import Settings, redact
from compileq.connect import redis_client


def is_full(error: BaseException) -> bool:
    """Whether a failed publish means a full broker (rather than an unreachable one).

    A Redis at ``maxmemory`` with ``noeviction`` refuses writes with an OOM reply, which
    redis-py raises as OutOfMemoryError; kombu may wrap it, so the cause chain is searched.
    """
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, redis.exceptions.OutOfMemoryError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def warn_if_evicting(settings: Settings) -> None:
    """Warn once when the broker may evict keys under memory pressure.

    An evicted queue takes its build messages with it and nobody is told: each client then
    waits out ``COMPILEQ_DEADLINE_S`` and builds locally. That is no loss, but a cluster that
    silently degrades to local builds is worth one line at start. Asked with CONFIG GET, which
    ACLs may refuse (managed Redis often does): then there is nothing to say.
    """
    # No retries: this runs on a worker's start, which an unreachable broker must not stall.
    client = redis_client(
        settings.broker, settings, retries=0, socket_timeout_s=settings.connect_timeout_s
    )
    try:
        config = cast("dict[bytes | str, bytes | str]", client.config_get("maxmemory-policy"))
    except redis.RedisError as e:  # NOPERM, a renamed CONFIG, or the broker not up yet
        log.debug("compileq: cannot read the broker's maxmemory-policy (%s)", e)
        return
    finally:
        client.close()
    raw = next(iter(config.values()), b"noeviction")
    policy = raw.decode() if isinstance(raw, bytes) else raw
    if policy != "noeviction":
        warn_once(
            "broker-eviction",
            "compileq: the broker Redis at %s has maxmemory-policy %s: under memory pressure "
            "it drops queued build messages, and each one then waits out COMPILEQ_DEADLINE_S "
            "before building locally; give the broker a Redis with noeviction "
            "(COMPILEQ_BROKER_URL)",
            redact(settings.broker),
            policy,
        )
