"""``examples/llama_script.py`` (imported, so the worker cannot import its classes), with every
rank told that the first DDP forward it deferred came back with other output strides than the
traced ones, as Inductor may choose for a saved activation (compileq.scheduler.deferred): the
frame must be compiled again, as stock compiles it, and train exactly as eager.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from compileq.scheduler import deferred

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import llama_script

_verified = deferred.Forward.verified
_told: list[Any] = []


def verified(self: deferred.Forward) -> bool:
    if not _told:
        _told.append(self)
        return False
    return _verified(self)


deferred.Forward.verified = verified  # type: ignore[method-assign]

if __name__ == "__main__":
    llama_script.main()
