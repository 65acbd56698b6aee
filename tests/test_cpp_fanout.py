"""C++ objects built by workers (issue 15, item 3): real Inductor builds, a real worker."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import redis

from compileq import keys
from compileq.cache import meta
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.fingerprint import cpp_toolchain
from compileq.tasks.cpp_jobs import KIND, CppJob, Unportable, fill, machine_dirs
from compileq.tasks.queues import cpp_queue
from tests.conftest import Env, Worker, client_json, compileq_cmd, stats

TRAIN = Path(__file__).parent / "clients" / "train_cpu.py"
CODEGEN = Path(__file__).parent / "clients" / "codegen_cpp.py"


def run_training(env: Env, tmp: Path, name: str, width: int, **more: str) -> dict[str, Any]:
    """``compileq run --no-fx``: the client generates its graphs itself, so every C++ object
    is its build to make (fresh process, empty local cache dirs)."""
    proc = subprocess.run(
        compileq_cmd("run", "--no-fx", "--", sys.executable, str(TRAIN), str(width)),
        env=env.vars(
            TORCHINDUCTOR_CACHE_DIR=str(tmp / name / "inductor"),
            TRITON_CACHE_DIR=str(tmp / name / "triton"),
            TMPDIR=str(tmp / name),  # where Inductor makes its precompiled header
            **more,
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def precompiled_headers(machine: Path) -> list[Path]:
    return list(machine.rglob("*.h.gch"))


def objects_on(machine: Path) -> set[str]:
    """The C++ objects in this "machine"'s Inductor cache dir, by name: whatever built them."""
    return {p.name for p in (machine / "inductor").rglob("*.so")}


def graph_objects(machine: Path) -> set[str]:
    """The C++ objects of a graph's kernels in this "machine"'s cache dir, by name: each next
    to the source it was built from, which is no vector-ISA probe's (``__<isa>_chk_kernel``)."""
    return {
        p.name
        for p in (machine / "inductor").rglob("*.so")
        if p.with_suffix(".cpp").is_file()
        and "_chk_kernel" not in p.with_suffix(".cpp").read_text()
    }


def built_by_workers(client: redis.Redis) -> set[str]:
    """The C++ objects workers built since the cache was wiped, by name, as each worker
    recorded its build (``compileq stats``' slowest builds, at most ``SLOW_LEN``)."""
    return {Path(row["name"]).name for row in meta.slowest(client, KIND, meta.SLOW_LEN)}


def isa_verdicts(client: redis.Redis, settings: Settings) -> list[bytes]:
    """The vector-ISA probes' verdicts the client stored (``cpp_cache``): one per probe it ran,
    b"1" for each that compiled (each such compile is counted as a local one)."""
    names = [k.decode() for k in client.scan_iter(match=keys.artifact("isa", "") + "*")]
    entries = RedisStore(client, settings).get_many(names)
    return [e.payload() for e in entries if e is not None]


