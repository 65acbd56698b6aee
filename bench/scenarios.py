"""The benchmark scenarios. Each returns plain dicts that report.py turns into tables.

Every scenario runs stock and compileq in the same invocation on the same machine, and every
time is the median over ``reps`` fresh processes. Ratios are compileq / stock.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import (
    COMPILEQ,
    ROOT,
    STOCK,
    STOCK_REMOTE,
    CacheDirs,
    Cluster,
    Run,
    finish,
    launch,
    run_once,
    tree_cpu_s,
)

Row = dict[str, Any]


def _median(runs: list[Run], of: Callable[[Run], float] = lambda r: r.first_step_s) -> float:
    return statistics.median(of(r) for r in runs)


def _delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, int]:
    return {k: int(after[k]) - int(before.get(k, 0)) for k in after if after[k] != before.get(k)}


def first_steps(
    cluster: Cluster,
    dirs: CacheDirs,
    workload: str,
    reps: int,
    log: Path,
    after_rep: Callable[[dict[str, Any]], None] | None = None,
    only: str | None = None,
) -> dict[str, Any]:
    """Scenarios 1-3 for one workload: cold, new machine on a warm cluster, edited model.

    ``only="stock"`` or ``"compileq"`` runs one half, for a workload whose repetition outlasts
    one device call: two halves run back to back are merged by ``bench.report``.

    Per repetition, from empty caches everywhere: stock cold, then stock warm (same local
    dirs); stock's Redis remote cache filled by one run, then read by a new machine, then by a
    new machine running the edited model; compileq cold (a cold cluster: Redis and the worker's
    local caches empty), then a new machine, then a new machine with the edited model.
    """
    runs: dict[str, list[Run]] = {}
    counters: dict[str, dict[str, int]] = {}

    def record(name: str, run: Run) -> None:
        runs.setdefault(name, []).append(run)
        print(f"  {workload} {name}: first step {run.first_step_s:.2f}s", flush=True)
        if after_rep is not None and last in runs:
            # Saved after every run once a repetition is complete: a run cut short by a time
            # limit keeps the runs of its last, partial repetition too.
            after_rep(_summary(workload, runs, counters))

    stock, ours = only in (None, "stock"), only in (None, "compileq")
    last = "cq_edit" if ours else "stock_remote_edit"
    for _ in range(reps):
        cluster.flush()
        cluster.wipe_worker_caches()
        if stock:
            _stock_runs(cluster, dirs, workload, log, record)
        if not ours:
            continue
        before = cluster.stats()
        record("cq_cold", run_once(cluster, dirs, COMPILEQ, dirs.fresh(), workload, log))
        mid = cluster.stats()
        record("cq_new", run_once(cluster, dirs, COMPILEQ, dirs.fresh(), workload, log))
        new = cluster.stats()
        record("cq_edit", run_once(cluster, dirs, COMPILEQ, dirs.fresh(), workload, log, edit=True))
        counters = {
            "cq_cold": _delta(mid, before),
            "cq_new": _delta(new, mid),
            "cq_edit": _delta(cluster.stats(), new),
        }
        if after_rep is not None:
            after_rep(_summary(workload, runs, counters))
    return _summary(workload, runs, counters)


def _stock_runs(
    cluster: Cluster,
    dirs: CacheDirs,
    workload: str,
    log: Path,
    record: Callable[[str, Run], None],
) -> None:
    """Stock's five runs of one repetition: cold, warm, and its Redis remote caches."""
    local = dirs.fresh()
    record("stock_cold", run_once(cluster, dirs, STOCK, local, workload, log))
    record("stock_warm", run_once(cluster, dirs, STOCK, local, workload, log))
    record("stock_remote_fill", run_once(cluster, dirs, STOCK_REMOTE, dirs.fresh(), workload, log))
    record("stock_remote_new", run_once(cluster, dirs, STOCK_REMOTE, dirs.fresh(), workload, log))
    record(
        "stock_remote_edit",
        run_once(cluster, dirs, STOCK_REMOTE, dirs.fresh(), workload, log, edit=True),
    )


def _summary(
    workload: str, runs: dict[str, list[Run]], counters: dict[str, dict[str, int]]
) -> dict[str, Any]:
    stock_cold = runs["stock_cold"][0].result if "stock_cold" in runs else {}
    losses = {name: [r.result["loss"] for r in rs] for name, rs in runs.items()}
    return {
        "workload": workload,
        "reps": min(len(rs) for rs in runs.values()),  # complete repetitions
        "median_s": {name: _median(rs) for name, rs in runs.items()},
        "all_s": {name: [round(r.first_step_s, 3) for r in rs] for name, rs in runs.items()},
        "loss_equal_stock": loss_equal_stock(losses),
        "counters_last_rep": counters,
        "losses": losses,
        "stock_graphs": stock_cold.get("fx_codegen"),
        "stock_kernels": stock_cold.get("kernels_submitted"),
    }


