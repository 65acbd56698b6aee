"""compileq against stock torch.compile, every scenario side by side in one invocation.

    python -m bench                                   # every scenario this machine can run
    python -m bench --scenarios first --workloads gpt --reps 3
    python -m bench --scenarios herd,scaling,queue
    python -m bench --scenarios first --workloads mlp --reps 1 --only stock --out a
    python -m bench --scenarios first --workloads mlp --reps 1 --only compileq --out b
    python -m bench.report a/results.json b/results.json   # the two halves, one table
    python -m bench matrix                            # every training configuration (two GPUs)
    python -m bench zoo                               # PyTorch's own benchmark models

The halves are for a workload whose repetition outlasts one device call (the max-autotune
MLP's takes ~11 minutes on an H100): run them back to back on the same machine.
``bench.report`` pools a workload's runs over every file it is given, so repetitions made in
separate calls give one median too.

Scenarios: ``first`` (1 cold, 2 new machine on a warm cluster, 3 edited model on a new
machine), ``herd`` (4), ``scaling`` (5), ``queue`` (6). It starts a private redis-server (or
uses ``BENCH_REDIS_URL``) and one ``compileq worker`` (GPU-pinned when there is a GPU, else
``--cpu-only``), and runs every measurement in a fresh process. Writes ``results.json``,
``bench.md`` and ``bench.png`` to ``--out`` (default ``$OUT``, else ``bench-out/``); ``python -m
bench.report results.json --docs docs/BENCHMARKS.md`` puts the tables into the docs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from bench.harness import ROOT, CacheDirs, Cluster, new_workdir
from bench.report import chart, render
from bench.scenarios import first_steps, herd, queue_overhead, scaling

SCENARIOS = ("first", "herd", "scaling", "queue")


def _meta(gpu: bool, argv: list[str]) -> dict[str, Any]:
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return {
        "device": torch.cuda.get_device_name(0) if gpu else "CPU only",
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "triton": triton_version,
        "date": datetime.date.today().isoformat(),
        "command": " ".join(["python -m bench", *argv]),
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--scenarios", default=None, help="default: all with a GPU; first,herd,queue on CPU"
    )
    parser.add_argument(
        "--workloads", default=None, help="default: gpt,convnet,mlp on a GPU; mlp on CPU"
    )
    parser.add_argument("--herd-workload", default=None, help="default: gpt on a GPU; mlp on CPU")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--only",
        choices=("stock", "compileq"),
        default=None,
        help="scenarios 1-3: one half only, for a repetition longer than a device call "
        "(bench.report merges the two halves)",
    )
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--scaling", default="1,2,4,8", help="worker process counts")
    parser.add_argument(
        "--scaling-kinds", default=None, help="gpu,cpu (default: gpu,cpu with a GPU)"
    )
    parser.add_argument("--round-trips", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=None, help="worker processes for builds")
    parser.add_argument("--out", default=os.environ.get("OUT") or "bench-out")
    args = parser.parse_args(argv)

    import torch

    gpu = torch.cuda.is_available()
    chosen = [
        s
        for s in (args.scenarios or (",".join(SCENARIOS) if gpu else "first,herd,queue")).split(",")
        if s
    ]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; choose from {', '.join(SCENARIOS)}")
    workloads = (args.workloads or ("gpt,convnet,mlp" if gpu else "mlp")).split(",")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    log = out / "runs.log"
    results: dict[str, Any] = {"meta": _meta(gpu, argv)}
    # `timeout` (as on the device) sends SIGTERM: exit through the finally below, which stops
    # the worker and keeps the logs, instead of dying where the signal lands.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    workdir = new_workdir()
    cluster = Cluster(workdir, gpu).start()
    dirs = CacheDirs(workdir / "machines")
    concurrency = args.concurrency or min(16, os.cpu_count() or 1)

    def save() -> None:
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "bench.md").write_text(render(results))

    try:
        if "first" in chosen or "herd" in chosen:
            cluster.start_worker(concurrency)
        if "first" in chosen:
            for workload in workloads:
                print(f"scenarios 1-3: {workload}", flush=True)
                done = list(results.get("first_steps", []))

                def partial(summary: dict[str, Any], done: list[dict[str, Any]] = done) -> None:
                    results["first_steps"] = [*done, summary]
                    save()

                partial(first_steps(cluster, dirs, workload, args.reps, log, partial, args.only))
        if "herd" in chosen:
            workload = args.herd_workload or ("gpt" if gpu else "mlp")
            print(f"scenario 4: herd of {args.ranks} x {workload}", flush=True)
            results.setdefault("herd", []).append(herd(cluster, dirs, workload, args.ranks, log))
            save()
        if "queue" in chosen:
            print("scenario 6: queue overhead", flush=True)
            cluster.start_worker(concurrency)
            results["queue"] = queue_overhead(cluster, out, max(5, args.reps), args.round_trips)
            save()
        if "scaling" in chosen:
            kinds = (args.scaling_kinds or ("gpu,cpu" if gpu else "cpu")).split(",")
            sizes = [int(n) for n in args.scaling.split(",")]
            print(f"scenario 5: scaling {kinds} x {sizes}", flush=True)
            results["scaling"] = scaling(
                cluster,
                dirs,
                ROOT / "bench/data/autotune_mlp.jsonl",
                sizes,
                [k == "cpu" for k in kinds],
            )
            save()
    finally:
        cluster.close()
        save()
        # Kept beside the results: a failed build or FX job is explained only there. One
        # file, in start order (scaling starts eight workers; a device call returns few files).
        with (out / "workers.log").open("wb") as joined:
            for worker_log in sorted(workdir.glob("worker-*.log")):
                joined.write(f"==> {worker_log.name} <==\n".encode())
                with worker_log.open("rb") as part:
                    shutil.copyfileobj(part, joined)
    chart(results, out / "bench.png")
    print(render(results))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["zoo"]:  # PyTorch's own benchmark models (bench/zoo.py)
        from bench import zoo

        sys.exit(zoo.main(sys.argv[2:]))
    if sys.argv[1:2] == ["matrix"]:  # every training configuration (bench/matrix.py)
        from bench import matrix

        sys.exit(matrix.main(sys.argv[2:]))
    sys.exit(main())
