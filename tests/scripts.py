"""Running training scripts the way users do: ``compileq run -- python SCRIPT`` or
``compileq run -- torchrun --nproc-per-node N SCRIPT``, each rank with its own cache dirs.

Shared by the CPU tests (tests/test_user_scripts.py) and the GPU tests (tests/test_gpu_ranks.py).
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tests.conftest import CacheSnapshot, Env, compileq_cmd, snapshot_cache, stats, wipe_cache

LLAMA = Path(__file__).resolve().parents[1] / "examples" / "llama_script.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
#: Inductor names a kernel's file in a comment; the file lies in whichever cache dir built it.
_KERNEL_PATH = re.compile(r"^# kernel path: .*$", re.MULTILINE)
#: A hash of the Triton backend as this process sees it, in every GPU kernel's metadata. A
#: process that has built a kernel hashes the ptxas Inductor switched Triton to; one that has
#: not, the ptxas Triton found first: equal toolchains (routing checks the assembler itself),
#: two spellings. It names autotuning results, never changes the code.
_BACKEND_HASH = re.compile(r"'backend_hash': '[0-9A-F]+'")


def fx_builds(env: Env, tmp: Path) -> list[dict[str, Any]]:
    """The workers' FX codegens as ``compileq stats`` lists them: start and seconds each."""
    builds: list[dict[str, Any]] = stats(env, tmp)["slowest"]["fxcode"]
    return builds


def overlapping(builds: list[dict[str, Any]]) -> int:
    """How many pairs of builds ran at the same time."""
    spans = sorted((b["started"], b["started"] + b["seconds"]) for b in builds)
    return sum(1 for i, (_, end) in enumerate(spans) for start, _ in spans[i + 1 :] if start < end)


#: The deadline of a test's real jobs on the loaded 2-core machine (run_script says why; the
#: load test and the local cluster's test set it too): a miss there is a duplicate compile,
#: not a finding.
LOADED_DEADLINE_S = "600"


@dataclass
class ScriptRun:
    ranks: list[dict[str, Any]]  # each rank's JSON line, by rank
    stderr: str


def traced_once(first: dict[str, Any], new: dict[str, Any]) -> None:
    """A length that changes (``--dynamic``), one rank's results: the first job compiled its
    frame static, then again dynamic at step 1's length (each step's compile phases); the new
    machine read which sizes went dynamic (``inductor/dynamic_profile.py``) and compiled the
    dynamic graphs only, at step 0: one Dynamo trace where the first job made two."""
    assert first["step_phases"][1].get("_compile.compile_inner", 0) > 0, first["step_phases"]
    assert "_compile.compile_inner" not in new["step_phases"][1], new["step_phases"]
    assert new["graphs"] == first["graphs"] // 2, (first["graphs"], new["graphs"])


def run_script(
    env: Env,
    tmp: Path,
    name: str,
    script: Path,
    *args: str,
    nproc: int = 0,
    compileq: bool = True,
    run_flags: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    timeout: float = 900,
) -> ScriptRun:
    """``[compileq run --] [torchrun --nproc-per-node N] python SCRIPT ARGS`` in a fresh process
    tree; every rank gets empty Inductor/Triton cache dirs of its own under ``tmp/name``."""
    caches = tmp / name
    launcher = (
        [*TORCHRUN, "--nproc-per-node", str(nproc), "--master-port", str(_free_port())]
        if nproc
        else [sys.executable]
    )
    argv = [*launcher, str(script), *args, "--rank-caches", str(caches)]
    # A script's waits get ten minutes, not the product's 60 s: on the 2-core machine, beside
    # the other pytest process's job, one codegen took 86 s (C++ builds in it 107 s of CPU),
    # and a forward deferred past its deadline is compiled again as stock, which is what
    # test_ddp_aot and the training configurations check never happens. The deadline itself
    # is tested with short values of its own (test_broker, test_faults, test_partition, chaos).
    deadline = (
        {} if "COMPILEQ_DEADLINE_S" in env.extra else {"COMPILEQ_DEADLINE_S": LOADED_DEADLINE_S}
    )
    if compileq:
        argv = compileq_cmd("run", *run_flags, "--", *argv)
    proc = subprocess.run(
        argv,
        env=env.vars(
            TORCHINDUCTOR_CACHE_DIR=str(caches / "launcher" / "inductor"),
            TRITON_CACHE_DIR=str(caches / "launcher" / "triton"),
            **{**deadline, **(extra_env or {})},
        ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    results = sorted(caches.glob("rank*/result.json"))
    assert len(results) == max(nproc, 1), proc.stdout[-3000:]
    ranks = [json.loads(path.read_text()) for path in results]
    return ScriptRun(sorted(ranks, key=lambda r: int(r["rank"])), proc.stderr)


@dataclass
class ColdJob:
    run: ScriptRun
    #: The cache (entries, records, counters) as the job left it, for restore_cache.
    left: CacheSnapshot


def cold_job(env: Env, client: redis.Redis, tmp: Path, *args: Any, **kwargs: Any) -> ColdJob:
    """``run_script(env, tmp, *args, **kwargs)`` on a cold cluster, and what it left: for a
    module's tests that each start from the same cold job, run once (a module fixture), each
    restoring ``left`` instead of running it again."""
    wipe_cache(client)
    return ColdJob(run_script(env, tmp, *args, **kwargs), snapshot_cache(client))


def output_code(folder: Path) -> list[str]:
    """The output-code modules a run dumped (``--dump-code``), kernel path comments masked."""
    return [
        _BACKEND_HASH.sub("'backend_hash': -", _KERNEL_PATH.sub("# kernel path: -", p.read_text()))
        for p in sorted(folder.iterdir())
    ]


def code_diff(ours: list[str], theirs: list[str], limit: int = 60) -> str:
    """The first lines of a unified diff between two runs' output code ("" when equal)."""
    import difflib

    lines: list[str] = []
    if len(ours) != len(theirs):
        lines.append(f"{len(ours)} output-code modules against {len(theirs)}")
    for i, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        lines += difflib.unified_diff(
            a.splitlines(), b.splitlines(), f"ours/graph{i}", f"theirs/graph{i}", lineterm="", n=1
        )
    return "\n".join(lines[:limit])


def _free_port() -> int:
    from compileq.localstack import free_port

    return free_port()


def build_kernel(row: dict[str, str], out: Path) -> Any:
    """A manifest row's kernel built for real through the cross-compile path (real sm_90 cubins),
    in a process of its own (the cross-compile switch is process-wide), unpickled here as a
    client receives it: a ``CachingAutotuner`` whose configs are compiled."""
    script = textwrap.dedent(
        f"""
        import json, pathlib
        from compileq.build.triton import build_triton_payload
        from compileq.scheduler.recognise import inductor_extra_config
        job = json.dumps({{"name": {row["name"]!r}, "source": {row["source"]!r},
                           "extra_config": inductor_extra_config()}}).encode()
        payload, _ = build_triton_payload(job, {{}}, cross_compile=True)
        pathlib.Path({str(out)!r}).write_bytes(payload)
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600)
    return pickle.loads(out.read_bytes())[0]
