"""The local cluster's own process: starts redis-server and a worker, stops both when idle.

Run as ``python -m compileq.local.daemon`` by ``control.start``; it forks once and the
parent returns at once, so the daemon is nobody's child (not the job's that started it, which
``compileq run`` replaces with the user's command) and leads its own session, out of the
reach of the terminal's Ctrl-C. redis-server and the worker get SIGTERM when it dies
(``PR_SET_PDEATHSIG``): a daemon killed with SIGKILL leaves no cluster running on its own.

Idle means: no job has held ``jobs.lock`` for ``COMPILEQ_LOCAL_IDLE_S``. The daemon checks
once a second; it stops only while it holds ``start.lock``, so a ``compileq run`` joining at
that moment waits and starts a new cluster rather than joining one going away. Its store is
saved (an RDB file in the dir) when it stops and every few minutes while it runs, so the next
cluster starts with what this one built. The rejected alternative, an idle clock counting
Redis commands, would count the worker's own heartbeats and never stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from types import FrameType
from typing import Any

import redis

from compileq import localstack
from compileq.config import Settings, load_settings
from compileq.errors import CompileqError
from compileq.local import state

log = logging.getLogger("compileq.local")

#: How often the daemon checks its processes and the jobs.
POLL_S = 1.0
#: The longest a worker may take to start (a 2-core machine importing torch under load).
WORKER_START_S = 600.0
#: redis-server saves its store when at least 10 entries changed in 5 minutes.
SAVE = ("--save", "300 10", "--dbfilename", "store.rdb")
_PR_SET_PDEATHSIG = 1


class Stopping(BaseException):  # a signal, like KeyboardInterrupt
    """SIGTERM (``compileq stop``), SIGINT or SIGHUP arrived."""


def _stopping(signum: int, frame: FrameType | None) -> None:
    raise Stopping(signal.Signals(signum).name)


def _die_with_parent() -> None:
    """In a child before exec: SIGTERM when the daemon dies, however it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_args() -> list[str]:
    """This machine's GPUs if it has any, else its CPU."""
    from compileq.workers.gpus import probe_gpus

    # --cpu-only with no --arch serves this machine's CPU kernels and FX codegen.
    return [] if probe_gpus() else ["--cpu-only"]


def settings_for(where: state.Place) -> Settings:
    """The environment's settings, pointed at this cluster (another cluster's URLs dropped)."""
    return load_settings(
        redis_url=where.url, secret=state.secret(where), broker_url=None, sentinel_master=None
    )


def serve(where: state.Place, record: dict[str, Any]) -> None:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        settings = settings_for(where)  # a malformed COMPILEQ_* setting: logged, no cluster
        where.socket.unlink(missing_ok=True)
        server = localstack.start_redis(
            where.redis_dir,
            *SAVE,
            "--logfile",
            str(where.log("redis")),
            unix_socket=where.socket,
            preexec_fn=_die_with_parent,
        )
        procs["redis"] = server.process
        record["redis"] = state.ident(server.process.pid)
        state.write_record(where, record)
        args = worker_args()
        log.info(
            "redis-server %d on %s; starting compileq worker %s",
            server.process.pid,
            where.socket,
            " ".join(args),
        )
        procs["worker"] = localstack.start_worker(
            settings,
            args,
            where.log("worker"),
            timeout_s=WORKER_START_S,
            preexec_fn=_die_with_parent,
        )
        record["worker"] = state.ident(procs["worker"].pid)
        record["ready"], record["idle_s"] = True, settings.local_idle_s
        state.write_record(where, record)
        log.info(
            "ready: worker %d; stops after %.0fs without a job",
            procs["worker"].pid,
            settings.local_idle_s,
        )
        _watch(where, settings, procs)
    except Stopping as e:
        log.info("stopping: %s", e)
    except CompileqError as e:
        log.error("compileq: %s", e)
    finally:
        _teardown(where, procs)


def _watch(
    where: state.Place, settings: Settings, procs: dict[str, subprocess.Popen[bytes]]
) -> None:
    last_job = time.monotonic()
    while True:
        time.sleep(POLL_S)
        dead = [name for name, proc in procs.items() if proc.poll() is not None]
        if dead:
            log.error("%s exited: stopping the local cluster", " and ".join(dead))
            with state.start_lock(where):
                _teardown(where, procs)
            return
        if state.jobs_running(where):
            last_job = time.monotonic()
            continue
        if time.monotonic() - last_job < settings.local_idle_s:
            continue
        # Idle: stop, unless a job joins right now (it holds start.lock while it joins).
        with state.start_lock(where, blocking=False) as held:
            if not held or state.jobs_running(where):
                continue
            log.info("no job for %.0fs: stopping", settings.local_idle_s)
            _teardown(where, procs)
            return


def _teardown(where: state.Place, procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """The record first (no one joins a cluster going away), the worker (it may be writing),
    then redis-server, saving the store, and its socket. Nothing once done."""
    if not procs:
        return
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)  # a second stop must not cut this short
    found = state.read_record(where)
    if found and found.get("daemon") == state.ident(os.getpid()):
        where.record_file.unlink(missing_ok=True)
    worker = procs.pop("worker", None)
    if worker is not None:
        localstack.stop(worker)
    server = procs.pop("redis", None)
    if server is not None:
        if server.poll() is None:
            with contextlib.suppress(redis.RedisError):
                client = redis.Redis(unix_socket_path=str(where.socket), socket_timeout=60)
                client.shutdown(save=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                server.wait(timeout=60)
            localstack.stop(server)
        where.socket.unlink(missing_ok=True)


def main() -> int:
    if os.fork() > 0:
        os._exit(0)  # the starter waits for this; the daemon goes on in the child
    os.setsid()
    where = state.place()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stopping)
    record: dict[str, Any] = {
        "daemon": state.ident(os.getpid()),
        "socket": str(where.socket),
        "ready": False,
        "started": time.time(),
    }
    state.write_record(where, record)
    log.info("local cluster in %s (pid %d)", where.root, os.getpid())
    try:
        serve(where, record)
    except Stopping as e:  # arrived in the teardown of a failed start
        log.info("stopping: %s", e)
    finally:
        # The record, if still ours: a failed start tore nothing down.
        found = state.read_record(where)
        if found and found.get("daemon") == record["daemon"]:
            where.record_file.unlink(missing_ok=True)
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
