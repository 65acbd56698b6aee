"""One worker process: a Celery worker consuming the queues of its targets' toolchains.

Started by the supervisor (``compileq worker``) with ``CUDA_VISIBLE_DEVICES`` already set, so
it sees exactly one GPU (or none with ``--cpu-only``) before anything touches CUDA.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import faulthandler
import functools
import gc
import logging
import os
import signal
import socket
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from compileq._gc import collector_paused
from compileq._laps import Laps
from compileq._log import log
from compileq.errors import ConfigError
from compileq.workers.prefork import preload

if TYPE_CHECKING:
    from compileq.cache.store import RedisStore
    from compileq.config import Settings
    from compileq.fingerprint import FxToolchain, Target, Toolchain
    from compileq.workers.heartbeat import Heartbeat


def cpu_fx_toolchains(gpus: list[Target]) -> dict[str, FxToolchain]:
    """The FX targets naming this CPU's vector ISAs: CPU graphs, and each GPU's graphs with a
    CPU tensor. Finding the ISAs compiles a probe per ISA the first time on a machine."""
    from compileq.fingerprint import fx_target, local_fx_toolchain

    found = {fx_target(None): local_fx_toolchain(None)}
    for gpu in gpus:
        found[fx_target(gpu)] = local_fx_toolchain(gpu)
    return found


def _ready_line(times: Laps) -> str:
    times.lap("celery start")
    return f"ready {times.total():.1f}s after its process started ({times.describe(1)})"


@dataclass
class QueuePlan:
    """What this worker serves: its queues, with the toolchains and the GPU behind them."""

    targets: list[Target]
    toolchains: dict[Target, Toolchain]
    queues: list[str]
    #: GPU graphs by FX target; the targets naming this CPU's vector ISAs join later (late_fx).
    fx_toolchains: dict[str, FxToolchain]
    #: The GPUs this worker generates graphs for: none when --cpu-only or after a bad fork check.
    fx_gpus: list[Target]
    #: The GPU model whose autotuning candidates this worker times; None when it times none.
    gpu_name: str | None


def main(argv: list[str] | None = None) -> int:
    # Where a slow start goes (imports, fingerprints, probes, the fork check), in every log.
    times = Laps()
    # `kill -USR2` writes every thread's stack to the worker's log (stderr), in this process and
    # in its pool processes, which inherit it. faulthandler writes from C, without the logging
    # locks or the GIL-held Python code a stuck process may be stuck in; Celery's own SIGUSR1
    # dump goes through logging and its signal handler, which a hung shutdown can block.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    args = _parse_args(argv)
    with collector_paused():
        try:
            settings = _prepare_process(args)
        except ConfigError as e:  # a setting it can never start with: once, not for ever
            from compileq import flags

            print(f"compileq worker: error: {e}", file=sys.stderr)
            return flags.CONFIG_EXIT
        times.lap("compileq imports")
        # Triton's cross-compile driver only where GPU targets are named: a --cpu-only worker
        # without --arch serves this CPU's C++ objects and graphs only.
        preload(args.cpu_only and bool(args.targets))
    gc.collect()  # what the imports left, before the freeze below keeps it for good
    times.lap("torch imports")
    targets, toolchains = _kernel_toolchains(args.targets)
    times.lap("kernel toolchains")
    store = _open_store(settings, times)
    plan = _plan_queues(args, settings, targets, toolchains, times)
    host = socket.gethostname()
    _start(args, settings, store, plan, host, times)
    _exit_without_teardown(_run_celery(args, settings, plan.queues, host))


def _exit_without_teardown(code: int) -> NoReturn:
    """Leave once Celery has shut down: exit handlers run and logs are flushed, as on any exit,
    but the interpreter's teardown is skipped, as Celery's pool processes skip it.

    The objects frozen before the fork (``_run_celery``) are never collected, so at teardown
    libtriton's were still alive, and nanobind's leak check printed about 30 lines of "leaked"
    instances, types and functions into every worker's log at exit. Nothing leaked: the
    process was ending. Rejected alternative: thawing them at exit (``gc.unfreeze``), which
    made the teardown collect the whole heap, 2.3 s more per exit on the 2-core machine (and
    a worker runs niced), only to free memory the exit frees anyway.
    """
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or not a file any more
            stream.flush()
    os._exit(code)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    # A bad flag is a configuration error: one line and flags.CONFIG_EXIT, which the
    # supervisor does not restart (`compileq worker` checks the same flags before it starts
    # any child; these checks hold for a child started by hand too).
    from compileq import flags

    parser = flags.OneLineParser(prog="compileq-worker-process", exit_code=flags.CONFIG_EXIT)
    parser.add_argument("--name", required=True)
    parser.add_argument("--targets", required=True, help="comma list, e.g. cuda-90-w32")
    parser.add_argument("--concurrency", type=flags.int_in(1, flags.MAX_CONCURRENCY), required=True)
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--gpu", default=None)
    parser.add_argument("--gpu-name", default="", help="the GPU's model, as nvidia-smi names it")
    parser.add_argument("--loglevel", type=flags.log_level, default="INFO")
    parser.add_argument("--metrics-port", type=flags.port, default=None)
    parser.add_argument("--cpus", default="", help="pin to these CPUs (workers.cpus)")
    return parser.parse_args(argv)


# -- start-up ----------------------------------------------------------------------------------


def _prepare_process(args: argparse.Namespace) -> Settings:
    """Pin the CPUs, watch CUDA, then import compileq and check its settings (in that order:
    everything imported or started later inherits the pinning, and is watched)."""
    if args.cpus:  # first: the pool, its compilers and torch's threads inherit it
        from compileq.workers import cpus

        cpus.pin(cpus.parse(args.cpus))

    from compileq.workers import cuda_fork

    cuda_fork.prefer_nvml()
    cuda_fork.watch()
    from compileq.config import get_settings
    from compileq.tasks.broker import warn_if_evicting

    settings = get_settings()
    settings.secret_bytes()  # fail now, not on the first task
    warn_if_evicting(settings)
    return settings


def _kernel_toolchains(names: str) -> tuple[list[Target], dict[Target, Toolchain]]:
    """The kernel targets of ``--targets`` (none: a --cpu-only worker without --arch), and
    this process's toolchain for each."""
    from compileq.fingerprint import Target, local_toolchain

    targets = [Target.parse(t) for t in names.split(",") if t.strip()]
    return targets, {t: local_toolchain(t) for t in targets}


