"""The figures ``compileq stats`` shows: a table per kind of build, the store's size, the
workers per toolchain; with ``--all`` every counter, per queue, and the slowest builds.

Everything here is read from Redis, where anybody may have written: a key of another type, a
field that is no number, a slow-build member that is no JSON object or lacks its fields, a
worker record that is unsigned, all read as absent (and are counted or named where an
operator should know), never as a traceback. Worker records go through
``workers_seen.read_workers``: only those whose signature verifies are workers.

The graphs the cluster remembers as failing codegen on workers (``cache/verdicts.py``) are
read through their index and listed only if their verdicts verify, newest first.

The default output is a short table like ``sccache --show-stats``, built from the same flat
counters that ``--json`` carries (their names are a stable interface, read by scripts and
tests). Rejected alternative: printing the flat counters by default (47 lines, zeros
included, hit rates for two kinds of six).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from compileq import keys
from compileq.cache import meta, verdicts
from compileq.cache.counters import (
    Counter,
    read_counters,
    read_fallback_reasons,
    read_queue_counters,
)
from compileq.cache.store import RedisStore, batched
from compileq.cache.workers_seen import WorkersSeen, read_workers

if TYPE_CHECKING:
    from compileq.config import Settings

#: How many of the slowest builds per kind ``compileq stats`` lists.
TOP = 10
#: How many of the graphs remembered as failing codegen on workers it names, the newest first.
FAILURES_SHOWN = 5
#: A heartbeat TTL for reading worker records when no settings are given (Settings' default).
_DEFAULT_TTL_S = 15.0


@dataclass(frozen=True)
class Kind:
    """One row of the default table: a kind of build and the counters that describe it
    (None: compileq does not count that for this kind)."""

    label: str
    hits: Counter
    misses: Counter | None
    remote: Counter | None
    local: Counter | None


KINDS = (
    Kind(
        "Triton kernels",
        Counter.KERNEL_HITS,
        Counter.KERNEL_MISSES,
        Counter.KERNEL_REMOTE_COMPILES,
        Counter.KERNEL_LOCAL_COMPILES,
    ),
    Kind(
        "FX graphs",
        Counter.FX_HITS,
        Counter.FX_MISSES,
        Counter.FX_REMOTE_COMPILES,
        Counter.FX_LOCAL_COMPILES,
    ),
    Kind("AOTAutograd", Counter.AOT_HITS, Counter.AOT_MISSES, None, None),
    Kind(
        "C++ objects",
        Counter.CPP_HITS,
        Counter.CPP_MISSES,
        Counter.CPP_REMOTE_COMPILES,
        Counter.CPP_LOCAL_COMPILES,
    ),
    # Autotuning counts no misses: a candidate not found is timed remotely or locally.
    Kind("autotune results", Counter.TUNE_HITS, None, Counter.TUNE_REMOTE, Counter.TUNE_LOCAL),
    Kind(
        "Triton modules",
        Counter.TRITON_MODULE_HITS,
        Counter.TRITON_MODULE_MISSES,
        None,
        Counter.TRITON_MODULE_BUILDS,
    ),
    Kind(
        "Triton binaries",
        Counter.TRITON_BINARY_HITS,
        Counter.TRITON_BINARY_MISSES,
        None,
        Counter.TRITON_BINARY_BUILDS,
    ),
    # A kernel not found benchmarks its configs at first launch, in the client: a local build.
    Kind("runtime tuning", Counter.RUNTIME_TUNE_HITS, None, None, Counter.RUNTIME_AUTOTUNES),
    # A matmul padding decision not found is timed in the client: a local build.
    Kind("padding decisions", Counter.PAD_DECISION_HITS, None, None, Counter.PAD_DECISION_TIMINGS),
    # Dynamo's record of dynamic sizes, read at a process's first compile: nothing is built.
    Kind("dynamic profiles", Counter.DYNAMIC_PROFILE_HITS, None, None, None),
)

#: Queue prefixes and the kind of build a worker on them does.
_QUEUE_KINDS = (
    (keys.QUEUE_PREFIX, "Triton kernels"),
    (keys.FX_QUEUE_PREFIX, "FX graphs"),
    (keys.CPP_QUEUE_PREFIX, "C++ objects"),
    (keys.TUNE_QUEUE_PREFIX, "autotune results"),
)
#: A toolchain's parts shown beside its workers, in this order, when the record has them.
_TOOLCHAIN_PARTS = ("torch_version", "triton_version", "assembler", "compiler", "machine")


def _rate(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 4) if hits + misses else None


def kind_rows(counters: dict[str, int]) -> dict[str, dict[str, int | float | None]]:
    """The default table's rows, by kind label."""
    rows: dict[str, dict[str, int | float | None]] = {}
    for kind in KINDS:

        def n(c: Counter | None) -> int | None:
            return None if c is None else counters.get(c.value, 0)

        hits, misses, remote, local = n(kind.hits), n(kind.misses), n(kind.remote), n(kind.local)
        # Without a miss counter, every request not a hit was built, here or remotely.
        requests = (hits or 0) + (misses if misses is not None else (remote or 0) + (local or 0))
        rows[kind.label] = {
            "requests": requests,
            "hits": hits,
            "hit_rate": round((hits or 0) / requests, 4) if requests else None,
            "remote": remote,
            "local": local,
        }
    return rows


