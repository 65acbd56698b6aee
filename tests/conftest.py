"""Real components for the tests: a private redis-server and real compileq workers.

Nothing is mocked. Without a redis-server binary the tests that need one are skipped locally
and fail in CI (CI=true), where `make test` installs it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import redis

from compileq import keys, localstack
from compileq.cache.counters import COUNTER_KEYS, reset_counters
from compileq.config import Settings
from compileq.localstack import RedisServer, stop
from tests import compiler_cache

#: The `reliability` fixture and `--reliability-report` (docs/RELIABILITY.md).
pytest_plugins = ("tests.reliability",)

FIXTURES = Path(__file__).parent / "fixtures"
CLIENTS = Path(__file__).parent / "clients"
INDUCTOR_CLIENT = CLIENTS / "inductor_client.py"
LOAD_CLIENT = CLIENTS / "load_client.py"
SECRET = "test-secret-" + "x" * 20


#: Modules whose tests take minutes on the 2-core CI machine, heaviest first (their summed
#: durations under ``make test``). They run first: in name order they came last
#: (test_training_configs, test_user_scripts), and one pytest process ran them alone while the
#: other had finished. Ordering by measured time instead (pytest's cache) was rejected: CI
#: starts from a fresh clone and has no cache. A module not listed keeps its place after these.
LONG_FIRST = (
    "test_training_configs",
    "test_user_scripts",
    "test_deferred",
    "test_profiles",
    "test_chaos",
    "test_demo",
    "test_load",
    "test_ddp_aot",
    "test_lease_keeper",
    "test_broker",
    "test_stack",
    "test_fx_remote",
    "test_fx_failures",
    "test_cluster",
    "test_local_cluster",
    "test_poisoning",
    "test_poisoning_availability",
    "test_sentinel",
    "test_speculative",
    "test_partition",
    "test_cpp_fanout",
    "test_faults",
    "test_graph_cache",
    # Then the modules of half a minute or more: listed, or the last in name order
    # (test_workers, test_wrong_secret) ran on one process for a minute after the other had
    # finished (47 s apart, the 2-core machine). Short tests, test_cli_input's 81 above all,
    # are what is left for the end, where they even out the two processes' last minutes.
    "test_bench",
    "test_metrics_progress",
    "test_poisoning_starvation",
    "test_fingerprint",
    "test_explain",
    "test_doctor",
    "test_ops_junk",
    "test_workers",
    "test_security",
    "test_wrong_secret",
    "test_inductor_hook",
    "test_triton_modules",
    "test_triton_binaries",
    "test_worker_cpu_only",
    "test_outage_graphs",
    "test_gc_window",
)


#: Modules whose tests run in one pytest process, by group: the Docker ones (one process builds
#: the images, and no two compose stacks or Slurm clusters fight for the 2 cores at once), and
#: the ones whose tests share a set-up (a cold job, a filled cache, a Sentinel cluster), which
#: each process running one of their tests would otherwise set up again: test_ddp_aot's cold
#: DDP job alone is a minute and a half of the 2-core machine. ``filled_cache`` is the
#: session's, used by two modules. Every other test goes to whichever process is free.
#: Rejected: pytest-xdist's own ``--dist loadgroup`` and ``xdist_group`` marks, which pytest
#: 9.2 silently defeats (xdist 3.8 renames a test's ``_nodeid``; pytest 9.2 reads its ``_id``):
#: the marks were there, and the tests still ran on both processes.
ONE_PROCESS = {
    "test_stack": "docker",
    "test_slurm": "docker",
    "test_poisoning": "filled_cache",
    "test_poisoning_availability": "filled_cache",
    "test_ddp_aot": "test_ddp_aot",
    "test_profiles": "test_profiles",
    "test_fx_remote": "test_fx_remote",
    "test_cpp_fanout": "test_cpp_fanout",
    "test_sentinel": "test_sentinel",
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test``'s scheduler: xdist's by scope, a scope being a group of ONE_PROCESS or a
    single test, taken in collection order (LONG_FIRST)."""
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            stem = Path(nodeid.split("::", 1)[0]).stem
            return ONE_PROCESS.get(stem, nodeid)

    config.option.loadscopereorder = False  # collection order: the longest modules first
    return Grouped(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A stable sort: each module's tests stay together and in their order, so a module-scoped
    # fixture (a shared cold job) is still set up once per pytest process.
    rank = {name: i for i, name in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


#: ``COMPILEQ_TEST_CPU_LOG=FILE``: each test's wall time and the CPU seconds of its pytest
#: process and of the processes it started and reaped (clients, workers, redis-servers), one
#: JSON line per test. A process is counted when it is reaped: a session fixture's worker
#: lands on the test whose teardown stops it (the last of its pytest process), and a
#: daemon (the local cluster, dockerd) on none. For the whole machine, process accounting
#: (Debian's acct) tells more, and each line's ``pid`` and ``end`` let its records be
#: matched to tests.
_CPU_LOG = os.environ.get("COMPILEQ_TEST_CPU_LOG")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not _CPU_LOG:
        yield
        return
    import resource

    def cpu() -> tuple[float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime

    wall, (own, children) = time.monotonic(), cpu()
    yield
    wall, (own_after, children_after) = time.monotonic() - wall, cpu()
    line = {
        "test": item.nodeid,
        "wall": round(wall, 2),
        "own": round(own_after - own, 2),
        "children": round(children_after - children, 2),
        # Which pytest process ran it and when it ended: process accounting's records (pid,
        # parent, start time) then say which processes each test started.
        "pid": os.getpid(),
        "end": round(time.time(), 1),
    }
    with open(_CPU_LOG, "a") as log:
        log.write(json.dumps(line) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    """Put the suite's compiler cache (tests/compiler_cache.py) first on every test process's
    PATH. Done once, by the controller (or the only process): pytest-xdist's processes start
    after this and inherit it, so the two share one cache."""
    if os.environ.get("COMPILEQ_TEST_CXX_CACHE") == "0" or compiler_cache.DIR_VAR in os.environ:
        return
    real = shutil.which("g++")
    if real is None:
        return
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="compileq-suite-cxx-"))
    (root / "bin").mkdir()
    shim = root / "bin" / "g++"
    script = Path(compiler_cache.__file__).resolve()
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "{script}" "{real}" "$@"\n')
    shim.chmod(0o755)
    os.environ[compiler_cache.DIR_VAR] = str(root)
    os.environ["PATH"] = f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    config.stash[_CXX_CACHE] = root


def pytest_unconfigure(config: pytest.Config) -> None:
    root = config.stash.get(_CXX_CACHE, None)
    if root is not None:
        log = root / "log"
        if log.exists():
            words = log.read_text().split()
            print(f"\ncompiler cache: {words.count('hit')} hits, {words.count('miss')} builds")
        shutil.rmtree(root, ignore_errors=True)


_CXX_CACHE = pytest.StashKey[Path]()


def start_redis(workdir: Path) -> RedisServer:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is required in CI (make test installs it)")
        pytest.skip("redis-server not installed (apt-get install redis-server)")
    return localstack.start_redis(workdir)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis"))
    yield server
    stop(server.process)


@dataclass
class Env:
    """The environment of one compileq process (a client or a worker)."""

    redis_url: str
    home: Path
    extra: dict[str, str] = field(default_factory=dict)

    def vars(self, **more: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("COMPILEQ_", "TRITON_", "TORCHINDUCTOR_"))
        }
        env.update(
            COMPILEQ_REDIS_URL=self.redis_url,
            COMPILEQ_SECRET=SECRET,
            COMPILEQ_HEARTBEAT_INTERVAL_S="0.5",
            COMPILEQ_HEARTBEAT_TTL_S="3",
            # Shared across the session so the toolchain memo is computed once.
            XDG_CACHE_HOME=str(self.home / "xdg"),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra)
        env.update(more)
        return env


@pytest.fixture(scope="session")
def session_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="session")
def env(redis_server: RedisServer, session_home: Path) -> Env:
    return Env(redis_server.url(0), session_home)