def _open_store(settings: Settings, times: Laps) -> RedisStore:
    """The store, as a worker uses it; with the graph cache on, also the C++ cache's."""
    from compileq.cache.store import RedisStore
    from compileq.connect import redis_client

    store = RedisStore(redis_client(settings.redis_url, settings), settings)
    # A worker builds only jobs signed with its secret: the cluster shares it, so an entry
    # sealed with another one is stale (a rotation) or planted, and its build replaces it.
    store.replace_foreign = lambda: True
    if settings.graph_cache:
        from compileq.cache.counters import Counter
        from compileq.inductor import cpp_cache

        # Finding this CPU's vector ISAs compiles a probe per ISA; shared through the store,
        # a client asking the same question of the same CPU loads them instead of building.
        cpp_cache.FEATURE.start(store, Counter.CPP_REMOTE_COMPILES)
        times.lap("c++ cache")
    return store


# -- queue planning ----------------------------------------------------------------------------


def _plan_queues(
    args: argparse.Namespace,
    settings: Settings,
    targets: list[Target],
    toolchains: dict[Target, Toolchain],
    times: Laps,
) -> QueuePlan:
    """Kernel queues for each target; the C++ queue (fan-out on); FX queues for each GPU this
    worker generates graphs for; tune queues for its GPU model."""
    from compileq.fingerprint import cpp_toolchain, fx_target, local_fx_toolchain
    from compileq.tasks import triton_queue
    from compileq.tasks.queues import cpp_queue, fx_queue, tune_queue

    queues = [triton_queue(toolchains[t], t) for t in targets]
    if settings.cpp_fanout:
        # Any client's C++ objects, where its compiler, torch and CPU are this worker's.
        queues.append(cpp_queue(cpp_toolchain()))
        times.lap("c++ toolchain")
    fx_gpus = _fx_gpus(args, targets)
    # GPU graphs without a CPU tensor are routed by the GPU alone (see fx_target).
    fx_toolchains = {fx_target(gpu, cpu=False): local_fx_toolchain(gpu) for gpu in fx_gpus}
    times.lap("gpu fx toolchains and fork check")
    queues += [fx_queue(tc, target) for target, tc in fx_toolchains.items()]
    # Timing autotuning candidates needs the GPU in the pool processes, as GPU graphs do.
    gpu_name = args.gpu_name if fx_gpus and args.gpu_name else None
    if gpu_name:
        queues += [tune_queue(toolchains[t], gpu_name) for t in targets]
    return QueuePlan(targets, toolchains, queues, fx_toolchains, fx_gpus, gpu_name)


