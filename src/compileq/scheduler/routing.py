"""Which queue a kernel goes to, and whether anyone is listening there."""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from compileq.config import Settings
from compileq.fingerprint import FxToolchain, Target, Toolchain, differences, local_toolchain
from compileq.tasks import liveness
from compileq.tasks.queues import triton_queue

#: How long a liveness answer is trusted. Asking per kernel would add a round trip to every
#: miss; a worker that dies inside this window is covered by the deadline.
_LIVENESS_CACHE_S = 2.0


class Router:
    def __init__(self, client: redis.Redis, settings: Settings) -> None:
        self._client = client
        self._ttl = settings.heartbeat_ttl_s
        self._toolchains: dict[Target, Toolchain] = {}
        self._live: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

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
            theirs = info.get(field, {}).get(target)
            if not isinstance(theirs, dict):
                continue
            diffs = [
                f"{name} (worker {theirs.get(name)!r}, here {mine.get(name)!r})"
                for name in differences(mine, theirs)
            ]
            seen.append(f"{info.get('host')}/{info.get('name')} differs in " + "; ".join(diffs))
        if not seen:
            # Say what the live workers do serve: for FX, a target that differs only in the
            # CPU's vector ISAs is the usual reason, and it shows in the target's name.
            others = sorted({t for info in infos for t in info.get(field, {})})
            served = f"; live workers build for {', '.join(others[:5])}" if others else ""
            return f"no live worker builds for {target}{served}"
        return " | ".join(seen[:3])

    def has_worker(self, queue: str) -> bool:
        now = time.monotonic()
        cached = self._live.get(queue)
        if cached and now - cached[0] < _LIVENESS_CACHE_S:
            return cached[1]
        live = liveness.live_count(self._client, queue, self._ttl) > 0
        self._live[queue] = (now, live)
        return live