def snapshot(store: RedisStore, settings: Settings | None = None) -> dict[str, Any]:
    """Flat counters first (their keys are a stable interface), then the tables.

    ``settings``: whose secret verifies worker records (without: signed and recent ones are
    listed, unverified) and whose entry cap the store is shown against."""
    client = store.client
    values: dict[str, Any] = dict(read_counters(client))
    values["entries"], values["bytes"], wrong_type = usage(client)
    values["kernel_hit_rate"] = _rate(values["kernel_hits"], values["kernel_misses"])
    values["fx_hit_rate"] = _rate(values["fx_hits"], values["fx_misses"])
    values["cpp_hit_rate"] = _rate(values["cpp_hits"], values["cpp_misses"])
    values["aot_hit_rate"] = _rate(values["aot_hits"], values["aot_misses"])
    # Most frequent first: the first one is what to fix (``compileq doctor`` names it).
    reasons = read_fallback_reasons(client)
    values["fallback_reasons"] = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))
    values["kinds"] = kind_rows(values)
    values["fx_failures"] = fx_failures(store)
    values["store"] = {
        "entries": values["entries"],
        "bytes": values["bytes"],
        "entries_of_another_type": wrong_type,
        "max_entry_bytes": settings.max_entry_bytes if settings else None,
        **_memory(client),
    }

    secret = settings.secret_bytes() if settings and settings.secret else None
    ttl_s = settings.heartbeat_ttl_s if settings else _DEFAULT_TTL_S
    seen = read_workers(client, secret, ttl_s)
    values["queues"] = _queues(client, seen)
    values["toolchains"] = _toolchains(seen)
    values["slowest"] = {kind: _slowest(client, kind) for kind in _slow_kinds(client)}
    values["workers"] = len(seen.live)
    values["workers_verified"] = seen.verified
    values["foreign_workers"] = seen.foreign
    values["ignored_worker_records"] = seen.ignored
    values["wrong_type_keys"] = seen.wrong_type
    return values


def fx_failures(store: RedisStore) -> dict[str, Any]:
    """The graphs the cluster remembers as failing codegen on workers (``cache/verdicts.py``):
    how many, and the newest ones' verdicts. Only verdicts that verify are counted."""
    found = verdicts.remembered(store)
    return {"remembered": len(found), "newest": [v.to_json() for v in found[:FAILURES_SHOWN]]}


