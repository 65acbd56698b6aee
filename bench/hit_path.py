"""Hit path: compileq's per-kernel cache hit against stock Inductor's local hit, same run.

    python -m bench.hit_path [--manifest tests/fixtures/dynamic_mlp.jsonl] [--reps 20]

Stock's local hit is what Inductor pays for a kernel already in its local Triton cache: a job
through its process pool that reloads the cubin from disk. On a machine with a GPU that is the
real stock pool; without one the stock job runs in this process (cross-compiling) plus a pickle
round trip for the pool's transfer, which flatters stock (no IPC). compileq's hit is a submit to
its pool: one MGET, HMAC check, zstd, unpickle. Also times a batched lookup of 1,000 keys.
Writes a markdown table to stdout and to $OUT/hit_path.md when OUT is set.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import pickle
import secrets
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench._redis import redis_url

ROOT = Path(__file__).resolve().parents[1]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", default=str(ROOT / "tests/fixtures/dynamic_mlp.jsonl"))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="bench-triton-"))
    gpu = torch.cuda.is_available()

    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codecache import _load_triton_kernel_from_source
    from torch._inductor.runtime.compile_tasks import _worker_compile_triton

    import compileq
    from compileq.build.triton import build_triton, enable_cross_compile
    from compileq.cache.store import RedisStore
    from compileq.config import Settings
    from compileq.connect import redis_client
    from compileq.fingerprint import local_toolchain
    from compileq.scheduler.recognise import inductor_extra_config
    from compileq.tasks.jobs import TritonJob

    if not gpu:
        enable_cross_compile()
    rows = [
        json.loads(line) for line in Path(args.manifest).read_text().splitlines() if line.strip()
    ]
    config = inductor_extra_config()
    jobs = [TritonJob(r["name"], r["source"], config) for r in rows]
    env = {"TRITON_CACHE_DIR": os.environ["TRITON_CACHE_DIR"]}

    def stock_args(job: TritonJob) -> tuple[Any, ...]:
        return (
            _worker_compile_triton,
            functools.partial(_load_triton_kernel_from_source, job.name, job.source),
            env,
            dict(job.extra_config),
        )

    with redis_url() as url:
        settings = Settings(redis_url=url, secret=secrets.token_hex(16))
        store = RedisStore(redis_client(url, settings), settings)
        # Fill the cache (and the local Triton cache, for stock's hit) with real builds.
        cold = []
        payloads = []
        for job in jobs:
            started = time.perf_counter()
            payload = build_triton(job)
            cold.append(time.perf_counter() - started)
            target = job.target
            assert target is not None
            store.put(job.key(local_toolchain(target), target), payload)
            payloads.append(payload)

        # Stock local hit.
        stock: list[float] = []
        if gpu:
            pool = AsyncCompile.process_pool()
            for job in jobs:  # warm the pool's processes
                fn, *rest = stock_args(job)
                pool.submit(fn, *rest).result()
        for _ in range(args.reps):
            for job in jobs:
                fn, *rest = stock_args(job)
                started = time.perf_counter()
                if gpu:
                    pool.submit(fn, *rest).result()
                else:
                    pickle.loads(pickle.dumps(fn(*rest)))
                stock.append(time.perf_counter() - started)

        # compileq hit, through the pool Inductor would call.
        assert compileq.install(settings)
        pool = AsyncCompile.process_pool()
        for job in jobs:  # first submit starts the listener; not a steady-state hit
            fn, *rest = stock_args(job)
            pool.submit(fn, *rest).result()
        ours: list[float] = []
        for _ in range(args.reps):
            for job in jobs:
                fn, *rest = stock_args(job)
                started = time.perf_counter()
                pool.submit(fn, *rest).result()
                ours.append(time.perf_counter() - started)
        compileq.uninstall()

        # Batched lookup of 1,000 keys (real kernel payloads, round-robin under distinct keys).
        keys = [
            f"compileq:a:triton:{hashlib.sha256(str(i).encode()).hexdigest()}" for i in range(1000)
        ]
        for i, key in enumerate(keys):
            store.put(key, payloads[i % len(payloads)])
        batch = []
        for _ in range(max(5, args.reps)):
            started = time.perf_counter()
            found = store.get_many(keys)
            batch.append(time.perf_counter() - started)
            assert all(p is not None for p in found)
        store.client.delete(*keys)

    ms = 1000.0
    rows_out = [
        ("kernels", f"{len(jobs)} ({Path(args.manifest).name})", ""),
        ("cold build per kernel, median", f"{statistics.median(cold) * ms:.1f} ms", ""),
        (
            "stock local hit p50 / p99",
            f"{pct(stock, 0.5) * ms:.2f} / {pct(stock, 0.99) * ms:.2f} ms",
            "real stock pool" if gpu else "in-process + pickle (no IPC: flatters stock)",
        ),
        (
            "compileq hit p50 / p99",
            f"{pct(ours, 0.5) * ms:.2f} / {pct(ours, 0.99) * ms:.2f} ms",
            "through compileq's pool",
        ),
        (
            "compileq - stock, p50",
            f"{(pct(ours, 0.5) - pct(stock, 0.5)) * ms:+.2f} ms",
            "target <= +2 ms",
        ),
        ("compileq / stock, p50", f"{pct(ours, 0.5) / pct(stock, 0.5):.2f}x", ""),
        (
            "batched lookup of 1,000 keys p50 / p99",
            f"{pct(batch, 0.5) * ms:.1f} / {pct(batch, 0.99) * ms:.1f} ms",
            "target <= 50 ms; MGET + HMAC (zstd runs when a payload is read)",
        ),
    ]
    device = torch.cuda.get_device_name() if gpu else "CPU only"
    import triton

    header = (
        f"Hit path on {device}, {os.cpu_count()} cores; torch {torch.__version__}, triton {triton.__version__}; "
        f"{args.reps} reps\n\n| measure | value | note |\n|---|---|---|\n"
    )
    table = header + "\n".join(f"| {a} | {b} | {c} |" for a, b, c in rows_out) + "\n"
    print(table)
    if out := os.environ.get("OUT"):
        Path(out, "hit_path.md").write_text(table)
    if args.json:
        figures = {
            "device": device,
            "kernels": len(jobs),
            "cold_build_ms_p50": statistics.median(cold) * ms,
            "stock_hit_ms": [pct(stock, 0.5) * ms, pct(stock, 0.99) * ms],
            "stock_hit_kind": "stock pool" if gpu else "in-process",
            "compileq_hit_ms": [pct(ours, 0.5) * ms, pct(ours, 0.99) * ms],
            "lookup_1000_ms": [pct(batch, 0.5) * ms, pct(batch, 0.99) * ms],
        }
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
