"""Capacity figures for docs/DEPLOY.md: Redis memory per graph and kernel, and the Redis load of
one rank starting on a new machine.

    python -m bench.capacity --small --out /tmp/cap            # CPU preset: mlp, 15 kernels
    python -m bench.capacity --out "$OUT"                       # every workload this device runs
    python -m bench.capacity --workloads gpt,convnet --rank-starts 3 --out "$OUT"

Like ``python -m bench`` it starts a private redis-server and one ``compileq worker``
(``--gpus 0`` with a GPU, else ``--cpu-only --arch sm_90``). Per workload, on a cold cluster:

1. one fresh process runs it through ``compileq run`` with empty local caches (a kernel manifest
   runs through ``compileq warm`` instead: Triton kernels, cross-compiled on a CPU machine);
2. memory: ``compileq stats --json``, ``INFO memory`` before and after, and every key SCANned
   (an offline tool may scan; compileq itself never does on a client's path), classified by
   kind (``classify``) and sized with ``MEMORY USAGE``;
3. the hit path: ``--rank-starts`` more fresh processes with empty local caches (a new
   machine, everything already in Redis), each bracketed by ``INFO`` snapshots of the private
   server: commands (``commandstats``; commands a Lua script calls count too, as they cost
   Redis the same), round trips (``total_reads_processed``: one socket read per request,
   pipeline or script call, plus a couple per connection opened), bytes read by the rank (``total_net_output_bytes``) and written, connections
   opened, and the most connections the rank held at once (from /proc/net/tcp). The worker
   is then a quiet one (a heartbeat every 5 minutes; a window a beat falls into is run again),
   whose blocking pops on the broker are subtracted one by one. The idle load of a worker at
   the default heartbeat is measured first, apart.

(``bench.hit_path`` times one hit; this counts what a whole rank start costs Redis.) Then
projects the hit path onto ``--nodes`` x ``--ranks-per-node`` rank starts at once, under stated
assumptions (``--redis-ops``, ``--nic-gbps``). Writes ``capacity.json``, ``capacity.md`` and
``workers.log`` to ``--out`` (default ``$OUT``, else ``bench-out/capacity``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from bench.harness import COMPILEQ, ROOT, CacheDirs, Cluster, new_workdir, run_once
from bench.scenarios import _warm as warm_manifest
from compileq import keys
from compileq.cache.store import batched

T = TypeVar("T")

#: What every key that is not a classified kind reads as; the test asserts none does.
UNCLASSIFIED = "unclassified"

#: Artifact kinds (``compileq:a:<kind>:``) and the unit each is counted per.
UNITS = {
    "fx": "graph",
    "aot": "graph",
    "autotune": "graph",
    "fxcode": "graph",
    "triton": "Triton kernel",
    "tune": "Triton kernel",
    "tunetable": "graph",
    "cpp": "C++ kernel",
}
#: The artifact kind that counts a unit: one FX-graph entry per distinct graph.
UNIT_COUNTED_BY = {"graph": "fx", "Triton kernel": "triton", "C++ kernel": "cpp"}

LABELS = {
    "fx": "FX graph (Inductor's FX-graph cache)",
    "aot": "AOTAutograd",
    "autotune": "autotune results",
    "fxcode": "FX codegen a worker did",
    "fxfail": "FX codegen failure verdict",
    "triton": "Triton kernel",
    "tune": "max-autotune candidate timing",
    "tunetable": "max-autotune GEMM table (every choice's time)",
    "cpp": "C++ kernel (.so)",
    "isa": "vector-ISA probe verdict",
    "job": "job spec",
    "meta": "metadata record",
    "lock": "lease",
    "building": "a worker's mark on a job it builds",
    "siblings": "kernel index by source",
    "misses": "miss log",
    "slow": "slowest builds",
    "counters": "counters",
    "liveness": "worker liveness",
    "broker": "broker (kombu queues)",
    "doctor": "doctor's probes and records",
    "verdicts": "index of FX codegen failure verdicts",
    UNCLASSIFIED: "not compileq's",
}

# Records about one artifact, whose key embeds the artifact's: attributed to its kind.
_PER_ARTIFACT = (
    (keys.JOB, "job"),
    (keys.META, "meta"),
    (keys.LOCK, "lock"),
    # Spelt out: this runs against a keys.py from before marks too.
    (f"{keys.PREFIX}:building:", "building"),
)
# Everything else compileq writes. First match wins, so a family whose prefix extends another
# one's (the broker's doctor records, under the broker's prefix) comes first.
_FIXED = (
    (keys.BROKER_DOCTOR, "doctor"),
    (keys.DOCTOR, "doctor"),
    # The Sentinel master ``compileq doctor`` saw last (keys.SENTINEL, keys.BROKER_SENTINEL),
    # spelt out so that this runs against a keys.py from before them too.
    (f"{keys.BROKER}sentinel:", "doctor"),
    (f"{keys.PREFIX}:sentinel:", "doctor"),
    (keys.BROKER, "broker"),
    (keys.STATS, "counters"),  # also QUEUE_STATS and FALLBACK_REASONS, which extend it
    (keys.SLOW, "slow"),
    (keys.MISSES, "misses"),
    # The index of FX codegen failure verdicts, spelt out as the Sentinel's records are.
    (f"{keys.PREFIX}:fxfailures", "verdicts"),
    (keys.WORKER_REGISTRY, "liveness"),  # also WORKERS (its per-queue sets)
    (keys.WORKER_INFO, "liveness"),
)


def _artifact_kind(key: str) -> str | None:
    if not key.startswith(keys.ARTIFACT):
        return None
    kind, sep, digest = key[len(keys.ARTIFACT) :].partition(":")
    return kind if kind and sep and digest else None


def classify(key: str) -> str:
    """The kind of a compileq key: an artifact kind (``triton``, ``fx``...), a record of one
    (``job:triton``, ``meta:fx``, ``lock:fx``, ``siblings:triton``), a fixed family
    (``counters``, ``liveness``, ``broker``...) or ``unclassified``."""
    if key.startswith(keys.ARTIFACT):
        return _artifact_kind(key) or UNCLASSIFIED
    for prefix, family in _PER_ARTIFACT:
        if key.startswith(prefix):
            kind = _artifact_kind(key[len(prefix) :])
            return f"{family}:{kind}" if kind else UNCLASSIFIED
    if key.startswith(keys.SIBLINGS):
        kind, sep, digest = key[len(keys.SIBLINGS) :].partition(":")
        return f"siblings:{kind}" if kind and sep and digest else UNCLASSIFIED
    for prefix, family in _FIXED:
        if key.startswith(prefix):
            return family
    return UNCLASSIFIED


def unit_of(kind: str) -> str | None:
    """The unit (graph, Triton kernel, C++ kernel) a kind's bytes are counted per; None for
    what does not grow with them (counters, liveness, the broker, per-machine ISA verdicts)."""
    return UNITS.get(kind.rpartition(":")[2])


def label(kind: str) -> str:
    family, _, of = kind.partition(":")
    return f"{LABELS.get(family, family)} ({of})" if of else LABELS.get(kind, kind)


def pct(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0


# -- memory ---------------------------------------------------------------------------------


@dataclass
class KindMemory:
    """The keys of one kind: how many, ``MEMORY USAGE`` summed, and each value's size
    (STRLEN for a string, else its MEMORY USAGE)."""

    keys: int = 0
    memory_bytes: int = 0
    sizes: list[int] = field(default_factory=list)

    def add(self, memory: int, size: int) -> None:
        self.keys += 1
        self.memory_bytes += memory
        self.sizes.append(size)

    def merge(self, other: KindMemory) -> None:
        self.keys += other.keys
        self.memory_bytes += other.memory_bytes
        self.sizes += other.sizes

    def as_dict(self) -> dict[str, Any]:
        return {
            "keys": self.keys,
            "memory_bytes": self.memory_bytes,
            "value_bytes_total": sum(self.sizes),
            "value_bytes_p50": int(statistics.median(self.sizes)) if self.sizes else 0,
            "value_bytes_p95": pct(self.sizes, 0.95),
            "value_bytes_max": max(self.sizes, default=0),
        }


def scan_memory(client: redis.Redis) -> dict[str, KindMemory]:
    """Every key of the database by kind. SCAN, then one pipeline per 1,000 keys: an offline
    measurement (it walks the whole keyspace), never something compileq's own paths do."""
    kinds: dict[str, KindMemory] = {}
    for batch in batched(client.scan_iter(count=1000), 1000):
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.type(key)
            pipe.memory_usage(key, samples=0)  # every element, not a sample, of a collection
            pipe.strlen(key)  # WRONGTYPE on a collection: left as an error below
        replies = pipe.execute(raise_on_error=False)
        for i, key in enumerate(batch):
            kind_of_value, memory, length = replies[3 * i : 3 * i + 3]
            if memory is None or isinstance(memory, Exception):
                continue  # expired or deleted between SCAN and now
            string = kind_of_value in (b"string", "string")
            size = int(length) if string and isinstance(length, int) else int(memory)
            kinds.setdefault(classify(key.decode(errors="replace")), KindMemory()).add(
                int(memory), size
            )
    return kinds


