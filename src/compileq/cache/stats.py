"""The figures ``compileq stats`` shows: counters, hit rates, slowest builds, live workers."""

from __future__ import annotations

from typing import Any

from compileq.cache import liveness, meta
from compileq.cache.counters import read_counters, read_fallback_reasons, read_queue_counters
from compileq.cache.store import RedisStore

#: How many of the slowest builds per kind ``compileq stats`` lists.
TOP = 10


def _rate(hits: int, misses: int) -> float | None:
    return round(hits / (hits + misses), 4) if hits + misses else None


def snapshot(store: RedisStore) -> dict[str, Any]:
    """Flat counters first (their keys are a stable interface), then the breakdowns."""
    client = store.client
    values: dict[str, Any] = dict(read_counters(client))
    values["entries"], values["bytes"] = store.usage()
    values["kernel_hit_rate"] = _rate(values["kernel_hits"], values["kernel_misses"])
    values["fx_hit_rate"] = _rate(values["fx_hits"], values["fx_misses"])
    # Most frequent first: the first one is what to fix (``compileq doctor`` names it).
    reasons = read_fallback_reasons(client)
    values["fallback_reasons"] = dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))

    workers = liveness.live_workers(client)
    queues: dict[str, dict[str, Any]] = {}
    for queue, counts in sorted(read_queue_counters(client).items()):
        queues[queue] = {
            **counts,
            "kernel_hit_rate": _rate(counts["kernel_hits"], counts["kernel_misses"]),
            "workers": [],
        }
    for info in workers:
        for queue in info.get("queues") or []:
            row = queues.setdefault(str(queue), {"kernel_hit_rate": None, "workers": []})
            row["workers"].append(_worker_row(info, str(queue)))
    values["queues"] = queues
    values["slowest"] = {kind: meta.slowest(client, kind, TOP) for kind in meta.slow_kinds(client)}
    values["workers"] = len(workers)
    return values


def _worker_row(info: dict[str, Any], queue: str) -> dict[str, Any]:
    target = queue.rsplit(".", 1)[-1]
    toolchain = (info.get("toolchains") or {}).get(target) or {}
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
    }


def _shown(name: str, value: Any) -> str:
    if value is None:
        return "-"
    if name.endswith("hit_rate"):
        return f"{value:.1%}"
    if name == "bytes":
        return f"{value} ({value / 2**20:.1f} MiB)"
    return str(value)


def render(values: dict[str, Any]) -> str:
    flat = {k: v for k, v in values.items() if not isinstance(v, dict)}
    width = max(len(k) for k in flat)
    lines = ["compileq cluster statistics"]
    lines += [f"  {name:<{width}}  {_shown(name, value)}" for name, value in flat.items()]
    if values.get("fallback_reasons"):
        lines.append("fallbacks by reason")
        lines += [f"  {n:>6}  {reason}" for reason, n in values["fallback_reasons"].items()]
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
            tc = w["toolchain"]
            device = "cpu-only" if w["cpu_only"] else f"gpu {w['gpu']}"
            lines.append(
                f"  worker {w['id']} on {w['host']} ({device}, x{w['concurrency']}): "
                f"torch {tc['torch_version']}, triton {tc['triton_version']}, "
                f"{tc['assembler']}"
                + (f", env {tc['codegen_env']}" if tc.get("codegen_env") else "")
            )
    for kind, rows in values.get("slowest", {}).items():
        if rows:
            lines.append(f"slowest {kind} builds")
            lines += [f"  {r['seconds']:8.2f}s  {r['name']}  ({r['by']}, {r['key']})" for r in rows]
    return "\n".join(lines)
