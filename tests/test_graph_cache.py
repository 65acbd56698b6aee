"""Graph and C++ caches in Redis, and `compileq run` (real torch.compile on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import redis

import compileq
from compileq import keys
from compileq.config import Settings
from tests.conftest import Env, Worker, compileq_cmd, stats

SCRIPT = Path(__file__).parent / "clients" / "train_cpu.py"


def run_training(env: Env, tmp: Path, name: str, *flags: str) -> dict[str, object]:
    proc = subprocess.run(
        compileq_cmd("run", *flags, "--", sys.executable, str(SCRIPT)),
        env=env.vars(
            TORCHINDUCTOR_CACHE_DIR=str(tmp / name / "inductor"),
            TRITON_CACHE_DIR=str(tmp / name / "triton"),
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_new_machine_gets_fx_graphs_and_cpp_kernels_from_redis(
    env: Env, empty_cache: redis.Redis, tmp_path: Path
) -> None:
    # --no-fx: this is about the caches behind an in-process compile, whether or not a worker
    # for FX codegen happens to be alive (test_fx_remote covers the codegen on a worker).
    first = run_training(env, tmp_path, "first", "--no-fx")
    assert first == {**first, "matches_eager": True, "compileq": True}
    cold = stats(env, tmp_path)
    assert cold["fx_local_compiles"] > 0 and cold["cpp_local_compiles"] > 0
    assert cold["fx_hits"] == cold["cpp_hits"] == 0

    second = run_training(env, tmp_path, "second", "--no-fx")  # empty TORCHINDUCTOR_CACHE_DIR
    assert second == {**second, "matches_eager": True, "compileq": True}
    warm = stats(env, tmp_path)
    assert warm["fx_hits"] > 0 and warm["aot_hits"] > 0 and warm["cpp_hits"] > 0
    # Neither codegen nor the C++ compiler ran on the new machine.
    assert warm["fx_local_compiles"] == cold["fx_local_compiles"]
    assert warm["cpp_local_compiles"] == cold["cpp_local_compiles"]
    assert warm["cpp_misses"] == cold["cpp_misses"] and warm["fx_misses"] == cold["fx_misses"]
    # Nor did Inductor's vector-ISA probes (a compile and a Python subprocess per ISA): their
    # verdicts for this very CPU came from the store, so no probe source was even written.
    # (A CPU without AVX2 has no probe to run, even on the first machine.)
    probed = _probe_sources(tmp_path / "first")
    assert not _probe_sources(tmp_path / "second")
    assert probed or "avx2" not in Path("/proc/cpuinfo").read_text(errors="replace")


def _probe_sources(machine: Path) -> list[Path]:
    """Inductor's vector-ISA probes (``__avx2_chk_kernel``, ``__amx_chk_kernel``, ...)."""
    return [p for p in machine.rglob("*.cpp") if "_chk_kernel" in p.read_text(errors="replace")]


def test_compileq_run_passes_arguments_and_the_exit_code_through(env: Env) -> None:
    code = "import sys; print(sys.argv[1:]); sys.exit(7)"
    proc = subprocess.run(
        compileq_cmd("run", "--", sys.executable, "-c", code, "a", "--", "b"),
        env=env.vars(),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 7
    assert proc.stdout.strip() == "['a', '--', 'b']"
    missing = subprocess.run(compileq_cmd("run"), env=env.vars(), capture_output=True, text=True)
    assert missing.returncode == 2 and "needs a command" in missing.stderr


def test_install_routes_inductors_remote_caches_to_the_store_and_uninstall_restores(
    settings: Settings,
) -> None:
    from torch._inductor import codecache
    from torch._inductor import config as inductor_config
    from torch._inductor.remote_cache import RemoteFxGraphCache

    before = (
        RemoteFxGraphCache.backend_override_cls,
        codecache._worker_compile_cpp,
        inductor_config.fx_graph_remote_cache,
    )
    assert compileq.install(settings)
    try:
        assert RemoteFxGraphCache.backend_override_cls.__name__ == "FxGraphBackend"
        assert inductor_config.fx_graph_remote_cache is True
        assert codecache._worker_compile_cpp.__module__ == "compileq.inductor.cpp_cache"
    finally:
        compileq.uninstall()
    after = (
        RemoteFxGraphCache.backend_override_cls,
        codecache._worker_compile_cpp,
        inductor_config.fx_graph_remote_cache,
    )
    assert after == before


def test_a_graph_put_by_its_compiler_between_a_lookup_and_the_lease_it_frees_is_a_hit_not_a_compile(
    clean_cache: redis.Redis, settings: Settings
) -> None:
    # The race CI met with four processes (one of them compiled nothing and hit nothing): this
    # process looks the graph up (miss); the process compiling it puts the entry and frees its
    # lease; this process then takes the lease. Holding it means "compile it" only if the
    # entry is still missing, so the lookup is made once more after the take.
    from compileq.cache.counters import read_counters, reset_counters
    from compileq.cache.store import Entry, RedisStore
    from compileq.inductor import graph_cache
    from compileq.scheduler import leases

    fx = graph_cache.FxGraphBackend()
    name = fx._key("fxgraph-compiled-elsewhere")
    other = "the-process-compiling-it"
    assert leases.take_many(clean_cache, [name], other, 30_000, secret=settings.secret_bytes()) == [
        True
    ]

    class Interleaved(RedisStore):
        """The other process's put and release, made to fall right after this one's miss."""

        def get_many(self, names: Sequence[str]) -> list[Entry | None]:
            found = super().get_many(names)
            if (
                list(names) == [name]
                and found == [None]
                and leases.release(clean_cache, name, other)
            ):
                assert RedisStore(clean_cache, settings).put(name, b"generated elsewhere")
            return found

    reset_counters(clean_cache)
    graph_cache.enable(Interleaved(clean_cache, settings), deadline_s=5)
    try:
        assert fx._get("fxgraph-compiled-elsewhere") == b"generated elsewhere"
    finally:
        graph_cache.disable()
    counters = read_counters(clean_cache)
    assert counters["fx_hits"] == 1 and counters["fx_misses"] == 0, counters
    assert clean_cache.get(keys.lock(name)) is None  # the lease taken for nothing is handed back


def test_four_processes_compiling_the_same_model_at_once_run_one_codegen_per_graph(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    procs = [
        subprocess.Popen(
            compileq_cmd("run", "--", sys.executable, str(SCRIPT)),
            env=env.vars(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / f"p{i}" / "inductor")),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-4000:]
        assert json.loads(out.strip().splitlines()[-1])["matches_eager"] is True
    counters = stats(env, tmp_path)
    # Forward and backward: two graphs, each generated once (on the worker, which `compileq
    # run` sends FX codegen to; in process had it fallen back); the other three processes hit.
    assert counters["fx_local_compiles"] + counters["fx_remote_compiles"] == 2
    assert counters["fx_hits"] == 6
    assert counters["fallbacks"] == 0
