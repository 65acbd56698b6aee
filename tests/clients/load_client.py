"""A client process that requests a manifest's kernels through compileq and checks each one.

Usage: python load_client.py MANIFEST [--on-worker free|busy|share:N]   (settings from COMPILEQ_*)

``--on-worker`` makes it the client a worker's graph codegen uses, told that a sibling pool
process is free (it enqueues) or that none is (it builds in place), or given a share of N
kernels with siblings at once (the rest built on its own compile threads); then the JSON says
how many were ever with siblings at once (``peak_sent``).

Submits every kernel at once through :class:`KernelClient` (what ``compileq.install()`` uses),
records each kernel's latency from submission to its result, and checks every result is a
correct, loadable build: it unpickles to Inductor's ``CachingAutotuner`` for the kernel asked
for (its name, not another's), holding sm_90 cubins. Prints one JSON object.
"""

from __future__ import annotations

import json
import pickle
import struct
import sys
import threading
import time
from concurrent.futures import Future, wait

from compileq.config import Settings
from compileq.scheduler.client import Built, KernelClient
from compileq.scheduler.warm import read_manifest


def problem(name: str, payload: bytes) -> str | None:
    """Why ``payload`` is not a correct build of kernel ``name``, or None."""
    kernel, elapsed_us = pickle.loads(payload)
    if type(kernel).__name__ != "CachingAutotuner" or elapsed_us <= 0:
        return f"{name}: got {type(kernel).__name__}"
    if kernel.fn.__name__ != name or not kernel.compile_results:
        return f"{name}: got kernel {kernel.fn.__name__}"
    for result in kernel.compile_results:
        # Inductor ships a statically launchable kernel (cubin_raw) when it can, else Triton's
        # own CompiledKernel (its cubin in asm); stock Inductor loads either.
        compiled = result.kernel
        cubin = bytes(getattr(compiled, "cubin_raw", None) or compiled.asm.get("cubin", b""))
        if compiled.name != name or cubin[:4] != b"\x7fELF":
            return f"{name}: compiled {result.kernel.name}, not an ELF cubin"
        flags = struct.unpack_from("<I", cubin, 48)[0]  # sm in bits 8-15 (CUDA 13), 0-7 (12)
        if 90 not in ((flags >> 8) & 0xFF, flags & 0xFF):
            return f"{name}: cubin not for sm_90"
    return None


def main() -> None:
    from torch._inductor.async_compile import AsyncCompile, get_compile_threads

    from compileq.scheduler.local import LocalBuilder

    get_compile_threads()
    jobs = read_manifest(__import__("pathlib").Path(sys.argv[1]))
    on_worker = sys.argv[3] if sys.argv[2:3] == ["--on-worker"] else None
    share = int(on_worker.split(":")[1]) if on_worker and on_worker.startswith("share:") else None
    client = KernelClient(
        Settings(),
        LocalBuilder(AsyncCompile.process_pool),
        on_worker=None if on_worker is None else lambda: on_worker != "busy",
        kernel_share=None if share is None else lambda: share,
        local_slots=get_compile_threads(),
    )
    peak = [0]
    stop = threading.Event()

    def watch() -> None:  # how many were with siblings at once, sampled every 5 ms
        while not stop.wait(0.005):
            if client._share is not None:
                peak[0] = max(peak[0], client._share.counts[1])

    done_at: dict[int, float] = {}

    def stamp(i: int) -> object:
        return lambda _f: done_at.__setitem__(i, time.perf_counter())

    threading.Thread(target=watch, daemon=True).start()
    started = time.perf_counter()
    futures: list[Future[Built]] = client.submit_many([(job, {}) for job in jobs])
    for i, future in enumerate(futures):
        future.add_done_callback(stamp(i))  # type: ignore[arg-type]
    wait(futures, timeout=600)
    wall = time.perf_counter() - started
    stop.set()
    client.close()
    tally = {"hit": 0, "remote": 0, "local": 0}
    failed, bad = [], []
    for job, future in zip(jobs, futures, strict=True):
        if not future.done() or future.exception() is not None:
            failed.append(f"{job.name}: {future.exception() if future.done() else 'unresolved'}")
            continue
        built = future.result()
        tally[built.outcome.value] += 1
        if (why := problem(job.name, built.payload)) is not None:
            bad.append(why)
    latencies = [round((done_at[i] - started) * 1000, 2) for i in sorted(done_at)]
    print(
        json.dumps(
            {
                "kernels": len(jobs),
                "hits": tally["hit"],
                "remote": tally["remote"],
                "local": tally["local"],
                "failed": len(failed),
                "bad": len(bad),
                "problems": (failed + bad)[:5],
                "latencies_ms": latencies,
                "wall_s": round(wall, 3),
                "peak_sent": peak[0],
            }
        )
    )


if __name__ == "__main__":
    main()