def per_thousand(kinds: dict[str, KindMemory]) -> dict[str, dict[str, Any]]:
    """Bytes per 1,000 of each unit: every kind counted per that unit (its artifacts and the
    job specs, metadata, leases and indexes about them), over the number of unit artifacts."""
    out: dict[str, dict[str, Any]] = {}
    for unit, counted_by in UNIT_COUNTED_BY.items():
        n = kinds[counted_by].keys if counted_by in kinds else 0
        memory = sum(k.memory_bytes for kind, k in kinds.items() if unit_of(kind) == unit)
        values = sum(sum(k.sizes) for kind, k in kinds.items() if unit_of(kind) == unit)
        out[unit] = {
            "count": n,
            "memory_bytes": memory,
            "memory_bytes_per_1000": round(memory * 1000 / n) if n else None,
            "value_bytes_per_1000": round(values * 1000 / n) if n else None,
        }
    return out


# -- the hit path ---------------------------------------------------------------------------

#: INFO fields a window's figures come from (all counters since the server started).
_STATS = {
    "commands": "total_commands_processed",
    "round_trips": "total_reads_processed",
    "bytes_read": "total_net_output_bytes",  # what Redis sent: what clients read
    "bytes_written": "total_net_input_bytes",
    "connections": "total_connections_received",
}