def _fx_gpus(args: argparse.Namespace, targets: list[Target]) -> list[Target]:
    """The GPUs whose graphs this worker generates.

    FX codegen: every worker generates CPU graphs for its own CPU (vector ISAs, compiler); a
    GPU worker also generates graphs for its GPU. A --cpu-only worker's --arch targets are for
    cross-compiling kernels only: generating a GPU graph needs the GPU. Targets that name this
    CPU's vector ISAs join after the worker takes work (workers.late_fx).
    """
    from compileq.workers import cuda_fork

    fx_gpus = [] if args.cpu_only else targets
    if fx_gpus and not cuda_fork.forks_cleanly():  # checked last: after all setup so far
        log.warning(
            "compileq worker %s: CUDA was initialised before the pool forked, so this worker "
            "will not generate GPU graphs (clients compile them in process). First CUDA call:\n%s",
            args.name,
            cuda_fork.first_touch() or "(not seen)",
        )
        fx_gpus = []
    return fx_gpus


# -- start-up, once the queues are known ------------------------------------------------------


def _start(
    args: argparse.Namespace,
    settings: Settings,
    store: RedisStore,
    plan: QueuePlan,
    host: str,
    times: Laps,
) -> None:
    """Configure the pool's context, serve metrics, register the tasks, and announce this
    worker (its heartbeat) once Celery is ready, withdrawing it at shutdown."""
    from compileq.workers import lifecycle
    from compileq.workers.fx_slots import FxSlots

    late_fx = functools.partial(cpu_fx_toolchains, plan.fx_gpus)
    worker_id = f"{host}:{args.name}:{os.getpid()}"
    lifecycle.configure(
        lifecycle.WorkerContext(
            settings,
            store,
            plan.toolchains,
            plan.fx_toolchains,
            worker_id,
            FxSlots(args.concurrency),
            late_fx=late_fx,
            gpu_name=plan.gpu_name,
        )
    )
    if args.metrics_port is not None:
        from compileq.workers import metrics

        metrics.serve(args.metrics_port)
    from compileq.workers import tasks  # noqa: F401  (registers the tasks with the app)
    from compileq.workers.heartbeat import Heartbeat

    info = _worker_info(args, plan, host)
    heartbeat = Heartbeat(
        store.client,
        worker_id,
        plan.queues,
        info,
        settings.heartbeat_interval_s,
        settings.heartbeat_ttl_s,
        secret=settings.secret_bytes(),
    )
    _connect_signals(args, heartbeat, info, late_fx, times)


def _worker_info(args: argparse.Namespace, plan: QueuePlan, host: str) -> dict[str, Any]:
    """What the heartbeat record says of this worker (read by clients, doctor and localstack)."""
    return {
        "host": host,
        "name": args.name,
        "gpu": args.gpu,
        "gpu_name": plan.gpu_name,
        "cpu_only": args.cpu_only,
        "concurrency": args.concurrency,
        "queues": plan.queues,
        "toolchains": {str(t): tc.describe() for t, tc in plan.toolchains.items()},
        "fx_toolchains": {t: tc.describe() for t, tc in plan.fx_toolchains.items()},
        # Until this CPU's vector ISAs are known: what localstack.start_worker waits for, and
        # the joining sets of the CPU FX queues, for which clients wait (scheduler/fx_join.py).
        "pending": ["cpu fx queues"],
        "pending_fx": _joining(plan.fx_gpus),
        # What pinning really is: doctor checks each GPU worker sees exactly one device.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "metrics_port": args.metrics_port,
    }


def _joining(gpus: list[Target]) -> list[str]:
    """The joining sets of the CPU FX queues (``cpu_fx_toolchains``), named without the ISAs."""
    from compileq.fingerprint import local_fx_toolchain
    from compileq.scheduler.fx_join import pending_queue

    return [pending_queue(local_fx_toolchain(gpu), gpu) for gpu in [None, *gpus]]


