"""Where the local cluster lives and what it leaves there: its dir, secret, record and locks.

Everything sits in ``$XDG_CACHE_HOME/compileq/local`` (``~/.cache/compileq/local``), a dir of
mode 0700 refused if another user owns it or may write to it (``_private_dir``): two users of
one machine each get their own cluster, and neither can reach the other's socket or secret.

- ``redis.sock``: redis-server's only listener (mode 0700). A unix socket's path is limited to
  107 bytes; a deeper cache dir gets its socket in ``/tmp/compileq-<uid>`` instead, named by
  a hash of the dir.
- ``secret``: made once (32 random bytes, hex), mode 0600; refused if anyone else may read it.
- ``cluster.json``: the record of its processes (pid and start time each, so a pid the
  system gave to another process since is never taken for ours), written atomically.
- ``start.lock``: held while a cluster is found or started, stopped or recovered: two
  ``compileq run`` started at the same moment share one cluster.
- ``jobs.lock``: every job that uses the cluster holds it shared, through a descriptor its
  processes inherit; the cluster is idle while nobody holds it.

Only the standard library is used here: ``compileq run`` reads this before every job.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import socket
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from compileq._files import write_atomically
from compileq._private_dir import checked_private, private_dir
from compileq.errors import LocalClusterError

#: The longest socket path kept in the cache dir (the kernel's limit is 107 bytes).
SOCKET_PATH_MAX = 100

#: One process of the cluster as the record holds it: ``{"pid": int, "start": int | None}``.
Ident = dict[str, Any]


@dataclass(frozen=True)
class Place:
    """The local cluster's files."""

    root: Path
    socket: Path

    @property
    def secret_file(self) -> Path:
        return self.root / "secret"

    @property
    def record_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def start_lock(self) -> Path:
        return self.root / "start.lock"

    @property
    def jobs_lock(self) -> Path:
        return self.root / "jobs.lock"

    @property
    def redis_dir(self) -> Path:
        return self.root / "redis"

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"


def place() -> Place:
    """This user's local cluster dir (made, and checked, here)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    root = checked_private(Path(base, "compileq", "local").absolute())
    sock = root / "redis.sock"
    if len(os.fsencode(sock)) > SOCKET_PATH_MAX:
        digest = hashlib.sha256(os.fsencode(root)).hexdigest()[:16]
        sock = private_dir(f"compileq-{os.getuid()}") / f"local-{digest}.sock"
    return Place(root, sock)


def secret(where: Place) -> str:
    """The cluster's secret, made on first use; an error if it is not this user's alone."""
    path = where.secret_file
    if not path.exists():
        # Written aside, then linked into place: a reader never sees a half-written secret,
        # and of two processes making one at once, the first link wins for both.
        tmp = path.with_name(f".secret.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
        tmp.unlink()
    found = os.lstat(path)
    if not stat.S_ISREG(found.st_mode) or found.st_uid != os.getuid():
        raise LocalClusterError(f"{path} is not a file of this user's")
    if found.st_mode & 0o077:
        raise LocalClusterError(
            f"{path} may be read by others (mode {found.st_mode & 0o777:o}): remove it, and a "
            "new secret is made"
        )
    value = path.read_text().strip()
    if not value:
        raise LocalClusterError(f"{path} is empty: remove it, and a new secret is made")
    return value


# --- the record of its processes -------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` after the command name (field 3 on), or None if no such process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rpartition(")")[2].split()


def ident(pid: int) -> Ident:
    """``pid`` with its start time (clock ticks since boot), which a reused pid does not share."""
    fields = _stat_fields(pid)
    return {"pid": pid, "start": int(fields[19]) if fields else None}


def alive(proc: Ident | None) -> bool:
    """Whether the process the record names still runs (a zombie does not)."""
    if not proc or not isinstance(proc.get("pid"), int):
        return False
    fields = _stat_fields(proc["pid"])
    if fields is None:
        if Path("/proc/self/stat").exists():
            return False
        try:  # no /proc (not Linux): the pid alone
            os.kill(proc["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False  # someone else's now
        return True
    return fields[0] != "Z" and int(fields[19]) == proc.get("start")


def read_record(where: Place) -> dict[str, Any] | None:
    try:
        record = json.loads(where.record_file.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_record(where: Place, record: dict[str, Any]) -> None:
    write_atomically(where.record_file, json.dumps(record).encode())


def group_members(pgid: int) -> list[int]:
    """This user's live processes in process group ``pgid`` (Linux; none elsewhere)."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc/self").exists() else ():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        with contextlib.suppress(OSError):
            if not fields or fields[0] == "Z" or entry.stat().st_uid != os.getuid():
                continue
            if int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def leftovers(record: dict[str, Any]) -> list[int]:
    """Processes a dead cluster left behind: the members of its process groups (the daemon's,
    holding redis-server, and the worker's). A group whose leader is alive but is not the
    process recorded belongs to someone else: its pid was reused."""
    pids: list[int] = []
    for name in ("daemon", "worker"):
        leader = record.get(name)
        if not isinstance(leader, dict) or not isinstance(leader.get("pid"), int):
            continue
        if _stat_fields(leader["pid"]) is not None and not alive(leader):
            continue
        pids += group_members(leader["pid"])
    return sorted(set(pids))


# --- locks ---------------------------------------------------------------------------------


@contextlib.contextmanager
def start_lock(where: Place, *, blocking: bool = True) -> Iterator[bool]:
    """Held while the cluster is found, started, stopped or recovered; yields False when not
    ``blocking`` and someone else holds it."""
    fd = os.open(where.start_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def hold_for_job(where: Place) -> int:
    """A shared hold on ``jobs.lock`` that the calling process and its children (across
    ``exec``) keep until the last of them exits: the cluster is busy while any job runs."""
    fd = os.open(where.jobs_lock, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_SH)
    os.set_inheritable(fd, True)
    return fd


def jobs_running(where: Place) -> bool:
    """Whether any job holds ``jobs.lock``."""
    fd = os.open(where.jobs_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases the lock
    return False


def answers(path: Path, timeout_s: float = 2.0) -> bool:
    """Whether a Redis answers PING on the unix socket ``path``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(str(path))
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False
