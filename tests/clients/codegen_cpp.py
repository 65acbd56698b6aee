"""The client a worker's graph codegen uses, for a CPU graph's C++ objects.

Usage: python codegen_cpp.py WIDTH CONCURRENCY   (settings from COMPILEQ_*)

compileq is installed as ``workers/fx.py`` installs it in a pool process (FX codegen stays
here; ``on_worker`` and ``send_slot`` from an ``FxSlots`` of CONCURRENCY processes), and this
process holds one of them as generating while it compiles and trains ``train_cpu``'s model of
hidden width WIDTH: CONCURRENCY - 1 siblings are free to build what it sends. Prints
``train_cpu``'s JSON line.
"""

from __future__ import annotations

import sys

import train_cpu

from compileq.features import install
from compileq.workers.fx_slots import FxSlots


def main() -> None:
    width, concurrency = sys.argv[1], int(sys.argv[2])
    slots = FxSlots(concurrency)
    assert install(fx=False, on_worker=slots.sibling_free, send_slot=slots.sending)
    sys.argv = [sys.argv[0], width]
    with slots.generating():
        train_cpu.main()


if __name__ == "__main__":
    main()