def loss_equal_stock(losses: dict[str, list[Any]]) -> dict[str, bool]:
    """Per run name: every run's losses equal, bit for bit, those of some stock run of the same
    model (edited runs: stock's edited runs). Some stock run, not the first: on a GPU stock
    itself gives two results in one invocation (an H100, 2026-11-23: a last-digit difference
    in the second step's loss between its cold run and its remote-cache runs), so a compileq
    run is wrong only when it matches none of stock's. Empty without stock's runs (a
    compileq-only half); bench.report recomputes it on merging."""
    if "stock_cold" not in losses or "stock_remote_edit" not in losses:
        return {}
    stock = {
        edit: [
            loss
            for name, runs in losses.items()
            if name.startswith("stock") and ("edit" in name) == edit
            for loss in runs
        ]
        for edit in (False, True)
    }
    return {
        name: all(loss in stock["edit" in name] for loss in runs) for name, runs in losses.items()
    }


def herd(cluster: Cluster, dirs: CacheDirs, workload: str, ranks: int, log: Path) -> dict[str, Any]:
    """Scenario 4: ``ranks`` processes of one node start cold at once, sharing the GPU and the
    node's local cache dir. Measured: launch to the last rank's first step, the skew between
    first and last, compile CPU-seconds summed over ranks (process trees) and, for compileq,
    the worker; and compiles per unique graph and kernel."""
    out: dict[str, Any] = {"workload": workload, "ranks": ranks}
    single: dict[str, Run] = {}
    for mode in (STOCK, COMPILEQ):
        cluster.flush()
        cluster.wipe_worker_caches()
        single[mode] = run_once(cluster, dirs, mode, dirs.fresh(), workload, log)
        cluster.flush()
        cluster.wipe_worker_caches()
        before = cluster.stats()
        worker = cluster.worker.pid if cluster.worker else None
        worker_cpu = tree_cpu_s(worker)
        node = dirs.fresh()
        started = time.time()
        procs = [launch(cluster, dirs, mode, node, workload) for _ in range(ranks)]
        runs = [finish(p, t, mode, log) for p, t in procs]
        finished = [float(r.result["finished_at"]) for r in runs]
        worker_cpu = tree_cpu_s(worker) - worker_cpu
        rank_cpu = sum(float(r.result["compile_cpu_s"] or 0.0) for r in runs)
        counts = _delta(cluster.stats(), before)
        if mode == STOCK:
            graphs = sum(int(r.result["fx_codegen"]) for r in runs)
            kernels = sum(int(r.result["kernels_submitted"]) for r in runs)
        else:
            graphs = counts.get("fx_remote_compiles", 0) + counts.get("fx_local_compiles", 0)
            kernels = counts.get("kernel_remote_compiles", 0) + counts.get(
                "kernel_local_compiles", 0
            )
        out[mode] = {
            "single_rank_done_s": single[mode].done_s,
            "all_done_s": max(finished) - started,
            "skew_s": max(finished) - min(finished),
            "compile_cpu_s": rank_cpu + (worker_cpu if mode == COMPILEQ else 0.0),
            "worker_cpu_s": worker_cpu if mode == COMPILEQ else 0.0,
            "graph_compiles": graphs,
            "kernel_compiles": kernels,
            "counters": counts,
            "loss_equal": len({json.dumps(r.result["loss"]) for r in runs}) == 1,
        }
        print(f"  herd {workload} {mode}: {out[mode]}", flush=True)
    out["unique_graphs"] = int(single[STOCK].result["fx_codegen"])
    out["unique_kernels"] = int(single[STOCK].result["kernels_submitted"])
    return out


def _warm(cluster: Cluster, manifest: Path, dirs: CacheDirs) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "compileq.cli", "warm", str(manifest), "--json"],
        env={**cluster.env(), **dirs.env(dirs.fresh())},
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"compileq warm failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def scaling(
    cluster: Cluster, dirs: CacheDirs, manifest: Path, sizes: list[int], kinds: list[bool]
) -> dict[str, Any]:
    """Scenario 5: the max-autotune workload's kernels (GEMM template candidates and fused
    kernels, as Inductor submits them while autotuning) built by 1, 2, 4, 8 worker processes,
    GPU-pinned and ``--cpu-only``. A cold cluster each time; speed-up against one process."""
    out: dict[str, Any] = {"manifest": manifest.name, "series": {}}
    for cpu_only in kinds:
        label = "cpu-only" if cpu_only else "gpu-pinned"
        series = []
        for n in sizes:
            cluster.start_worker(n, cpu_only=cpu_only)
            cluster.flush()
            report = _warm(cluster, manifest, dirs)
            if report.get("failed") or report.get("local"):
                print(f"  scaling {label} x{n}: {report}", flush=True)
            series.append({"workers": n, **report})
            print(f"  scaling {label} x{n}: {report['wall_s']:.2f}s", flush=True)
        base = series[0]["wall_s"]
        for point in series:
            point["speedup"] = base / point["wall_s"]
            point["efficiency"] = point["speedup"] / point["workers"]
        out["series"][label] = series
    return out


def queue_overhead(cluster: Cluster, out_dir: Path, reps: int, tasks: int) -> dict[str, Any]:
    """Scenario 6: hit-path latency (bench.hit_path, stock's local hit in the same run), the
    batched lookup of 1,000 keys, and no-op compile round trips per second through a worker."""
    env = {**cluster.env(), "OUT": str(out_dir), "COMPILEQ_REDIS_URL": cluster.url}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.hit_path", "--reps", str(reps), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench.hit_path failed:\n{proc.stderr[-3000:]}")
    hit = json.loads(proc.stdout.strip().splitlines()[-1])
    from bench.roundtrip import noop_round_trips

    return {"hit_path": hit, "round_trip": noop_round_trips(cluster.settings, tasks)}
