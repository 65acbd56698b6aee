"""compileq's three first-step runs alone (cold cluster, new machine, edited model), for a
check after a fix when there is no time for the stock baselines again:

    python -m bench.compileq_runs --workload gpt [--out DIR]

Not a comparison by itself: docs/BENCHMARKS.md sets its figures beside stock's from a full
``python -m bench`` run on the same machine, and says so.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.harness import COMPILEQ, CacheDirs, Cluster, new_workdir, run_once


def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.compileq_runs")
    parser.add_argument("--workload", default="gpt")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench-out"))
    args = parser.parse_args()
    import torch

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = new_workdir()
    cluster = Cluster(workdir, torch.cuda.is_available()).start()
    dirs = CacheDirs(workdir / "machines")
    results: dict[str, object] = {}
    try:
        cluster.start_worker(min(16, os.cpu_count() or 1))
        for name, edit in (("cq_cold", False), ("cq_new", False), ("cq_edit", True)):
            before = cluster.stats()
            run = run_once(
                cluster, dirs, COMPILEQ, dirs.fresh(), args.workload, out / "runs.log", edit=edit
            )
            counters = {
                k: v - before.get(k, 0)
                for k, v in cluster.stats().items()
                if isinstance(v, int) and v != before.get(k, 0)
            }
            results[name] = {
                "first_step_s": run.first_step_s,
                "loss": run.result["loss"],
                "counters": counters,
            }
            print(name, json.dumps(results[name]), flush=True)
            (out / "compileq_runs.json").write_text(json.dumps(results, indent=1))
    finally:
        cluster.close()


if __name__ == "__main__":
    main()