@pytest.fixture
def settings(env: Env) -> Settings:
    return Settings(redis_url=env.redis_url, secret=SECRET)


@pytest.fixture
def installed(settings: Settings) -> Iterator[Any]:
    """compileq installed in this process (its ``CompileqPool``); uninstalled after, with
    Inductor's own process pool put back."""
    from torch._inductor.async_compile import AsyncCompile

    import compileq
    from compileq.features import installed_pool

    original = AsyncCompile.__dict__["process_pool"]
    assert compileq.install(settings)
    pool = installed_pool()
    assert pool is not None
    try:
        yield pool
    finally:
        compileq.uninstall()
        assert AsyncCompile.__dict__["process_pool"] is original


def compileq_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "compileq.cli", *args]


@dataclass
class Worker:
    process: subprocess.Popen[bytes]
    log: Path
    metrics_port: int | None = None
    #: Where it writes what each graph's codegen was given (``COMPILEQ_CODEGEN_DUMP_DIR``).
    codegen_dumps: Path | None = None


#: What every test's worker is unless it says otherwise: cross-compiling for an H100, no GPU.
CPU_ONLY = ("--cpu-only", "--arch", "sm_90")


def start_worker(
    env: Env,
    logdir: Path,
    *args: str,
    device: Sequence[str] = CPU_ONLY,
    extra_env: dict[str, str] | None = None,
) -> Worker:
    log = logdir / f"worker-{time.monotonic_ns()}.log"
    settings = Settings(redis_url=env.redis_url, secret=SECRET)
    # Its own Inductor cache too: the default (/tmp/torchinductor_<user>) outlives the session,
    # and objects found there are shared, not compiled, which tests counting compiles must see.
    worker_env = env.vars(
        TRITON_CACHE_DIR=str(logdir / "worker-triton"),
        TORCHINDUCTOR_CACHE_DIR=str(logdir / "worker-inductor"),
        **(extra_env or {}),
    )
    argv = [*device, "--concurrency", "2", *args]
    return Worker(localstack.start_worker(settings, argv, log, env=worker_env), log)


