"""The figures ``compileq stats`` shows: counters, hit rate and what the store holds."""

from __future__ import annotations

from typing import Any

from compileq.cache.counters import read_counters
from compileq.cache.store import RedisStore


def snapshot(store: RedisStore) -> dict[str, Any]:
    values: dict[str, Any] = dict(read_counters(store.client))
    values["entries"], values["bytes"] = store.usage()
    lookups = values["kernel_hits"] + values["kernel_misses"]
    values["kernel_hit_rate"] = round(values["kernel_hits"] / lookups, 4) if lookups else None
    return values


def render(values: dict[str, Any]) -> str:
    width = max(len(k) for k in values)
    lines = ["compileq cluster statistics"]
    for name, value in values.items():
        shown = "-" if value is None else value
        if name == "kernel_hit_rate" and value is not None:
            shown = f"{value:.1%}"
        elif name == "bytes":
            shown = f"{value} ({value / 2**20:.1f} MiB)"
        lines.append(f"  {name:<{width}}  {shown}")
    return "\n".join(lines)
