"""The ``ddp`` scenario: torchrun over every GPU of the machine (two ranks on a CPU-only one),
the Llama-style model of ``examples/llama_script.py`` (classes defined in the script, run as
``__main__``), each rank with local cache dirs of its own as if on a node of its own; stock and
compileq in one invocation.

    python -m bench.ddp [--nproc N] [--reps R] [--runs A,B] [--out DIR] [--zoo MODEL]
                        [--cprofile | --strace] [-- SCRIPT ARGS]

``--nproc 0`` runs the script as plain ``python`` (one process, no torchrun, no DDP).
``--zoo MODEL`` trains a model of ``python -m bench zoo`` (a name of bench/zoo_models.py, or
``timm:NAME`` / ``hf:CLASS``) at the zoo's own size for this machine (its GPU size, tiny on a
CPU), the script arguments after ``--`` added to its own (``--zoo BertForMaskedLM --
--bucket-mb 4``): the zoo's models under torchrun, DDP or FSDP2, without copying their
configs into a command line.

Each repetition runs, in fresh process trees:

* ``stock_cold``: stock torch.compile, empty caches;
* ``stock_cold_keep``: the same with compileq's stack-chunk keeper alone in every process
  (``compileq/stack_chunks.py``, loaded from ``bench/stock_keep``): its share of compileq's gain;
* ``stock_warm_local``: stock again on the cold run's local cache dirs (a machine that has run
  the job before: the reference a new machine's warm start is measured against);
* ``stock_remote_fill`` then ``stock_remote_new``: stock with its own Redis remote caches,
  the second on empty local dirs (a new machine on a warm cluster);
* ``compileq_cold_lazy``: ``compileq run`` with ``COMPILEQ_SPECULATE=0`` on a cold cluster
  (each backward sent at its first backward call, as stock compiles it);
* ``compileq_cold_no_defer``: the same with ``COMPILEQ_DEFER_FORWARDS=0`` (each DDP
  subgraph's forward compile waits for its worker before the next bucket is traced);
* ``compileq_cold_nice0``: the same as ``compileq_cold`` below, with the workers' processes
  and their session's autogroup reniced to 0 for the run (they build at
  ``COMPILEQ_WORKER_NICE``, 10 by default, beside the ranks: workers/priority.py);
* ``compileq_cold_all_cpus``: the same with the workers' processes on every CPU for the run
  (``compileq worker`` leaves one physical core per GPU it serves to the ranks by default:
  workers/cpus.py);
* ``compileq_cold_no_keep``: the same with ``COMPILEQ_KEEP_STACK_CHUNKS=0`` in the ranks (the
  workers keep theirs);
* ``compileq_cold``: ``compileq run``, compileq's store emptied but for what the workers'
  start stored (``Cluster.flush``) and the workers' local caches wiped (a cold cluster),
  backwards sent when AOTAutograd partitions their graphs;
* ``compileq_new``: ``compileq run`` again on empty local dirs (every entry looked up in
  compileq's store as Inductor asks for it);
* ``compileq_new_no_gc_window``: the same with ``COMPILEQ_GC_WINDOW=0`` (Python's full
  collections walk every object during the compiles, as in stock: inductor/gc_window.py);
* ``compileq_profile_fill`` then ``compileq_new_profile``: the same with job profiles on
  (``COMPILEQ_PROFILES=1``, opt-in: inductor/profiles.py); the first saves each rank's
  profile at exit, the second loads it while Python imports.

Every compileq run but the last two runs compileq's defaults. Profiles used to be on in all of
them: on two H200s that made ``import torch`` 0.7-1.2 s slower in each rank (the fetch
thread's own imports), a cost a default user never pays.

Per run: each rank's first step, all ranks done (launch to the end of the slowest rank's first
step, start-up included), graph codegens against distinct graphs, backwards sent ahead, and
fallbacks. Writes
``ddp.json`` and ``ddp.md`` to ``--out`` (default ``$OUT``, else ``bench-out/``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness import ROOT, Cluster, new_workdir, process_tree, tree_cpu_s
from compileq.workers import cpus
from compileq.workers.priority import autogroup_nice

SCRIPT = ROOT / "examples" / "llama_script.py"
GPU_ARGS = ("--device", "cuda", "--width", "512", "--layers", "8", "--bucket-mb", "4")
CPU_ARGS = ("--width", "128", "--layers", "4", "--bucket-mb", "1")
#: Each run: its name, how it runs, and what comes before it ("flush": compileq's store and
#: stock's remote cache emptied; "cold": that and the worker's local caches wiped; "reuse":
#: stock's cold run's local dirs, so a warm local cache).
PLAN = (
    ("stock_cold", "stock", "flush"),
    ("stock_cold_keep", "stock-keep", "flush"),
    ("stock_warm_local", "stock", "reuse"),
    ("stock_remote_fill", "stock-remote", None),
    ("stock_remote_new", "stock-remote", None),
    ("compileq_cold_lazy", "compileq-lazy", "cold"),
    ("compileq_cold_no_defer", "compileq-no-defer", "cold"),
    ("compileq_cold_nice0", "compileq-nice0", "cold"),
    ("compileq_cold_all_cpus", "compileq-all-cpus", "cold"),
    ("compileq_cold_no_keep", "compileq-no-keep", "cold"),
    ("compileq_cold", "compileq", "cold"),
    ("compileq_new", "compileq", None),
    ("compileq_new_no_gc_window", "compileq-no-gc-window", None),
    ("compileq_profile_fill", "compileq-profile", None),
    ("compileq_new_profile", "compileq-profile", None),
)
RUNS = tuple(name for name, _, _ in PLAN)
#: The stats counters a run records under their own names (run_job): differences over the run.
SAME_NAME_COUNTERS = (
    "triton_module_hits",
    "triton_module_builds",
    "triton_module_misses",
    "triton_binary_hits",
    "triton_binary_builds",
    "tune_hits",
    "tune_remote",
    "tune_local",
    "tune_table_hits",
    "runtime_tune_hits",
    "runtime_autotunes",
    "pad_decision_hits",
    "pad_decision_timings",
    "ddp_subgraph_loads",
    "ddp_subgraph_records",
    # Jobs waited for past the deadline while a live worker built them (cache/building.py).
    "waited_past_deadline",
    # Backwards held for their forward's padded strides, and those held for nothing
    # (codegen/padding.py).
    "fx_held_for_padding",
    "fx_held_not_padded",
)


@contextlib.contextmanager
def adjusted(cluster: Cluster, nice: int | None, cpu_set: set[int] | None) -> Iterator[None]:
    """Within: every process of the cluster's worker at ``nice`` and on ``cpu_set`` (None: as
    they are)."""
    if (nice is None and cpu_set is None) or cluster.worker is None:
        yield
        return
    import psutil

    procs = process_tree(cluster.worker.pid)
    before = {p.pid: (p.nice(), p.cpu_affinity()) for p in procs}
    # The session's autogroup too (workers/priority.py): the worker leads a session of its own.
    autogroup = Path(f"/proc/{cluster.worker.pid}/autogroup")
    group_nice = autogroup_nice(cluster.worker.pid)
    for p in procs:
        if nice is not None:
            p.nice(nice)
        if cpu_set is not None:
            p.cpu_affinity(sorted(cpu_set))
    if nice is not None and group_nice is not None:
        autogroup.write_text(f"{nice}\n")
    try:
        yield
    finally:
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.nice(before[p.pid][0])
                p.cpu_affinity(before[p.pid][1])
        if nice is not None and group_nice is not None:
            with contextlib.suppress(OSError):
                autogroup.write_text(f"{group_nice}\n")


def host_busy_s() -> float:
    """CPU seconds the whole host has spent busy (not idle, not waiting on I/O) since boot."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def fx_builds(cluster: Cluster, since: float) -> list[list[float]]:
    """The graph codegens recorded since ``since`` (Unix time): [start after it, seconds]."""
    from compileq.cache import meta
    from compileq.tasks.fx_jobs import FX

    rows = meta.slowest(cluster.client(), FX, meta.SLOW_LEN)
    spans = [
        [round(r["started"] - since, 2), round(r["seconds"], 2)] for r in rows if "started" in r
    ]
    return sorted(s for s in spans if s[0] >= 0)


