"""Fresh-process runs of a workload under stock Inductor and under compileq, on one cluster.

Every measurement is a new Python process with its own local cache directories (or, for "warm
local", the directories of an earlier run), so nothing carries over in memory. Stock runs use
the same Redis as compileq for stock's own remote caches; compileq's keys live under
``compileq:`` and stock's elsewhere, so each side is flushed without touching the other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from compileq import keys
from compileq.config import Settings
from compileq.localstack import RedisServer, start_redis, start_worker, stop

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-" + "s" * 26


@dataclass
class Run:
    """What one fresh process reported, plus what the harness saw from outside."""

    mode: str
    result: dict[str, Any]
    launched_at: float
    wall_s: float  # launch to exit, process start-up included

    @property
    def first_step_s(self) -> float:
        return float(self.result["first_step_s"])

    @property
    def done_s(self) -> float:
        """Launch to the end of the first step: what a rank waits before training."""
        return float(self.result["finished_at"]) - self.launched_at


@dataclass
class Cluster:
    """A Redis and (optionally) one ``compileq worker`` with its own wipeable cache dirs."""

    workdir: Path
    gpu: bool
    redis: RedisServer | None = None
    url: str = ""
    worker: subprocess.Popen[bytes] | None = None
    worker_args: list[str] = field(default_factory=list)
    _workers_started: int = 0
    #: ``start_worker``'s arguments, for a cold start again (``wipe_worker_caches``).
    _worker_start: tuple[Any, ...] = (None, None, None, None)
    #: More ``COMPILEQ_*`` settings for every process of the cluster's runs and workers (the
    #: zoo's ``--deadline-s``).
    settings_env: dict[str, str] = field(default_factory=dict)

    @property
    def settings(self) -> Settings:
        return Settings(redis_url=self.url, secret=SECRET, heartbeat_interval_s=1)

    def start(self) -> Cluster:
        # Every run counts CPU-seconds with psutil (the bench extra): say so before the first
        # run, not as a traceback after it.
        try:
            import psutil  # noqa: F401
        except ImportError:
            raise SystemExit("the bench needs psutil: pip install -e '.[bench]'") from None
        if url := os.environ.get("BENCH_REDIS_URL"):
            self.url = url
        else:
            self.redis = start_redis(self.workdir / "redis")
            self.url = self.redis.url()
        return self

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def start_worker(
        self,
        concurrency: int | None,
        cpu_only: bool | None = None,
        gpus: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``gpus``: ``--gpus`` of a GPU worker (default 0: one GPU); ``concurrency`` None:
        the worker's own default (its cores, shared among its GPUs), as deployed; ``env``:
        more of the worker's settings (``COMPILEQ_*``)."""
        self.stop_worker()
        self._worker_start = (concurrency, cpu_only, gpus, env)
        cpu_only = (not self.gpu) if cpu_only is None else cpu_only
        args = ["--cpu-only", "--arch", "sm_90"] if cpu_only else ["--gpus", gpus or "0"]
        if concurrency is not None:
            args += ["--concurrency", str(concurrency)]
        self.worker_args = args
        self._empty_worker_dirs()
        self._workers_started += 1  # a log per start: a later worker must not overwrite one
        kind = "cpu" if cpu_only else "gpu"
        log = (
            self.workdir / f"worker-{self._workers_started:02d}-{kind}-{concurrency or 'cores'}.log"
        )
        self.worker = start_worker(
            self.settings,
            self.worker_args,
            log,
            env={**self.env(), **self.worker_dirs(), **(env or {})},
        )

    def stop_worker(self) -> None:
        if self.worker is not None:
            stop(self.worker)
            self.worker = None
            # Its heartbeat entries expire on their own; drop them now so the next worker's
            # start is not mistaken for this one's.
            client = self.client()
            for key in client.scan_iter(match=keys.WORKERS + "*"):
                client.delete(key)

    def worker_dirs(self) -> dict[str, str]:
        base = self.workdir / "worker-cache"
        return {
            "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
            "TRITON_CACHE_DIR": str(base / "triton"),
        }

    def wipe_worker_caches(self) -> None:
        """A cold cluster: the worker's local Triton/Inductor caches emptied, on disk and in
        memory, so a running worker is started again (on the same arguments).

        Emptying its dirs alone, as this did until the thirty-first session, left its pool
        processes' memory warm: a process that built a kernel keeps the kernel's module
        (Inductor's ``PyCodeCache``, keyed by the file's path, which the same kernel has again
        in the emptied dir), and Inductor's build job returns a loaded kernel's compile results
        without compiling. A "cold" run repeating a model (the zoo's second looks, the matrix's
        later configs of one workload, ``--reps``) then built few of its kernels: swin_base's
        second cold run on the H200 took 66.8 s where its first took 127.6 s.
        """
        if self.worker is not None:
            self.start_worker(*self._worker_start)  # stops it, empties its dirs, starts it
        else:
            self._empty_worker_dirs()

    def _empty_worker_dirs(self) -> None:
        for path in self.worker_dirs().values():
            shutil.rmtree(path, ignore_errors=True)
            Path(path).mkdir(parents=True, exist_ok=True)

    def flush(self, compileq: bool = True, stock: bool = True, keep_start: bool = True) -> None:
        """Empty compileq's cache and/or stock's remote cache: a cold cluster, whose workers
        have started. What their start put there is kept: liveness, and (``keep_start``) the
        verdicts of their CPU's vector-ISA probes (a CPU client would otherwise compile the
        probes again before its first graph, 4.8 s on the 2-core machine, which no started
        cluster makes it do), and Triton's C modules (``cuda_utils``, launchers: one per Triton
        version and signature, which any cluster that ran a job holds; without them a new
        machine of a cell whose cold run never loaded ``cuda_utils`` built it, ~0.6 s on an
        H100, that no warm cluster makes it build). Without ``keep_start``, only what a
        workload stores is measured."""
        client = self.client()
        started = (keys.WORKERS, keys.WORKER_INFO, keys.BROKER)
        if keep_start:
            started += (keys.artifact("isa", ""), keys.artifact("triton-so", ""))
        for key in client.scan_iter(count=1000):
            name = key.decode()
            if name.startswith(keys.PREFIX + ":"):
                keep = name == keys.WORKER_REGISTRY or name.startswith(started)
                if compileq and not keep:
                    client.delete(key)
            elif stock:
                client.delete(key)

    def stats(self) -> dict[str, Any]:
        from compileq.cache.counters import read_counters

        return dict(read_counters(self.client()))

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COMPILEQ_", "TORCHINDUCTOR_", "TRITON_CACHE_DIR"))
        }
        env.update(
            COMPILEQ_REDIS_URL=self.url,
            COMPILEQ_SECRET=SECRET,
            COMPILEQ_HEARTBEAT_INTERVAL_S="1",
            PYTHONPATH=os.pathsep.join(
                p for p in (str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.settings_env)
        return env

    def stock_remote_env(self) -> dict[str, str]:
        """Stock Inductor's own Redis remote caches on this cluster's Redis."""
        host_port = self.url.split("//", 1)[1].split("/", 1)[0]
        host, port = host_port.rsplit(":", 1)
        env = {
            "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
            "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
            "TORCHINDUCTOR_REDIS_HOST": host,
            "TORCHINDUCTOR_REDIS_PORT": port,
        }
        if self.gpu:  # without a GPU Inductor asserts a GPU backend hash for this cache
            env["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] = "1"
        return env

    def close(self) -> None:
        self.stop_worker()
        if self.redis is not None:
            stop(self.redis.process)


def process_tree(pid: int) -> list[Any]:
    """A process and all its descendants, as psutil processes (a worker and its pool);
    empty if it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system, reaped children's included) used so far by a process tree's
    living members; 0 without one."""
    import psutil

    total = 0.0
    for p in process_tree(pid) if pid is not None else []:
        try:
            times = p.cpu_times()
        except psutil.Error:  # exited meanwhile
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


class CacheDirs:
    """Named local cache directories: a new name is a new machine, a reused name a warm one."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._n = 0

    def fresh(self) -> str:
        self._n += 1
        return f"m{self._n}"

    def env(self, name: str) -> dict[str, str]:
        base = self._root / name
        return {
            "TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"),
            "TRITON_CACHE_DIR": str(base / "triton"),
        }


STOCK, STOCK_REMOTE, COMPILEQ, COMPILEQ_NO_FX = "stock", "stock-remote", "compileq", "compileq-nofx"


def command(mode: str, workload: str, edit: bool, steps: int) -> list[str]:
    step = [sys.executable, "-m", "bench.step", "--workload", workload, "--steps", str(steps)]
    if edit:
        step.append("--edit")
    if mode == COMPILEQ:
        return [sys.executable, "-m", "compileq.cli", "run", "--", *step]
    if mode == COMPILEQ_NO_FX:
        return [sys.executable, "-m", "compileq.cli", "run", "--no-fx", "--", *step]
    return step


def launch(
    cluster: Cluster,
    dirs: CacheDirs,
    mode: str,
    machine: str,
    workload: str,
    edit: bool = False,
    steps: int = 2,
) -> tuple[subprocess.Popen[str], float]:
    env = {**cluster.env(), **dirs.env(machine)}
    if mode == STOCK_REMOTE:
        env.update(cluster.stock_remote_env())
    proc = subprocess.Popen(
        command(mode, workload, edit, steps),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    return proc, time.time()


def finish(
    proc: subprocess.Popen[str], launched_at: float, mode: str, log: Path, timeout: float = 900
) -> Run:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    wall = time.time() - launched_at
    with log.open("a") as f:
        f.write(f"==== {mode} exit {proc.returncode}\n{err[-20000:]}\n")
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} run failed (exit {proc.returncode}):\n{err[-3000:]}")
    return Run(mode, json.loads(lines[-1]), launched_at, wall)


def run_once(
    cluster: Cluster,
    dirs: CacheDirs,
    mode: str,
    machine: str,
    workload: str,
    log: Path,
    edit: bool = False,
) -> Run:
    proc, launched_at = launch(cluster, dirs, mode, machine, workload, edit)
    return finish(proc, launched_at, mode, log)


def new_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="compileq-bench-"))


#: Worker log lines that say what one graph's codegen did: how long and in which phases, or why
#: it failed. Kept whole in a joined log, where the rest is only a tail: a zoo lane's worker
#: serves every model of the lane, and its tail shows the last model only.
_GRAPH_LINES = ("compileq worker: generated graph", "compileq worker: FX codegen of")


def join_logs(workdir: Path, path: Path, tail: int) -> None:
    """Every ``*.log`` of ``workdir`` in the one file ``path`` (a device call returns few
    files): each log's lines naming a graph a worker generated or failed to generate, then its
    last ``tail`` characters."""
    with path.open("w") as joined:
        for log in sorted(workdir.glob("*.log")):
            text = log.read_text(errors="replace")
            graphs = [line for line in text.splitlines() if any(g in line for g in _GRAPH_LINES)]
            joined.write(f"==> {log.name} <==\n" + "".join(f"{g}\n" for g in graphs))
            joined.write(f"{text[-tail:]}\n")
