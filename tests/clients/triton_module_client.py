"""A process that needs one of Triton's C modules, as Triton's CUDA driver does at its start:
``compile_module_from_src`` on the C source in the file ``argv[1]``; prints one JSON line."""

from __future__ import annotations

import json
import sys

import compileq

installed = compileq.install()

from triton import knobs  # noqa: E402
from triton.runtime.build import compile_module_from_src  # noqa: E402

with open(sys.argv[1]) as f:
    source = f.read()
module = compile_module_from_src(src=source, name="cq_probe")
manager = knobs.cache.manager_class
print(
    json.dumps(
        {
            "installed": installed,
            "answer": module.answer(),
            "manager": None if manager is None else manager.__name__,
        }
    )
)