def stop_worker(worker: Worker) -> None:
    stop(worker.process)


@pytest.fixture(scope="session")
def worker(env: Env, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    # With a metrics endpoint: a test scrapes it instead of paying for a worker of its own.
    port = localstack.free_port()
    # And writing what each codegen was given: a test reads it instead of starting its own.
    logdir = tmp_path_factory.mktemp("worker")
    dumps = {"COMPILEQ_CODEGEN_DUMP_DIR": str(logdir / "codegen-dumps")}
    w = start_worker(env, logdir, "--metrics-port", str(port), extra_env=dumps)
    w.metrics_port, w.codegen_dumps = port, logdir / "codegen-dumps"
    yield w
    stop_worker(w)


#: What wipe_cache drops by prefix (then the misses list, and the counters as `compileq stats
#: --reset` does); snapshot_cache saves the same.
_CACHE_PATTERNS = (keys.ARTIFACT, keys.LOCK, keys.JOB, keys.META, keys.SIBLINGS)


#: This CPU's vector-ISA verdicts (inductor/cpp_cache.py): the same for every test of a
#: session, so wipe_cache keeps them. Dropped, each cold test's first client probed the CPU
#: again: two C++ compiles and two Python processes importing torch, 5 s of CPU and 8 s of a
#: 2-core machine's wall time, in some 45 tests.
KEPT_VERDICTS = keys.artifact("isa", "").encode()


def wipe_cache(client: redis.Redis, *, everything: bool = False) -> None:
    """Drop artifacts (graphs' failure verdicts and their index too), leases, jobs, counters
    and records; workers' heartbeats are kept, and the CPU's vector-ISA verdicts unless
    ``everything`` (a test that counts every entry, or needs a client to probe its CPU)."""
    for pattern in _CACHE_PATTERNS:
        for key in client.scan_iter(match=pattern + "*"):
            if everything or not key.startswith(KEPT_VERDICTS):
                client.delete(key)
    client.delete(keys.MISSES, keys.FX_FAILURES)
    # The same reset as `compileq stats --reset`, so a counter added there is wiped here too.
    reset_counters(client)


#: A cache's state as Redis holds it: each key's DUMP and its remaining life (ms, 0 = none).
CacheSnapshot = dict[bytes, tuple[bytes, int]]


def snapshot_cache(client: redis.Redis) -> CacheSnapshot:
    """The cache's whole state (what wipe_cache drops), for restore_cache: a module's tests
    that each need the same cold job run it once, then each starts from what it left."""
    names = [k for p in (*_CACHE_PATTERNS, keys.SLOW) for k in client.scan_iter(match=p + "*")]
    names += [k.encode() for k in (keys.MISSES, keys.FX_FAILURES, *COUNTER_KEYS)]
    snapshot: CacheSnapshot = {}
    for name in names:
        dumped, ttl = client.dump(name), client.pttl(name)
        if dumped is not None and ttl != -2:
            snapshot[name] = (dumped, max(ttl, 0))
    return snapshot


def restore_cache(client: redis.Redis, snapshot: CacheSnapshot) -> None:
    """Exactly the state ``snapshot`` saw: the cache wiped, then its keys (counters included)
    written back with their remaining lives."""
    wipe_cache(client)
    for name, (dumped, ttl) in snapshot.items():
        client.restore(name, ttl, dumped, replace=True)


@pytest.fixture(scope="session")
def filled_cache(
    env: Env, worker: Worker, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> CacheSnapshot:
    """A cold cluster filled once for the poisoning tests: the GPT head's kernels warmed, then a
    compiled training step's graphs and C++ objects (tests/test_fx_remote.py's TINY client).
    Each test that starts from it restores it (restore_cache) instead of filling it again."""
    from tests.test_fx_remote import TINY, run_client

    client = redis_server.client()
    wipe_cache(client)
    tmp = tmp_path_factory.mktemp("filled")
    warm_json(env, FIXTURES / "gpt_head.jsonl", tmp / "fill")
    assert run_client(env, tmp, "fill-graphs", TINY).result["matches_eager"] is True
    return snapshot_cache(client)


@pytest.fixture
def clean_cache(redis_server: RedisServer) -> redis.Redis:
    """An empty cache (artifacts, leases, jobs, counters, records) but for the CPU's vector-ISA
    verdicts; workers' heartbeats are kept."""
    client = redis_server.client()
    wipe_cache(client)
    return client


@pytest.fixture
def empty_cache(redis_server: RedisServer) -> redis.Redis:
    """clean_cache without the vector-ISA verdicts either: nothing under an entry's key."""
    client = redis_server.client()
    wipe_cache(client, everything=True)
    return client


def run_cli(
    env: Env, *args: str, tmp: Path, check: bool = True, timeout: float = 300, **more: str
) -> subprocess.CompletedProcess[str]:
    """Run ``compileq ARGS`` as a fresh process with its own empty Inductor/Triton cache dirs."""
    tag = str(time.monotonic_ns())
    proc = subprocess.run(
        compileq_cmd(*args),
        env=env.vars(
            TRITON_CACHE_DIR=str(tmp / f"triton-{tag}"),
            TORCHINDUCTOR_CACHE_DIR=str(tmp / f"inductor-{tag}"),
            **more,
        ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"compileq {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
        )
    return proc


def client_json(
    env: Env, script: Path, *args: str, caches: Path
) -> tuple[dict[str, Any], subprocess.CompletedProcess[str]]:
    """Run ``python SCRIPT ARGS`` as a fresh process with empty Triton/Inductor cache dirs
    under ``caches``; the JSON object it printed last, and the process."""
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        env=env.vars(
            TRITON_CACHE_DIR=str(caches / "triton"),
            TORCHINDUCTOR_CACHE_DIR=str(caches / "inductor"),
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc


def warm_json(env: Env, manifest: Path, tmp: Path, **more: str) -> dict[str, float]:
    proc = run_cli(env, "warm", str(manifest), "--json", tmp=tmp, **more)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def stats(env: Env, tmp: Path) -> dict[str, Any]:
    """What ``compileq stats --json`` prints: counters (ints), and the nested tables (queues,
    slowest). ``tmp``: where the command's own dirs would go (unused here).

    Read in this process, by the function that command prints (``cache.stats.snapshot``),
    with the settings the command reads from ``env``'s variables. Rejected: the command itself
    each time, a fresh process costing 0.7-0.8 s of CPU for each of the suite's ~150 reads on
    the CPU-bound 2-core machine. The command is run by test_stats_table (which checks it
    prints what this returns), test_explain and test_cli_input."""
    del tmp
    from unittest import mock

    from compileq.cache.stats import snapshot
    from compileq.cache.store import RedisStore
    from compileq.config import load_settings
    from compileq.connect import redis_client

    with mock.patch.dict(os.environ, env.vars(), clear=True):  # the command's environment
        settings = load_settings()
    client = redis_client(settings.redis_url, settings)
    try:
        values = snapshot(RedisStore(client, settings), settings)
    finally:
        client.close()
    return json.loads(json.dumps(values))  # as the command prints it: JSON's types


def manifest_rows(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class StampedLines:
    """A pipe's lines, each with the wall-clock time it arrived (read on a thread of its own)."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            self.lines.append((time.time(), line))

    def text(self, timeout: float = 30) -> str:
        self._thread.join(timeout)
        return "".join(line for _, line in self.lines)

    def first(self, needle: str) -> float | None:
        return next((t for t, line in self.lines if needle in line), None)
