"""A private redis-server and local workers, for the demo, benchmarks, tests and the local
cluster (``compileq/local/``).

The same processes a deployment runs, started on loopback with a free port, or on a unix
socket (the local cluster: only its user may connect), and stopped after.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis

from compileq.cache import liveness
from compileq.config import Settings, child_env
from compileq.connect import redis_client
from compileq.errors import CompileqError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    port: int  # 0: no TCP port, only ``socket``
    process: subprocess.Popen[bytes]
    socket: Path | None = None

    def url(self, db: int = 0) -> str:
        if self.socket is not None:
            return f"unix://{self.socket}?db={db}"
        return f"redis://127.0.0.1:{self.port}/{db}"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis.from_url(self.url(db))


#: What to say when there is no redis-server to start.
NO_REDIS_SERVER = (
    "redis-server not found (Debian/Ubuntu: apt-get install redis-server; macOS: brew install "
    "redis; conda: conda install -c conda-forge redis-server)"
)


def start_redis(
    workdir: Path,
    *extra: str,
    port: int | None = None,
    unix_socket: Path | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> RedisServer:
    """A redis-server with no persistence unless ``extra`` asks for it, on a free loopback
    port, or with ``unix_socket`` on that socket only (mode 0700, no TCP port).

    A port found free can be taken before the server binds it (by another test's server, or
    as the local end of some connection: both come from the same ephemeral range). The server
    then exits, or another server answers on that port. So the server that answers must be
    this one (its ``process_id``), and a port this function chose is chosen again, up to
    ``_PORT_TRIES`` times; a port the caller gave is an error at once."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise CompileqError(NO_REDIS_SERVER)
    workdir.mkdir(parents=True, exist_ok=True)
    tries = 1 if port is not None or unix_socket is not None else _PORT_TRIES
    for _ in range(tries):
        server = _start_redis_once(binary, workdir, extra, port, unix_socket, preexec_fn)
        if server is not None:
            return server
    where = f"{tries} free ports" if tries > 1 else (unix_socket or f"port {port}")
    raise CompileqError(f"redis-server did not start on {where}")


#: Ports a private server tries before giving up: each lost race is rare.
_PORT_TRIES = 5


def _start_redis_once(
    binary: str,
    workdir: Path,
    extra: tuple[str, ...],
    port: int | None,
    unix_socket: Path | None,
    preexec_fn: Callable[[], None] | None,
) -> RedisServer | None:
    """The server, or None if it exited or another process answered in its place."""
    if unix_socket is not None:
        port = 0
        listen = ["--port", "0", "--unixsocket", str(unix_socket), "--unixsocketperm", "700"]
    else:
        port = port or free_port()
        listen = ["--port", str(port), "--bind", "127.0.0.1"]
    argv = [binary, *listen, "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [*argv, "--dir", str(workdir), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=preexec_fn,
    )
    server = RedisServer(port, proc, unix_socket)
    # Short timeouts: a port held by something that accepts and never answers must not hang.
    probe = redis.Redis.from_url(server.url(), socket_timeout=1, socket_connect_timeout=1)
    deadline = time.monotonic() + 10
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                # Not a ping: any server on that port answers one (a foreign server with a
                # password refuses: a ConnectionError too, until this one has exited).
                answered = probe.info("server").get("process_id")
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.05)
                continue
            if answered == proc.pid:
                return server
            break  # another server holds the port: this one cannot bind it
    finally:
        probe.close()
    stop(proc)
    return None


def stop(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; also kills the process group it leads."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def private_redis() -> Iterator[RedisServer]:
    with tempfile.TemporaryDirectory(prefix="compileq-redis-") as workdir:
        server = start_redis(Path(workdir))
        try:
            yield server
        finally:
            stop(server.process)


def start_worker(
    settings: Settings,
    args: list[str],
    log: Path | None = None,
    env: dict[str, str] | None = None,
    timeout_s: float = 180,
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """``compileq worker ARGS`` in its own process group; returns once it has a heartbeat."""
    out = log.open("wb") if log else subprocess.DEVNULL
    client = redis_client(settings.redis_url, settings)  # a redis:// or sentinel:// URL
    # Workers started earlier (another test's, a bench's) are not this one: waiting on any
    # worker returned before this one's late queues had joined, and its ISA probes then ran
    # (and counted C++ builds) in the middle of the caller's first job.
    before = {info.get("id") for info in liveness.workers_info(client)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "compileq.cli", "worker", *args],
        env={**child_env(settings), **(env or {})},
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec_fn,
    )
    deadline = time.monotonic() + timeout_s
    # Every queue: a worker beats as soon as it takes kernel work, and says which queues are
    # still to join (workers.late_fx); callers here want the whole worker.
    while True:
        mine = [i for i in liveness.workers_info(client) if i.get("id") not in before]
        if mine and not any(i.get("pending") for i in mine):
            break
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            tail = log.read_text()[-3000:] if log else ""
            raise CompileqError(f"the worker did not start\n{tail}")
        time.sleep(0.2)
    return proc
