"""A Slurm cluster for real: Debian's slurmctld, slurmd and munge in containers (a controller that
is also the login node, and CPU nodes c1..c5, each with its own hostname), the two Redis outside
Slurm, and deploy/slurm/'s scripts submitted with sbatch as docs/DEPLOY.md says.

A standing pool (workers-cpu.sbatch) builds; a 2-node training job (torchrun over gloo with a c10d
rendezvous, the model defined in the script) fills the cache; the same job on two other nodes,
whose local Inductor caches are empty, is served from it. Marked slow: `make test-all` runs it
(skipped only where Docker cannot run, and failing there under CI=true, like
tests/test_stack.py).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.docker_engine import STACK, build_images, json_line, require_docker

#: The walkthrough on its six containers: three minutes of a 2-core machine, so `make test-all`
#: runs it, not CI (`make test`). CI keeps the compose stack's containers (tests/test_stack.py),
#: and the last test here, which holds DEPLOY.md to these commands.
walkthrough = pytest.mark.slow

ROOT = Path(__file__).parents[1]
CLUSTER = ROOT / "docker" / "slurm" / "compose.yml"
DEPLOY_MD = ROOT / "docs" / "DEPLOY.md"
NODES = ("c1", "c2", "c3", "c4", "c5")

# The walkthrough of docs/DEPLOY.md, command for command (the last test checks it is there).
# As alice on the login node, from the checkout's root in her home:
SECRET = "openssl rand -hex 32 > ~/.compileq-secret && chmod 600 ~/.compileq-secret"
URLS = (
    "export COMPILEQ_BROKER_URL=redis://compileq-broker:6379/0"
    " COMPILEQ_REDIS_URL=redis://compileq-cache:6379/0"
)
POOL = "sbatch --nodes 1 --cpus-per-task 2 deploy/slurm/workers-cpu.sbatch"
STATS = "source deploy/slurm/env.sh && compileq stats --json"
TRAIN = (
    "COMPILEQ_JOB_WORKERS=0 sbatch --wait --nodes 2 --gpus-per-node 0"
    " deploy/slurm/train.sbatch examples/llama_script.py --steps 2 --layers 1"
)
# The pool holds c1 whole (2 CPUs of 2), so Slurm gives the first job c2 and c3: these are
# two other nodes, whose /tmp (Inductor's and Triton's caches) never saw the model.
TRAIN_ELSEWHERE = TRAIN.replace("--gpus-per-node 0", "--gpus-per-node 0 --exclude c2,c3")
STOP_POOL = "scancel --name compileq-workers-cpu"
#: A pool's stop this slow gets its worker's threads dumped into the job's output.
SLOW_STOP_S = 12
DUMP_WORKER_THREADS = (
    "import os\n"
    "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
    "    try:\n"
    "        argv = open(f'/proc/{pid}/cmdline', 'rb').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    if b'compileq.workers.process' in argv:\n"
    "        os.kill(int(pid), 12)  # SIGUSR2\n"
)
# As root on the controller (jobcomp/filetxt's records; docker/slurm/slurm.conf says why).
SACCT = "sacct --completion --format=JobID,JobName,NodeList,State,ExitCode --parsable2 --noheader"


@dataclass
class Cluster:
    project: str
    env: dict[str, str]
    #: The host's side of /home/alice, the home every node mounts.
    home: Path
    #: The controller's container, also the login node (known once the cluster is up).
    controller: str = ""

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        command = [str(STACK), "compose", "-f", str(CLUSTER), "-p", self.project, *args]
        return subprocess.run(
            command, env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    def shell(
        self, script: str, *, user: str = "alice", timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """``script`` in bash on the login node, from the checkout's root, the URLs exported."""
        command = ["docker", "exec", "-u", user, "-w", "/home/alice/compileq", self.controller]
        return subprocess.run(
            [*command, "bash", "-c", f"set -e\n{URLS}\n{script}"],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def ok(self, script: str, *, user: str = "alice", timeout: float = 300) -> str:
        proc = self.shell(script, user=user, timeout=timeout)
        assert proc.returncode == 0, f"{script}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        return proc.stdout

    def node(self, host: str, python: str) -> subprocess.CompletedProcess[str]:
        """``python`` run as root on node ``host`` (its container), by compileq's Python."""
        container = self.compose("ps", "-q", host).stdout.strip()
        return subprocess.run(
            ["docker", "exec", container, "/opt/compileq/bin/python", "-c", python],
            capture_output=True,
            text=True,
            timeout=60,
        )

    def output(self, job: str) -> str:
        """The job's slurm-<id>.out, written where it was submitted (the shared home)."""
        path = self.home / "compileq" / f"slurm-{job}.out"
        return path.read_text(errors="replace") if path.exists() else "(no output file)"

    def stats(self) -> dict[str, Any]:
        return json_line(self.ok(STATS))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    require_docker("the Slurm test")
    build_images("build-slurm")
    home = tmp_path_factory.mktemp("slurm-home")
    key = tmp_path_factory.mktemp("slurm-munge") / "munge.key"
    key.write_bytes(os.urandom(1024))  # one key for the whole cluster, made for this run only
    env = {**os.environ, "COMPILEQ_SLURM_HOME": str(home), "COMPILEQ_MUNGE_KEY": str(key)}
    cluster = Cluster(f"compileq-slurm-{os.getpid()}", env, home)
    try:
        up = cluster.compose("up", "-d")
        assert up.returncode == 0, up.stderr[-4000:]
        cluster.controller = cluster.compose("ps", "-q", "slurmctld").stdout.strip()
        # The user's checkout on the shared filesystem: the scripts and the training script.
        for part in ("deploy", "examples"):
            shutil.copytree(
                ROOT / part,
                home / "compileq" / part,
                ignore=shutil.ignore_patterns("__pycache__"),
            )
        cluster.ok("chown -R alice: /home/alice", user="root")
        deadline = time.monotonic() + 120
        while True:
            states = cluster.shell("sinfo --noheader --Node --format '%N %T'").stdout.split()
            if dict(zip(states[::2], states[1::2], strict=True)) == dict.fromkeys(NODES, "idle"):
                break
            if time.monotonic() > deadline:
                logs = cluster.compose("logs", "--tail", "20").stdout
                pytest.fail(f"the nodes never became idle: {states}\n{logs[-4000:]}")
            time.sleep(1)
        yield cluster
    finally:
        cluster.compose("down", "-v", "-t", "10")


@dataclass
class Job:
    id: str
    returncode: int
    #: Each rank's JSON line (examples/llama_script.py prints one per rank).
    ranks: list[dict[str, Any]]


@dataclass
class Observed:
    pool: str
    pool_hosts: list[str]
    before: dict[str, Any]
    first: Job
    after_first: dict[str, Any]
    second: Job
    after_second: dict[str, Any]
    #: sacct's records by job id: name, node list, state, exit code.
    sacct: dict[str, tuple[str, str, str, str]]
    #: Seconds from scancel until the pool's job left the queue.
    stop_s: float


def _submitted(stdout: str) -> str:
    line = next(line for line in stdout.splitlines() if line.startswith("Submitted batch job"))
    return line.split()[-1]


def _train(cluster: Cluster, command: str) -> Job:
    proc = cluster.shell(command, timeout=600)
    job = _submitted(proc.stdout)
    output = cluster.output(job)
    ranks = [json.loads(line) for line in output.splitlines() if line.startswith('{"rank"')]
    return Job(job, proc.returncode, sorted(ranks, key=lambda r: int(r["rank"])))


@pytest.fixture(scope="module")
def observed(cluster: Cluster) -> Observed:
    """The walkthrough, run once: the pool, a training job, the same job on two other nodes."""
    cluster.ok(SECRET)
    pool = _submitted(cluster.ok(POOL))
    deadline = time.monotonic() + 240
    while not (before := cluster.stats())["workers"]:
        if time.monotonic() > deadline:
            pytest.fail(f"the pool's worker never came up:\n{cluster.output(pool)[-4000:]}")
        time.sleep(2)
    pool_hosts = [w["host"] for q in before["queues"].values() for w in q["workers"]]
    first = _train(cluster, TRAIN)
    after_first = cluster.stats()
    second = _train(cluster, TRAIN_ELSEWHERE)
    after_second = cluster.stats()
    stopping = time.monotonic()
    cluster.ok(STOP_POOL)
    dumped = False
    while cluster.shell(f"squeue --noheader --jobs {pool}").stdout.strip():
        if time.monotonic() - stopping > 300:
            pytest.fail(f"the pool never stopped:\n{cluster.output(pool)[-4000:]}")
        if not dumped and time.monotonic() - stopping > SLOW_STOP_S:
            # A stop this slow fails the check below: the worker's threads, in its log, say where
            # it is stuck (process.py registers SIGUSR2 with faulthandler).
            for host in pool_hosts:
                cluster.node(host, DUMP_WORKER_THREADS)
            dumped = True
        time.sleep(1)
    stop_s = time.monotonic() - stopping
    records = [line.split("|") for line in cluster.ok(SACCT, user="root").splitlines()]
    sacct = {r[0]: (r[1], r[2], r[3], r[4]) for r in records}
    # Shown with a failure (or under -s): what the cluster did, for the reader of a CI log.
    for name, after, before_job in (
        ("first", after_first, before),
        ("second", after_second, after_first),
    ):
        counts = {k: v for k, v in _delta(after, before_job).items() if v}
        print(f"{name} job: {counts}")
    print("sacct:", *("|".join((job, *rest)) for job, rest in sacct.items()), sep="\n  ")
    return Observed(
        pool, pool_hosts, before, first, after_first, second, after_second, sacct, stop_s
    )


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, int)}


