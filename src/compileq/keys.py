"""Every Redis key and channel compileq uses, in one place.

All keys live under one prefix so an operator can find, count or drop compileq's data with
one pattern (``compileq:*``), and so the broker's own keys (kombu's lists and unacked sets)
stay apart from the cache's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

PREFIX = "compileq"

#: Content-addressed artifacts: ``compileq:a:<kind>:<sha256>``.
ARTIFACT = f"{PREFIX}:a:"
#: Single-flight leases: ``compileq:lock:<artifact key>`` holds the owner's id.
LOCK = f"{PREFIX}:lock:"
#: Signed job specs a worker reads by key: ``compileq:job:<artifact key>``.
JOB = f"{PREFIX}:job:"
#: A live worker's signed mark on a job it is building now: ``compileq:building:<artifact
#: key>`` (cache/building.py), with a short expiry its worker keeps renewing.
BUILDING = f"{PREFIX}:building:"
#: Cluster-wide counters (one hash).
STATS = f"{PREFIX}:stats"
#: Per-queue counters, one hash whose fields are ``<queue>|<counter>`` (one key to read or reset).
QUEUE_STATS = f"{PREFIX}:stats:queues"
#: Hash: fallback reason -> how many builds or graphs went local for it (``compileq stats``).
FALLBACK_REASONS = f"{PREFIX}:stats:fallbacks"
#: Slowest builds per kind, a capped sorted set scored by seconds: ``compileq:slow:<kind>``.
SLOW = f"{PREFIX}:slow:"
#: The key material an entry was built from (JSON): ``compileq:meta:<artifact key>``.
META = f"{PREFIX}:meta:"
#: Entries of one kernel source (its own name left out, see ``TritonJob.source_sha``) across
#: toolchains and configs, a set of artifact keys: ``compileq:siblings:<kind>:<source sha256>``;
#: explain finds a miss's neighbour here.
SIBLINGS = f"{PREFIX}:siblings:"
#: The last kernel misses' key material (JSON), newest first, capped.
MISSES = f"{PREFIX}:misses"
#: The graphs whose codegen failed on a worker (cache/verdicts.py): a capped sorted set of
#: their verdicts' keys (``fx_failure``), scored by the time each was written. Only an index
#: for ``compileq stats``, ``doctor`` and ``forget-failures``, which read and verify each
#: verdict itself; a client never reads it.
FX_FAILURES = f"{PREFIX}:fxfailures"
#: Live workers per queue: sorted set of worker ids scored by Redis server time.
WORKERS = f"{PREFIX}:workers:"
#: Every worker by id, scored by Redis server time of its last beat: how readers find the
#: workers' descriptions without a keyspace SCAN.
WORKER_REGISTRY = f"{PREFIX}:workers"
#: One worker's description (JSON, expiring with its heartbeat): ``compileq:worker:<id>``.
WORKER_INFO = f"{PREFIX}:worker:"
#: Pub/sub channel on which builds are announced (JSON ``{"key", "ok", "error"}``).
DONE_CHANNEL = f"{PREFIX}:done"
#: ``compileq doctor``'s short-lived write probes (cache Redis, then broker Redis).
DOCTOR = f"{PREFIX}:doctor:"
BROKER_DOCTOR = f"{PREFIX}:broker:doctor:"
#: kombu's ``global_keyprefix``: the broker's queues and bookkeeping.
BROKER = f"{PREFIX}:broker:"
#: The Sentinel master ``compileq doctor`` saw last (hash: master address, config epoch,
#: time): ``compileq:sentinel:<master name>``, and its broker twin; a later run that finds
#: another master names the failover.
SENTINEL = f"{PREFIX}:sentinel:"
BROKER_SENTINEL = f"{BROKER}sentinel:"

#: Celery queues: ``compileq.triton.<toolchain digest>.<target>``.
QUEUE_PREFIX = "compileq.triton."
#: Celery queues for timing autotuning candidates: ``compileq.tune.<toolchain digest>.<GPU model>``.
TUNE_QUEUE_PREFIX = "compileq.tune."
#: Celery queues for graph codegen: ``compileq.fx.<FX toolchain digest>.<FX target>``.
FX_QUEUE_PREFIX = "compileq.fx."
#: Celery queues for C++ objects: ``compileq.cpp.<C++ toolchain digest>`` (compiler, torch, CPU).
CPP_QUEUE_PREFIX = "compileq.cpp."


def artifact(kind: str, digest: str) -> str:
    return f"{ARTIFACT}{kind}:{digest}"


def artifact_of(kind: str, material: Mapping[str, object]) -> str:
    """The artifact key of everything that decides an entry (``material``: JSON values),
    hashed in one canonical spelling (sorted keys), so equal material is one key anywhere."""
    canonical = json.dumps(material, sort_keys=True).encode()
    return artifact(kind, hashlib.sha256(canonical).hexdigest())


def early(key: str) -> str:
    """Where a worker stores part of a job's output before the whole, for the client waiting
    for that job to act on (an FX forward's output strides, once its lowering fixed them:
    ``tasks/fx_strides.py``). An artifact of its own kind, keyed by the job's key."""
    return artifact("early", hashlib.sha256(key.encode()).hexdigest())


def fx_failure(key: str, version: str) -> str:
    """Where a worker remembers that the codegen of the graph whose job key is ``key`` failed
    (cache/verdicts.py): an artifact of its own kind, keyed by the job's key (so by the graph,
    its toolchain and target) and by compileq's ``version``, so that a new toolchain or a new
    compileq misses the verdict and tries the graph again."""
    return artifact("fxfail", hashlib.sha256(f"{key}\0{version}".encode()).hexdigest())


def lock(key: str) -> str:
    return LOCK + key


def job(key: str) -> str:
    return JOB + key


def building(key: str) -> str:
    return BUILDING + key


def workers(queue: str) -> str:
    return WORKERS + queue


def worker_info(worker_id: str) -> str:
    return WORKER_INFO + worker_id


def slow(kind: str) -> str:
    return SLOW + kind


def meta(key: str) -> str:
    return META + key


def siblings(kind: str, source_sha: str) -> str:
    return f"{SIBLINGS}{kind}:{source_sha}"
