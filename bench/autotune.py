"""max-autotune cold: stock, and compileq with and without its GPU workers timing candidates.

``examples/mlp_autotune.py`` (the model's class in the script, run as ``__main__``), every run a
fresh process on empty local cache dirs, in one invocation:

- ``stock``: stock Inductor, no Redis, no workers.
- ``stock-again``: the same, a second fresh process: stock's own spread, in its picks (timed
  anew by each process) and in the compiled step's speed.
- ``compileq-no-fx-tune-off``: ``compileq run --no-fx`` on a cold cluster (graphs generated in
  the training process, kernels built on the workers) with ``COMPILEQ_TUNE_ON_WORKERS=0``:
  candidates timed one after another in the training process, as stock does.
- ``compileq-no-fx``: the same with the candidates timed by the GPU workers.
- ``compileq-timings-warm``: every entry of the store dropped but the timings, then the same
  again on a new machine: every graph generated, every kernel built and every GEMM autotuned
  again, every timing found in the store.
- ``compileq``: ``compileq run`` on a cold cluster, graphs generated on the workers, where
  the candidates are timed in the generating worker and stored (inductor/autotune.py).

``--workers N`` GPU workers are started (``compileq worker --gpus K``, K = i mod the GPU
count: on a one-GPU machine they share GPU 0 and take turns on it). Each run reports the
first step's time, launch to end of that step (``done_s``), losses, compileq's counters
(``tune_*``, kernels) and Inductor's AUTOTUNE tables (client stderr and worker logs): per GEMM
the pick, its time, the seconds spent timing and precompiling. ``picks`` compares each run's
picks with stock's: a differing pick is given with the time stock's own table gave it. What a
pick costs is read from ``step_ms``: the compiled step's speed after compile (median of the
script's timed rounds), against stock's (``vs_stock_step``).

    python -m bench.autotune [--workers 2] [--small] [--runs stock,compileq,...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from bench.harness import ROOT, CacheDirs, Cluster, new_workdir
from compileq import keys
from compileq.localstack import start_worker, stop
from compileq.tasks.tune_jobs import KIND, TABLE_KIND

SCRIPT = ROOT / "examples" / "mlp_autotune.py"
RUNS = (
    "stock",
    "stock-again",
    "compileq-no-fx-tune-off",
    "compileq-no-fx",
    "compileq-timings-warm",
    "compileq",
)

#: Runs of stock Inductor alone: no compileq, no workers.
STOCK = ("stock", "stock-again")
_TAG = re.compile(r"(ForkPoolWorker-\d+|MainProcess)")
_HEADER = re.compile(r"AUTOTUNE (\w+\(.*\))\s*$")
_ROW = re.compile(r"\s(\w+) (\d+\.\d+) ms (\d+\.\d+)% ?(.*)$")
_SUMMARY = re.compile(
    r"AUTOTUNE benchmarking takes ([\d.]+) seconds and ([\d.]+) seconds precompil"
)


def autotune_tables(text: str) -> list[dict[str, Any]]:
    """Inductor's ``AUTOTUNE op(sizes)`` tables in ``text``; lines of several processes of
    a worker may interleave, so each is followed by its process name where the log has one."""
    open_: dict[str, dict[str, Any]] = {}
    done: list[dict[str, Any]] = []
    for line in text.splitlines():
        tag = m[1] if (m := _TAG.search(line)) else ""
        if header := _HEADER.search(line):
            open_[tag] = {"op": header[1], "rows": []}
            continue
        table = open_.get(tag)
        if table is None:
            continue
        if summary := _SUMMARY.search(line):
            table["bench_s"], table["precompile_s"] = float(summary[1]), float(summary[2])
            done.append(open_.pop(tag))
        elif row := _ROW.search(line):
            table["rows"].append({"name": row[1], "ms": float(row[2]), "config": row[4].strip()})
    for table in done:
        best = table["rows"][0] if table["rows"] else None
        table["pick"] = _pick(best) if best else None
    return done


def _pick(row: dict[str, Any]) -> str:
    """A candidate as another process names it: its config (Triton), or its kernel (ATen)."""
    return row["config"] or re.sub(r"_\d+$", "", row["name"])


def compare_picks(stock: list[dict[str, Any]], other: list[dict[str, Any]]) -> dict[str, Any]:
    """Per GEMM (in order of meeting it): the same pick as stock's, or how much slower stock's
    own table timed the other pick (None: not in stock's top candidates)."""
    by_op: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for table in stock:
        by_op[table["op"]].append(table)
    same, differ = 0, []
    for table in other:
        if not by_op.get(table["op"]):
            continue
        ref = by_op[table["op"]].pop(0)
        if table["pick"] == ref["pick"]:
            same += 1
            continue
        timed = [r["ms"] for r in ref["rows"] if _pick(r) == table["pick"]]
        best = ref["rows"][0]["ms"]
        differ.append(
            {
                "op": table["op"],
                "stock": ref["pick"],
                "this": table["pick"],
                "this_vs_stock_best_in_stock_table": round(timed[0] / best, 3) if timed else None,
            }
        )
    return {"same": same, "different": differ}


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m bench.autotune", description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="a quick model (tests, smoke runs)")
    parser.add_argument(
        "--runs",
        default=",".join(RUNS),
        help=f"comma-separated, in this order; stock always runs first (default: {','.join(RUNS)})",
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench-out"))
    args = parser.parse_args(argv)
    asked = {name.strip() for name in args.runs.split(",") if name.strip()}
    if unknown := asked - set(RUNS):
        parser.error(f"unknown runs: {', '.join(sorted(unknown))} (known: {', '.join(RUNS)})")
    runs = [name for name in RUNS if name in asked or name == "stock"]
    if not torch.cuda.is_available():
        print("bench.autotune needs a CUDA GPU", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = (
        ["--dim", "256", "--hidden", "512", "--layers", "1", "--batch", "64"] if args.small else []
    )
    workdir = new_workdir()
    cluster = Cluster(workdir, gpu=True).start()
    dirs = CacheDirs(workdir / "clients")
    logs: list[Path] = []
    workers: list[subprocess.Popen[bytes]] = []
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "gpus": gpus,
        "torch": torch.__version__,
        "workers": args.workers,
        "small": args.small,
        "runs": {},
    }
    try:
        import triton

        report["triton"] = triton.__version__
        for mode in runs:
            if mode != "compileq-timings-warm":
                cluster.flush(stock=True)
                cluster.wipe_worker_caches()
            else:  # every artifact but the timings: graphs generated and kernels built again
                drop_all_but_timings(cluster.client())
            if mode not in STOCK and not workers:
                started = time.perf_counter()
                logs = [workdir / f"worker-{i}.log" for i in range(args.workers)]
                workers = [
                    start_worker(
                        cluster.settings,
                        ["--gpus", str(i % gpus)],
                        log,
                        env={**cluster.env(), **cluster.worker_dirs()},
                    )
                    for i, log in enumerate(logs)
                ]
                report["workers_start_s"] = round(time.perf_counter() - started, 1)
            report["runs"][mode] = _run(cluster, dirs, mode, size, logs, out)
            summary = {k: v for k, v in report["runs"][mode].items() if k != "tables"}
            print(mode, json.dumps(summary), flush=True)
    finally:
        for proc in workers:
            stop(proc)
        cluster.close()
    against_stock(report["runs"])
    for log in sorted(workdir.glob("worker-*.log")):
        (out / f"autotune-{log.name}").write_text(log.read_text()[-2_000_000:])
    (out / "autotune.json").write_text(json.dumps(report, indent=1))
    for mode in runs:
        run = report["runs"][mode]
        print(
            f"{mode:24s} done {run['done_s']:7.2f}s  first step {run['first_step_s']:7.2f}s  "
            f"timing {run['bench_s']:6.2f}s  precompile {run['precompile_s']:6.2f}s  "
            f"step {run['step_ms']} ms  "
            f"tables {len(run['tables'])}  tune {run['tune']}  picks {run.get('picks', '')}"
        )
    return 0


def against_stock(runs: dict[str, dict[str, Any]]) -> None:
    """Each run beside stock's, in place: time to done, the compiled step's speed (where both
    were timed) and the picks."""
    stock = runs["stock"]
    for mode, run in runs.items():
        if mode == "stock":
            continue
        run["vs_stock_done"] = round(run["done_s"] / stock["done_s"], 3)
        if run.get("step_ms") and stock.get("step_ms"):
            run["vs_stock_step"] = round(run["step_ms"] / stock["step_ms"], 3)
        run["picks"] = compare_picks(stock["tables"], run["tables"])


def drop_all_but_timings(client: redis.Redis, keep_tables: bool = False) -> None:
    """Every compileq artifact but max-autotune's candidate timings (and, with ``keep_tables``,
    its GEMM tables): graphs and kernels are made again, and every GEMM autotuned again."""
    kept = (keys.artifact(KIND, ""), *((keys.artifact(TABLE_KIND, ""),) if keep_tables else ()))
    for key in client.scan_iter(match=keys.ARTIFACT + "*", count=1000):
        if not key.decode().startswith(kept):
            client.delete(key)


def _run(
    cluster: Cluster, dirs: CacheDirs, mode: str, size: list[str], logs: list[Path], out: Path
) -> dict[str, Any]:
    env = {
        **cluster.env(),
        **dirs.env(dirs.fresh()),
        "TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED": "all",
    }
    cmd = [sys.executable, str(SCRIPT), *size]
    if mode not in STOCK:
        cmd = [sys.executable, "-m", "compileq.cli", "run", "--", *cmd]
    if mode == "compileq-no-fx-tune-off":
        env["COMPILEQ_TUNE_ON_WORKERS"] = "0"
    if mode != "compileq" and mode not in STOCK:
        cmd.insert(cmd.index("--"), "--no-fx")
    before = cluster.stats()
    offsets = [log.stat().st_size for log in logs]
    launched = time.time()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    (out / f"autotune-{mode}.err").write_text(proc.stderr[-1_000_000:])
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    after = cluster.stats()
    text = proc.stderr
    for log, offset in zip(logs, offsets, strict=True):
        with log.open("rb") as f:
            f.seek(offset)
            text += "\n" + f.read().decode(errors="replace")
    tables = autotune_tables(text)
    delta = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    return {
        "done_s": round(result["finished_at"] - launched, 2),
        "first_step_s": round(result["first_step_s"], 2),
        "losses": result["losses"],
        "step_ms": statistics.median(result["step_ms"]) if result.get("step_ms") else None,
        "step_ms_rounds": result.get("step_ms", []),
        "bench_s": round(sum(t.get("bench_s", 0.0) for t in tables), 2),
        "precompile_s": round(sum(t.get("precompile_s", 0.0) for t in tables), 2),
        "tune": {k: v for k, v in delta.items() if k.startswith("tune_")},
        "counters": delta,
        "tables": tables,
    }


if __name__ == "__main__":
    sys.exit(main())