def run_job(
    cluster: Cluster,
    workdir: Path,
    name: str,
    nproc: int,
    args: list[str],
    mode: str,
    caches_of: str | None = None,
    cprofile: Path | None = None,
    strace: Path | None = None,
) -> dict[str, Any]:
    """One job in a fresh process tree, on empty local cache dirs, or on those that run
    ``caches_of`` left (its results are read back from there too). ``strace``: a directory
    for the job's memory system calls, counted over every process (``NAME.strace``)."""
    caches = workdir / (caches_of or name)
    if caches_of is None:
        shutil.rmtree(caches, ignore_errors=True)
    else:
        for old in caches.glob("rank*/result.json"):
            old.unlink()
    port = str(29500 + (os.getpid() + len(name) + int(time.monotonic())) % 1000)
    argv = [sys.executable]
    if nproc:
        argv += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        argv += ["--master-port", port]
        if cprofile is not None:  # each rank: NAME-rankK.pstats (bench.rank_cprofile)
            argv += ["-m", "bench.rank_cprofile", str(cprofile / name)]
    elif cprofile is not None:  # the whole process; read with python -m bench.profile_report
        argv += ["-m", "cProfile", "-o", str(cprofile / f"{name}.pstats")]
    argv += [str(SCRIPT), *args, "--rank-caches", str(caches)]
    env = cluster.env()
    if mode.startswith("compileq"):
        argv = [sys.executable, "-m", "compileq.cli", "run", "--", *argv]
        env["COMPILEQ_SPECULATE"] = "0" if mode == "compileq-lazy" else "1"
        env["COMPILEQ_DEFER_FORWARDS"] = "0" if mode == "compileq-no-defer" else "1"
        env["COMPILEQ_PROFILES"] = "1" if mode == "compileq-profile" else "0"  # opt-in
        env["COMPILEQ_GC_WINDOW"] = "0" if mode == "compileq-no-gc-window" else "1"
        env["COMPILEQ_KEEP_STACK_CHUNKS"] = "0" if mode == "compileq-no-keep" else "1"
        # Dynamo's record of dynamic sizes not shared (inductor/dynamic_profile.py): a new
        # machine compiles a frame static, then dynamic, as before it.
        env["COMPILEQ_DYNAMIC_PROFILE"] = "0" if mode == "compileq-static-first" else "1"
        # Graphs with an autocast region left out of AOTAutograd's cache, as stock leaves them
        # (codegen/aot_regions.py): a new machine traces their joint graphs again.
        env["COMPILEQ_AOT_REGIONS"] = "0" if mode == "compileq-autocast-traced" else "1"
        if mode == "compileq-split":  # big graphs compiled in parts (codegen/split.py)
            env["COMPILEQ_SPLIT_GRAPHS"] = "gpu"
        # The caller's own settings (``bench zoo --setting``) over the modes' defaults.
        env.update(cluster.settings_env)
    elif mode == "stock-remote":
        env.update(cluster.stock_remote_env())
    elif mode == "stock-keep":
        path = [str(ROOT / "bench" / "stock_keep"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    if strace is not None:
        out = str(strace / f"{name}.strace")
        argv = ["strace", "-f", "-c", "-e", "trace=memory", "-o", out, *argv]
    before = cluster.stats()
    worker = cluster.worker.pid if cluster.worker is not None else None
    worker_cpu, host_busy = tree_cpu_s(worker), host_busy_s()
    launched = time.time()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    wall = time.time() - launched
    worker_cpu, host_busy = tree_cpu_s(worker) - worker_cpu, host_busy_s() - host_busy
    (workdir / f"{name}.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-4000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(caches.glob("rank*/result.json"))]
    after = cluster.stats()
    delta = {k: int(v) - int(before.get(k, 0)) for k, v in after.items() if isinstance(v, int)}
    return {
        "ranks_first_step_s": [r["first_step_s"] for r in ranks],
        "ranks_steps_s": [r.get("steps_s", [r["first_step_s"]]) for r in ranks],
        "all_done_s": round(max(r["finished_at"] for r in ranks) - launched, 3),
        "distinct_graphs": ranks[0]["graphs"],
        "device": ranks[0].get("device"),
        "codegens": delta.get("fx_remote_compiles", 0) + delta.get("fx_local_compiles", 0),
        "fallbacks": delta.get("fallbacks", 0),
        # Graph codegens in the training process itself (a fallback's, or FX codegen off).
        "fx_local_compiles": delta.get("fx_local_compiles", 0),
        # Kernels looked up one by one through compileq's pool (not inside an FX entry).
        "kernel_fetches": delta.get("kernel_hits", 0) + delta.get("kernel_misses", 0),
        "fx_hits": delta.get("fx_hits", 0),
        "sent_ahead": delta.get("fx_sent_ahead", 0),
        "profiles_loaded": delta.get("profile_loads", 0),
        # AOTAutograd: lookups that missed, and DDP subgraphs loaded or recorded (ddp_aot).
        "aot_misses": delta.get("aot_misses", 0),
        # Counters kept under their own names: Triton's C modules (cuda_utils, launchers) and
        # binaries served from the store or built here; max-autotune's GEMM candidates timed
        # (found, by GPU workers, here) and whole tables found (inductor/autotune.py); kernels'
        # first-launch timings found or taken here; DDP subgraphs loaded or recorded.
        **{name: delta.get(name, 0) for name in SAME_NAME_COUNTERS},
        # Forwards compiled on without waiting for their worker, frames compiled again (deferred).
        "forwards_deferred": delta.get("ddp_forwards_deferred", 0),
        "mispredictions": delta.get("ddp_forward_mispredictions", 0),
        "saved_restrided": delta.get("ddp_saved_restrided", 0),
        # Of those, backwards sent again from the strides a worker stored once it lowered the
        # forward, before the forward was loaded.
        "saved_restrided_early": delta.get("ddp_saved_restrided_early", 0),
        "losses": [r["losses"] for r in ranks],
        "matches_eager": all(r["matches_eager"] for r in ranks),
        # The workers' graph codegens of this job: start (s after launch) and seconds each,
        # to see which ran beside which (a backward sent ahead beside its forward).
        "fx_builds": fx_builds(cluster, launched),
        "phases": ranks[0].get("compile_phases", {}),
        "step_phases": ranks[0].get("step_phases", []),  # what each of the first steps added
        # How busy the worker and the whole host were over the run (CPUs in use, on average).
        "worker_cpus_busy": round(worker_cpu / wall, 2),
        "host_cpus_busy": round(host_busy / wall, 2),
        # Rank 0's start-up marks, seconds after launch (launcher, imports, models, wrap).
        "startup": {k: round(t - launched, 2) for k, t in ranks[0].get("startup", {}).items()},
    }


def chosen_script_args(given: list[str], gpus: int) -> list[str]:
    """The script's arguments: the defaults for this machine where none are given; else the
    given ones, on the GPUs where there are some and they name no device. The script's own
    default device is the CPU, so ``-- --fsdp`` on a GPU node ran every rank on the CPU,
    silently (a whole device call of the thirty-sixth session went so)."""
    if not given:
        return list(GPU_ARGS if gpus else CPU_ARGS)
    named = any(a == "--device" or a.startswith("--device=") for a in given)
    return [*given] if named or not gpus else ["--device", "cuda", *given]


def zoo_script_args(name: str, gpus: int) -> list[str]:
    """The script's arguments for the zoo's model ``name`` at the zoo's size for this machine:
    what ``python -m bench zoo`` trains it with, less its step count and device (this bench's
    and :func:`chosen_script_args`'). ``ValueError`` names the choices for a name it lacks."""
    from bench.zoo_models import MODELS, named, size_for

    model = named(name)
    if model is None:
        examples = ", ".join(m.name for m in MODELS[:2])
        raise ValueError(
            f"--zoo: unknown model {name!r}: a name of bench/zoo_models.py ({examples}, ...), "
            "or timm:NAME or hf:CLASS"
        )
    return model.args(size_for(gpus > 0))


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m bench.ddp", description=__doc__)
    gpus = torch.cuda.device_count()
    parser.add_argument("--nproc", type=int, default=gpus or 2)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help="which runs, comma-separated (a run that needs another's dirs needs that run too)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench-out"))
    parser.add_argument(
        "--cprofile",
        action="store_true",
        help="run each job under cProfile, writing RUN.pstats (with ranks: RUN-rankK.pstats) "
        "to --out (timings then include the profiler's own cost)",
    )
    parser.add_argument(
        "--strace",
        action="store_true",
        help="count each job's memory system calls (mmap, munmap, brk...) over all its "
        "processes with strace, writing RUN.strace to --out (timings then include strace's cost)",
    )
    parser.add_argument(
        "--zoo",
        metavar="MODEL",
        default=None,
        help="a model of `python -m bench zoo` at the zoo's size for this machine (GPU size, "
        "tiny on a CPU); the script arguments after -- are added to its own",
    )
    parser.add_argument(
        "script_args",
        nargs="*",
        help="after --: llama_script.py arguments (on a GPU machine, with --device cuda "
        "unless they name a device)",
    )
    args = parser.parse_args(argv)
    chosen = args.runs.split(",")
    if unknown := set(chosen) - set(RUNS):
        parser.error(f"unknown runs {sorted(unknown)}; choose from {', '.join(RUNS)}")
    given = list(args.script_args)
    if args.zoo:
        try:
            given = [*zoo_script_args(args.zoo, gpus), *given]
        except ValueError as bad:
            parser.error(str(bad))
    script_args = chosen_script_args(given, gpus)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = new_workdir()
    cluster = Cluster(workdir, gpu=bool(gpus)).start()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in RUNS if name in chosen}
    started = time.monotonic()
    try:
        worker_started = time.monotonic()
        # On a GPU node, the worker's default concurrency (its cores), as `compileq worker`
        # runs there: stock's compile pool has every core too. With 4, a worker generating
        # two graphs built their kernels two at a time (H100 log of 2026-11-23). The 2-core
        # CPU machine keeps 4: graph codegens and kernel builds overlap there.
        cluster.start_worker(None if gpus else 4, gpus="all" if gpus else None)
        worker_ready_s = round(time.monotonic() - worker_started, 1)
        worker_cpus = cpus.describe(
            set(os.sched_getaffinity(process_tree(cluster.worker.pid)[-1].pid))
        )
        for rep in range(args.reps):
            for name, mode, before in PLAN:
                if name not in chosen:
                    continue
                if before in ("flush", "cold"):
                    cluster.flush()
                if before == "cold":
                    cluster.wipe_worker_caches()
                reuse = f"stock_cold-{rep}" if before == "reuse" else None
                nice = 0 if mode == "compileq-nice0" else None
                every_cpu = cpus.usable() if mode == "compileq-all-cpus" else None
                with adjusted(cluster, nice, every_cpu):
                    results[name].append(
                        run_job(
                            cluster,
                            workdir,
                            f"{name}-{rep}",
                            args.nproc,
                            script_args,
                            mode,
                            reuse,
                            out if args.cprofile else None,
                            out if args.strace else None,
                        )
                    )
                # Saved as it goes: a run cut short by a time limit keeps what it measured.
                (out / "ddp.json").write_text(json.dumps({"runs": results}, indent=1))
    finally:
        cluster.close()
        for log in workdir.glob("*.log"):
            shutil.copy(log, out / f"ddp-{log.name}")
    meta = {
        "device": torch.cuda.get_device_name(0) if gpus else "CPU only",
        "gpus": gpus,
        "nproc": args.nproc,
        "torch": torch.__version__,
        "script_args": script_args,
        "worker_ready_s": worker_ready_s,
        "cpus": len(cpus.usable()),
        "physical_cores": len(cpus.cores(cpus.usable())),
        "worker_cpus": worker_cpus,
        "bench_s": round(time.monotonic() - started, 1),
    }
    (out / "ddp.json").write_text(json.dumps({"meta": meta, "runs": results}, indent=1))
    (out / "ddp.md").write_text(render(meta, results))
    print((out / "ddp.md").read_text())
    return 0


