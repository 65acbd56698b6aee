"""The client a worker's graph codegen uses, for a CPU graph's C++ objects.

Usage: python codegen_cpp.py WIDTH CONCURRENCY [--no-slot]   (settings from COMPILEQ_*)

compileq is installed as ``workers/fx.py`` installs it in a pool process (FX codegen stays
here; ``on_worker`` and ``send_slot`` from an ``FxSlots`` of CONCURRENCY processes), and this
process holds one of them as generating while it compiles and trains ``train_cpu``'s model of
hidden width WIDTH: CONCURRENCY - 1 siblings are free to build what it sends. ``--no-slot``
installs ``on_worker`` alone, as a codegen that reserves nothing. Prints ``train_cpu``'s JSON
line.
"""

from __future__ import annotations

import sys

import train_cpu

from compileq.features import install
from compileq.workers.fx_slots import FxSlots


def main() -> None:
    width, concurrency, no_slot = sys.argv[1], int(sys.argv[2]), "--no-slot" in sys.argv[3:]
    slots = FxSlots(concurrency)
    send_slot = None if no_slot else slots.sending
    assert install(fx=False, on_worker=slots.sibling_free, send_slot=send_slot)
    sys.argv = [sys.argv[0], width]
    with slots.generating():
        train_cpu.main()


if __name__ == "__main__":
    main()
