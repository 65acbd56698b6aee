"""A seeded chaos soak: training-like jobs while a driver breaks the cluster, and a report.

    python -m tests.chaos [--seed 34] [--seconds 600] [--json] [--doc docs/RELIABILITY.md]

A Sentinel set-up (primary, replica, three Sentinels; tests/test_sentinel.py's ``Cluster``)
holds cache and broker; two CPU workers serve it. Two job runners start, one after another,
fresh processes that each train a small compiled model (tests/clients/train_cpu.py, a
ConvNet of a width drawn from the seed: some widths repeat, so some jobs hit) under
``compileq run`` with fresh Inductor and Triton dirs, and compare outputs and gradients with
eager. Meanwhile a driver, from the same seed, takes the faults one at a time in a shuffled
cycle: SIGKILL a worker (restarted a few seconds later), restart the master redis-server
(SIGTERM, restarted with its AOF), fail Sentinel over (SIGKILL the master; the old one rejoins
as a replica), partition a worker (its network namespace's link down), fill Redis to
``maxmemory`` (noeviction), and plant junk (tampered and emptied entries, wrong-typed and
stray keys under compileq's prefixes).

The report: jobs, wrong results, failed jobs, waits past the deadline (a job longer than two
deadlines, one per graph of its step, plus three times its stock compile and 30 s), entries
lost per fault (stored before it, gone after it was healed, not counting the ones the junk
fault damaged on purpose) and rebuilds per fault (builds counted in the window after the fault
less the keys that were new in it). ``make chaos`` runs ten minutes and writes the figures
into docs/RELIABILITY.md ("Chaos soak"); tests/test_chaos.py runs 45 s (faults 2-5 s apart)
and asserts 0 wrong, 0 failed, 0 overdue.

Network: loopback, and with root two test network namespaces (tests/netns.py): everything runs
in the first, on its own address, and the partitioned worker in the second; without root the
partition is skipped and the report says why. This module re-runs itself inside the first
namespace (``ip netns exec``).

Why here and not bench/: it is built from the suite's real components (the Sentinel cluster,
the namespaces) and measures faults, not speed. Rejected alternative: a pytest test alone,
the long version marked slow; a ten-minute soak's report should not need pytest's capture to
be read, so one engine, two callers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from compileq import keys
from compileq.cache.counters import read_counters
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.connect import redis_client
from tests import netns
from tests.conftest import CLIENTS, CPU_ONLY, SECRET, Env, compileq_cmd
from tests.test_sentinel import MASTER, Cluster

ROOT = Path(__file__).parent.parent
TRAIN = CLIENTS / "train_cpu.py"
#: Widths of the jobs' models: few enough that many jobs find their graphs stored.
WIDTHS = (24, 32, 40, 48, 56, 64)
RUNNERS = 2
DEADLINE_S = 20.0
FAULTS = ("kill-worker", "restart-redis", "failover", "partition", "maxmemory", "junk")
#: Pause between two faults (after the previous one healed), seconds: the soak's default; the
#: suite's short run (tests/test_chaos.py) draws its faults closer (``--between``).
BETWEEN_S = (6.0, 14.0)
#: Every counter of a build (not a hit).
BUILDS = (
    "kernel_remote_compiles",
    "kernel_local_compiles",
    "fx_remote_compiles",
    "fx_local_compiles",
    "cpp_remote_compiles",
    "cpp_local_compiles",
)
FILL_PREFIX = "chaos:fill:"  # not compileq's: the filler the maxmemory fault adds


@dataclass
class JobResult:
    index: int
    width: int
    wall_s: float
    ok: bool  # exited 0 and printed its result
    matches_eager: bool
    overdue: bool
    tail: str = ""


@dataclass
class FaultResult:
    name: str
    started: float  # seconds into the soak
    held_s: float
    note: str
    lost: int = 0
    rebuilds: int = 0
    damaged: list[str] = field(default_factory=list)


@dataclass
class Report:
    seed: int
    seconds: float
    jobs: int = 0
    wrong: int = 0
    failed: int = 0
    overdue: int = 0
    stock_s: float = 0.0
    limit_s: float = 0.0
    entries_lost: int = 0
    #: Entries that do not verify at the end: of those damaged on purpose (never asked for
    #: again since, or not repaired), and of all the others.
    damaged_unsound_at_end: int = 0
    unsound_at_end: int = 0
    faults: list[FaultResult] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def per_fault(self) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for f in self.faults:
            row = out.setdefault(f.name, {"count": 0, "lost": 0, "rebuilds": 0})
            row["count"] += 1
            row["lost"] += f.lost
            row["rebuilds"] += f.rebuilds
        return out

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_fault": self.per_fault()}


@dataclass
class Partition:
    """The second namespace of a :class:`netns.Link`: where the partitioned worker runs."""

    client_ns: str
    server_ns: str
    server_if: str

    def link(self) -> netns.Link:
        return netns.Link(self.server_ns, self.client_ns, self.server_if)


class Soak:
    def __init__(
        self,
        seed: int,
        seconds: float,
        workdir: Path,
        part: Partition | None,
        between: tuple[float, float],
    ) -> None:
        #: Two streams from the seed, so that the faults' order and timing never depend on
        #: how fast the jobs ran (and the widths, drawn under the lock, on job order only).
        self.rng = random.Random(f"{seed}:faults")
        self.widths = random.Random(f"{seed}:jobs")
        self.seed = seed
        self.report = Report(seed, seconds)
        self.seconds = seconds
        self.between = between
        self.workdir = workdir
        self.part = part
        host = netns.SERVER_IP if part is not None else "127.0.0.1"
        self.cluster = Cluster(workdir / "cluster", host=host, extra=("--appendonly", "yes"))
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.seen: set[bytes] = set()
        #: Stray keys the junk fault planted under compileq's prefixes: no entry of anyone's.
        self.strays: set[bytes] = set()
        #: Entries the junk fault damaged on purpose: a reader removes them when it rejects
        #: them, perhaps faults later, which is no loss.
        self.damaged: set[bytes] = set()
        self.t0 = 0.0
        self.job_count = 0

    # -- set-up -------------------------------------------------------------------------------

    def env(self) -> Env:
        return Env(
            self.cluster.url(),
            self.workdir / "home",
            {
                "COMPILEQ_SENTINEL_MASTER": MASTER,
                "COMPILEQ_DEADLINE_S": str(DEADLINE_S),
                # A loaded two-core machine: beats a little apart, and a little slack.
                "COMPILEQ_HEARTBEAT_INTERVAL_S": "1",
                "COMPILEQ_HEARTBEAT_TTL_S": "8",
            },
        )

    def settings(self) -> Settings:
        return Settings(redis_url=self.cluster.url(), secret=SECRET, sentinel_master=MASTER)

    def admin(self) -> redis.Redis:
        return redis_client(self.cluster.url(), self.settings())

    def start_worker(self, name: str) -> None:
        """``compileq worker`` in its own session (killed as a group); the partitioned one in
        the second namespace."""
        tag = f"{name}-{time.monotonic_ns()}"
        env = self.env().vars(
            TRITON_CACHE_DIR=str(self.workdir / tag / "triton"),
            TORCHINDUCTOR_CACHE_DIR=str(self.workdir / tag / "inductor"),
        )
        argv = compileq_cmd("worker", *CPU_ONLY, "--concurrency", "1")
        if name == "partitioned" and self.part is not None:
            argv = self.part.link().client_argv(*argv)
        log = (self.workdir / f"{tag}.log").open("wb")
        self.workers[name] = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT
        )

    def kill_worker(self, name: str) -> None:
        proc = self.workers[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def live_workers(self) -> int:
        from compileq.cache import liveness

        with contextlib.suppress(redis.RedisError):
            return len(liveness.workers_info(self.admin()))
        return 0

    def start(self) -> None:
        self.cluster.start()
        names = ["steady", "partitioned" if self.part is not None else "second"]
        for name in names:
            self.start_worker(name)
        # What a job costs with compileq off, the yardstick of "a wait past the deadline";
        # measured while the workers start, as the soak's jobs run beside busy workers.
        started = time.monotonic()
        stock = self.run_job(-1, WIDTHS[0], COMPILEQ_ENABLED="0")
        self.report.stock_s = time.monotonic() - started
        if not stock.ok:
            raise RuntimeError(f"the stock job failed: {stock.tail}")
        self.report.limit_s = 2 * DEADLINE_S + 3 * self.report.stock_s + 30
        deadline = time.monotonic() + 240
        while self.live_workers() < len(names):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start")
            time.sleep(0.5)

    def close(self) -> None:
        for proc in self.workers.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        self.cluster.stop()

    # -- jobs ---------------------------------------------------------------------------------

    def run_job(self, index: int, width: int, **more: str) -> JobResult:
        tmp = self.workdir / f"job-{index}-{time.monotonic_ns()}"
        env = self.env().vars(
            TRITON_CACHE_DIR=str(tmp / "triton"),
            TORCHINDUCTOR_CACHE_DIR=str(tmp / "inductor"),
            **more,
        )
        argv = compileq_cmd("run", "--", sys.executable, str(TRAIN), str(width))
        started = time.monotonic()
        limit = self.report.limit_s or 900.0
        try:
            proc = subprocess.run(
                argv, env=env, capture_output=True, text=True, timeout=2 * limit, cwd=ROOT
            )
        except subprocess.TimeoutExpired as e:
            wall = time.monotonic() - started
            tail = (e.stderr or b"")[-2000:]
            text = tail.decode(errors="replace") if isinstance(tail, bytes) else tail
            return JobResult(index, width, wall, False, False, True, text)
        wall = time.monotonic() - started
        result: dict[str, Any] = {}
        with contextlib.suppress(ValueError, IndexError):
            result = json.loads(proc.stdout.strip().splitlines()[-1])
        ok = proc.returncode == 0 and "matches_eager" in result
        same = bool(result.get("matches_eager"))
        overdue = self.report.limit_s > 0 and wall > self.report.limit_s
        return JobResult(index, width, wall, ok, same, overdue, proc.stderr[-2000:])

    def runner(self) -> None:
        while time.monotonic() - self.t0 < self.seconds:
            with self.lock:
                index = self.job_count
                self.job_count += 1
                width = self.widths.choice(WIDTHS)
            job = self.run_job(index, width)
            with self.lock:
                r = self.report
                r.jobs += 1
                r.failed += not job.ok
                r.wrong += job.ok and not job.matches_eager
                r.overdue += job.overdue
                if not job.ok or not job.matches_eager or job.overdue:
                    r.problems.append(
                        f"job {job.index} (width {job.width}, {job.wall_s:.0f} s): "
                        f"ok={job.ok} matches={job.matches_eager} overdue={job.overdue}: "
                        f"{job.tail[-600:]}"
                    )

    # -- faults -------------------------------------------------------------------------------

    def snapshot(self) -> set[bytes]:
        for _ in range(20):
            try:
                return set(self.admin().scan_iter(match=keys.ARTIFACT + "*", count=1000))
            except redis.RedisError:
                time.sleep(0.5)
        return set()

    def builds(self) -> int:
        for _ in range(20):
            try:
                counters = read_counters(self.admin())
                return sum(counters.get(name, 0) for name in BUILDS)
            except redis.RedisError:
                time.sleep(0.5)
        return 0

    def data_ports(self) -> list[int]:
        return [p for p, proc in self.cluster.data.items() if proc.poll() is None]

    def settle(self) -> None:
        """Wait until the Sentinels agree on a master that answers (bounded)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, AssertionError):
                if self.cluster.master() is not None and self.admin().ping():
                    return
            time.sleep(0.2)

    def fault_kill_worker(self) -> str:
        name = self.rng.choice(sorted(self.workers))
        self.kill_worker(name)
        time.sleep(self.rng.uniform(2, 6))
        self.start_worker(name)
        return f"SIGKILL to worker {name!r}'s process group, restarted"

    def fault_restart_redis(self) -> str:
        port = self.cluster.master()
        if port is None:
            return "no master agreed on; nothing restarted"
        proc = self.cluster.data[port]
        proc.terminate()
        proc.wait(timeout=30)
        self.cluster.start_data(port)  # its AOF brings the data back
        self.cluster.wait_ready()
        return f"master :{port} restarted (SIGTERM, AOF)"

    def fault_failover(self) -> str:
        old = self.cluster.kill_master()
        new = self.cluster.wait_failover(old)
        self.cluster.heal()
        return f"master :{old} SIGKILLed, :{new} promoted, :{old} back as a replica"

    def fault_partition(self) -> str:
        assert self.part is not None
        held = self.rng.uniform(6, 12)
        link = self.part.link()
        link.cut()
        try:
            time.sleep(held)
        finally:
            link.heal()
        return f"the partitioned worker's link down {held:.0f} s"

    def fault_maxmemory(self) -> str:
        port = self.cluster.master()
        if port is None:
            return "no master agreed on; not filled"
        node = redis.Redis(host=self.cluster.host, port=port, socket_timeout=5)
        used = int(node.info("memory")["used_memory"])
        node.config_set("maxmemory-policy", "noeviction")
        node.config_set("maxmemory", used + 2 * 2**20)
        filled = 0
        try:
            for i in range(200):
                node.set(f"{FILL_PREFIX}{i}", os.urandom(64 * 1024))
                filled += 1
        except redis.ResponseError:
            pass  # OOM: full
        held = self.rng.uniform(5, 10)
        time.sleep(held)
        for p in self.data_ports():
            with contextlib.suppress(redis.RedisError):
                redis.Redis(host=self.cluster.host, port=p, socket_timeout=5).config_set(
                    "maxmemory", 0
                )
        with contextlib.suppress(redis.RedisError):
            fill = list(self.admin().scan_iter(match=FILL_PREFIX + "*"))
            if fill:
                self.admin().delete(*fill)
        return f"master :{port} full at {filled} x 64 KiB for {held:.0f} s"

    def fault_junk(self, damaged: list[str]) -> str:
        db = self.admin()
        stored = sorted(self.snapshot() - self.strays - self.damaged)
        # Its own stream: how many entries exist must not shift the faults' draws.
        random.Random(f"{self.seed}:junk:{len(self.damaged)}").shuffle(stored)
        strings = [k for k in stored[:20] if db.type(k) == b"string"][:4]
        tampered, emptied = strings[:3], strings[3:4]
        for key in tampered:
            db.setrange(key, 40, b"\x00chaos")
        for key in emptied:
            db.set(key, b"")
        damaged.extend(k.decode() for k in [*tampered, *emptied])
        self.damaged.update([*tampered, *emptied])
        junk = os.urandom(8).hex()
        db.hset(keys.ARTIFACT + f"junk:{junk}", "f", "v")
        self.strays.add((keys.ARTIFACT + f"junk:{junk}").encode())
        db.set(keys.JOB + junk, b"not a job")
        db.set(keys.LOCK + junk, b"x", px=5000)
        db.zadd(keys.SLOW + "fx", {"{}": 99})
        return (
            f"{len(tampered)} entries tampered, {len(emptied)} emptied, 4 stray keys of "
            "wrong types under compileq's prefixes"
        )

    def apply(self, name: str) -> FaultResult:
        at = time.monotonic() - self.t0
        damaged: list[str] = []
        before = self.snapshot()
        started = time.monotonic()
        try:
            if name == "junk":
                note = self.fault_junk(damaged)
            else:
                note = getattr(self, "fault_" + name.replace("-", "_"))()
        except Exception as e:  # a fault that could not be injected is reported, not fatal
            note = f"not injected: {type(e).__name__}: {e}"
        held = time.monotonic() - started
        self.settle()
        after = self.snapshot()
        self.seen |= before
        lost = before - after - self.damaged
        return FaultResult(name, at, held, note, len(lost), 0, damaged)

    # -- the soak -----------------------------------------------------------------------------

    def run(self) -> Report:
        self.start()
        self.t0 = time.monotonic()
        self.seen = self.snapshot()
        rebuilds = Rebuilds(self)
        runners = [threading.Thread(target=self.runner, daemon=True) for _ in range(RUNNERS)]
        driver = threading.Thread(target=self.driver_with(rebuilds), daemon=True)
        for t in [*runners, driver]:
            t.start()
        for t in runners:
            t.join()  # each ends with its job running at the end of the soak
        self.stop.set()
        driver.join()
        rebuilds.close()
        self.settle()
        self.finish()
        return self.report

    def driver_with(self, rebuilds: Rebuilds) -> Callable[[], None]:
        def run() -> None:
            names = [n for n in FAULTS if n not in self.report.skipped]
            cycle: list[str] = []
            while not self.stop.wait(self.rng.uniform(*self.between)):
                if time.monotonic() - self.t0 >= self.seconds:
                    return
                if not cycle:
                    cycle = list(names)
                    self.rng.shuffle(cycle)
                rebuilds.close()
                fault = self.apply(cycle.pop())
                with self.lock:
                    self.report.faults.append(fault)
                rebuilds.open(fault)

        return run

    def finish(self) -> None:
        r = self.report
        r.entries_lost = sum(f.lost for f in r.faults)
        db = self.admin()
        names = [k.decode() for k in self.snapshot() - self.strays]
        store = RedisStore(db, self.settings())
        for i in range(0, len(names), 200):
            batch = names[i : i + 200]
            for name, entry in zip(batch, store.get_many(batch), strict=True):
                if entry is None and name.encode() in self.damaged:
                    r.damaged_unsound_at_end += 1
                elif entry is None:
                    r.unsound_at_end += 1