def render(meta: dict[str, Any], results: dict[str, list[dict[str, Any]]]) -> str:
    def median(name: str, field: str) -> float:
        return statistics.median(r[field] for r in results[name])

    def ratio(name: str, stock: str | None) -> str:
        """``name``'s all-ranks-done against that stock run's, where it ran."""
        if stock is None or not results.get(stock):
            return "-"
        return f"{median(name, 'all_done_s') / median(stock, 'all_done_s'):.2f}x"

    lines = [
        (f"DDP on {meta['nproc']} ranks" if meta["nproc"] else "One process, no DDP")
        + f" ({meta['device']}, torch {meta['torch']}); "
        f"worker ready in {meta['worker_ready_s']} s",
        "",
        "| run | first step per rank (s) | all ranks done (s) | vs stock | vs stock warm local "
        "| codegens / graphs | backwards sent ahead | fallbacks | losses = stock |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    # Losses are compared with stock's cold run, or, without it, with the first run made.
    reference = (results.get("stock_cold") or next(iter(results.values())))[0]["losses"]
    for name, rows in results.items():
        last = rows[-1]
        new = "_new" in name  # a new machine: against stock's remote cache and warm local
        against = ratio(name, "stock_remote_new" if new else "stock_cold")
        against_warm = ratio(name, "stock_warm_local" if new else None)
        same = all(
            abs(a - b) <= 1e-2 * max(1.0, abs(b))
            for r in rows
            for ours, theirs in zip(r["losses"], reference, strict=True)
            for a, b in zip(ours, theirs, strict=True)
        )
        lines.append(
            f"| {name} | {' / '.join(f'{s:.2f}' for s in last['ranks_first_step_s'])} "
            f"| {median(name, 'all_done_s'):.2f} | {against} | {against_warm} "
            f"| {last['codegens']} / {last['distinct_graphs']} | {last.get('sent_ahead', 0)} "
            f"| {last['fallbacks']} | {same} |"
        )
    return "\n".join([*lines, "", *breakdown(results), "", *startup(results)]) + "\n"


#: Where rank 0's first step went, by torch's own phase timers (``dynamo_timed``), seconds.
#: Nested: the backend holds AOTAutograd, which holds the forward compile; a graph's codegen
#: (in process, or the wait for a worker) is inside the forward or backward compile.
PHASES = (
    ("frame compiles", ("_compile.compile_inner",)),
    ("Dynamo tracing", ("bytecode_tracing",)),
    (
        "AOTAutograd tracing + partition",
        (
            "aot_collect_metadata",
            "aot_trace_joint_graph",
            "_recursive_joint_graph_passes",
            "min_cut_rematerialization_partition",
        ),
    ),
    ("forward compiles", ("compile_fx.<locals>.fw_compiler_base",)),
    ("backward compiles", ("compile_fx.<locals>.bw_compiler",)),
    ("codegen here (lowering + code)", ("GraphLowering.compile_to_module",)),
    ("loading output code", ("PyCodeCache.load_by_key_path",)),
    ("waiting for kernels", ("async_compile.wait",)),
)


def breakdown(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    rows = [(name, runs[-1].get("phases") or {}) for name, runs in results.items() if runs]
    if not any(phases for _, phases in rows):
        return []
    head = "| rank 0, first step (s) | " + " | ".join(name for name, _ in rows) + " |"
    lines = [head, "| --- |" + " --- |" * len(rows)]
    for label, names in PHASES:
        cells = [f"{sum(phases.get(n, 0.0) for n in names):.2f}" for _, phases in rows]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def startup(results: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Rank 0's start-up: seconds after launch at which each mark was reached."""
    rows = [(name, runs[-1].get("startup") or {}) for name, runs in results.items() if runs]
    marks = next((list(marks) for _, marks in rows if marks), [])
    if not marks:
        return []
    lines = ["| rank 0, seconds after launch | " + " | ".join(name for name, _ in rows) + " |"]
    lines.append("| --- |" + " --- |" * len(rows))
    for mark in marks:
        cells = [f"{m[mark]:.2f}" if mark in m else "-" for _, m in rows]
        lines.append(f"| {mark} | " + " | ".join(cells) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
