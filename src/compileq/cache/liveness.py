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

A queue's members cannot crowd out a real worker: each member a signed heartbeat adds is
``<id>#<tag>``, the tag an HMAC of the id under the secret, so a client picks the members
worth reading by their names alone, out of every member of the window (paged, up to
``_MAX_MEMBERS``), and reads the records of those only. Rejected alternatives: reading the
newest 32 members' records (32 fresh ghosts hid the real worker), and reading every record
(a flood of 256 KiB ghost records would cost each census megabytes).

compileq's own keys of the wrong type (``SET compileq:workers:<queue> junk``) are repaired
by the next heartbeat (deleted and written again), and read by a client as "no verified
worker", never as Redis failing: a typed key is the only thing a writer can break there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from compileq import keys
from compileq._log import log, warn_once

#: Domain separation: a heartbeat tag can never be mistaken for an entry's, a job's or a probe's.
_DOMAIN = b"compileq-heartbeat-v1\0"
#: A record larger than this is not a worker's (theirs are a few KB): skipped unread.
MAX_RECORD_BYTES = 256 * 1024
#: Records read per queue and liveness check: tagged members first, then (for diagnosis:
#: a worker with another secret is named) untagged ones up to this many in all.
_CANDIDATES = 32
#: Untagged members whose records are read to name them (a worker with another secret).
_DIAGNOSED = 8
#: Members looked at per page of a census, and in all: ghosts cost the reader their names
#: (at most ``_MAX_MEMBER_BYTES`` each), never their records.
_PAGE = 1024
_MAX_MEMBERS = 64 * 1024
#: A member longer than this is no worker's (``<id>#<32 hex>``, ids are host:pid-like).
_MAX_MEMBER_BYTES = 512
#: Domain separation for a member's tag.
_MEMBER_DOMAIN = b"compileq-member-v1\0"

# KEYS: the worker's record, the registry, its queues' sets, then the sets it leaves with
# this beat (its FX queues' joining sets, scheduler/fx_join.py: left in the beat that joins
# the queues, so there is no moment in which it is in neither); ARGV: the worker id, the ttl,
# the record, the queue member, how many sets it leaves. A key of ours holding another type is
# deleted first (repaired: the beat writes it again); returns the server time and how many
# were repaired.
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ttl = tonumber(ARGV[2])
local last = #KEYS - tonumber(ARGV[5])
local repaired = 0
for i = 2, #KEYS do
  local kind = redis.call('TYPE', KEYS[i])['ok']
  if kind ~= 'none' and kind ~= 'zset' then
    redis.call('DEL', KEYS[i])
    repaired = repaired + 1
  end
end
for i = last + 1, #KEYS do
  redis.call('ZREM', KEYS[i], ARGV[4])
end
for i = 3, last do
  redis.call('ZADD', KEYS[i], now, ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now - 4 * ttl)
  redis.call('ZREMRANGEBYSCORE', KEYS[i], now + ttl, '+inf')
end
redis.call('SET', KEYS[1], ARGV[3], 'PX', math.floor(ttl * 1000))
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - 4 * ttl)
return {tostring(now), repaired}
"""

# The server time, how many future-scored members were trimmed (a score no worker's beat can
# make; -1: the key is not a sorted set), then one page of the members scored in the last ttl,
# newest first; a member too long to be a worker's is removed instead.
_MEMBERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind ~= 'zset' then
  if kind == 'none' then return {tostring(now), 0} end
  return {tostring(now), -1}
end
local ttl = tonumber(ARGV[1])
local trimmed = redis.call('ZREMRANGEBYSCORE', KEYS[1], now + ttl, '+inf')
local ids = redis.call('ZREVRANGEBYSCORE', KEYS[1], '+inf', now - ttl, 'LIMIT',
                       tonumber(ARGV[2]), tonumber(ARGV[3]))
local out = {tostring(now), trimmed}
for _, id in ipairs(ids) do
  if #id > tonumber(ARGV[4]) then redis.call('ZREM', KEYS[1], id)
  else out[#out + 1] = id end
end
return out
"""

# The records under KEYS, each '' unless a string of 1..ARGV[1] bytes.
_RECORDS = """
local out = {}
for i, key in ipairs(KEYS) do
  local n = redis.pcall('STRLEN', key)
  if type(n) == 'number' and n > 0 and n <= tonumber(ARGV[1]) then
    out[i] = redis.call('GET', key)
  else
    out[i] = ''
  end
end
return out
"""