@dataclass
class Snapshot:
    at: float
    figures: dict[str, int]
    calls: dict[str, int]

    @classmethod
    def take(cls, client: redis.Redis) -> Snapshot:
        # One INFO (one command, one read): its own cost is the calibration subtracted below.
        info = client.info("stats", "commandstats")
        calls = {
            k[len("cmdstat_") :]: int(v["calls"])
            for k, v in info.items()
            if k.startswith("cmdstat_") and isinstance(v, dict)
        }
        return cls(time.monotonic(), {k: int(info[f]) for k, f in _STATS.items()}, calls)

    def minus(self, before: Snapshot) -> Window:
        names = set(self.calls) | set(before.calls)
        return Window(
            self.at - before.at,
            {k: v - before.figures[k] for k, v in self.figures.items()},
            {n: self.calls.get(n, 0) - before.calls.get(n, 0) for n in names},
        )


@dataclass
class Window:
    """Counter deltas over ``seconds``."""

    seconds: float
    figures: dict[str, float]
    calls: dict[str, float]

    def less(self, other: Window, scale: float = 1.0) -> Window:
        names = set(self.calls) | set(other.calls)
        return Window(
            self.seconds,
            {k: v - scale * other.figures.get(k, 0) for k, v in self.figures.items()},
            {n: self.calls.get(n, 0) - scale * other.calls.get(n, 0) for n in names},
        )

    def scaled(self, factor: float) -> Window:
        return Window(
            self.seconds * factor,
            {k: v * factor for k, v in self.figures.items()},
            {n: v * factor for n, v in self.calls.items()},
        )

    def per_second(self) -> Window:
        s = max(self.seconds, 1e-9)
        return Window(
            1.0,
            {k: v / s for k, v in self.figures.items()},
            {n: v / s for n, v in self.calls.items()},
        )


