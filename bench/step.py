"""One benchmark measurement: a fresh process runs a workload's first training steps.

    python -m bench.step --workload gpt [--edit] [--steps 2]

Prints one JSON line: the first step's wall time (compilation included), the losses, the CPU
seconds this process and its children (stock's compile pool) spent in that first step, and
Inductor's own counts of graphs generated and kernels submitted. Whether compileq is active is
decided by the caller (``compileq run --`` around this command, or not), never in here, so the
stock and compileq runs execute the same code.
"""

from __future__ import annotations

import argparse
import json
import time


def tree_cpu_s() -> float | None:
    """CPU seconds of this process and every live or reaped descendant (None without psutil)."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:  # a child that exited meanwhile
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench.step")
    parser.add_argument("--workload", required=True)
    parser.add_argument("--edit", action="store_true", help="change one block of the model")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    args = parser.parse_args(argv)

    import torch
    from torch._dynamo.utils import counters

    from bench.workloads import build

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    step = build(args.workload, device, edit=args.edit)
    cpu_before = tree_cpu_s()
    started = time.perf_counter()
    losses = [step.run()]
    first_step_s = time.perf_counter() - started
    cpu_after = tree_cpu_s()
    losses += [step.run() for _ in range(args.steps - 1)]

    import compileq.features as features

    inductor = counters["inductor"]
    print(
        json.dumps(
            {
                "workload": args.workload,
                "edit": args.edit,
                "device": device,
                "first_step_s": first_step_s,
                "loss": losses,
                "compile_cpu_s": None
                if cpu_before is None or cpu_after is None
                else cpu_after - cpu_before,
                "fx_codegen": inductor["fxgraph_cache_miss"],
                "fx_cache_hits": inductor["fxgraph_cache_hit"],
                "kernels_submitted": inductor["async_compile_cache_miss"],
                "compileq": features.installed_pool() is not None,
                "finished_at": time.time(),
            }
        )
    )


if __name__ == "__main__":
    main()
