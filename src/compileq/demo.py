"""``compileq demo``: compileq against stock Inductor on an embedded workload, in one run.

Without ``COMPILEQ_REDIS_URL`` it starts a private redis-server and a local worker (GPU-pinned
when this machine has a GPU, cross-compiling otherwise). It builds the kernels of a real
training step three times, each in a fresh process with empty local caches: with stock
Inductor's local pool, through compileq on a cold cluster, and through compileq again as a
new machine. Then it prints one table.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from compileq.config import Settings, child_env, get_settings
from compileq.localstack import private_redis, start_worker, stop
from compileq.scheduler.warm import read_manifest

PHASES = [
    ("stock Inductor, local pool", ["--stock"]),
    ("compileq, cold cluster", []),
    ("compileq, new machine", []),
]


def _say(message: str) -> None:
    # Progress is for people at a terminal; logs and pipes stay clean.
    if sys.stderr.isatty():
        print(f"\r\033[K{message}", end="", file=sys.stderr, flush=True)


def _has_gpu() -> bool:
    probe = "import torch; print(torch.cuda.is_available())"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return out.stdout.strip().endswith("True")


def run_demo(manifest: Path | None, as_json: bool) -> int:
    with contextlib.ExitStack() as stack:
        path = manifest or stack.enter_context(
            resources.as_file(resources.files("compileq") / "data" / "demo_kernels.jsonl")
        )
        jobs = read_manifest(path)
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="compileq-demo-")))
        if os.environ.get("COMPILEQ_REDIS_URL"):
            settings = get_settings()
            settings.secret_bytes()
            where = f"the cluster at {settings.redis_display}"
        else:
            _say("starting a private redis-server and a local worker...")
            server = stack.enter_context(private_redis())
            settings = Settings(redis_url=server.url(), secret=secrets.token_hex(16))
            if _has_gpu():
                args = ["--gpus", "0"]
            else:
                archs = sorted({str(t) for j in jobs if (t := j.target)})
                args = ["--cpu-only", "--arch", ",".join(archs)]
            worker = start_worker(settings, args, log=workdir / "worker.log")
            stack.callback(stop, worker)
            where = "a private redis-server and one local worker (embedded default)"
        rows = []
        for number, (label, flags) in enumerate(PHASES, 1):
            _say(f"[{number}/{len(PHASES)}] {label}: building {len(jobs)} kernels...")
            cache = workdir / f"phase{number}"
            env = child_env(
                settings,
                TRITON_CACHE_DIR=str(cache / "triton"),
                TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
            )
            started = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "compileq.cli", "warm", str(path), "--json", *flags],
                env=env,
                capture_output=True,
                text=True,
            )
            process_s = time.perf_counter() - started
            if proc.returncode != 0:
                _say("")
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            report = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append({"phase": label, **report, "process_s": round(process_s, 2)})
    _say("")
    base = rows[0]["wall_s"]
    for row in rows:
        row["vs_stock"] = round(row["wall_s"] / base, 3) if base else None
    if as_json:
        print(json.dumps({"kernels": len(jobs), "where": where, "phases": rows}))
        return 0
    print(f"compileq demo: {len(jobs)} Triton kernels of a real training step, {where}")
    print("each phase is a fresh process with empty local Inductor/Triton caches\n")
    head = f"{'phase':<28} {'build s':>8} {'vs stock':>9} {'hits':>5} {'remote':>7} {'local':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['phase']:<28} {r['wall_s']:>8.2f} {r['vs_stock']:>8.2f}x {r['hits']:>5} "
            f"{r['remote']:>7} {r['local']:>6}"
        )
    print(
        "\n'build s' runs from the first submit until every kernel is built. Process start is\n"
        "excluded; stock's figure includes starting its compile pool, which a running compileq\n"
        "worker has already paid."
    )
    return 0