def _median_window(windows: list[Window]) -> Window:
    names = set().union(*(w.calls for w in windows))
    return Window(
        statistics.median(w.seconds for w in windows),
        {k: statistics.median(w.figures[k] for w in windows) for k in windows[0].figures},
        {n: statistics.median(w.calls.get(n, 0) for w in windows) for n in names},
    )


#: The one thing a quiet worker (see ``_Cluster``) sends while a rank starts: the broker's
#: blocking pop, which times out and is sent again every second. A rank never pops a queue.
_WORKER_POP = "brpop"
#: A heartbeat writes its sorted sets; a rank that only hits never does (ZADD is a build's).
_HEARTBEAT_MARK = "zadd"


def measuring_overhead(client: redis.Redis) -> Window:
    """What a window's two INFO snapshots add to it: one command and one read, and the
    reply's bytes (the median of five back-to-back pairs)."""
    pairs = []
    for _ in range(5):
        first = Snapshot.take(client)
        pairs.append(Snapshot.take(client).minus(first))
    return _median_window(pairs)


@dataclass
class Baseline:
    """What a window holds that is not the rank's: the measuring itself (a back-to-back
    snapshot pair) and, per blocking pop, what the quiet worker's pops cost."""

    overhead: Window
    per_pop: Window

    @classmethod
    def measure(cls, client: redis.Redis, quiet_s: float) -> Baseline:
        overhead = measuring_overhead(client)
        for _ in range(3):  # a heartbeat in the window spoils it: measure again
            first = Snapshot.take(client)
            time.sleep(quiet_s)
            quiet = Snapshot.take(client).minus(first).less(overhead)
            if quiet.calls.get(_HEARTBEAT_MARK, 0) == 0:
                break
        pops = quiet.calls.get(_WORKER_POP, 0)
        return cls(overhead, quiet.scaled(1 / pops if pops else 0.0))

    def net(self, raw: Window) -> Window:
        return raw.less(self.overhead).less(self.per_pop, scale=raw.calls.get(_WORKER_POP, 0))


def idle_load(client: redis.Redis, seconds: float) -> Window:
    """Commands, round trips and bytes per second of a cluster with one idle worker at the
    default heartbeat: what every worker adds to Redis whether or not anyone compiles."""
    overhead = measuring_overhead(client)
    first = Snapshot.take(client)
    time.sleep(seconds)
    return Snapshot.take(client).minus(first).less(overhead).per_second()


def established_to(port: int) -> int | None:
    """TCP connections on this host open to ``port`` (/proc/net/tcp; None off Linux)."""
    n = 0
    found = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        found = True
        for line in lines:
            parts = line.split()
            # rem_address is HEX_IP:HEX_PORT; state 01 is ESTABLISHED.
            if len(parts) > 3 and parts[3] == "01" and int(parts[2].rsplit(":", 1)[1], 16) == port:
                n += 1
    return n if found else None


class PeakConnections:
    """The most connections to Redis open at once while a rank runs, less those open before
    (the worker's): what one rank holds. Sampled from /proc, so it adds no Redis traffic."""

    def __init__(self, port: int, every_s: float = 0.05) -> None:
        self._port, self._every = port, every_s
        self._base = established_to(port)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            now = established_to(self._port)
            if now is not None and self._base is not None:
                self.peak = max(self.peak, now - self._base)

    def __enter__(self) -> PeakConnections:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def known(self) -> bool:
        return self._base is not None