def _connect_signals(
    args: argparse.Namespace,
    heartbeat: Heartbeat,
    info: dict[str, Any],
    late_fx: Callable[[], dict[str, FxToolchain]],
    times: Laps,
) -> None:
    from celery import signals

    from compileq.tasks.queues import fx_queue
    from compileq.workers import broker_close, shutdown
    from compileq.workers.late_fx import LateFxQueues

    def joined(late: dict[str, FxToolchain], more: list[str], seconds: float) -> None:
        described = {**info["fx_toolchains"], **{t: tc.describe() for t, tc in late.items()}}
        heartbeat.extend(more, {"fx_toolchains": described, "pending": [], "pending_fx": []})
        if not more:  # the probes failed (late_fx said why): clients wait no longer
            return
        log.info(
            "compileq worker %s: FX queues %s joined %.1fs after ready (cpu isa probes)",
            args.name,
            ", ".join(more),
            seconds,
        )

    late_queues = LateFxQueues(late_fx, lambda target, tc: fx_queue(tc, target), joined)
    # Before Celery connects: a broker lost under a pending pop with a build in hand must not
    # end this process (workers.broker_close).
    broker_close.install()

    # Announce liveness only once the pool can take work, and withdraw it before shutdown,
    # so clients never route to a worker that is not consuming.
    def ready(sender: Any = None, **_: Any) -> None:
        heartbeat.start()
        log.info(  # the queues too: Celery's banner, which listed them, is off (_quiet_celery)
            "compileq worker %s: %s; on CPUs %s; queues %s",
            args.name,
            _ready_line(times),
            args.cpus or "all",
            ", ".join(info["queues"]),
        )
        late_queues.start(sender)
        # Celery's shutdown handlers are installed by now (its start-up, before the consumer):
        # a second SIGTERM inside the first one's handling would deadlock it (workers.shutdown).
        if not shutdown.serialise():
            log.warning("compileq worker: shutdown signals not serialised (not the main thread)")

    signals.worker_ready.connect(ready, weak=False)
    # Withdrawn when shutdown *starts* (SIGTERM: a Slurm job ending, a pod evicted), before the
    # running builds finish: clients stop routing here at once, so a miss meanwhile goes to
    # another live worker instead of a queue this one no longer consumes. Its running builds
    # finish (warm shutdown); one cut off by the grace period is redelivered (acks late).
    signals.worker_shutting_down.connect(lambda **_: heartbeat.stop(), weak=False)
    signals.worker_shutdown.connect(lambda **_: heartbeat.stop(), weak=False)


# -- the Celery call ---------------------------------------------------------------------------


def _run_celery(args: argparse.Namespace, settings: Settings, queues: list[str], host: str) -> int:
    """Prepare what the pool inherits, then run Celery's worker until it shuts down; its exit
    code (Celery's own: 0 once told to stop, 1 after an unrecoverable error).

    ``app.start``, not ``app.worker_main``: the latter drops the code Celery's worker command
    exits with, so a worker that shut down on an error exited 0 and its supervisor's line read
    as a clean stop (CI's failover test, where the log said only "exited with 0")."""
    from compileq import stack_chunks
    from compileq.tasks.app import app
    from compileq.workers import priority

    log.info("compileq worker %s: queues %s", args.name, ", ".join(queues))
    # Everything imported so far (torch, Inductor, Triton: millions of objects) moves to the
    # collector's permanent generation before Celery forks the pool. Otherwise each pool
    # process's first collections walk all of them and write their headers, copying the
    # parent's heap page by page into every child: Celery's start took 6.7 s with 16 pool
    # processes on 2 cores, 0.6 s frozen (docs/BENCHMARKS.md, worker start). Rejected
    # alternative: gc.disable() in the pool processes, which would also stop collecting
    # what a codegen job leaves behind.
    gc.freeze()  # so they are never collected at exit either: see _exit_without_teardown
    # Inherited by the pool Celery forks next, and by every compiler it runs (workers/priority.py).
    priority.lower_process(settings.worker_nice)
    if settings.keep_stack_chunks:  # before the fork: every pool process's codegen keeps them
        stack_chunks.keep()
    code = app.start(
        [
            *_quiet_celery(args.loglevel),
            "worker",
            f"--queues={','.join(queues)}",
            f"--concurrency={args.concurrency}",
            "--pool=prefork",
            # Celery's default, named because FxSlots relies on it: a message goes only to an
            # idle pool process, never queued behind a graph that waits for kernels.
            "--optimization=fair",
            f"--hostname=compileq-{args.name}-{os.getpid()}@{host}",
            f"--loglevel={args.loglevel}",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )
    return code if isinstance(code, int) else 0


def _quiet_celery(loglevel: str) -> list[str]:
    """Celery's options that keep its start-up banner (app, transport, queues, tasks: 25 lines
    that compileq's own ready line already covers) and its superuser warning out of the log,
    unless the log is asked for in detail (``--loglevel debug``). Running as root is common in
    containers and harmless here: the app accepts JSON only, never pickle, which is what
    Celery's warning is about (it refuses to start as root with pickle)."""
    if loglevel.strip().upper() == "DEBUG":
        return []
    from celery.exceptions import SecurityWarning

    warnings.filterwarnings("ignore", category=SecurityWarning)
    return ["--quiet"]


if __name__ == "__main__":
    sys.exit(main())