def usage(client: redis.Redis) -> tuple[int, int, int]:
    """``(entries, bytes, entries of another type)`` under ``compileq:a:``: SCANned, as
    ``RedisStore.usage`` does, but a key that is no string (``HSET compileq:a:x f v``) is
    counted apart instead of failing the whole count with WRONGTYPE."""
    entries = size = other = 0
    for batch in batched(client.scan_iter(match=keys.ARTIFACT + "*", count=1000), 1000):
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.strlen(key)
        for length in pipe.execute(raise_on_error=False):
            if isinstance(length, int):
                entries, size = entries + 1, size + length
            else:
                other += 1
    return entries, size, other


def _memory(client: redis.Redis) -> dict[str, Any]:
    """Redis's memory and its limit (``INFO memory``); None where an ACL forbids INFO."""
    try:
        info = client.info("memory")
    except redis.ResponseError:
        info = {}
    used, limit = info.get("used_memory"), info.get("maxmemory")
    return {
        "redis_used_bytes": used if isinstance(used, int) else None,
        "redis_maxmemory": limit if isinstance(limit, int) else None,
        "redis_maxmemory_policy": str(info.get("maxmemory_policy") or "") or None,
    }


def _queues(client: redis.Redis, seen: WorkersSeen) -> dict[str, dict[str, Any]]:
    queues: dict[str, dict[str, Any]] = {}
    for queue, counts in sorted(read_queue_counters(client).items()):
        queues[queue] = {
            **counts,
            "kernel_hit_rate": _rate(counts["kernel_hits"], counts["kernel_misses"]),
            "workers": [],
        }
    for info in seen.live:
        for queue in info["queues"]:
            row = queues.setdefault(queue, {"kernel_hit_rate": None, "workers": []})
            row["workers"].append(_worker_row(info, queue))
    return queues


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def queue_toolchain(info: dict[str, Any], queue: str) -> dict[str, Any]:
    """The toolchain a worker builds ``queue``'s jobs with, from its record: a Triton queue's
    by its target, an FX queue's by its FX target, an autotuning queue's by its digest, the
    C++ queue's from the CPU graphs' toolchain (compiler, torch, machine)."""
    toolchains, fx = _dict(info.get("toolchains")), _dict(info.get("fx_toolchains"))
    if queue.startswith(keys.QUEUE_PREFIX):
        return _dict(toolchains.get(queue.rsplit(".", 1)[-1]))
    if queue.startswith(keys.FX_QUEUE_PREFIX):
        target = queue[len(keys.FX_QUEUE_PREFIX) :].partition(".")[2]
        return _dict(fx.get(target))
    if queue.startswith(keys.TUNE_QUEUE_PREFIX):
        digest = queue[len(keys.TUNE_QUEUE_PREFIX) :].partition(".")[0]
        found = [t for t in toolchains.values() if _dict(t).get("digest") == digest]
        return _dict(found[0]) if found else {}
    if queue.startswith(keys.CPP_QUEUE_PREFIX):
        cpu = [t for t in fx.values() if _dict(t).get("kernels") == ""]
        return _dict(cpu[0]) if cpu else {}
    return {}