def measure_rank_start(
    client: redis.Redis,
    port: int | None,
    baseline: Baseline,
    start: Callable[[], T],
    counters: Callable[[], dict[str, Any]],
    attempts: int = 3,
) -> tuple[T, dict[str, Any]]:
    """Run ``start`` (a rank start, in a fresh process) between two INFO snapshots; its Redis
    figures less the measuring's and the quiet worker's pops, and the counters it moved (read
    outside the window, so they are not in its figures). A window a heartbeat fell into is
    run again: its figures would be the rank's plus a beat's."""
    tries = 0
    while True:
        tries += 1
        counts_before = counters()
        before = Snapshot.take(client)
        peak = PeakConnections(port) if port is not None else None
        if peak is not None:
            with peak:
                result = start()
        else:
            result = start()
        raw = Snapshot.take(client).minus(before)
        counts_after = counters()
        if raw.calls.get(_HEARTBEAT_MARK, 0) == 0 or tries == attempts:
            break
    net = baseline.net(raw)
    net.calls.pop(_WORKER_POP, None)
    calls = {n: round(v) for n, v in sorted(net.calls.items(), key=lambda kv: -kv[1])}
    figures: dict[str, Any] = {k: max(0, round(v)) for k, v in net.figures.items()}
    figures.update(
        seconds=round(raw.seconds, 3),
        commands_by_name={n: v for n, v in calls.items() if v > 0},
        peak_connections=peak.peak if peak is not None and peak.known else None,
        raw={k: int(v) for k, v in raw.figures.items()},
        worker_pops=int(raw.calls.get(_WORKER_POP, 0)),
        attempts=tries,
        counters={
            k: int(counts_after[k]) - int(counts_before.get(k, 0))
            for k in counts_after
            if counts_after[k] != counts_before.get(k)
        },
    )
    return result, figures


def median_rank_start(starts: list[dict[str, Any]]) -> dict[str, Any]:
    keys_ = ("commands", "round_trips", "bytes_read", "bytes_written", "connections", "seconds")
    out: dict[str, Any] = {k: statistics.median(s[k] for s in starts) for k in keys_}
    peaks = [s["peak_connections"] for s in starts if s["peak_connections"] is not None]
    out["peak_connections"] = max(peaks) if peaks else None
    names = set().union(*(s["commands_by_name"] for s in starts))
    by_name = {n: statistics.median(s["commands_by_name"].get(n, 0) for s in starts) for n in names}
    out["commands_by_name"] = dict(sorted(by_name.items(), key=lambda kv: -kv[1]))
    return out


def project(
    rank: dict[str, Any], nodes: int, ranks_per_node: int, ops_per_s: float, nic_gbps: list[float]
) -> dict[str, Any]:
    """``nodes`` x ``ranks_per_node`` rank starts at once against one Redis, from one rank's
    median figures: arithmetic, not a run of that many clients. The rates are assumptions
    given on the command line, not measurements."""
    n = nodes * ranks_per_node
    commands, trips, read = (rank[k] * n for k in ("commands", "round_trips", "bytes_read"))
    # Every connection a rank opens stays in its client's pool until the process exits, so
    # the connections it opened, not the fewer the /proc sampler caught at once, are what
    # 8,000 ranks hold together once they have started.
    held = max(rank["connections"], rank.get("peak_connections") or 0)
    return {
        "rank_starts": n,
        "commands": commands,
        "round_trips": trips,
        "bytes_read": read,
        "assumed_ops_per_s": ops_per_s,
        "seconds_at_ops_rate": commands / ops_per_s,
        "seconds_at_nic": {str(g): read * 8 / (g * 1e9) for g in nic_gbps},
        "connections_at_once": held * n,
    }


# -- the run --------------------------------------------------------------------------------


class _Cluster(Cluster):
    """The harness's cluster, its worker beating at ``heartbeat_s`` (None: compileq's default,
    5 s) rather than the harness's 1 s. The rank starts are measured with a quiet worker,
    beating every 5 minutes, so that no heartbeat lands in their windows (one that does is run
    again); clients are told the same, so they still find that worker live."""

    heartbeat_s: float | None = None

    def env(self) -> dict[str, str]:
        env = super().env()
        env.pop("COMPILEQ_HEARTBEAT_INTERVAL_S", None)
        if self.heartbeat_s is not None:
            env["COMPILEQ_HEARTBEAT_INTERVAL_S"] = str(self.heartbeat_s)
            env["COMPILEQ_HEARTBEAT_TTL_S"] = str(3 * self.heartbeat_s)
        return env