def _show(cluster: Cluster, job: Job) -> str:
    return f"job {job.id} (exit {job.returncode}):\n{cluster.output(job.id)[-3000:]}"


@walkthrough
def test_the_standing_pool_runs_one_worker_on_the_node_slurm_gave_it(
    observed: Observed,
) -> None:
    assert observed.before["workers"] == 1
    # Every queue of the worker (FX graphs for this CPU, Triton kernels for sm_90) names c1.
    assert set(observed.pool_hosts) == {"c1"}
    assert observed.sacct[observed.pool][:2] == ("compileq-workers-cpu", "c1")


@walkthrough
def test_a_two_node_training_job_over_gloo_completes_and_its_builds_run_on_the_pool(
    cluster: Cluster, observed: Observed
) -> None:
    job = observed.first
    assert job.returncode == 0, _show(cluster, job)  # sbatch --wait exits as the job did
    # One torchrun per node, one process each: a world of 2 ranks, which DDP kept in step.
    assert [r["rank"] for r in job.ranks] == [0, 1], _show(cluster, job)
    assert all(r["matches_eager"] and r["compileq"] and r["device"] == "cpu" for r in job.ranks)
    assert observed.sacct[job.id] == ("compileq-train", "c[2-3]", "COMPLETED", "0:0")
    delta = _delta(observed.after_first, observed.before)
    assert delta["fx_remote_compiles"] > 0 and delta["cpp_remote_compiles"] > 0, delta