def describe_toolchain(toolchain: dict[str, Any]) -> str:
    """``torch 2.13.0, triton 3.9.0, ptxas 12.8``: the parts a record has, none as None."""
    names = {"torch_version": "torch", "triton_version": "triton"}
    parts = []
    for part in _TOOLCHAIN_PARTS:
        value = toolchain.get(part)
        if value not in (None, ""):
            parts.append(f"{names[part]} {value}" if part in names else str(value))
    env = _dict(toolchain.get("codegen_env"))
    if env:
        parts.append("env " + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
    return ", ".join(parts) or "toolchain not published"


def _worker_row(info: dict[str, Any], queue: str) -> dict[str, Any]:
    toolchain = queue_toolchain(info, queue)
    return {
        "id": info.get("id"),
        "host": info.get("host"),
        "gpu": None if info.get("cpu_only") else info.get("gpu"),
        "cpu_only": bool(info.get("cpu_only")),
        "concurrency": info.get("concurrency"),
        "toolchain": {
            k: toolchain.get(k)
            for k in ("torch_version", "triton_version", "assembler", "codegen_env", "digest")
        },
        "described": describe_toolchain(toolchain),
    }


def _queue_kind(queue: str) -> tuple[str, str]:
    """A queue's kind of build and what it builds for (a target, an FX target, a GPU model,
    or this CPU for C++ objects)."""
    for prefix, label in _QUEUE_KINDS:
        if queue.startswith(prefix):
            rest = queue[len(prefix) :].partition(".")[2]
            return label, rest or "the workers' CPU"
    return "other", queue


def _toolchains(seen: WorkersSeen) -> list[dict[str, Any]]:
    """Live workers grouped by kind, target and toolchain: one row each."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for info in seen.live:
        for queue in info["queues"]:
            kind, target = _queue_kind(queue)
            described = describe_toolchain(queue_toolchain(info, queue))
            groups.setdefault((kind, target, described), []).append(str(info["id"]))
    return [
        {"kind": kind, "target": target, "toolchain": described, "workers": ids}
        for (kind, target, described), ids in sorted(groups.items())
    ]


def _slow_kinds(client: redis.Redis) -> list[str]:
    return sorted(
        k.decode(errors="replace")[len(keys.SLOW) :]
        for k in client.scan_iter(match=keys.SLOW + "*", count=1000)
    )


def _slowest(client: redis.Redis, kind: str) -> list[dict[str, Any]]:
    """A kind's slowest builds; members that are not what compileq writes are left out."""
    try:
        rows = meta.slowest(client, kind, TOP)
    except redis.ResponseError:  # WRONGTYPE
        return []
    out = []
    for row in rows:
        name, key, by = row.get("name"), row.get("key"), row.get("by")
        if all(isinstance(v, str) for v in (name, key, by)):
            kept = {"name": name, "key": key, "by": by, "seconds": row["seconds"]}
            started = row.get("started")
            if isinstance(started, (int, float)) and not isinstance(started, bool):
                kept["started"] = started
            out.append(kept)
    return out


def _shown(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name.endswith("hit_rate"):
        return f"{value:.1%}"
    if name == "bytes":
        return f"{value} ({_size(value)})"
    return str(value)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def render(values: dict[str, Any], everything: bool = False) -> str:
    """The text ``compileq stats`` prints: the short report, and with ``everything`` every
    flat counter, the queues and the slowest builds after it. ``values``: a
    :func:`snapshot`, its strings already escaped (``_text.printable_values``)."""
    lines = _summary(values)
    if everything:
        lines += _details(values)
    else:
        lines.append("(compileq stats --all: every counter, per queue, and the slowest builds)")
    return "\n".join(lines)


def _summary(values: dict[str, Any]) -> list[str]:
    header = ("kind", "requests", "hits", "hit rate", "remote", "local")
    rows = [header]
    for label, row in values.get("kinds", {}).items():
        rows.append(
            (
                label,
                str(row["requests"]),
                _shown("hits", row["hits"]),
                _shown("hit_rate", row["hit_rate"]),
                _shown("remote", row["remote"]),
                _shown("local", row["local"]),
            )
        )
    width = max(len(r[0]) for r in rows)
    lines = ["compileq stats"]
    lines += [f"  {r[0]:<{width}}" + "".join(f"  {c:>8}" for c in r[1:]) for r in rows]
    reasons = values.get("fallback_reasons") or {}
    total = values.get("fallbacks", 0)
    if total or reasons:
        listed = ", ".join(f"{n} {reason}" for reason, n in reasons.items())
        lines.append(f"fallbacks: {total}" + (f" ({listed})" if listed else ""))
    else:
        lines.append("fallbacks: none")
    lines += _failure_lines(values.get("fx_failures") or {})
    lines.append("store: " + _store_line(values.get("store") or {}))
    lines += _worker_lines(values)
    return lines


def _failure_lines(failures: dict[str, Any]) -> list[str]:
    """The graphs remembered as failing codegen on workers, if any: a line, and the newest."""
    n = failures.get("remembered", 0)
    if not n:
        return []
    lines = [
        f"failing codegen on workers: {_plural(n, 'graph')}, compiled in process without "
        "another try (`compileq forget-failures` to try again):"
    ]
    for row in failures.get("newest", []):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["at"]))
        lines.append(
            f"  {row['error']} ({row['reason']}; worker {row['worker']}, {when}; {row['graph']})"
        )
    return lines


