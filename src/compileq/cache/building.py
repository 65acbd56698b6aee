"""Which jobs a live worker is building right now: a signed mark per job, renewed while it runs.

A client waits for a remote build ``COMPILEQ_DEADLINE_S`` (60 s), then compiles in process. For
a job still queued (no worker free, none alive) that is right. For one a live worker is already
generating it is the worst choice: the local compile starts over from nothing, on the same
host's cores as the worker's (they sit on the GPU node) and so slower than either alone, and
the worker's output arrives meanwhile for nobody. The zoo met it on the 2-core machine: timm's
adv_inception_v3, dm_nfnet_f0 and ghostnet_100 each have a backward whose codegen takes 100-125 s
there (stock's own in-process compile of it takes ~70 s); each client gave up at 60 s and
compiled it again beside the worker, and compileq's first step was 1.2x stock's.

So the worker marks each job it runs (``compileq:building:<key>``), signed with the shared
secret, naming itself and Redis's time, with a short lifetime (``TTL_MS``) that it renews every
``EVERY_S`` while the build runs, and deletes when the job settles. A client whose deadline has
passed reads the marks of the keys it still waits for (one ``MGET``) and waits on for those a
live worker marks, for as long as the mark lives, up to the worker's own hard time limit
(``COMPILEQ_TASK_TIME_LIMIT_S``, which ends any build by then). A worker that dies stops
renewing: its mark lapses within ``TTL_MS`` and the client falls back as before. A mark is
trusted only if it verifies for that very key and its signed lifetime has not run out on
Redis's clock: a writer without the secret can make no client wait. Triton kernels are not
marked: the kernel client's listener waits for them with its own deadline (a kernel builds in
a second or two), and a mark per kernel would cost two Redis calls each.

Rejected alternatives: a longer deadline (it would also keep a client waiting on a job that no
worker will take); the lease itself as the mark (its owner is the sender, who renews it while
the job waits in its queue too, so a live lease cannot tell queued from building); Celery's
STARTED state (a result backend round trip per task, and unsigned).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection

import redis

from compileq import keys

#: A mark's lifetime: how long a client waits on past its deadline for a worker that died.
TTL_MS = 10_000
#: How often a building worker renews its marks.
EVERY_S = 3.0
_DOMAIN = b"compileq-building-v1\0"
_MAX_VALUE_BYTES = 512


def _tag(secret: bytes, key: str, worker: str, at_ms: int) -> str:
    material = f"{keys.building(key)}\0{worker}\0{at_ms}\0{TTL_MS}".encode()
    return hmac.new(secret, _DOMAIN + material, hashlib.sha256).hexdigest()[:32]


def value(secret: bytes, key: str, worker: str, at_ms: int) -> str:
    """The mark of ``worker`` building ``key``, signed at Redis's ``at_ms``."""
    return f"{worker}|{at_ms}|{_tag(secret, key, worker, at_ms)}"


def mark(client: redis.Redis, key: str, secret: bytes, worker: str) -> None:
    """Say (again) that ``worker`` is building ``key``: its mark signed with Redis's time now."""
    now_ms = _ms(client.time())
    client.set(keys.building(key), value(secret, key, worker, now_ms), px=TTL_MS)


def _ms(clock: tuple[int, int]) -> int:
    """Redis's ``TIME`` reply in milliseconds: marks are judged on its clock, never a node's."""
    seconds, micros = clock
    return int(seconds) * 1000 + int(micros) // 1000


def unmark(client: redis.Redis, key: str) -> None:
    client.delete(keys.building(key))


def _live(secret: bytes, key: str, raw: object, now_ms: int) -> bool:
    if not isinstance(raw, bytes) or len(raw) > _MAX_VALUE_BYTES:
        return False
    parts = raw.decode(errors="replace").rsplit("|", 2)
    if len(parts) != 3 or not (parts[1].isascii() and parts[1].isdigit()):
        return False
    worker, at_ms, tag = parts[0], int(parts[1]), parts[2]
    if not hmac.compare_digest(tag.encode(), _tag(secret, key, worker, at_ms).encode()):
        return False
    return at_ms - 1000 <= now_ms < at_ms + TTL_MS


def building(client: redis.Redis, secret: bytes, names: Collection[str]) -> set[str]:
    """Those of ``names`` that a live worker is building now (a verified mark, not lapsed on
    Redis's clock); one ``TIME`` and one ``MGET``."""
    ordered = sorted(names)
    if not ordered:
        return set()
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.mget([keys.building(k) for k in ordered])
    clock, raws = pipe.execute()
    now_ms = _ms(clock)
    return {k for k, raw in zip(ordered, raws, strict=True) if _live(secret, k, raw, now_ms)}
