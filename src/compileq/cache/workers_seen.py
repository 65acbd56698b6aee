"""The workers an operator's tool reports, read from Redis as untrusted input.

``compileq stats`` and ``compileq doctor`` list workers; anybody who can write to Redis can
add a member to the registry or a record under ``compileq:worker:<id>``, of any type and any
shape. So a worker is counted only when its record's heartbeat signature verifies with this
machine's secret and is recent (cache/liveness.py's rule, the one routing uses); records
signed and recent but not with this secret are named apart (a worker started with another
``COMPILEQ_SECRET``, or a forgery: the two cannot be told apart without the secret); the
rest, unsigned, stale, malformed or of another Redis type, are reported as ignored and never
judged. Rejected alternative: reading every record the registry names and checking its
fields one by one where they are used, which gave a traceback for each field a writer could
make the wrong type, and counted an unsigned record as a worker with another secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import redis

from compileq import keys
from compileq.cache import liveness

#: Registry members read per report: more than any cluster runs, few enough to read at once.
LIMIT = 1000


@dataclass
class WorkersSeen:
    """What the registry holds, sorted out."""

    #: Records whose signature verifies with this secret (or, read without a secret, that
    #: are signed and recent: ``verified`` is then False), each with ``beat``: the Redis
    #: server time of its last heartbeat, from the signed record.
    live: list[dict[str, Any]] = field(default_factory=list)
    #: Ids of records signed and recent, but not with this secret.
    foreign: list[str] = field(default_factory=list)
    #: Those records: unproven, for diagnosis only (doctor compares the toolchain they claim,
    #: the usual companion of a wrong secret), never counted or routed to.
    foreign_records: list[dict[str, Any]] = field(default_factory=list)
    #: Ids of records ignored: unsigned, stale, malformed or not a string in Redis.
    ignored: list[str] = field(default_factory=list)
    #: Whether ``live`` was checked against a secret.
    verified: bool = True
    #: Keys of compileq's that hold another Redis type than compileq writes there.
    wrong_type: list[str] = field(default_factory=list)


def read_workers(client: redis.Redis, secret: bytes | None, ttl_s: float) -> WorkersSeen:
    """The registry's workers, sorted by what their records prove (see the module's text).
    Raises only redis-py's connection errors: a key of the wrong type is reported in
    ``wrong_type``, a bad record in ``ignored``."""
    seen = WorkersSeen(verified=secret is not None)
    try:
        members = cast("list[bytes]", client.zrevrange(keys.WORKER_REGISTRY, 0, LIMIT - 1))
    except redis.ResponseError:  # WRONGTYPE
        seen.wrong_type.append(keys.WORKER_REGISTRY)
        return seen
    ids = [m.decode(errors="replace") for m in members]
    if not ids:
        return seen
    pipe = client.pipeline(transaction=False)
    for worker_id in ids:
        pipe.strlen(keys.worker_info(worker_id))
    sizes = pipe.execute(raise_on_error=False)
    small = []
    for worker_id, size in zip(ids, sizes, strict=True):
        if isinstance(size, int) and 0 < size <= liveness.MAX_RECORD_BYTES:
            small.append(worker_id)
        elif isinstance(size, int) and size == 0:
            continue  # expired since it last beat: a worker that left, not a bad record
        else:
            seen.ignored.append(worker_id)
            if isinstance(size, redis.ResponseError):
                seen.wrong_type.append(keys.worker_info(worker_id))
    raws = cast(
        "list[bytes | None]", client.mget([keys.worker_info(i) for i in small]) if small else []
    )
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    for worker_id, raw in zip(small, raws, strict=True):
        info = liveness.parse(raw)
        if info is None:
            if raw is not None:
                seen.ignored.append(worker_id)
            continue
        if secret is not None and liveness.verified(secret, info, now, ttl_s):
            seen.live.append({**info, "beat": float(info["beat_time"])})
        elif liveness.fresh(info, now, ttl_s):
            if secret is None:
                seen.live.append({**info, "beat": float(info["beat_time"])})
            else:
                seen.foreign.append(str(info["id"]))
                seen.foreign_records.append(info)
        else:
            seen.ignored.append(str(info["id"]))
    return seen
