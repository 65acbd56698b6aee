"""A training process compiling a kernel's configs in its own process, as coordinate descent and a
reloaded best config do at first launch: Inductor's own Triton job, run here with compileq
installed as a client (cross-compiled for the GPU the fixture's source names: real cubins on a
machine without one). argv[1]: a manifest row (JSON). Prints one JSON line."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import compileq

installed = compileq.install()

from compileq.build.triton import build_triton, enable_cross_compile  # noqa: E402
from compileq.scheduler.recognise import inductor_extra_config  # noqa: E402
from compileq.tasks.jobs import TritonJob  # noqa: E402

enable_cross_compile()
row = json.loads(Path(sys.argv[1]).read_text())
job = TritonJob(row["name"], row["source"], inductor_extra_config())
kernel = pickle.loads(build_triton(job))[0]
cache = Path(os.environ["TRITON_CACHE_DIR"])
print(
    json.dumps(
        {
            "installed": installed,
            "configs": len(kernel.compile_results),
            "cubins": len(list(cache.rglob("*.cubin"))),
        }
    )
)
