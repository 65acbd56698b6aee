"""How workers say they are alive and how clients ask, on Redis server time.

Each worker scores itself into a sorted set per queue with the *server's* clock (TIME inside a
script), so a client on a machine whose clock is off by minutes still reads liveness right. It
also lists itself in one registry set, so readers find every worker without a keyspace SCAN.

Everything here is read back as untrusted: anybody who can write to Redis can add a member
or a record. So a client counts a worker live only if its record is signed with the shared
secret (HMAC over the record, Redis's own time of the beat included) and that time is recent:
a forged member, a far-future score, or a dead worker's record copied back, all read as
nobody. Rejected alternative: signing the sorted-set member alone, which a copied member
replays for ever. Far-future scores are trimmed on read, so ghosts also go away.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from compileq import keys

#: Domain separation: a heartbeat tag can never be mistaken for an entry's, a job's or a probe's.
_DOMAIN = b"compileq-heartbeat-v1\0"
#: A record larger than this is not a worker's (theirs are a few KB): skipped unread.
MAX_RECORD_BYTES = 256 * 1024
#: Members looked at per queue and liveness check: a flood of fake members costs no more.
_CANDIDATES = 32

_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[2])
for i = 3, #KEYS do
  redis.call('ZADD', KEYS[i], now, ARGV[1])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 4 * ttl)
  redis.call('ZREMRANGEBYSCORE', KEYS[i], now + ttl, '+inf')
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', math.floor(ttl * 1000))
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 4 * ttl)
return tostring(now)
"""

