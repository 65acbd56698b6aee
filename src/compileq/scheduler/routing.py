"""Which queue a kernel goes to, and whether anyone is listening there."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from compileq._log import warn_once
from compileq.cache import liveness
from compileq.cache.counters import Counter
from compileq.config import Settings
from compileq.fingerprint import FxToolchain, Target, Toolchain, differences, local_toolchain
from compileq.tasks.queues import triton_queue

#: How long a liveness answer is trusted. Asking per kernel would add a round trip to every
#: miss; a worker that dies inside this window is covered by the deadline.
_LIVENESS_CACHE_S = 2.0


class Router:
    def __init__(
        self,
        client: redis.Redis,
        settings: Settings,
        count: Callable[[dict[Counter, int]], None] = lambda _: None,
    ) -> None:
        """``count``: where rejected worker records are counted (the store's telemetry)."""
        self._client = client
        self._ttl = settings.heartbeat_ttl_s
        self._toolchains: dict[Target, Toolchain] = {}
        # No secret (doctor may run without one): then no heartbeat verifies, no worker is live.
        self._secret = settings.secret.get_secret_value().encode() if settings.secret else b""
        self._live: dict[str, tuple[float, bool]] = {}
        self._verified_at = -float("inf")
        self._rejected: set[str] = set()  # records already counted, so a ghost counts once
        self._lock = threading.Lock()
        self._count = count

    def toolchain(self, target: Target) -> Toolchain:
        with self._lock:
            if target not in self._toolchains:
                self._toolchains[target] = local_toolchain(target)
            return self._toolchains[target]

    def queue(self, target: Target) -> str:
        return triton_queue(self.toolchain(target), target)

    def why_unserved(self, target: Target) -> str:
        """Which part of this machine's toolchain no live worker for ``target`` shares.

        A miss of routing is the cluster-level "it recompiled and I don't know why": naming
        the differing component (a version, the assembler, a TRITON_* variable) makes it
        actionable without a debugger.
        """
        return self._why(str(target), self.toolchain(target).describe(), "toolchains")

    def why_unserved_fx(self, target: str, toolchain: FxToolchain) -> str:
        """The same for an FX queue: what no live worker generating for ``target`` shares."""
        return self._why(target, toolchain.describe(), "fx_toolchains")

    def _why(self, target: str, mine: dict[str, Any], field: str) -> str:
        seen = []
        infos = liveness.workers_info(self._client)
        for info in infos:
            served = info.get(field)
            theirs = served.get(target) if isinstance(served, dict) else None
            if not isinstance(theirs, dict):
                continue
            diffs = [
                f"{name} (worker {theirs.get(name)!r}, here {mine.get(name)!r})"
                for name in differences(mine, theirs)
            ]
            # repr: a host or name read from Redis must not forge a line of the client's log.
            who = f"{info.get('host')!r}/{info.get('name')!r}"
            if diffs:
                seen.append(f"{who} differs in " + "; ".join(diffs))
            else:  # same toolchain, so not live for us: its heartbeat did not verify
                seen.append(f"{who} has this toolchain but its heartbeat does not verify")
        if not seen:
            # Say what the live workers do serve: for FX, a target that differs only in the
            # CPU's vector ISAs is the usual reason, and it shows in the target's name.
            others = sorted(
                {
                    repr(t)
                    for info in infos
                    if isinstance(info.get(field), dict)
                    for t in info[field]
                }
            )
            served_here = f"; live workers build for {', '.join(others[:5])}" if others else ""
            return f"no live worker builds for {target}{served_here}"
        return " | ".join(seen[:3])

    def has_worker(self, queue: str, fresh: bool = False) -> bool:
        """Whether a worker whose heartbeat verifies (see cache/liveness.py) serves ``queue``;
        ``fresh``: asked of Redis now, not answered from the last few seconds' census."""
        now = time.monotonic()
        cached = self._live.get(queue)
        if cached and now - cached[0] < _LIVENESS_CACHE_S and not fresh:
            return cached[1]
        live = self.live_count(queue) > 0
        self._live[queue] = (now, live)
        return live

    def live_count(self, queue: str, listed_in: str = "queues") -> int:
        """How many workers whose heartbeat verifies serve ``queue`` (asked of Redis now);
        ``listed_in``: the field of their records naming it (``pending_fx``: about to join)."""
        found = liveness.census(self._client, queue, self._ttl, self._secret, listed_in)
        fresh = [r for r in found.rejected if r not in self._rejected]
        if found.foreign:
            warn_once(
                f"foreign-heartbeat:{queue}",
                "compileq: %d workers of queue %s do not sign their heartbeats with this "
                "COMPILEQ_SECRET (started with another secret, or forged; ids %s): not "
                "sending them builds, which they would refuse",
                len(found.foreign),
                queue,
                ", ".join(repr(r) for r in found.foreign[:3]),
            )
        if fresh:
            self._rejected.update(fresh)
            warn_once(
                "bad-heartbeat",
                "compileq: ignoring %d worker records in Redis that are unsigned, stale or "
                "malformed (ids %s)",
                len(fresh),
                ", ".join(repr(r) for r in fresh[:3]),
            )
            self._count({Counter.REJECTED_RECORDS: len(fresh)})
        if found.live:
            self._verified_at = time.monotonic()
        return len(found.live)

    def shares_secret(self) -> bool:
        """Whether a live worker proved this process's secret lately: the cluster agrees with
        us, so an entry sealed with another secret is stale (a rotation), not the truth.
        Asked of the registry when no census proved it lately: a vector-ISA probe's verdict
        is stored before any queue's census runs."""
        if time.monotonic() - self._verified_at < 4 * self._ttl:
            return True
        if self._secret and liveness.any_verified(self._client, self._ttl, self._secret):
            self._verified_at = time.monotonic()
            return True
        return False