class Rebuilds:
    """Builds counted in the window after a fault, less the keys that were new in it: work
    done again (an entry lost or damaged and rebuilt, or two processes building one key)."""

    def __init__(self, soak: Soak) -> None:
        self._soak = soak
        self._fault: FaultResult | None = None
        self._builds = 0
        self._keys: set[bytes] = set()

    def open(self, fault: FaultResult) -> None:
        self._fault = fault
        self._builds = self._soak.builds()
        self._keys = self._soak.snapshot()

    def close(self) -> None:
        if self._fault is None:
            return
        builds = self._soak.builds() - self._builds
        now = self._soak.snapshot()
        new = len(now - self._keys - self._soak.seen - self._soak.strays)
        self._soak.seen |= now
        self._fault.rebuilds = max(0, builds - new)
        self._fault = None


# -- entry points -------------------------------------------------------------------------------


def markdown(report: Report) -> str:
    """The "Chaos soak" section of docs/RELIABILITY.md (lists, not a table: that file's one
    table is the suite's faults, checked by tests/test_reliability_doc.py)."""
    r = report
    lines = [
        "## Chaos soak",
        "",
        "Written by `make chaos` (`python -m tests.chaos`, tests/chaos.py): a Sentinel set-up "
        "(primary, replica, three Sentinels; cache and broker on it) and two CPU workers, "
        f"while {RUNNERS} runners start training-like jobs one after another (a compiled "
        "ConvNet trained one step under `compileq run`, a fresh process with fresh Inductor "
        "and Triton dirs each, compared with eager) and a driver, from the seed, injects one "
        "fault at a time. tests/test_chaos.py runs 30 seconds of it in the suite, its faults "
        "drawn closer.",
        "",
        f"- seed {r.seed}, {r.seconds:.0f} s of jobs, deadline {DEADLINE_S:.0f} s; a job with "
        f"compileq off took {r.stock_s:.0f} s, so a job over {r.limit_s:.0f} s counts as a wait "
        "past the deadline",
        f"- jobs: {r.jobs}; wrong results: {r.wrong}; failed jobs: {r.failed}; waits past the "
        f"deadline: {r.overdue}",
        f"- faults: {len(r.faults)}; entries lost: {r.entries_lost} (stored before a fault, gone "
        "after it healed; the entries the junk fault damaged on purpose not counted); entries "
        f"that do not verify at the end: {r.unsound_at_end}, and {r.damaged_unsound_at_end} of "
        "those the junk fault damaged (not asked for again since, or not repaired)",
        "- rebuilds: builds counted in the window after a fault (until the next) less the keys "
        "new in it, i.e. work done again: a lost or damaged entry built once more, or two "
        "processes building one key at once",
    ]
    for name, row in r.per_fault().items():
        lines.append(
            f"- {name}: {row['count']}x, {row['lost']} entries lost, {row['rebuilds']} rebuilds"
        )
    for name, why in r.skipped.items():
        lines.append(f"- {name}: skipped ({why})")
    return "\n".join(lines) + "\n"


