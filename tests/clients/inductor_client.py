"""A client process that submits kernels exactly as Inductor does, through compileq's pool.

Usage: python inductor_client.py MANIFEST   (settings from COMPILEQ_* variables)
Prints one JSON object describing what came back.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time

import compileq


def main() -> None:
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.codecache import _load_triton_kernel_from_source
    from torch._inductor.runtime.compile_tasks import _worker_compile_triton

    from compileq.scheduler.recognise import inductor_extra_config

    with open(sys.argv[1]) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert compileq.install(), "compileq did not install"
    pool = AsyncCompile.process_pool()
    env = {
        v: os.environ[v] for v in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR") if v in os.environ
    }
    started = time.perf_counter()
    futures = [
        pool.submit(
            _worker_compile_triton,
            functools.partial(_load_triton_kernel_from_source, row["name"], row["source"]),
            env,
            inductor_extra_config(),
        )
        for row in rows
    ]
    results = [f.result(timeout=300) for f in futures]
    wall = time.perf_counter() - started
    cubins = 0
    types = set()
    for kernel, _elapsed_us in results:
        types.add(type(kernel).__name__)
        for compiled in kernel.compile_results:
            if bytes(compiled.kernel.cubin_raw[:4]) == b"\x7fELF":
                cubins += 1
    print(
        json.dumps(
            {"kernels": len(results), "cubins": cubins, "types": sorted(types), "wall_s": wall}
        )
    )
    compileq.uninstall()


if __name__ == "__main__":
    main()
