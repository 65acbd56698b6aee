"""FX codegen on a worker (real torch.compile on CPU, a real --cpu-only worker, real Redis)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

import compileq
from compileq import keys
from compileq.cache import liveness
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.localstack import RedisServer
from compileq.tasks.app import COMPILE_FX, client_app
from compileq.tasks.fx_jobs import FX, CodegenState, FxJob
from tests.conftest import Env, Worker, compileq_cmd, stats, wipe_cache
from tests.test_doctor import doctor

CLIENTS = Path(__file__).parent / "clients"
TRAIN = CLIENTS / "train_cpu.py"
COND = CLIENTS / "cond_cpu.py"
TINY = CLIENTS / "tiny_cpu.py"  # where any graph will do: fewer kernels, a shorter suite
POSITIONS = CLIENTS / "positions.py"  # prims ops in its graphs

#: Every counter that grows when graph code is generated or a C++ kernel is compiled.
COMPILES = ("fx_local_compiles", "fx_remote_compiles", "cpp_local_compiles", "cpp_remote_compiles")


@dataclass
class Run:
    result: dict[str, object]
    stderr: str


def run_client(
    env: Env, tmp: Path, name: str, script: Path, *flags: str, args: tuple[str, ...] = ()
) -> Run:
    """``compileq run [FLAGS] -- python SCRIPT [ARGS]``: a fresh process, empty local caches."""
    proc = subprocess.run(
        compileq_cmd("run", *flags, "--", sys.executable, str(script), *args),
        env=env.vars(
            TORCHINDUCTOR_CACHE_DIR=str(tmp / name / "inductor"),
            TRITON_CACHE_DIR=str(tmp / name / "triton"),
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return Run(json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr)


@dataclass
class TwoMachines:
    first: Run
    after_first: dict[str, int]
    second: Run
    after_second: dict[str, int]


@pytest.fixture(scope="module")
def two_machines(
    env: Env, worker: Worker, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> TwoMachines:
    """A cold run with FX on the worker, then a "new machine" (empty local cache dirs).

    Both runs happen here, back to back on a cache emptied first, so that the tests reading
    them hold whatever else ran before or between them.
    """
    tmp = tmp_path_factory.mktemp("fx-two-machines")
    wipe_cache(redis_server.client())
    # A width no other test uses: the worker's own disk cache cannot hold these kernels yet,
    # so its C++ compiler must run, whatever ran before in this session.
    width = (str(random.randrange(65, 1000)),)
    first = run_client(env, tmp, "first", TRAIN, args=width)
    after_first = stats(env, tmp)
    second = run_client(env, tmp, "second", TRAIN, args=width)
    return TwoMachines(first, after_first, second, stats(env, tmp))


@pytest.mark.release
def test_a_model_compiled_through_a_worker_matches_eager_forward_and_backward(
    two_machines: TwoMachines,
) -> None:
    run, counters = two_machines.first, two_machines.after_first
    assert run.result == {**run.result, "matches_eager": True, "compileq": True}
    # Forward and backward graphs were both generated on the worker, none in the client.
    assert counters["fx_remote_compiles"] == 2
    assert counters["fx_local_compiles"] == 0
    # The C++ kernels of that codegen were built on the worker too, and the client loading the
    # output code found them in the store instead of compiling them again. (The client may
    # still compile the CPU's vector-ISA probes if the cache was emptied after the worker
    # shared its own: routing asks which ISAs this CPU has.)
    assert counters["cpp_remote_compiles"] > 0 and counters["cpp_hits"] > 0
    assert counters["fallbacks"] == 0
    assert "compiling the graph in process" not in run.stderr


def test_a_worker_asked_to_writes_what_each_codegen_was_given_under_its_key(
    two_machines: TwoMachines, worker: Worker, redis_server: RedisServer
) -> None:
    """``COMPILEQ_CODEGEN_DUMP_DIR`` (workers/fx_debug.py), set for the session's worker: each
    graph it generated has a readable file under its key, enough to tell two graphs apart."""
    assert worker.codegen_dumps is not None
    built = [k.decode() for k in redis_server.client().scan_iter(match=keys.artifact(FX, "*"))]
    assert len(built) == 2  # the forward and the backward of the first machine
    texts = [(worker.codegen_dumps / f"{k.rsplit(':', 1)[-1][:32]}.txt").read_text() for k in built]
    for key, text in zip(built, texts, strict=True):
        lines = text.splitlines()
        assert lines[0] == f"key {key}"
        assert any(line.startswith("graph_key ") for line in lines)
        assert any(line.startswith("input 0 torch.float32 cpu (") for line in lines), text[:2000]
        assert "def forward(self" in text  # the graph's code
    assert sorted(t.count("graph_kwargs is_backward True") for t in texts) == [0, 1]


def test_a_codegen_profile_is_written_under_the_graphs_key_and_reads_as_one(
    tmp_path: Path,
) -> None:
    import pstats

    from compileq.workers import fx_debug

    key = keys.artifact(FX, "ab" * 32)
    with fx_debug.profiled(str(tmp_path / "profiles"), key):
        sorted(random.random() for _ in range(1000))
    with fx_debug.profiled(None, key):  # off: nothing written, nothing profiled
        pass
    [written] = (tmp_path / "profiles").iterdir()
    assert written.name == "ab" * 16 + ".pstats"
    names = {func[2] for func in pstats.Stats(str(written)).stats}  # type: ignore[attr-defined]
    assert "<genexpr>" in names


@pytest.mark.release
def test_a_new_machine_gets_graphs_and_cpp_kernels_and_compiles_nothing_anywhere(
    two_machines: TwoMachines,
) -> None:
    run, before, after = two_machines.second, two_machines.after_first, two_machines.after_second
    assert run.result == {**run.result, "matches_eager": True, "compileq": True}
    assert after["fx_hits"] - before["fx_hits"] == 2
    assert after["cpp_hits"] > before["cpp_hits"]
    # No codegen and no C++ compiler ran, neither in the client nor on the worker.
    assert {c: after[c] for c in COMPILES} == {c: before[c] for c in COMPILES}
    assert after["fx_misses"] == before["fx_misses"]
    assert after["cpp_misses"] == before["cpp_misses"]
    # It sent nothing, so it never imported Celery (0.28 s of its first compile on 2 cores);
    # the first machine, which sent its graphs, did.
    assert run.result["celery_imported"] is False
    assert two_machines.first.result["celery_imported"] is True


def test_compileq_run_no_fx_compiles_graphs_in_process_even_with_a_live_worker(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    run = run_client(env, tmp_path, "no-fx", TINY, "--no-fx")
    assert run.result["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["fx_local_compiles"] == 2
    assert counters["fx_remote_compiles"] == 0


def test_a_graph_inductor_will_not_serialize_compiles_in_process_and_matches_eager(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # torch.cond is a higher-order op Inductor refuses to pickle for an out-of-process compile.
    run = run_client(env, tmp_path, "cond", COND)
    assert run.result == {**run.result, "matches_eager": True, "compileq": True}
    counters = stats(env, tmp_path)
    assert counters["fx_remote_compiles"] == 0
    assert counters["fallbacks"] == 1  # its one graph (cond takes the branch at run time)
    assert run.stderr.count("Inductor will not serialize a graph") == 1  # logged once
    # Counted under its reason, and doctor names it with what to do about it.
    assert stats(env, tmp_path)["fallback_reasons"] == {"unserializable": 1}
    _, checks, _ = doctor(env, tmp_path)
    assert checks["fallbacks"]["status"] == "warn"
    assert "'unserializable' (1)" in checks["fallbacks"]["detail"]
    assert "torch.cond" in checks["fallbacks"]["hint"]


def test_without_a_live_fx_worker_graphs_compile_in_process_and_it_is_said_once(
    redis_server: RedisServer, session_home: Path, tmp_path: Path
) -> None:
    # A database no worker heartbeats into: the cluster is reachable, but nobody serves FX.
    lonely = Env(redis_server.url(3), session_home)
    wipe_cache(redis_server.client(3))
    run = run_client(lonely, tmp_path, "lonely", TINY)
    assert run.result == {**run.result, "matches_eager": True, "compileq": True}
    counters = stats(lonely, tmp_path)
    assert counters["fx_local_compiles"] == 2 and counters["fx_remote_compiles"] == 0
    assert counters["fallbacks"] >= 2
    assert run.stderr.count("no live worker for FX queue compileq.fx.") == 1
    assert "no live worker builds for cpu-" in run.stderr  # and it says which target


def test_install_with_fx_puts_compileqs_scheme_into_inductor_and_uninstall_restores(
    settings: Settings,
) -> None:
    from torch._inductor import compile_fx, compile_fx_subproc

    from compileq.codegen import remote

    before = (compile_fx.fx_compile_mode, compile_fx_subproc._SubprocessFxCompile)
    assert compileq.install(settings, fx=True)
    try:
        assert remote.active()
        assert compile_fx.fx_compile_mode == compile_fx.FxCompileMode.SUBPROCESS
        assert compile_fx_subproc._SubprocessFxCompile.__name__ == "RemoteFxCompile"
    finally:
        compileq.uninstall()
    assert not remote.active()
    assert (compile_fx.fx_compile_mode, compile_fx_subproc._SubprocessFxCompile) == before


def test_a_worker_refuses_fx_jobs_that_are_unsigned_or_not_what_their_key_says(
    worker: Worker, clean_cache: redis.Redis, settings: Settings
) -> None:
    info = next(i for i in liveness.workers_info(clean_cache) if i["name"] == "cpu")
    (queue,) = [q for q in info["queues"] if q.startswith(keys.FX_QUEUE_PREFIX)]
    target, toolchain = next(iter(info["fx_toolchains"].items()))
    store = RedisStore(clean_cache, settings)
    unsigned = keys.artifact(FX, "1" * 64)
    clean_cache.set(keys.job(unsigned), b"\x80\x04 a pickle nobody signed")
    # Signed, so it is ours, but its content hashes to another key: never generated.
    mislabelled = keys.artifact(FX, "2" * 64)
    job = FxJob(target, toolchain["digest"], b"graph bytes")
    clean_cache.set(keys.job(mislabelled), store.seal(keys.job(mislabelled), job.to_bytes()))
    sender = client_app(settings)
    for key in (unsigned, mislabelled, 123):
        sender.send_task(COMPILE_FX, args=[key], queue=queue)
    deadline = time.monotonic() + 60
    while int(clean_cache.hget(keys.STATS, "rejected_tasks") or 0) < 3:
        assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
        time.sleep(0.2)
    assert int(clean_cache.hget(keys.STATS, "integrity_failures") or 0) == 1
    assert int(clean_cache.hget(keys.STATS, "fx_remote_compiles") or 0) == 0
    assert not list(clean_cache.scan_iter(match=keys.artifact(FX, "*")))


def test_an_fx_job_key_covers_toolchain_target_env_and_graph_and_round_trips() -> None:
    job = FxJob("cpu-avx2", "a" * 20, b"graph", {"ATEN_CPU_CAPABILITY": "avx2"})
    variants = [
        FxJob("cpu-avx512+avx2", job.toolchain, job.pickled_input, job.env),
        FxJob(job.target, "b" * 20, job.pickled_input, job.env),
        FxJob(job.target, job.toolchain, b"graph2", job.env),
        FxJob(job.target, job.toolchain, job.pickled_input, {}),
    ]
    assert len({job.key(), *(v.key() for v in variants)}) == 5
    assert job.key().startswith(keys.artifact(FX, ""))
    assert FxJob.from_bytes(job.to_bytes()) == job
    for bad in (
        b"no header",
        b'{"target": 1, "toolchain": "x"}\nbody',
        b'{"target": "t", "toolchain": "x", "state": {"threads": "2"}}\nbody',
        b'{"target": "t", "toolchain": "x", "graph": 7}\nbody',
    ):
        with pytest.raises(ValueError):
            FxJob.from_bytes(bad)


def test_a_job_with_a_graph_key_is_keyed_by_it_not_by_its_bytes() -> None:
    # Two ranks pickle one graph into different bytes (ids, set order): one key all the same.
    job = FxJob("cpu-avx2", "a" * 20, b"rank0 bytes", graph_key="f" * 64)
    assert FxJob(job.target, job.toolchain, b"rank1 bytes", graph_key=job.graph_key).key() == (
        job.key()
    )
    assert FxJob(job.target, job.toolchain, job.pickled_input, graph_key="e" * 64).key() != (
        job.key()
    )
    # What codegen reads of the client's process is part of what it generates, so of the key.
    threaded = FxJob(
        job.target,
        job.toolchain,
        b"x",
        graph_key=job.graph_key,
        state=CodegenState(threads=8, donated=(0, 2)),
    )
    assert threaded.key() != job.key()
    assert FxJob.from_bytes(threaded.to_bytes()) == threaded


def test_a_graph_whose_job_is_over_the_cap_compiles_in_process_and_says_so_once(
    env: Env, worker: Worker, tmp_path: Path
) -> None:
    before = stats(env, tmp_path)
    proc = subprocess.run(
        # 2 MB of weights and a compiled optimizer step: Inductor pickles that graph with the
        # weights themselves, so its job is over a 1 MiB cap; the two others fit.
        compileq_cmd("run", "--", sys.executable, str(TINY), "65536"),
        env=env.vars(
            COMPILEQ_MAX_ENTRY_BYTES=str(2**20),
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"),
            TRITON_CACHE_DIR=str(tmp_path / "triton"),
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["matches_eager"] is True
    after = stats(env, tmp_path)
    assert after["fx_remote_compiles"] - before["fx_remote_compiles"] == 2  # forward, backward
    assert after["fx_local_compiles"] - before["fx_local_compiles"] == 1  # the optimizer step
    assert after["fallbacks"] - before["fallbacks"] == 1
    assert proc.stderr.count("over the cap") == 1


def test_a_graph_with_prims_ops_from_arange_is_generated_on_the_worker(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # torch.arange reaches Inductor as prims.iota, which Inductor's cache pickler refuses; the
    # GPT of the benchmark fell back to in-process codegen on the GPU because of it.
    run = run_client(env, tmp_path, "positions", POSITIONS)
    assert run.result == {**run.result, "matches_eager": True, "compileq": True}
    counters = stats(env, tmp_path)
    assert counters["fx_remote_compiles"] == 2 and counters["fx_local_compiles"] == 0
    assert counters["fallbacks"] == 0


def test_waiting_for_a_graph_ignores_other_builds_announced_meanwhile(
    clean_cache: redis.Redis, settings: Settings
) -> None:
    # On the GPU the worker's codegen builds dozens of kernels while the client waits, each
    # announced on the channel the client listens to. One arriving when the client was due to
    # poll was once taken for "output missing", and the graph was compiled twice.
    import threading

    from compileq.scheduler import roundtrip
    from compileq.tasks import events

    store = RedisStore(clean_cache, settings)
    key = keys.artifact(FX, "9" * 64)
    watcher = roundtrip.Watcher(store, connect_timeout_s=1)

    def worker_side() -> None:
        for i in range(40):  # 2 s of other kernels' announcements, past the client's poll
            events.announce(clean_cache, events.Done(keys.artifact("triton", f"{i:064d}"), True))
            time.sleep(0.05)
        store.put(key, b"the graph's output")
        events.announce(clean_cache, events.Done(key, True))

    announcer = threading.Thread(target=worker_side)
    announcer.start()
    try:
        waited = watcher.wait([key], time.monotonic() + 30)
        assert waited.found[key].payload() == b"the graph's output"
        assert (waited.lost, waited.failed, waited.late) == ([], {}, [])
    finally:
        announcer.join()
        watcher.close()
