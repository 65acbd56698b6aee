"""The local cluster: ``compileq run`` with no settings at all, as a user on their own machine.

Real processes only: each test gets a HOME and XDG cache dir of its own, so its own local
cluster (a real redis-server on a unix socket, a real worker, a real daemon), and stops it
at the end; the scripts are real torch.compile on CPU.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.conftest import compileq_cmd
from tests.scripts import LOADED_DEADLINE_S
from tests.test_fx_remote import COMPILES

#: A model defined in the script itself, compiled on CPU: a forward and a backward graph.
SCRIPT = """
import json, sys, torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).sum()

torch.manual_seed(0)
loss = torch.compile(Net())(torch.randn(8, 16))
loss.backward()
print(json.dumps({"loss": loss.item()}))
"""

#: A job that outlives the idle time, then asks whether its cluster still answers.
LONG_JOB = """
import os, sys, time
import redis
time.sleep(float(sys.argv[1]))
client = redis.Redis.from_url(os.environ["COMPILEQ_REDIS_URL"])
print("answers" if client.ping() else "gone", client.connection_pool.connection_kwargs["path"])
"""


def _need_redis_server() -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is required in CI (make test installs it)")
        pytest.skip("redis-server not installed (apt-get install redis-server)")


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting to be reaped is not)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    return fields[0] != "Z"


def _group(pgid: int) -> list[int]:
    """Live processes of process group ``pgid``, as ``ps`` lists them."""
    out = subprocess.run(["ps", "-eo", "pid=,pgid=,stat="], capture_output=True, text=True)
    rows = [line.split() for line in out.stdout.splitlines() if line.strip()]
    return [int(pid) for pid, group, st in rows if int(group) == pgid and not st.startswith("Z")]


def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f}s: {what}")
        time.sleep(0.2)


@dataclass
class Local:
    """One user's machine: its HOME and cache dir, and compileq run there."""

    home: Path
    tmp: Path

    @property
    def root(self) -> Path:
        return self.home / "xdg" / "compileq" / "local"

    def env(self, **more: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COMPILEQ_", "TRITON_", "TORCHINDUCTOR_"))
        }
        env.update(HOME=str(self.home), XDG_CACHE_HOME=str(self.home / "xdg"))
        env.update(PYTHONUNBUFFERED="1", **more)
        return env

    def cli(self, *args: str, check: bool = True, **more: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            compileq_cmd(*args), env=self.env(**more), capture_output=True, text=True, timeout=900
        )
        if check:
            assert proc.returncode == 0, f"compileq {args[0]}: {proc.stderr[-4000:]}"
        return proc

    def run_script(self, name: str) -> subprocess.CompletedProcess[str]:
        """``compileq run -- python SCRIPT`` on empty Inductor and Triton dirs (a new machine's).

        The one setting: a deadline of 10 minutes. On a 2-core machine under load, a fresh
        worker's first graph (its precompiled C++ header included) took over 3 minutes, and
        at the default 60 s the client rightly compiled it itself."""
        script = self.tmp / "train.py"
        script.write_text(SCRIPT)
        dirs = self.tmp / name
        return self.cli(
            "run",
            "--",
            sys.executable,
            str(script),
            TORCHINDUCTOR_CACHE_DIR=str(dirs / "inductor"),
            TRITON_CACHE_DIR=str(dirs / "triton"),
            COMPILEQ_DEADLINE_S=LOADED_DEADLINE_S,
        )

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = json.loads(self.cli("stats", "--json").stdout.splitlines()[-1])
        return stats

    def record(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads((self.root / "cluster.json").read_text())
        return record

    def pids(self) -> list[int]:
        """Every live process of the cluster: the daemon's group (with redis-server) and the
        worker's (its supervisor and pool)."""
        record = self.record()
        return sorted({*_group(record["daemon"]["pid"]), *_group(record["worker"]["pid"])})


@pytest.fixture
def local(tmp_path: Path) -> Iterator[Local]:
    _need_redis_server()
    machine = Local(tmp_path / "home", tmp_path)
    machine.home.mkdir()
    yield machine
    machine.cli("stop", check=False)


@pytest.mark.release
def test_a_script_run_with_no_settings_has_its_graphs_generated_by_a_local_worker_and_hit_next_time(
    local: Local,
) -> None:
    first = local.run_script("first")
    assert "local cluster ready" in first.stderr, first.stderr[-3000:]
    loss = json.loads(first.stdout.splitlines()[-1])["loss"]
    after_first = local.stats()  # `compileq stats` with no settings: the local cluster's
    # Both graphs (forward and backward) were generated by the local cluster's worker.
    assert after_first["fx_remote_compiles"] == 2, after_first
    assert after_first["fx_local_compiles"] == 0 and after_first["fallbacks"] == 0
    assert after_first["workers"] == 1

    # This user's alone: a 0700 dir, a socket only its owner may open, a 0600 secret.
    assert stat.S_IMODE(local.root.stat().st_mode) == 0o700
    socket = Path(local.record()["socket"])
    assert stat.S_ISSOCK(socket.stat().st_mode) and stat.S_IMODE(socket.stat().st_mode) == 0o700
    assert stat.S_IMODE((local.root / "secret").stat().st_mode) == 0o600
    redis_pid = local.record()["redis"]["pid"]
    assert redis.Redis(unix_socket_path=str(socket)).config_get("port") == {"port": "0"}

    # A second run in a fresh process on new local dirs joins the same cluster and hits
    # everything: nothing is generated or built, anywhere.
    second = local.run_script("second")
    assert "starting the local cluster" not in second.stderr
    assert json.loads(second.stdout.splitlines()[-1])["loss"] == loss
    after = local.stats()
    assert {c: after[c] for c in COMPILES} == {c: after_first[c] for c in COMPILES}
    assert after["fx_hits"] - after_first["fx_hits"] == 2
    assert after["kernel_local_compiles"] == after_first["kernel_local_compiles"]
    assert after["fallbacks"] == 0 and local.record()["redis"]["pid"] == redis_pid

    # `compileq stop` ends it now and leaves no process behind.
    pids = local.pids()
    assert redis_pid in pids and len(pids) >= 3  # daemon, redis-server, worker (and its pool)
    assert "local cluster stopped" in local.cli("stop").stdout
    assert not [pid for pid in pids if _running(pid)]
    assert not socket.exists() and not (local.root / "cluster.json").exists()
    gone = local.cli("stats", check=False)
    assert gone.returncode == 2 and "no local cluster is running" in gone.stderr


def test_two_runs_started_together_share_one_local_cluster_which_stops_itself_once_idle(
    local: Local,
) -> None:
    job = local.tmp / "long_job.py"
    job.write_text(LONG_JOB)
    runs = [
        subprocess.Popen(
            compileq_cmd("run", "--", sys.executable, str(job), "10"),
            env=local.env(COMPILEQ_LOCAL_IDLE_S="3"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        # While their jobs run (10 s each after the cluster is ready): one cluster, one
        # redis-server, one daemon.
        ready = lambda: (local.root / "cluster.json").exists() and local.record().get("ready")  # noqa: E731
        _wait_for(ready, 900, "the local cluster ready")
        record = local.record()
        servers = subprocess.run(
            ["pgrep", "-f", f"redis-server unixsocket:{record['socket']}"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert servers == [str(record["redis"]["pid"])]
        pids = local.pids()
        daemons = [p for p in pids if b"local.daemon" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert daemons == [record["daemon"]["pid"]]
    finally:
        outputs = [run.communicate(timeout=900) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    # One of them started it, the other joined; both jobs, outliving the idle time three
    # times over, found it answering to the end.
    assert sum("starting the local cluster" in err for _, err in outputs) == 1, outputs
    assert [out.split() for out, _ in outputs] == [["answers", record["socket"]]] * 2

    # Then, with no job, it stops by itself and leaves nothing behind.
    _wait_for(lambda: not (local.root / "cluster.json").exists(), 120, "the idle cluster stopped")
    _wait_for(lambda: not [p for p in pids if _running(p)], 60, "every process gone")
    assert "no job for 3s: stopping" in (local.root / "daemon.log").read_text()
    assert not Path(record["socket"]).exists()


def test_a_local_cluster_killed_with_sigkill_is_recovered_by_the_next_run(local: Local) -> None:
    noop = [sys.executable, "-c", "pass"]
    local.cli("run", "--", *noop)
    killed = local.record()
    old = local.pids()
    for name in ("daemon", "redis"):
        os.kill(killed[name]["pid"], signal.SIGKILL)
    _wait_for(lambda: not _running(killed["redis"]["pid"]), 30, "redis-server gone")
    socket = Path(killed["socket"])
    assert socket.exists() and (local.root / "cluster.json").exists()  # both stale now
    # Meanwhile the dead daemon's pid went to an unrelated process: it must be left alone.
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        stale = {**killed, "daemon": {"pid": bystander.pid, "start": 1}}
        (local.root / "cluster.json").write_text(json.dumps(stale))

        again = local.cli(
            "run", "--", sys.executable, "-c", "import os; print(os.environ['COMPILEQ_REDIS_URL'])"
        )
        assert "recovered from a local cluster that was killed" in again.stderr, again.stderr
        assert again.stdout.strip() == f"unix://{socket}?db=0"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
    fresh = local.record()
    assert fresh["ready"] and fresh["redis"]["pid"] != killed["redis"]["pid"]
    assert not [pid for pid in old if _running(pid)]  # the old worker went with its daemon
    assert local.stats()["workers"] == 1


def test_without_redis_server_a_run_says_how_to_get_it_and_runs_as_stock(local: Local) -> None:
    bare = local.tmp / "bin"
    bare.mkdir()  # a PATH with no redis-server on it
    show = "import os; print(os.environ.get('COMPILEQ_ENABLED'))"
    run = local.cli("run", "--", sys.executable, "-c", show, PATH=str(bare))
    assert run.stdout.strip() == "0"  # compileq off: the job ran as stock
    [line] = [line for line in run.stderr.splitlines() if "redis-server" in line]
    assert "apt-get install redis-server" in line and "runs without compileq" in line