@walkthrough
def test_the_same_job_on_two_other_nodes_is_served_from_the_cache_with_no_compile(
    cluster: Cluster, observed: Observed
) -> None:
    job = observed.second
    assert job.returncode == 0, _show(cluster, job)
    assert observed.sacct[job.id] == ("compileq-train", "c[4-5]", "COMPLETED", "0:0")
    assert [r["losses"] for r in job.ranks] == [r["losses"] for r in observed.first.ranks]
    assert all(r["matches_eager"] and r["compileq"] for r in job.ranks)
    delta = _delta(observed.after_second, observed.after_first)
    # Both graphs (forward, backward), their AOTAutograd entries and every C++ kernel come from
    # Redis. A CPU job has no Triton kernels: its kernels are the C++ ones (cpp_hits).
    assert delta["fx_hits"] > 0 and delta["aot_hits"] > 0 and delta["cpp_hits"] > 0, delta
    nothing = {
        k: v for k, v in delta.items() if k.endswith(("_compiles", "_misses")) or k == "fallbacks"
    }
    assert set(nothing.values()) == {0}, delta


@walkthrough
def test_sacct_records_both_jobs_completed_and_the_pool_cancelled(observed: Observed) -> None:
    states = {job: (name, state) for job, (name, _, state, _) in observed.sacct.items()}
    assert states == {
        observed.pool: ("compileq-workers-cpu", "CANCELLED"),
        observed.first.id: ("compileq-train", "COMPLETED"),
        observed.second.id: ("compileq-train", "COMPLETED"),
    }


@walkthrough
def test_scancel_stops_the_pools_worker_gracefully_within_killwait(
    cluster: Cluster, observed: Observed
) -> None:
    # Slurm signals every process of the step (proctrack/linuxproc, as proctrack/cgroup does):
    # the worker's Celery process gets SIGTERM from slurmstepd and again from its supervisor.
    # Until it withdraws its heartbeat, clients keep sending it builds; SIGKILL follows KillWait.
    log = cluster.output(observed.pool)
    assert "heartbeat withdrawn" in log, log[-3000:]
    assert observed.stop_s < 20, (observed.stop_s, log[-3000:])


def test_deploy_md_walks_through_the_commands_this_test_runs() -> None:
    text = DEPLOY_MD.read_text()
    slurm = text[text.index("## Slurm") :]
    for command in (SECRET, URLS, POOL, STATS, TRAIN, TRAIN_ELSEWHERE, STOP_POOL, SACCT):
        assert command in slurm, command
    assert "docker/stack.sh build-slurm" in slurm