def test_a_cold_graphs_cpp_objects_are_built_by_a_worker_and_none_by_the_client(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    width = random.randrange(1001, 5000)  # no other test's: none of its objects exists yet
    result = run_training(env, tmp_path, "client", width)
    assert result == {**result, "matches_eager": True, "compileq": True}
    counters = stats(env, tmp_path)
    # What is counted is what compileq recorded, never a guess from a file's content: on a CPU
    # with AMX, Inductor also builds an AMX tile probe, which no filter of sources foresaw.
    remote = built_by_workers(clean_cache)
    assert remote, "no worker recorded a C++ build"
    assert counters["cpp_remote_compiles"] >= len(remote)
    objects = objects_on(tmp_path / "client")
    assert remote <= objects  # the client loaded every object the workers built for it
    # The client compiled only the vector-ISA probes that say which ISAs this CPU has (they
    # must run here, on this CPU): every local compile is a probe that compiled, and every
    # object in its cache dir that no worker built is such a probe's.
    verdicts = isa_verdicts(clean_cache, settings)
    compiled = verdicts.count(b"1")
    assert counters.get("cpp_local_compiles", 0) <= compiled
    assert len(objects - remote) <= len(verdicts)
    assert "built C++ object" in worker.log.read_text()
    # Nor did it make Inductor's precompiled header (155 MB, 4.3 s here): only its builds read it.
    assert not precompiled_headers(tmp_path / "client")

    # A second machine finds every object in the store: nothing built anywhere.
    again = run_training(env, tmp_path, "again", width)
    assert again == {**again, "matches_eager": True}
    after = stats(env, tmp_path)
    assert after["cpp_remote_compiles"] == counters["cpp_remote_compiles"]
    assert after.get("cpp_local_compiles", 0) == counters.get("cpp_local_compiles", 0)
    assert after["cpp_hits"] >= counters.get("cpp_hits", 0) + len(remote)


def test_a_workers_graph_codegen_sends_a_cpp_object_only_to_a_sibling_it_can_reserve(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # One sibling free (two pool processes, this codegen one of them): the sibling builds one
    # object sent at a time, and this codegen's own compile threads build the others meanwhile,
    # rather than all of them waiting in the queue for that one sibling.
    one_free, _ = client_json(
        env, CODEGEN, str(random.randrange(9001, 13000)), "2", caches=tmp_path / "one-free"
    )
    assert one_free == {**one_free, "matches_eager": True, "compileq": True}
    sent = built_by_workers(clean_cache)
    objects = graph_objects(tmp_path / "one-free")
    assert sent and sent <= objects, (sent, objects)
    assert objects - sent, "every object waited for the one free sibling"
    counters = stats(env, tmp_path)
    # Each is a worker's build (this is a worker's codegen), stored for every client.
    assert counters["cpp_remote_compiles"] >= len(objects)

    # None free (one pool process, generating): every object is built in place, none sent;
    # also where the codegen was installed with no slot to reserve (``on_worker`` alone).
    none_free, _ = client_json(
        env,
        CODEGEN,
        str(random.randrange(13001, 17000)),
        "1",
        "--no-slot",
        caches=tmp_path / "none-free",
    )
    assert none_free == {**none_free, "matches_eager": True}
    assert built_by_workers(clean_cache) == sent
    # Its objects the first run did not have (kernels of the other width) were built here.
    new = graph_objects(tmp_path / "none-free") - objects
    assert new
    assert stats(env, tmp_path)["cpp_remote_compiles"] >= counters["cpp_remote_compiles"] + len(new)


def test_with_fan_out_off_the_client_builds_its_cpp_objects_as_before(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    result = run_training(
        env, tmp_path, "client", random.randrange(5001, 9000), COMPILEQ_CPP_FANOUT="0"
    )
    assert result == {**result, "matches_eager": True, "compileq": True}
    counters = stats(env, tmp_path)
    assert counters.get("cpp_remote_compiles", 0) == 0 and not built_by_workers(clean_cache)
    # Every object of the graphs' own kernels in its dir was built here. Counted by what each
    # object is, not against the vector-ISA verdicts in the store: the started worker probed
    # as many ISAs as its CPU has (10 on an AVX-512 + AMX Xeon), which the client's count of
    # its own builds (8 there) need not exceed on every x86-64 CPU.
    kernels = graph_objects(tmp_path / "client")
    assert kernels and counters["cpp_local_compiles"] >= len(kernels), (kernels, counters)
    assert precompiled_headers(tmp_path / "client")  # its own builds read it


@pytest.fixture(scope="module")
def real_builders(tmp_path_factory: pytest.TempPathFactory) -> list[list[Any]]:
    """The ``CppBuilder`` lists Inductor passes to its C++ build for a small graph, here."""
    import torch
    from torch._inductor import codecache

    seen: list[list[Any]] = []
    original = codecache._worker_compile_cpp

    def spy(lock_path: str, builders: Any) -> None:
        seen.append(list(builders))
        original(lock_path, builders)

    codecache._worker_compile_cpp = spy
    # Inductor makes its precompiled header once per process: ask for it again, to see it.
    precompile = getattr(codecache, "_precompile_header", None)
    if hasattr(precompile, "cache_clear"):
        precompile.cache_clear()
    try:
        cache = str(tmp_path_factory.mktemp("inductor"))
        with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}):
            torch._dynamo.reset()
            fn = torch.compile(lambda x, y: (x.sin() + y).relu().sum(1))
            fn(torch.randn(32, 48), torch.randn(32, 48))
    finally:
        codecache._worker_compile_cpp = original
        torch._dynamo.reset()
    return seen


def kernels(real_builders: list[list[Any]]) -> list[list[Any]]:
    return [b for b in real_builders if not getattr(b[0], "_precompiling", False)]


def test_a_cpp_job_carries_no_path_of_the_client_and_builds_where_it_is_filled_in(
    real_builders: list[list[Any]], tmp_path: Path
) -> None:
    from compileq.workers.cpp import build

    assert kernels(real_builders), "Inductor built no C++ kernel"
    builders = kernels(real_builders)[0]
    dirs = machine_dirs()
    job = CppJob.from_builders("t", builders, dirs)
    wire = job.to_bytes()
    target = str(builders[-1].get_target_file_path())
    # Nothing of this machine travels: not its cache dir, torch, nor Python.
    for path in (str(Path(target).parent.parent), *dirs.values()):
        assert path not in wire.decode()
    assert CppJob.from_bytes(wire) == job
    assert job.output == "{out}/" + Path(target).name
    assert any(name.endswith(".cpp") for name in job.files)
    # Filled in with this machine's dirs, the job builds a loadable object.
    built = tmp_path / Path(target).name
    built.write_bytes(build(job))
    import ctypes

    ctypes.CDLL(str(built))


def test_a_workers_precompiled_header_is_made_once_from_the_clients_and_kept(
    real_builders: list[list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from compileq.workers.cpp import build

    (header,) = [b[0] for b in real_builders if getattr(b[0], "_precompiling", False)]
    path = str(header.get_target_file_path()).removesuffix(".gch")
    job = CppJob.from_builders("t", kernels(real_builders)[0], machine_dirs(), {path: header})
    assert job.header is not None and job.header.name == Path(path).name
    assert any(w == "{pch}/" + job.header.name for step in job.steps for w in step)
    assert path not in job.to_bytes().decode()  # the header's text and line travel, not it
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the worker host's temp dir
    import ctypes

    for n in range(2):
        (tmp_path / f"k{n}.so").write_bytes(build(job))
        ctypes.CDLL(str(tmp_path / f"k{n}.so"))  # a loadable object each time
        if n == 0:
            (made,) = tmp_path.glob("compileq-pch-*/*/*.gch")
            when = made.stat().st_mtime_ns
    assert made.stat().st_mtime_ns == when  # kept, not made again


def test_a_command_line_naming_a_dir_no_worker_has_stays_with_the_client(
    real_builders: list[list[Any]],
) -> None:
    builder = kernels(real_builders)[0][-1]

    class Elsewhere:
        def get_target_file_path(self) -> str:
            return str(builder.get_target_file_path())

        def get_command_line(self) -> str:
            return builder.get_command_line() + " -I/opt/only-here/include"

    with pytest.raises(Unportable, match="/opt/only-here"):
        CppJob.from_builders("t", [Elsewhere()], machine_dirs())


@pytest.mark.parametrize(
    "tampered",
    [
        {"steps": [["/bin/sh", "-c", "id"]]},
        {"steps": [["{cxx}", "{home}/x.cpp"]]},
        {"output": "{out}/../../etc/passwd"},
        {"files": {"{in}/../escape.cpp": "int x;"}},
    ],
    ids=["another-program", "unknown-placeholder", "output-outside", "file-outside"],
)
def test_a_cpp_job_that_would_run_or_touch_anything_outside_the_workers_dirs_is_refused(
    tampered: dict[str, Any],
) -> None:
    good = {
        "format": 1,
        "toolchain": "t",
        "steps": [["{cxx}", "{in}/0_k.cpp", "-o", "{out}/k.so"]],
        "output": "{out}/k.so",
        "files": {"{in}/0_k.cpp": "int x;"},
    }
    CppJob.from_bytes(json.dumps(good).encode())  # the untampered job is accepted
    with pytest.raises(ValueError):
        CppJob.from_bytes(json.dumps({**good, **tampered}).encode())
    assert fill("{in}/0_k.cpp", {"{in}": "/w"}) == "/w/0_k.cpp"


def test_a_signed_cpp_job_a_worker_refuses_is_announced_so_no_client_waits(
    env: Env, worker: Worker, clean_cache: redis.Redis, settings: Settings
) -> None:
    from compileq.scheduler.client import KernelClient
    from compileq.scheduler.fallback import Fallback
    from compileq.scheduler.local import LocalBuilder
    from compileq.scheduler.roundtrip import CPP, Job, fetch

    key = keys.artifact("cpp", "0" * 64)
    bad = json.dumps(
        {
            "format": 1,
            "toolchain": cpp_toolchain(),
            "steps": [["{cxx}", "{in}/0_k.cpp", "-o", "/tmp/outside.so"]],
            "output": "{out}/k.so",
            "files": {"{in}/0_k.cpp": "int x;"},
        }
    ).encode()
    client = KernelClient(settings, LocalBuilder(lambda: None))
    try:
        assert client.router.has_worker(cpp_queue(cpp_toolchain()))
        with pytest.raises(Fallback, match=r"could not build the C\+\+ object"):
            fetch(client, Job(CPP, key, cpp_queue(cpp_toolchain()), lambda: bad))
    finally:
        client.close()
    assert not Path("/tmp/outside.so").exists()
    assert RedisStore(clean_cache, settings).get_many([key])[0] is None
    assert stats_of(clean_cache)["rejected_tasks"] >= 1


def stats_of(client: redis.Redis) -> dict[str, int]:
    from compileq.cache.counters import read_counters

    return read_counters(client)


def test_a_cpp_objects_key_covers_the_cpus_features(monkeypatch: pytest.MonkeyPatch) -> None:
    # Inductor builds with -march=native: an object from a CPU with more features may not run
    # on this one, so it must not be found under this CPU's key.
    from compileq.inductor import cpp_cache

    here = cpp_cache.cpp_key("/x/ck.main.so")
    monkeypatch.setattr(cpp_cache, "cpu_flags", lambda: "avx512_fp16 amx_tile")
    assert cpp_cache.cpp_key("/x/ck.main.so") != here
    assert cpp_cache.cpp_key("/y/ck.main.so") == cpp_cache.cpp_key("/x/ck.main.so")
