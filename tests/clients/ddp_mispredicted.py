"""``examples/llama_script.py`` (imported, so the worker cannot import its classes), with every
rank's first deferred DDP forward (compileq.codegen.deferred) made to fail its check, as
``COMPILEQ_TEST_FAULT`` says (a comma-separated list: rank r takes the r-th fault):

- ``strides``: it came back with other output strides than the traced ones, as Inductor may
  choose for a saved activation;
- ``fetch``: its worker's output could not be loaded.

Either way the frame must be compiled again, as stock compiles it, and train exactly as eager.
Run as one process with a graph split in parts (codegen/split.py), the same for its parts.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from compileq.codegen import deferred

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import llama_script

_FAULTS = os.environ.get("COMPILEQ_TEST_FAULT", "strides").split(",")
FAULT = _FAULTS[int(os.environ.get("RANK", "0")) % len(_FAULTS)]
_verified, _resolve = deferred.Forward.verified, deferred.Forward.resolve
_hit: list[Any] = []


def verified(self: deferred.Forward) -> bool:
    if FAULT == "strides" and not _hit:
        _hit.append(self)
        return False
    return _verified(self)


def resolve(self: deferred.Forward, *args: Any) -> Any:
    if FAULT == "fetch" and not _hit:
        _hit.append(self)
        raise RuntimeError("the worker's output is lost")
    return _resolve(self, *args)


deferred.Forward.verified = verified  # type: ignore[method-assign]
deferred.Forward.resolve = resolve  # type: ignore[method-assign]

if __name__ == "__main__":
    llama_script.main()
