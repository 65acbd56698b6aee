"""``compileq worker``: one worker process per GPU (or one CPU worker, cross-compiling with --arch).

Each child gets ``CUDA_VISIBLE_DEVICES`` before it starts, so pinning never depends on code that
runs after CUDA initialises; the supervisor itself never touches CUDA. A child that dies is
restarted (its unacked task is redelivered by the broker); SIGTERM/SIGINT stop all children
with Celery's warm shutdown, letting running builds finish.
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from types import FrameType

from compileq import flags
from compileq._log import log
from compileq.config import Settings, child_env
from compileq.errors import WorkerError
from compileq.fingerprint import Target
from compileq.workers import cpus, priority
from compileq.workers.gpus import probe_gpus, select_gpus

#: A child that lived this long was healthy: its next death restarts it at once.
_STABLE_S = 60.0
#: The longest wait between restarts of a child that keeps dying.
_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class ChildSpec:
    name: str
    targets: tuple[Target, ...]
    concurrency: int
    cpu_only: bool
    gpu: int | None
    metrics_port: int | None = None
    #: The child's ``CUDA_VISIBLE_DEVICES`` (a GPU's UUID: see workers.gpus); none for --cpu-only.
    pin: str = ""
    #: The GPU's model (``NVIDIA H100 80GB HBM3``): which autotuning queue the child serves.
    gpu_name: str = ""
    #: The CPUs the child pins itself to before forking its pool (workers.cpus); () all.
    cpus: tuple[int, ...] = ()

    def argv(self, loglevel: str) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "compileq.workers.process",
            f"--name={self.name}",
            f"--targets={','.join(str(t) for t in self.targets)}",
            f"--concurrency={self.concurrency}",
            f"--loglevel={loglevel}",
        ]
        if self.cpu_only:
            argv.append("--cpu-only")
        if self.gpu is not None:
            argv.append(f"--gpu={self.gpu}")
        if self.gpu_name:
            argv.append(f"--gpu-name={self.gpu_name}")
        if self.metrics_port is not None:
            argv.append(f"--metrics-port={self.metrics_port}")
        if self.cpus:
            argv.append(f"--cpus={cpus.describe(set(self.cpus))}")
        return argv

    def env(self, settings: Settings) -> dict[str, str]:
        visible = "" if self.gpu is None else self.pin or str(self.gpu)
        return child_env(settings, CUDA_VISIBLE_DEVICES=visible)


def with_metrics(specs: list[ChildSpec], port: int | None) -> list[ChildSpec]:
    """Give each worker process its own metrics port: ``port``, ``port + 1``, ... in order."""
    if port is None:
        return specs
    return [dataclasses.replace(s, metrics_port=port + i) for i, s in enumerate(specs)]


def plan(
    gpus: str | None,
    cpu_only: bool,
    archs: list[str],
    concurrency: int | None,
    cpu_list: str = "",
    leave_cores: int | None = None,
) -> list[ChildSpec]:
    """One child per GPU (or one cross-compiling child), on ``cpu_list`` (empty: every CPU
    this process may use) less ``leave_cores`` physical cores (None: ``cpus.default_leave``,
    one per GPU served from ``cpus.LEAVE_FROM_CPUS_PER_GPU`` CPUs per GPU up).
    Without ``concurrency`` a child runs a pool process per CPU it has, shared with the
    other children."""
    if cpu_only:
        if gpus:
            raise WorkerError("--cpu-only and --gpus exclude each other")
        # Without --arch it serves this machine's CPU (its C++ objects and CPU graphs); each
        # --arch adds kernels cross-compiled for that GPU.
        targets = tuple(dict.fromkeys(Target.parse(a) for a in archs))
        mine = cpus.choose(cpu_list, leave_cores or 0)
        return [ChildSpec("cpu", targets, concurrency or len(mine), True, None, cpus=_pinned(mine))]
    if archs:
        raise WorkerError("--arch applies to --cpu-only; GPU workers build for their own GPU")
    chosen = select_gpus(gpus or "all", probe_gpus())
    listed = cpus.given(cpu_list)
    leave = cpus.default_leave(listed, len(chosen)) if leave_cores is None else leave_cores
    mine = cpus.leaving(listed, leave)
    per_gpu = concurrency or max(1, len(mine) // len(chosen))
    return [
        ChildSpec(
            f"gpu{g.index}",
            (g.target,),
            per_gpu,
            False,
            g.index,
            pin=g.visible_devices,
            gpu_name=g.name,
            cpus=_pinned(mine),
        )
        for g in chosen
    ]


def _pinned(mine: set[int]) -> tuple[int, ...]:
    """What a child pins itself to: nothing where that is every CPU it may use anyway."""
    return () if mine == cpus.usable() else tuple(sorted(mine))


def restart_delay(quick_deaths: int) -> float:
    """Seconds before restarting a child that died after ``quick_deaths`` short lives in a row."""
    return 0.0 if quick_deaths <= 0 else min(_MAX_BACKOFF_S, 2.0 ** (quick_deaths - 1))


def run(settings: Settings, specs: list[ChildSpec], loglevel: str = "INFO") -> int:
    children: dict[str, subprocess.Popen[bytes]] = {}
    stopping = False

    started: dict[str, float] = {}

    def start(spec: ChildSpec) -> None:
        children[spec.name] = subprocess.Popen(spec.argv(loglevel), env=spec.env(settings))
        started[spec.name] = time.monotonic()
        log.info("compileq worker: started %s (pid %d)", spec.name, children[spec.name].pid)

    def stop(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    if priority.lower_session(settings.worker_nice):
        log.info("compileq worker: this session's autogroup at nice %d", settings.worker_nice)
    for spec in specs:
        start(spec)
    # A child that dies is restarted after a delay that doubles with each quick death (capped),
    # and never given up on. The rejected alternative, giving up after a few deaths a minute,
    # let a broker that stayed full or unreachable for a minute stop every worker of the
    # fleet for good; what makes a child fail forever (flags, secret) is checked before here,
    # and a child that finds one anyway exits flags.CONFIG_EXIT: that one is never restarted.
    quick_deaths = {s.name: 0 for s in specs}
    config_error = False
    restart_at: dict[str, float] = {}
    while not stopping:
        time.sleep(0.5)
        now = time.monotonic()
        for spec in specs:
            if spec.name in restart_at:
                if now >= restart_at[spec.name] and not stopping:
                    del restart_at[spec.name]
                    start(spec)
                continue
            code = children[spec.name].poll()
            if code is None or stopping:
                continue
            if code == flags.CONFIG_EXIT:
                # A flag or setting it can never start with (its one line is above): every
                # child shares them, so none is restarted and the supervisor exits 2.
                log.error(
                    "compileq worker: %s cannot start with this configuration; not restarting",
                    spec.name,
                )
                config_error = True
                stop(signal.SIGTERM, None)
                break
            lived = now - started[spec.name]
            quick_deaths[spec.name] = 0 if lived > _STABLE_S else quick_deaths[spec.name] + 1
            delay = restart_delay(quick_deaths[spec.name])
            log.warning(
                "compileq worker: %s exited with %s after %.0fs; restarting in %.0fs",
                spec.name,
                code,
                lived,
                delay,
            )
            restart_at[spec.name] = now + delay
    deadline = time.monotonic() + settings.task_time_limit_s
    for child in children.values():
        try:
            child.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
    return flags.USAGE_EXIT if config_error else 0