def _store_line(store: dict[str, Any]) -> str:
    entries = store.get("entries", 0)
    text = f"{entries} {'entry' if entries == 1 else 'entries'}, {_size(store.get('bytes', 0))}"
    if store.get("max_entry_bytes"):
        text += f" (each at most {_size(store['max_entry_bytes'])}, COMPILEQ_MAX_ENTRY_BYTES)"
    used, limit = store.get("redis_used_bytes"), store.get("redis_maxmemory")
    if used is not None:
        if limit:
            policy = store.get("redis_maxmemory_policy") or "?"
            text += f"; Redis uses {_size(used)} of its {_size(limit)} maxmemory ({policy})"
        else:
            text += f"; Redis uses {_size(used)}, no maxmemory limit"
    if store.get("entries_of_another_type"):
        text += (
            f"; {store['entries_of_another_type']} keys under compileq:a: are not entries "
            "(another Redis type: not written by compileq)"
        )
    return text


def _worker_lines(values: dict[str, Any]) -> list[str]:
    n = values.get("workers", 0)
    checked = "" if values.get("workers_verified", True) else " (not verified: no secret here)"
    lines = [f"workers: {n} live{checked}" + (", per toolchain:" if n else "")]
    for row in values.get("toolchains", []):
        ids = row["workers"]
        lines.append(
            f"  {row['kind']} for {row['target']}: {_plural(len(ids), 'worker')} "
            f"({', '.join(ids[:3])}{', ...' if len(ids) > 3 else ''}): {row['toolchain']}"
        )
    foreign = values.get("foreign_workers") or []
    if foreign:
        lines.append(
            f"  {_plural(len(foreign), 'worker record')} signed with another COMPILEQ_SECRET "
            f"(or forged), not counted: {', '.join(foreign[:5])}"
        )
    ignored = values.get("ignored_worker_records") or []
    if ignored:
        lines.append(
            f"  {_plural(len(ignored), 'worker record')} unsigned, stale or malformed, "
            f"ignored: {', '.join(ignored[:5])}"
        )
    for key in values.get("wrong_type_keys") or []:
        lines.append(f"  {key} holds another Redis type than compileq writes: ignored")
    return lines


def _details(values: dict[str, Any]) -> list[str]:
    flat = {k: v for k, v in values.items() if not isinstance(v, (dict, list, bool))}
    width = max(len(k) for k in flat)
    lines = ["every counter"]
    lines += [f"  {name:<{width}}  {_shown(name, value)}" for name, value in flat.items()]
    for queue, row in values.get("queues", {}).items():
        lines.append(f"queue {queue}")
        if "kernel_hits" in row:
            lines.append(
                f"  kernels: {row['kernel_hits']} hits, {row['kernel_misses']} misses "
                f"(hit rate {_shown('hit_rate', row['kernel_hit_rate'])}), "
                f"{row['kernel_remote_compiles']} remote, {row['kernel_local_compiles']} local, "
                f"{row['kernel_remote_failures']} failed, {row['fallbacks']} fallbacks"
            )
        if not row["workers"]:
            lines.append("  no live worker")
        for w in row["workers"]:
            device = "cpu-only" if w["cpu_only"] else f"gpu {w['gpu']}"
            lines.append(
                f"  worker {w['id']} on {w['host']} ({device}, x{w['concurrency']}): "
                f"{w['described']}"
            )
    for kind, rows in values.get("slowest", {}).items():
        if rows:
            lines.append(f"slowest {kind} builds")
            lines += [f"  {r['seconds']:8.2f}s  {r['name']}  ({r['by']}, {r['key']})" for r in rows]
    return lines