# The server time, how many future-scored members were trimmed (a score no worker's beat can
# make), then the records of the members scored in the last ttl. One round trip per check.
_LIVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[1])
local trimmed = redis.call('ZREMRANGEBYSCORE', KEYS[1], now + ttl, '+inf')
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], now - ttl, '+inf', 'LIMIT', 0, tonumber(ARGV[2]))
local out = {tostring(now), trimmed}
for i, id in ipairs(ids) do
  local key = ARGV[3] .. id
  local n = redis.pcall('STRLEN', key)
  if type(n) == 'number' and n > 0 and n <= tonumber(ARGV[4]) then
    out[#out + 1] = redis.call('GET', key)
  else
    out[#out + 1] = ''
  end
end
return out
"""


def _canonical(info: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: v for k, v in info.items() if k != "sig"}, sort_keys=True, separators=(",", ":")
    ).encode()


def _tag(secret: bytes, info: dict[str, Any]) -> str:
    return hmac.new(secret, _DOMAIN + _canonical(info), hashlib.sha256).hexdigest()


def signed(secret: bytes, info: dict[str, Any], server_time: float) -> dict[str, Any]:
    """``info`` with the Redis server time of this beat and a tag over both."""
    out = {**info, "beat_time": server_time}
    out["sig"] = _tag(secret, out)
    return out


def parse(raw: bytes | str | None) -> dict[str, Any] | None:
    """A worker record, or None for anything that is not one (malformed, oversized)."""
    if raw is None or len(raw) == 0 or len(raw) > MAX_RECORD_BYTES:
        return None
    try:
        info = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(info, dict) or not isinstance(info.get("id"), str):
        return None
    queues = info.get("queues")
    if not isinstance(queues, list) or not all(isinstance(q, str) for q in queues):
        return None
    return info


def fresh(info: dict[str, Any], now: float, ttl_s: float) -> bool:
    """Signed (by someone) with a beat time within ``ttl_s`` of Redis's ``now``."""
    sig, beat_time = info.get("sig"), info.get("beat_time")
    return (
        isinstance(sig, str)
        and isinstance(beat_time, (int, float))
        and abs(now - float(beat_time)) <= ttl_s
    )


def verified(secret: bytes, info: dict[str, Any], now: float, ttl_s: float) -> bool:
    """Signed with ``secret``, and beat within ``ttl_s`` of Redis's ``now``."""
    return fresh(info, now, ttl_s) and hmac.compare_digest(_tag(secret, info), info["sig"])


def beat(
    client: redis.Redis,
    worker_id: str,
    queues: list[str],
    ttl_s: float,
    info: dict[str, Any],
    secret: bytes | None = None,
) -> None:
    record = dict(info)
    if secret is not None:
        seconds, micros = client.time()
        record = signed(secret, info, seconds + micros / 1e6)
    script = client.register_script(_BEAT)
    script(
        keys=[
            keys.worker_info(worker_id),
            keys.WORKER_REGISTRY,
            *(keys.workers(q) for q in queues),
        ],
        args=[worker_id, ttl_s, json.dumps(record)],
    )


def leave(client: redis.Redis, worker_id: str, queues: list[str]) -> None:
    pipe = client.pipeline(transaction=False)
    for q in queues:
        pipe.zrem(keys.workers(q), worker_id)
    pipe.zrem(keys.WORKER_REGISTRY, worker_id)
    pipe.delete(keys.worker_info(worker_id))
    pipe.execute()


@dataclass
class Census:
    """What a liveness read found: verified workers' records, and how many records failed."""

    live: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # ids (or "?") of records that failed
    #: Of ``rejected``: fresh, well-formed and signed, but not with this secret (a worker
    #: started with another COMPILEQ_SECRET, or a forgery): named apart, the usual mistake.
    foreign: list[str] = field(default_factory=list)


def census(client: redis.Redis, queue: str, ttl_s: float, secret: bytes) -> Census:
    """The workers of ``queue`` a client may route to: signed, recent, and listing ``queue``."""
    script = client.register_script(_LIVE)
    raw = cast(
        "list[bytes]",
        script(
            keys=[keys.workers(queue)],
            args=[ttl_s, _CANDIDATES, keys.WORKER_INFO, MAX_RECORD_BYTES],
        ),
    )
    now, trimmed, records = float(raw[0]), int(raw[1]), raw[2:]
    out = Census(rejected=["future-scored"] * trimmed)
    for record in records:
        info = parse(record)
        if info is not None and queue in info["queues"] and verified(secret, info, now, ttl_s):
            out.live.append(info)
            continue
        out.rejected.append(str(info["id"]) if info is not None else "?")
        if info is not None and queue in info["queues"] and fresh(info, now, ttl_s):
            out.foreign.append(str(info["id"]))
    return out


def live_count(client: redis.Redis, queue: str, ttl_s: float, secret: bytes) -> int:
    return len(census(client, queue, ttl_s, secret).live)


def workers_info(client: redis.Redis, limit: int = 1000) -> list[dict[str, Any]]:
    """What the workers in the registry published with their last heartbeat, well-formed ones
    only (unverified: for display and diagnosis; routing uses :func:`census`)."""
    ids = cast("list[bytes]", client.zrevrange(keys.WORKER_REGISTRY, 0, limit - 1))
    if not ids:
        return []
    names = [keys.worker_info(i.decode(errors="replace")) for i in ids]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.strlen(name)
    sizes = pipe.execute()
    small = [n for n, size in zip(names, sizes, strict=True) if 0 < size <= MAX_RECORD_BYTES]
    raws = cast("list[bytes | None]", client.mget(small)) if small else []
    return [info for info in map(parse, raws) if info is not None]


def live_workers(client: redis.Redis) -> list[dict[str, Any]]:
    """Every live worker's info with ``beat``: the Redis server time of its last heartbeat.

    The beat's server time is the score the heartbeat script gave it, read back here; next to
    the worker's own ``wall`` clock (sent in the same beat) it gives the worker's clock skew.
    """
    infos = [i for i in workers_info(client) if i["queues"]]
    pipe = client.pipeline(transaction=False)
    for info in infos:
        pipe.zscore(keys.workers(info["queues"][0]), info["id"])
    for info, score in zip(infos, pipe.execute() if infos else [], strict=True):
        info["beat"] = score if isinstance(score, float) else None
    return infos
