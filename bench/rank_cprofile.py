"""Run a script under cProfile, one file per torchrun rank (``bench.ddp --cprofile``).

    torchrun --nproc-per-node N -m bench.rank_cprofile OUT_PREFIX SCRIPT [ARGS...]

Writes ``OUT_PREFIX-rank<RANK>.pstats`` (read with ``python -m bench.profile_report``): cProfile's
own ``-o`` names one file, which every rank would overwrite.
"""

from __future__ import annotations

import cProfile
import os
import runpy
import sys


def main() -> None:
    prefix, script, *args = sys.argv[1:]
    sys.argv = [script, *args]
    profiler = cProfile.Profile()
    try:
        profiler.runcall(runpy.run_path, script, run_name="__main__")
    finally:
        profiler.dump_stats(f"{prefix}-rank{os.environ.get('RANK', '0')}.pstats")


if __name__ == "__main__":
    main()
