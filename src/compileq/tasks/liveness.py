"""How workers say they are alive and how clients ask, on Redis server time.

Each worker scores itself into a sorted set per queue with the *server's* clock (TIME inside a
script), so a client on a machine whose clock is off by minutes still reads liveness right.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from compileq import keys

_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[2])
for i = 2, #KEYS do
  redis.call('ZADD', KEYS[i], now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 4 * ttl)
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', math.floor(ttl * 1000))
return tostring(now)
"""

_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
return redis.call('ZCOUNT', KEYS[1], now - tonumber(ARGV[1]), '+inf')
"""


def beat(
    client: redis.Redis, worker_id: str, queues: list[str], ttl_s: float, info: dict[str, Any]
) -> None:
    script = client.register_script(_BEAT)
    script(
        keys=[keys.worker_info(worker_id), *(keys.workers(q) for q in queues)],
        args=[worker_id, ttl_s, json.dumps(info)],
    )


def leave(client: redis.Redis, worker_id: str, queues: list[str]) -> None:
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.zrem(keys.workers(q), worker_id)
    pipe.delete(keys.worker_info(worker_id))
    pipe.execute()


def workers_info(client: redis.Redis) -> list[dict[str, Any]]:
    """What every live worker published with its last heartbeat."""
    names = list(client.scan_iter(match=keys.WORKER_INFO + "*", count=1000))
    infos = []
    for raw in client.mget(names) if names else []:
        if raw is not None:
            try:
                infos.append(json.loads(raw))
            except ValueError:
                continue
    return infos


def live_count(client: redis.Redis, queue: str, ttl_s: float) -> int:
    return int(client.register_script(_LIVE)(keys=[keys.workers(queue)], args=[ttl_s]))


def live_workers(client: redis.Redis) -> list[dict[str, Any]]:
    """Every live worker's info with ``beat``: the Redis server time of its last heartbeat.

    The beat's server time is the score the heartbeat script gave it, read back here; next to
    the worker's own ``wall`` clock (sent in the same beat) it gives the worker's clock skew.
    """
    infos = [i for i in workers_info(client) if isinstance(i.get("id"), str) and i.get("queues")]
    pipe = client.pipeline(transaction=False)
    for info in infos:
        pipe.zscore(keys.workers(str(info["queues"][0])), info["id"])
    for info, score in zip(infos, pipe.execute() if infos else [], strict=True):
        info["beat"] = score if isinstance(score, float) else None
    return infos
