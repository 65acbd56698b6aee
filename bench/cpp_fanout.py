"""A cold CPU graph's C++ objects: built on the training machine, or by the workers.

Three runs per repetition, each a fresh process on empty local cache dirs, a fresh temporary
dir (Inductor keeps its precompiled header under ``$TMPDIR``, which would otherwise carry over
between "machines") and an emptied compileq store:

* ``stock``: the script alone, stock Inductor;
* ``compileq_local``: ``compileq run --no-fx`` with ``COMPILEQ_CPP_FANOUT=0``: codegen in
  the process, C++ objects built there (the store only shares them afterwards);
* ``compileq_fanout``: ``compileq run --no-fx``: the same, C++ objects built by the worker;
* ``compileq_new_local`` and ``compileq_new_fanout``: a new machine (empty local dirs) on the
  warm store the cold runs left, without and with the fan-out: every object is a hit, but
  Inductor makes its precompiled header before its first one, unless workers build this
  machine's objects (then it neither makes nor fetches it).

``--no-fx`` isolates the C++ builds: with codegen on the workers too, the objects are built in
the worker's codegen, not by the training process. One ``compileq worker --cpu-only`` with
``--concurrency`` pool processes; its precompiled header is made by its first job and kept,
as by any long-running worker (rep 1 pays it). ``--client-cpus`` and ``--worker-cpus``
(``0-3``, ``4-31``) pin each to some of the host's cores: a small training node beside a
fleet with more cores, on one host.

    python -m bench.cpp_fanout [--reps 2] [--client-cpus 0-3 --worker-cpus 4-15] [-- SCRIPT ARGS]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.harness import ROOT, CacheDirs, Cluster, new_workdir, process_tree
from compileq.workers import cpus

RUNS = (
    "stock",
    "compileq_local",
    "compileq_fanout",
    "compileq_new_local",
    "compileq_new_fanout",
)
SCRIPT_ARGS = ("--device", "cpu", "--layers", "4", "--width", "128", "--steps", "1")
_COUNTERS = ("cpp_local_compiles", "cpp_remote_compiles", "cpp_hits", "cpp_misses")


def pin_tree(pid: int, chosen: set[int]) -> None:
    """Pin a process and all its descendants (a worker and its forked pool)."""
    for proc in process_tree(pid):
        os.sched_setaffinity(proc.pid, chosen)


def run_job(
    cluster: Cluster, dirs: CacheDirs, name: str, script: list[str], pin: set[int] | None
) -> dict[str, Any]:
    machine = dirs.fresh()
    env = {**cluster.env(), **dirs.env(machine)}
    tmp = Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent / "tmp"
    tmp.mkdir(parents=True)
    env["TMPDIR"] = str(tmp)
    argv = [sys.executable, *script]
    if name != "stock":
        argv = [sys.executable, "-m", "compileq.cli", "run", "--no-fx", "--", *argv]
    if name in ("compileq_local", "compileq_new_local"):
        env["COMPILEQ_CPP_FANOUT"] = "0"
    if "_new_" not in name:
        cluster.flush()
    before = cluster.stats()
    launched = time.time()
    proc = subprocess.run(
        argv,
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        preexec_fn=(lambda: os.sched_setaffinity(0, pin)) if pin else None,
    )
    wall = time.time() - launched
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
    result = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1])
    after = cluster.stats()
    objects = [
        p
        for p in Path(env["TORCHINDUCTOR_CACHE_DIR"]).rglob("*.so")
        if "__avx" not in p.with_suffix(".cpp").read_text(errors="replace")
    ]
    return {
        "first_step_s": result["first_step_s"],
        "wall_s": round(wall, 2),
        "matches_eager": result["matches_eager"],
        "losses": result["losses"],
        "kernel_objects": len(objects),
        "headers_made": len(list(tmp.rglob("*.h.gch"))),  # Inductor's precompiled header
        **{c: after.get(c, 0) - before.get(c, 0) for c in _COUNTERS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpp_fanout", description=__doc__)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=None, help="worker pool processes")
    parser.add_argument("--client-cpus", default=None)
    parser.add_argument("--worker-cpus", default=None)
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench-out"))
    parser.add_argument("script_args", nargs="*", help="after --: llama_script.py arguments")
    args = parser.parse_args(argv)
    script = [str(ROOT / "examples" / "llama_script.py"), *(args.script_args or SCRIPT_ARGS)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = new_workdir()
    cluster = Cluster(workdir, gpu=False).start()
    # The same CPU lists as `compileq worker --cpus` (None: no pinning).
    client_cpus, worker_cpus = (
        cpus.parse(spec) if spec else None for spec in (args.client_cpus, args.worker_cpus)
    )
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNS}
    try:
        os.environ["TMPDIR"] = str(workdir / "worker-tmp")  # the worker's precompiled header
        Path(os.environ["TMPDIR"]).mkdir()
        cluster.start_worker(args.concurrency, cpu_only=True)
        if worker_cpus and cluster.worker is not None:
            pin_tree(cluster.worker.pid, worker_cpus)
        dirs = CacheDirs(workdir / "clients")
        for rep in range(args.reps):
            for name in RUNS:
                results[name].append(run_job(cluster, dirs, name, script, client_cpus))
                print(name, rep, json.dumps(results[name][-1]), flush=True)
    finally:
        cluster.close()
        for log in workdir.glob("worker-*.log"):
            shutil.copy(log, out / "cpp_fanout-worker.log")
        shutil.rmtree(workdir, ignore_errors=True)
    meta = {
        "script_args": script[1:],
        "cpus": os.cpu_count(),
        "client_cpus": args.client_cpus,
        "worker_cpus": args.worker_cpus,
        "concurrency": args.concurrency,
    }
    (out / "cpp_fanout.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    print(report(results))
    return 0


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    """A markdown table: each run's first steps, and the median's ratio to stock's."""
    from statistics import median

    stock = median(r["first_step_s"] for r in results["stock"])
    lines = [
        "| run | first step per rep (s) | vs stock | C++ objects | built here / by workers "
        "| hits | precompiled header made |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in results.items():
        steps = " / ".join(f"{r['first_step_s']:.2f}" for r in runs)
        ratio = median(r["first_step_s"] for r in runs) / stock
        last = runs[-1]
        built = f"{last['cpp_local_compiles']} / {last['cpp_remote_compiles']}"
        lines.append(
            f"| {name} | {steps} | {ratio:.2f}x | {last['kernel_objects']} | {built} "
            f"| {last['cpp_hits']} | {'yes' if last['headers_made'] else 'no'} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