def write_doc(path: Path, report: Report) -> None:
    """Put the section in place of any earlier one, at the end of the file."""
    text = path.read_text()
    head = re.split(r"\n## Chaos soak\n", text, maxsplit=1)[0].rstrip("\n")
    path.write_text(head + "\n\n" + markdown(report))


@contextlib.contextmanager
def maybe_link() -> Iterator[tuple[netns.Link | None, str]]:
    """Two test namespaces if this process may make them; else None and why not."""
    if os.geteuid() != 0:
        yield None, "needs root for `ip netns` (network namespaces)"
        return
    try:
        with netns.link() as made:
            yield made, ""
    except (pytest.skip.Exception, pytest.fail.Exception) as e:  # tests/netns.py's verdict
        yield None, str(e.msg)


def soak(
    seed: int,
    seconds: float,
    workdir: Path,
    part: Partition | None,
    why: str,
    between: tuple[float, float],
) -> Report:
    s = Soak(seed, seconds, workdir, part, between)
    if part is None:
        s.report.skipped["partition"] = why or "no network namespaces"
    try:
        return s.run()
    finally:
        s.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    parser.add_argument("--seed", type=int, default=34)
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON line")
    parser.add_argument("--doc", type=Path, help="write the figures into this Markdown file")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument(
        "--between",
        type=_between,
        default=BETWEEN_S,
        metavar="MIN,MAX",
        help="seconds between two faults, drawn from this range (default: %(default)s)",
    )
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # CLIENT_NS,SERVER_NS,SERVER_IF
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="compileq-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.inside:
        client_ns, server_ns, server_if = args.inside.split(",")
        part = Partition(client_ns, server_ns, server_if)
        report = soak(args.seed, args.seconds, workdir, part, "", args.between)
        print(json.dumps(report.as_json()), flush=True)
        return 0
    with maybe_link() as (link, why):
        if link is None:
            report = soak(args.seed, args.seconds, workdir, None, why, args.between)
        else:
            # Everything in the server namespace: re-run this module there.
            inside = f"{link.client_ns},{link.server_ns},{link.server_if}"
            proc = subprocess.run(
                link.server_argv(
                    sys.executable,
                    "-m",
                    "tests.chaos",
                    "--seed",
                    str(args.seed),
                    "--seconds",
                    str(args.seconds),
                    "--workdir",
                    str(workdir),
                    "--between",
                    ",".join(map(str, args.between)),
                    "--inside",
                    inside,
                ),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            if proc.returncode != 0:
                print(proc.stdout[-3000:], file=sys.stderr)
                return proc.returncode
            data = json.loads(proc.stdout.strip().splitlines()[-1])
            report = from_json(data)
    if args.doc:
        write_doc(args.doc, report)
    if args.json:
        print(json.dumps(report.as_json()), flush=True)
    else:
        print(markdown(report))
    return 0


def _between(text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX in seconds, got {text!r}") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX, got {text!r}")
    return low, high


def from_json(data: dict[str, Any]) -> Report:
    data = dict(data)
    data.pop("per_fault", None)
    faults = [FaultResult(**f) for f in data.pop("faults")]
    return Report(**data, faults=faults)


if __name__ == "__main__":
    sys.exit(main())
