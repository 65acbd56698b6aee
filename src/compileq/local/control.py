"""Finding, starting, joining and stopping the local cluster: what the CLI calls.

``compileq run`` with no ``COMPILEQ_REDIS_URL`` calls :func:`join_for_job` before it execs
the job. With the cluster up, that is a small JSON file read and two file locks, standard
library only (``compileq run`` starts every job). Without one, it starts the daemon
(``daemon.py``) and waits for its worker, once; a second ``compileq run`` arriving meanwhile
waits on ``start.lock`` and joins the same cluster. A record whose daemon is dead (a
cluster killed with SIGKILL, or a machine rebooted) is recovered: what is left of its process
groups is killed, its socket and record removed, and a new cluster started.

compileq may make a job slower, never fail it: a cluster that cannot be had (no
redis-server, a dir that is not this user's) is one line on stderr, and the job runs as
stock (``COMPILEQ_ENABLED=0``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from compileq.errors import CompileqError, LocalClusterError
from compileq.local import state

if TYPE_CHECKING:
    from compileq.config import Settings

#: The settings that name a cluster: the local cluster's own replace them, in its jobs and
#: in its daemon's environment (a broker URL left over would send its jobs elsewhere).
CLUSTER_VARS = (
    "COMPILEQ_REDIS_URL",
    "COMPILEQ_BROKER_URL",
    "COMPILEQ_SENTINEL_MASTER",
    "COMPILEQ_SECRET",
)
#: The longest a job waits for a starting cluster's worker, then goes on without it (its
#: graphs then compile in process until the worker is up).
READY_WAIT_S = 600.0
#: The longest the daemon may take to write its record once launched.
LAUNCH_WAIT_S = 30.0
#: The longest ``compileq stop`` waits for the daemon to stop its processes.
STOP_WAIT_S = 150.0
_FALSE = ("0", "false", "no", "off")


def _say(message: str) -> None:
    print(f"compileq: {message}", file=sys.stderr, flush=True)


def configured(env: Mapping[str, str]) -> bool:
    """Whether the environment names a cluster (then the local one is not used)."""
    return bool(env.get("COMPILEQ_REDIS_URL"))


def join_for_job(env: dict[str, str]) -> dict[str, str]:
    """``env`` for a job on the local cluster (started if need be): its URL and secret, and a
    hold on ``jobs.lock`` that this process passes to the job through ``exec``. With no
    cluster to be had: one line on stderr, and ``env`` with compileq off."""
    if env.get("COMPILEQ_ENABLED", "").lower() in _FALSE:
        return env
    try:
        where, secret = _join(state.place())
    except (CompileqError, OSError) as e:
        _say(f"{e}; this job runs without compileq")
        return {**env, "COMPILEQ_ENABLED": "0"}
    out = {k: v for k, v in env.items() if k not in CLUSTER_VARS}
    out.update(COMPILEQ_REDIS_URL=where.url, COMPILEQ_SECRET=secret)
    return out


def local_settings(settings: Settings, *, start: bool) -> Settings:
    """``settings`` pointed at the local cluster. ``start``: start it if need be, and count
    this process as a job while it lives (``compileq warm``); else it must be running."""
    from pydantic import SecretStr

    where = state.place()
    if start:
        where, secret = _join(where)
    else:
        record = state.read_record(where)
        if not (record and state.alive(record.get("daemon")) and record.get("ready")):
            raise LocalClusterError(
                "no local cluster is running (`compileq run -- python train.py` starts one; "
                "set COMPILEQ_REDIS_URL or pass --redis-url to use another cluster)"
            )
        secret = state.secret(where)
    update = {"redis_url": where.url, "secret": SecretStr(secret)}
    return settings.model_copy(update={**update, "broker_url": None, "sentinel_master": None})


def _join(where: state.Place) -> tuple[state.Place, str]:
    with state.start_lock(where):
        record = state.read_record(where)
        started = None
        if not (record and state.alive(record.get("daemon"))):
            if record is not None:
                _recover(where, record)
            started = time.monotonic()
            record = _launch(where)
        secret = state.secret(where)
        state.hold_for_job(where)  # kept open: the job inherits it across exec
    _wait_ready(where, record, started)
    return where, secret


def _launch(where: state.Place) -> dict[str, Any]:
    """Start the daemon; its record once it has written one."""
    import shutil

    if shutil.which("redis-server") is None:
        from compileq.localstack import NO_REDIS_SERVER

        raise LocalClusterError(NO_REDIS_SERVER)
    where.record_file.unlink(missing_ok=True)
    state.secret(where)  # made here, not raced for by the daemon
    _say(f"starting the local cluster in {where.root} (redis-server and a worker, once)")
    env = {k: v for k, v in os.environ.items() if k not in CLUSTER_VARS}
    log = where.log("daemon")
    offset = log.stat().st_size if log.exists() else 0
    with log.open("ab") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "compileq.local.daemon"],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    launcher.wait()  # it forks the daemon and returns at once
    deadline = time.monotonic() + LAUNCH_WAIT_S
    while time.monotonic() < deadline:
        record = state.read_record(where)
        if record and state.alive(record.get("daemon")):
            return record
        time.sleep(0.05)
    raise LocalClusterError(f"the local cluster did not start: {_log_tail(log, offset)}")


def _wait_ready(where: state.Place, record: dict[str, Any], started: float | None) -> None:
    """Wait for the cluster's worker (its first start takes a while)."""
    if record.get("ready") and state.answers(where.socket):
        return
    if started is None:
        _say("waiting for the local cluster to start")
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        found = state.read_record(where)
        if found is None or found.get("daemon") != record.get("daemon"):
            raise LocalClusterError(
                f"the local cluster stopped while starting: {_log_tail(where.log('daemon'), 0)}"
            )
        if found.get("ready") and state.answers(where.socket):
            break
        if time.monotonic() > deadline:
            _say("the local worker is still starting: this job's graphs compile here until then")
            return
        time.sleep(0.2)
    if started is not None:
        idle = float(found.get("idle_s") or 0)
        _say(
            f"local cluster ready in {time.monotonic() - started:.1f}s; it stops after "
            f"{idle / 60:g} min without a job (`compileq stop` stops it now)"
        )


def stop() -> str:
    """Stop the local cluster now; what was done, in words."""
    where = state.place()
    with state.start_lock(where):
        record = state.read_record(where)
        if record is None:
            where.socket.unlink(missing_ok=True)
            return "no local cluster is running"
        daemon = record.get("daemon")
        if state.alive(daemon):
            assert daemon is not None
            with contextlib.suppress(ProcessLookupError):
                os.kill(daemon["pid"], signal.SIGTERM)
            deadline = time.monotonic() + STOP_WAIT_S
            while state.alive(daemon) and time.monotonic() < deadline:
                time.sleep(0.1)
        killed = _recover(where, record, say=False)
    return "local cluster stopped" + (f" ({len(killed)} processes killed)" if killed else "")


def _recover(where: state.Place, record: dict[str, Any], *, say: bool = True) -> list[int]:
    """Kill what is left of a cluster whose daemon is gone; remove its record and socket."""
    left = state.leftovers(record)
    for pid in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(state.alive(state.ident(pid)) for pid in left):
        time.sleep(0.05)
    where.record_file.unlink(missing_ok=True)
    where.socket.unlink(missing_ok=True)
    if say:
        _say(f"recovered from a local cluster that was killed ({len(left)} processes left)")
    return left


def _log_tail(path: os.PathLike[str], offset: int, limit: int = 600) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return "(no log)"
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines)[-limit:] or f"(nothing in {os.fspath(path)})"