#: The quiet worker's heartbeat interval while ranks are measured, and how long it is watched
#: to learn what one of its blocking pops costs (they come once a second).
QUIET_HEARTBEAT_S = 300.0
QUIET_S = 3.0


def _model_run(cluster: Cluster, dirs: CacheDirs, workload: str, log: Path) -> dict[str, Any]:
    """A rank: one fresh process running ``workload``'s first steps under ``compileq run``."""
    return run_once(cluster, dirs, COMPILEQ, dirs.fresh(), workload, log).result


def _stats_json(env: dict[str, str]) -> dict[str, Any]:
    """``compileq stats --json``, as an operator runs it."""
    proc = subprocess.run(
        [sys.executable, "-m", "compileq.cli", "stats", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compileq stats failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _kib(n: float | None) -> str:
    if n is None:
        return "-"
    if n >= 2**20:
        return f"{n / 2**20:.2f} MiB"
    return f"{n / 2**10:.1f} KiB"


def render(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [
        f"Device: {meta['device']}, {meta['cores']} cores; torch {meta['torch']}, triton "
        f"{meta['triton']}, redis-server {meta['redis']}; {meta['date']}; command: "
        f"`{meta['command']}`",
        "",
        "**Redis memory by kind** (all workloads, each on a cold cluster; value = STRLEN of a "
        "string, MEMORY USAGE of anything else)",
        "",
        "| kind | per | keys | MEMORY USAGE | value p50 | value p95 | value max |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind, m in sorted(results["memory"].items(), key=lambda kv: -kv[1]["memory_bytes"]):
        lines.append(
            f"| {label(kind)} | {unit_of(kind) or '-'} | {m['keys']} | {_kib(m['memory_bytes'])} "
            f"| {_kib(m['value_bytes_p50'])} | {_kib(m['value_bytes_p95'])} "
            f"| {_kib(m['value_bytes_max'])} |"
        )
    lines += [
        "",
        "**Per 1,000** (the unit's artifacts plus the job specs, metadata and indexes about them)",
        "",
        "| unit | measured | MEMORY USAGE per 1,000 | values per 1,000 |",
        "|---|---|---|---|",
    ]
    for unit, p in results["per_1000"].items():
        lines.append(
            f"| {unit} | {p['count']} | {_kib(p['memory_bytes_per_1000'])} "
            f"| {_kib(p['value_bytes_per_1000'])} |"
        )
    lines += [
        "",
        "**Per workload** (cold cluster; used_memory = INFO memory after - before)",
        "",
        "| workload | graphs | Triton kernels | C++ kernels | keys | MEMORY USAGE | used_memory "
        "| stats entries / bytes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w in results["workloads"]:
        mem, stats = w["memory"], w["stats"]
        n = {u: mem.get(k, {}).get("keys", 0) for u, k in UNIT_COUNTED_BY.items()}
        lines.append(
            f"| {w['name']} | {n['graph']} | {n['Triton kernel']} | {n['C++ kernel']} "
            f"| {sum(m['keys'] for m in mem.values())} "
            f"| {_kib(sum(m['memory_bytes'] for m in mem.values()))} "
            f"| {_kib(w['used_memory']['delta'])} | {stats['entries']} / {_kib(stats['bytes'])} |"
        )
    nodes, per_node = results["scale"]["nodes"], results["scale"]["ranks_per_node"]
    lines += [
        "",
        "**One rank start on a new machine** (empty local caches, everything in Redis; median of "
        f"{results['rank_starts']}; the quiet worker's pops subtracted; a kernels: row is "
        "`compileq warm` of its manifest)",
        "",
        "| workload | commands | round trips | bytes read | bytes written | connections opened "
        "| held at once (sampled) | misses | top commands |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for w in results["workloads"]:
        r = w["rank_start"]
        misses = sum(
            v for s in w["rank_starts"] for k, v in s["counters"].items() if k.endswith("misses")
        )
        top = ", ".join(f"{n} {v:g}" for n, v in list(r["commands_by_name"].items())[:5])
        lines.append(
            f"| {w['name']} | {r['commands']:g} | {r['round_trips']:g} | {_kib(r['bytes_read'])} "
            f"| {_kib(r['bytes_written'])} | {r['connections']:g} "
            f"| {r['peak_connections'] if r['peak_connections'] is not None else '-'} "
            f"| {misses} | {top} |"
        )
    idle = results["idle_per_s"]
    lines += [
        "",
        f"Idle load of one worker (heartbeat every 5 s): {idle['commands']:.1f} commands/s, "
        f"{idle['round_trips']:.1f} round trips/s, {idle['bytes_read']:.0f} bytes/s read.",
        "",
        f"**{nodes:,} nodes x {per_node} ranks starting at once** against one Redis: the "
        "medians above times the ranks, not a run of that many clients (assumed, not measured: "
        f"{results['scale']['ops_per_s']:,.0f} simple "
        f"commands/s per Redis core; NIC {', '.join(f'{g:g}' for g in results['scale']['nic_gbps'])}"
        " Gb/s)",
        "",
        "| workload | commands | round trips | bytes read | s at the op rate | s at the NIC "
        "| connections held |",
        "|---|---|---|---|---|---|---|",
    ]
    for w in results["workloads"]:
        p = w["projection"]
        nic = " / ".join(f"{s:.1f}" for s in p["seconds_at_nic"].values())
        lines.append(
            f"| {w['name']} | {p['commands']:,.0f} | {p['round_trips']:,.0f} "
            f"| {p['bytes_read'] / 1e9:.2f} GB | {p['seconds_at_ops_rate']:.1f} | {nic} "
            f"| {p['connections_at_once']:,.0f} |"
        )
    return "\n".join(lines) + "\n"


def _meta(gpu: bool, argv: list[str], client: redis.Redis) -> dict[str, Any]:
    from bench.__main__ import _meta as bench_meta

    meta = bench_meta(gpu, argv)
    meta["command"] = " ".join(["python -m bench.capacity", *argv])
    meta["redis"] = client.info("server")["redis_version"]
    return meta


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__)
    parser.add_argument(
        "--workloads", default=None, help="default: gpt,convnet,mlp (--small: mlp); 'none'"
    )
    parser.add_argument(
        "--manifests",
        default=None,
        help="Triton kernel manifests run through `compileq warm`, comma-separated; default on "
        "CPU bench/data/autotune_mlp.jsonl (--small: tests/fixtures/dynamic_mlp.jsonl), "
        "none with a GPU (its workloads build Triton kernels themselves); 'none' for none",
    )
    parser.add_argument("--small", action="store_true", help="the CPU preset: quick, smaller")
    parser.add_argument("--rank-starts", type=int, default=None, help="default 3 (--small: 1)")
    parser.add_argument(
        "--idle-s", type=float, default=None, help="idle-load window; default 20 s (--small: 10)"
    )
    parser.add_argument("--concurrency", type=int, default=None, help="worker processes")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ranks-per-node", type=int, default=8)
    parser.add_argument(
        "--redis-ops", type=float, default=100_000, help="assumed commands/s of one Redis core"
    )
    parser.add_argument("--nic-gbps", default="10,25", help="assumed NIC speeds, Gb/s")
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench-out/capacity")
    args = parser.parse_args(argv)

    import torch

    from bench.workloads import WORKLOADS

    gpu = torch.cuda.is_available()
    chosen = args.workloads or ("mlp" if args.small else ",".join(WORKLOADS))
    workloads = [w for w in chosen.split(",") if w and w != "none"]
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
    default_manifest = (
        ""
        if gpu
        else ("tests/fixtures/dynamic_mlp.jsonl" if args.small else "bench/data/autotune_mlp.jsonl")
    )
    manifests = [
        ROOT / m for m in (args.manifests or default_manifest).split(",") if m and m != "none"
    ]
    if not workloads and not manifests:
        parser.error("nothing to measure: no workload and no manifest")
    rank_starts = args.rank_starts or (1 if args.small else 3)
    idle_s = args.idle_s or (10.0 if args.small else 20.0)
    nic = [float(g) for g in args.nic_gbps.split(",") if g]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.log"

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = new_workdir()
    cluster = _Cluster(workdir, gpu)
    cluster.start()
    dirs = CacheDirs(workdir / "machines")
    client = cluster.client()
    port = None if cluster.redis is None else cluster.redis.port
    results: dict[str, Any] = {
        "meta": _meta(gpu, argv, client),
        "rank_starts": rank_starts,
        "scale": {
            "nodes": args.nodes,
            "ranks_per_node": args.ranks_per_node,
            "ops_per_s": args.redis_ops,
            "nic_gbps": nic,
        },
        "workloads": [],
    }

    def save() -> None:
        (out / "capacity.json").write_text(json.dumps(results, indent=1))

    pooled: dict[str, KindMemory] = {}
    try:
        concurrency = args.concurrency or min(16, os.cpu_count() or 1)
        cluster.start_worker(concurrency)
        print("capacity: idle load", flush=True)
        idle = idle_load(client, idle_s)
        results["idle_per_s"] = idle.figures | {
            "calls": {n: round(v, 3) for n, v in idle.calls.items() if abs(v) > 1e-3}
        }
        cluster.heartbeat_s = QUIET_HEARTBEAT_S
        cluster.start_worker(concurrency)
        jobs: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            (w, functools.partial(_model_run, cluster, dirs, w, log)) for w in workloads
        ]
        jobs += [
            (f"kernels:{m.stem}", functools.partial(warm_manifest, cluster, m, dirs))
            for m in manifests
        ]
        for name, start in jobs:
            print(f"capacity: {name} cold", flush=True)
            cluster.flush(keep_start=False)  # the store's growth is the workload's alone
            cluster.wipe_worker_caches()
            used_before = int(client.info("memory")["used_memory"])
            cold = start()
            used_after = int(client.info("memory")["used_memory"])
            stats = _stats_json(cluster.env())
            memory = scan_memory(client)
            for kind, m in memory.items():
                pooled.setdefault(kind, KindMemory()).merge(m)
            print(f"capacity: {name} rank starts", flush=True)
            baseline = Baseline.measure(client, QUIET_S)
            starts = []
            for _ in range(rank_starts):
                result, figures = measure_rank_start(client, port, baseline, start, cluster.stats)
                figures["result"] = result
                starts.append(figures)
            rank = median_rank_start(starts)
            results["workloads"].append(
                {
                    "name": name,
                    "cold": cold,
                    "stats": {k: v for k, v in stats.items() if k != "queues"},
                    "used_memory": {
                        "before": used_before,
                        "after": used_after,
                        "delta": used_after - used_before,
                    },
                    "memory": {k: m.as_dict() for k, m in sorted(memory.items())},
                    "per_1000": per_thousand(memory),
                    "rank_starts": starts,
                    "rank_start": rank,
                    "projection": project(
                        rank, args.nodes, args.ranks_per_node, args.redis_ops, nic
                    ),
                }
            )
            results["memory"] = {k: m.as_dict() for k, m in sorted(pooled.items())}
            results["per_1000"] = per_thousand(pooled)
            save()
    finally:
        cluster.close()
        save()
        # A run cut short by a time limit still leaves the table of the workloads it finished.
        if results["workloads"]:
            (out / "capacity.md").write_text(render(results))
        with (out / "workers.log").open("wb") as joined:
            for worker_log in sorted(workdir.glob("worker-*.log")):
                joined.write(f"==> {worker_log.name} <==\n".encode())
                with worker_log.open("rb") as part:
                    shutil.copyfileobj(part, joined)
    print((out / "capacity.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
