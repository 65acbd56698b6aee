"""A fresh pool process's first graph against its later ones.

One ``compileq worker`` with one pool process (GPU-pinned to GPU 0 where there is a GPU, else
``--cpu-only``), then the script-defined Llama of ``examples/llama_script.py`` (one layer) cold
at each width in turn: other kernels each time, so nothing is reused but the pool process.
Each client is a fresh ``compileq run`` process with its own local cache dirs. Prints the
worker's log line for each graph it generated (forward, backward per width) and copies the log
to ``--out``. Stock has no worker, so there is no stock column: this measures compileq's own
overhead (docs/BENCHMARKS.md, "A fresh pool process's first graph").

    python -m bench.fresh_pool [--widths 64,96,128] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from bench.harness import ROOT, CacheDirs, Cluster, new_workdir

#: A graph's codegen line, shortened to the graph's key prefix and what follows "in".
_GENERATED = re.compile(r"generated graph compileq:a:fxcode:([0-9a-f]{8})[0-9a-f]* in (.*)")


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m bench.fresh_pool", description=__doc__)
    parser.add_argument("--widths", default="64,96,128")
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench-out"))
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = new_workdir()
    cluster = Cluster(workdir, gpu=gpu).start()
    try:
        cluster.start_worker(1)
        dirs = CacheDirs(workdir / "clients")
        for width in args.widths.split(","):
            script = [str(ROOT / "examples" / "llama_script.py"), "--width", width]
            script += ["--device", "cuda" if gpu else "cpu", "--layers", "1", "--steps", "1"]
            subprocess.run(
                [sys.executable, "-m", "compileq.cli", "run", "--", sys.executable, *script],
                env={**cluster.env(), **dirs.env(dirs.fresh())},
                cwd=ROOT,
                check=True,
                capture_output=True,
                timeout=900,
            )
    finally:
        cluster.close()
    (log,) = workdir.glob("worker-*.log")
    shutil.copy(log, out / "fresh_pool.log")
    for line in log.read_text().splitlines():
        if "ready " in line and "after its process started" in line:
            print(line.split("compileq worker", 1)[-1].strip())
        elif match := _GENERATED.search(line):
            print(f"{match[1]} {match[2][:130]}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
