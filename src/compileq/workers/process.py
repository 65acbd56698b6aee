"""One worker process: a Celery worker consuming the queues of its targets' toolchains.

Started by the supervisor (``compileq worker``) with ``CUDA_VISIBLE_DEVICES`` already set, so
it sees exactly one GPU (or none with ``--cpu-only``) before anything touches CUDA.
"""

from __future__ import annotations

import argparse
import faulthandler
import functools
import gc
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, Any

from compileq._laps import Laps
from compileq._log import log
from compileq.workers.prefork import preload

if TYPE_CHECKING:
    from compileq.fingerprint import FxToolchain, Target


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


def main(argv: list[str] | None = None) -> int:
    # Where a slow start goes (imports, fingerprints, probes, the fork check), in every log.
    times = Laps()
    # `kill -USR2` writes every thread's stack to the worker's log (stderr), in this process and
    # in its pool processes, which inherit it. faulthandler writes from C, without the logging
    # locks or the GIL-held Python code a stuck process may be stuck in; Celery's own SIGUSR1
    # dump goes through logging and its signal handler, which a hung shutdown can block.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    parser = argparse.ArgumentParser(prog="compileq-worker-process")
    parser.add_argument("--name", required=True)
    parser.add_argument("--targets", required=True, help="comma list, e.g. cuda-90-w32")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--cpu-only", action="store_true")
    parser.add_argument("--gpu", default=None)
    parser.add_argument("--gpu-name", default="", help="the GPU's model, as nvidia-smi names it")
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--cpus", default="", help="pin to these CPUs (workers.cpus)")
    args = parser.parse_args(argv)
    if args.cpus:  # first: the pool, its compilers and torch's threads inherit it
        from compileq.workers import cpus

        cpus.pin(cpus.parse(args.cpus))

    from compileq.workers import cuda_fork

    cuda_fork.prefer_nvml()
    cuda_fork.watch()
    from compileq import stack_chunks
    from compileq.cache.store import RedisStore
    from compileq.config import get_settings
    from compileq.connect import redis_client
    from compileq.fingerprint import (
        Target,
        cpp_toolchain,
        fx_target,
        local_fx_toolchain,
        local_toolchain,
    )
    from compileq.tasks import app, triton_queue
    from compileq.tasks.queues import cpp_queue, fx_queue, tune_queue
    from compileq.workers import execute, priority, shutdown
    from compileq.workers.fx_slots import FxSlots
    from compileq.workers.heartbeat import Heartbeat
    from compileq.workers.late_fx import LateFxQueues

    settings = get_settings()
    settings.secret_bytes()  # fail now, not on the first task
    from compileq.tasks.broker import warn_if_evicting

    warn_if_evicting(settings)
    times.lap("compileq imports")
    preload(args.cpu_only)
    times.lap("torch imports")
    targets = [Target.parse(t) for t in args.targets.split(",")]
    toolchains = {t: local_toolchain(t) for t in targets}
    times.lap("kernel toolchains")
    queues = [triton_queue(toolchains[t], t) for t in targets]
    client = redis_client(settings.redis_url, settings)
    store = RedisStore(client, settings)
    # A worker builds only jobs signed with its secret: the cluster shares it, so an entry
    # sealed with another one is stale (a rotation) or planted, and its build replaces it.
    store.replace_foreign = lambda: True
    if settings.graph_cache:
        from compileq.cache.counters import Counter
        from compileq.inductor import cpp_cache

        # Finding this CPU's vector ISAs compiles a probe per ISA; shared through the store,
        # a client asking the same question of the same CPU loads them instead of building.
        cpp_cache.enable(store, Counter.CPP_REMOTE_COMPILES)
        times.lap("c++ cache")
    if settings.cpp_fanout:
        # Any client's C++ objects, where its compiler, torch and CPU are this worker's.
        queues.append(cpp_queue(cpp_toolchain()))
        times.lap("c++ toolchain")
    # FX codegen: every worker generates CPU graphs for its own CPU (vector ISAs, compiler);
    # a GPU worker also generates graphs for its GPU. A --cpu-only worker's --arch targets
    # are for cross-compiling kernels only: generating a GPU graph needs the GPU. Targets that
    # name this CPU's vector ISAs join after the worker takes work (workers.late_fx).
    fx_gpus = [] if args.cpu_only else targets
    if fx_gpus and not cuda_fork.forks_cleanly():  # checked last: after all setup so far
        log.warning(
            "compileq worker %s: CUDA was initialised before the pool forked, so this worker "
            "will not generate GPU graphs (clients compile them in process). First CUDA call:\n%s",
            args.name,
            cuda_fork.first_touch() or "(not seen)",
        )
        fx_gpus = []
    # GPU graphs without a CPU tensor are routed by the GPU alone (see fx_target).
    fx_toolchains = {fx_target(gpu, cpu=False): local_fx_toolchain(gpu) for gpu in fx_gpus}
    times.lap("gpu fx toolchains and fork check")
    queues += [fx_queue(tc, target) for target, tc in fx_toolchains.items()]
    # Timing autotuning candidates needs the GPU in the pool processes, as GPU graphs do.
    gpu_name = args.gpu_name if fx_gpus and args.gpu_name else None
    if gpu_name:
        queues += [tune_queue(toolchains[t], gpu_name) for t in targets]
    late_fx = functools.partial(cpu_fx_toolchains, fx_gpus)
    host = socket.gethostname()
    worker_id = f"{host}:{args.name}:{os.getpid()}"
    execute.configure(
        execute.WorkerContext(
            settings,
            store,
            toolchains,
            fx_toolchains,
            worker_id,
            FxSlots(args.concurrency),
            late_fx=late_fx,
            gpu_name=gpu_name,
        )
    )
    if args.metrics_port is not None:
        from compileq.workers import metrics

        metrics.serve(args.metrics_port)
    import compileq.tasks.compile  # noqa: F401  (registers the task with the app)

    info: dict[str, Any] = {
        "host": host,
        "name": args.name,
        "gpu": args.gpu,
        "gpu_name": gpu_name,
        "cpu_only": args.cpu_only,
        "concurrency": args.concurrency,
        "queues": queues,
        "toolchains": {str(t): tc.describe() for t, tc in toolchains.items()},
        "fx_toolchains": {t: tc.describe() for t, tc in fx_toolchains.items()},
        # Until this CPU's vector ISAs are known: what localstack.start_worker waits for.
        "pending": ["cpu fx queues"],
        # What pinning really is: doctor checks each GPU worker sees exactly one device.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "metrics_port": args.metrics_port,
    }
    heartbeat = Heartbeat(
        client,
        worker_id,
        queues,
        info,
        settings.heartbeat_interval_s,
        settings.heartbeat_ttl_s,
        secret=settings.secret_bytes(),
    )
    from celery import signals

    def joined(late: dict[str, FxToolchain], more: list[str], seconds: float) -> None:
        described = {**info["fx_toolchains"], **{t: tc.describe() for t, tc in late.items()}}
        heartbeat.extend(more, {"fx_toolchains": described, "pending": []})
        log.info(
            "compileq worker %s: FX queues %s joined %.1fs after ready (cpu isa probes)",
            args.name,
            ", ".join(more),
            seconds,
        )

    late_queues = LateFxQueues(late_fx, lambda target, tc: fx_queue(tc, target), joined)

    # Announce liveness only once the pool can take work, and withdraw it before shutdown,
    # so clients never route to a worker that is not consuming.
    def ready(sender: Any = None, **_: Any) -> None:
        heartbeat.start()
        log.info(
            "compileq worker %s: %s; on CPUs %s", args.name, _ready_line(times), args.cpus or "all"
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
    log.info("compileq worker %s: queues %s", args.name, ", ".join(queues))
    # Everything imported so far (torch, Inductor, Triton: millions of objects) moves to the
    # collector's permanent generation before Celery forks the pool. Otherwise each pool
    # process's first collections walk all of them and write their headers, copying the
    # parent's heap page by page into every child: Celery's start took 6.7 s with 16 pool
    # processes on 2 cores, 0.6 s frozen (docs/BENCHMARKS.md, worker start). Rejected
    # alternative: gc.disable() in the pool processes, which would also stop collecting
    # what a codegen job leaves behind.
    gc.freeze()
    # Inherited by the pool Celery forks next, and by every compiler it runs (workers/priority.py).
    priority.lower_process(settings.worker_nice)
    if settings.keep_stack_chunks:  # before the fork: every pool process's codegen keeps them
        stack_chunks.keep()
    app.worker_main(
        [
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