# Remove ``worker id`` (ARGV[1]) from each set: its bare id and every ``<id>#<tag>`` member.
_LEAVE = """
for i = 1, #KEYS do
  if redis.call('TYPE', KEYS[i])['ok'] == 'zset' then
    redis.call('ZREM', KEYS[i], ARGV[1])
    for _, m in ipairs(redis.call('ZRANGE', KEYS[i], 0, -1)) do
      if string.sub(m, 1, #ARGV[1] + 1) == ARGV[1] .. '#' then redis.call('ZREM', KEYS[i], m) end
    end
  end
end
return 0
"""


def member(secret: bytes, worker_id: str) -> str:
    """The name a worker's signed heartbeat gives itself in its queues' sets: ``<id>#<tag>``."""
    tag = hmac.new(secret, _MEMBER_DOMAIN + worker_id.encode(), hashlib.sha256).hexdigest()
    return f"{worker_id}#{tag[:32]}"


def member_id(raw: bytes | str) -> str:
    """The worker id a member names (tagged or not)."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    head, sep, tag = text.rpartition("#")
    return head if sep and len(tag) == 32 else text


def tagged(secret: bytes, raw: bytes | str) -> bool:
    """Whether ``raw`` is a member a heartbeat signed with ``secret`` added."""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    # As bytes: compare_digest refuses a str with non-ASCII characters, which anyone can plant.
    return hmac.compare_digest(text.encode(), member(secret, member_id(text)).encode())


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
    return fresh(info, now, ttl_s) and hmac.compare_digest(
        _tag(secret, info).encode(), str(info["sig"]).encode()
    )


def beat(
    client: redis.Redis,
    worker_id: str,
    queues: list[str],
    ttl_s: float,
    info: dict[str, Any],
    secret: bytes | None = None,
    leaving: list[str] | None = None,
) -> int:
    """One heartbeat; how many of compileq's keys it found of the wrong type and repaired.
    ``leaving``: sets this beat takes the worker out of, in the same script."""
    gone = [q for q in leaving or [] if q not in queues]
    record = dict(info)
    if secret is not None:
        seconds, micros = client.time()
        record = signed(secret, info, seconds + micros / 1e6)
    script = client.register_script(_BEAT)
    _, repaired = script(
        keys=[
            keys.worker_info(worker_id),
            keys.WORKER_REGISTRY,
            *(keys.workers(q) for q in queues),
            *(keys.workers(q) for q in gone),
        ],
        args=[
            worker_id,
            ttl_s,
            json.dumps(record),
            worker_id if secret is None else member(secret, worker_id),
            len(gone),
        ],
    )
    if int(repaired):
        log.warning(
            "compileq worker: repaired %d liveness keys that held another Redis type",
            int(repaired),
        )
    return int(repaired)


def leave(client: redis.Redis, worker_id: str, queues: list[str]) -> None:
    pipe = client.pipeline(transaction=False)
    client.register_script(_LEAVE)(
        keys=[*(keys.workers(q) for q in queues), keys.WORKER_REGISTRY],
        args=[worker_id],
        client=pipe,
    )
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
    #: The queue's key held another Redis type (read as nobody; the next heartbeat repairs it).
    wrong_type: bool = False


def census(
    client: redis.Redis, queue: str, ttl_s: float, secret: bytes, listed_in: str = "queues"
) -> Census:
    """The workers of ``queue`` a client may route to: signed, recent, and listing ``queue``
    (in their record's ``listed_in``: ``pending_fx`` for a queue they are about to join).

    Every member of the window is looked at by name (up to ``_MAX_MEMBERS``), so no number of
    ghosts hides a worker whose member carries our tag; only the records of tagged members,
    and of a few untagged ones to name them, are read. A key of another type reads as nobody.
    """
    pages = client.register_script(_MEMBERS)
    ours: list[str] = []
    others: list[str] = []
    trimmed = 0
    now = 0.0
    for offset in range(0, _MAX_MEMBERS, _PAGE):
        raw = cast(
            "list[bytes]",
            pages(keys=[keys.workers(queue)], args=[ttl_s, offset, _PAGE, _MAX_MEMBER_BYTES]),
        )
        now, found = float(raw[0]), int(raw[1])
        if found < 0:
            warn_once(
                f"liveness-type:{queue}",
                "compileq: the liveness key of queue %s holds another Redis type; no worker "
                "counts as live there until a worker's heartbeat repairs it",
                queue,
            )
            return Census(wrong_type=True)
        trimmed += found
        for name in raw[2:]:
            (ours if tagged(secret, name) else others).append(member_id(name))
        if len(raw) - 2 < _PAGE or len(ours) >= _CANDIDATES:
            break
    out = Census(rejected=["future-scored"] * trimmed)
    diagnosed = others[: max(0, min(_DIAGNOSED, _CANDIDATES - len(ours)))]
    ids = [*ours[:_CANDIDATES], *diagnosed]
    if not ids:
        return out
    records = cast(
        "list[bytes]",
        client.register_script(_RECORDS)(
            keys=[keys.worker_info(i) for i in ids], args=[MAX_RECORD_BYTES]
        ),
    )
    for record in records:
        info = parse(record)
        listed = info is not None and _lists(info, listed_in, queue)
        if info is not None and listed and verified(secret, info, now, ttl_s):
            out.live.append(info)
            continue
        out.rejected.append(str(info["id"]) if info is not None else "?")
        if info is not None and listed and fresh(info, now, ttl_s):
            out.foreign.append(str(info["id"]))
    return out


def _lists(info: dict[str, Any], field: str, queue: str) -> bool:
    names = info.get(field)
    return isinstance(names, list) and queue in names


def any_verified(client: redis.Redis, ttl_s: float, secret: bytes, limit: int = 64) -> bool:
    """Whether any worker in the registry beat within ``ttl_s`` with a record signed with
    ``secret``: the cluster shares it (whatever queue). Never raises for a key's type."""
    try:
        seconds, micros = client.time()
        now = seconds + micros / 1e6
        ids = cast(
            "list[bytes]",
            client.zrevrangebyscore(keys.WORKER_REGISTRY, "+inf", now - ttl_s, start=0, num=limit),
        )
    except redis.ResponseError:  # the registry holds another type: nobody verified
        return False
    short = [i for i in ids if len(i) <= _MAX_MEMBER_BYTES]
    if not short:
        return False
    records = cast(
        "list[bytes]",
        client.register_script(_RECORDS)(
            keys=[keys.worker_info(member_id(i)) for i in short], args=[MAX_RECORD_BYTES]
        ),
    )
    return any(
        info is not None and verified(secret, info, now, ttl_s) for info in map(parse, records)
    )


def live_count(client: redis.Redis, queue: str, ttl_s: float, secret: bytes) -> int:
    return len(census(client, queue, ttl_s, secret).live)


def workers_info(client: redis.Redis, limit: int = 1000) -> list[dict[str, Any]]:
    """What the workers in the registry published with their last heartbeat, well-formed ones
    only (unverified: for display and diagnosis; routing uses :func:`census`). A registry or
    record of another Redis type reads as no worker (or no record), never as an error."""
    try:
        ids = cast("list[bytes]", client.zrevrange(keys.WORKER_REGISTRY, 0, limit - 1))
    except redis.ResponseError:
        return []
    if not ids:
        return []
    names = [keys.worker_info(i.decode(errors="replace")) for i in ids]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.strlen(name)
    sizes = pipe.execute(raise_on_error=False)
    small = [
        n
        for n, size in zip(names, sizes, strict=True)
        if isinstance(size, int) and 0 < size <= MAX_RECORD_BYTES
    ]
    raws = cast("list[bytes | None]", client.mget(small)) if small else []
    return [info for info in map(parse, raws) if info is not None]


def live_workers(client: redis.Redis) -> list[dict[str, Any]]:
    """Every live worker's info with ``beat``: the Redis server time of its last heartbeat.

    The beat's server time is the score the heartbeat script gave it in the registry, read
    back here; next to the worker's own ``wall`` clock (sent in the same beat) it gives the
    worker's clock skew.
    """
    infos = [i for i in workers_info(client) if i["queues"]]
    pipe = client.pipeline(transaction=False)
    for info in infos:
        pipe.zscore(keys.WORKER_REGISTRY, info["id"])
    scores = pipe.execute(raise_on_error=False) if infos else []
    for info, score in zip(infos, scores, strict=True):
        info["beat"] = score if isinstance(score, float) else None
    return infos
