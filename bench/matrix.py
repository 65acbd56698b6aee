"""Every training configuration as one matrix: workloads x configurations x runs, stock beside
compileq in one invocation (``python -m bench matrix``, on a node with two GPUs).

    python -m bench matrix [--workloads script,hf-llama,...] [--configs single,ddp,...]
                           [--out DIR]
    python -m bench.matrix --render DIR/matrix.json [more.json ...] [--docs docs/BENCHMARKS.md]

Workloads (``examples/llama_script.py --model``): ``script`` (a Llama-style model defined in the
training script, run as ``__main__``), ``hf-llama`` and ``hf-gpt2`` (transformers), ``timm-resnet``
and ``timm-vit`` (timm), all at random init, sized to compile in 10-60 s on an H100.

Configurations: ``single`` (``cuda:0``), ``cuda1`` (``cuda:1`` with every GPU visible), ``ddp``
and ``fsdp2`` (whole model compiled) and ``fsdp2-block`` (each block compiled) under torchrun
on two GPUs, ``reduce-overhead`` (CUDA graphs), ``dynamic`` (a second and third length, so a
dynamic graph after the static one) and ``ddp-dynamic`` (the same under DDP), ``compiled-opt`` (the optimizer step compiled too),
``max-autotune`` on ``cuda:0``, ``cuda:1`` and under DDP, and ``max-autotune-no-cg`` (its mode
without CUDA graphs). On a machine without a GPU: ``cpu``, ``cpu-fsdp2-block``,
``cpu-dynamic`` and ``cpu-ddp-dynamic``.

Runs of each cell, each a fresh process tree on fresh local cache dirs (every rank its own):
``eager``; ``stock_cold`` (stock with its own Redis remote caches on, filling them: the cold
cost is the same within noise, and a separate filling run would cost a run per cell);
``stock_warm_local`` (on stock_cold's dirs); ``stock_remote_new`` (empty dirs, stock's remote
caches warm); ``compileq_cold`` (store emptied, workers' local caches wiped);
``compileq_new`` (empty dirs, warm cluster); by name only, ``compileq_split_cold`` and
``compileq_split_new`` (big graphs compiled in parts, ``COMPILEQ_SPLIT_GRAPHS=gpu``), and
``compileq_new_static_first`` (a new machine not reading which sizes went dynamic,
``COMPILEQ_DYNAMIC_PROFILE=0``) and ``compileq_new_autocast_traced`` (a new machine whose
graphs with an autocast region bypass AOTAutograd's cache, ``COMPILEQ_AOT_REGIONS=0``). Per run: each rank's time to steady state (the
first step; the first three for ``dynamic``, ``reduce-overhead`` and ``max-autotune``, whose
later steps compile or record), all ranks done, losses against eager, graph codegens, kernels fetched one by one,
fallbacks, and the median step once steady (with ``--steps`` of at least 3 past it).

A cell's results are saved as it goes, so a matrix spread over several device calls (each at
most 10 minutes) is one ``--render`` of their files.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.ddp import run_job
from bench.harness import ROOT, Cluster, join_logs, new_workdir
from compileq._files import write_atomically

WORKLOADS = {
    "script": ("--model", "script", "--width", "512", "--layers", "8", "--bucket-mb", "4"),
    "hf-llama": ("--model", "hf-llama", "--width", "512", "--layers", "4"),
    "hf-gpt2": ("--model", "hf-gpt2", "--width", "512", "--layers", "4"),
    "timm-resnet": ("--model", "timm-resnet"),
    "timm-vit": ("--model", "timm-vit", "--layers", "0"),
}
#: Each configuration: torchrun's processes (0: plain python) and the script's arguments.
CONFIGS: dict[str, tuple[int, tuple[str, ...]]] = {
    "single": (0, ("--device", "cuda:0")),
    "cuda1": (0, ("--device", "cuda:1")),
    "ddp": (2, ("--device", "cuda")),
    "ddp-dynamic": (2, ("--device", "cuda", "--dynamic")),
    "fsdp2": (2, ("--device", "cuda", "--fsdp")),
    "fsdp2-block": (2, ("--device", "cuda", "--fsdp", "--compile-blocks")),
    "reduce-overhead": (0, ("--device", "cuda:0", "--mode", "reduce-overhead")),
    "dynamic": (0, ("--device", "cuda:0", "--dynamic")),
    "compiled-opt": (0, ("--device", "cuda:0", "--compile-optimizer")),
    # The script model's attention in an sdpa_kernel region and its rotary angles in an
    # autocast one: graphs AOTAutograd's cache bypassed (codegen/aot_regions.py).
    "regions": (0, ("--device", "cuda:0", "--float32-rotary", "--sdpa-backend", "FLASH_ATTENTION")),
    # mode="max-autotune" (GEMM templates timed, coordinate descent at first launch, CUDA
    # graphs), on cuda:0, on cuda:1 and per rank under DDP; and without CUDA graphs.
    "max-autotune": (0, ("--device", "cuda:0", "--mode", "max-autotune")),
    "max-autotune-cuda1": (0, ("--device", "cuda:1", "--mode", "max-autotune")),
    "max-autotune-ddp": (2, ("--device", "cuda", "--mode", "max-autotune")),
    "max-autotune-no-cg": (0, ("--device", "cuda:0", "--mode", "max-autotune-no-cudagraphs")),
    # The CPU's cells (a machine without a GPU: the harness's own test, and the CPU path).
    "cpu": (0, ("--device", "cpu")),
    "cpu-fsdp2": (2, ("--device", "cpu", "--fsdp")),
    "cpu-fsdp2-block": (2, ("--device", "cpu", "--fsdp", "--compile-blocks")),
    "cpu-dynamic": (0, ("--device", "cpu", "--dynamic")),
    "cpu-regions": (0, ("--device", "cpu", "--float32-rotary", "--sdpa-backend", "MATH")),
    "cpu-ddp-dynamic": (2, ("--device", "cpu", "--dynamic")),
}
#: Steps to steady state: the first step, or the first three where later steps compile
#: (another length) or record (CUDA graphs).
READY_STEPS = {
    "dynamic": 3,
    "cpu-dynamic": 3,
    "cpu-ddp-dynamic": 3,
    "ddp-dynamic": 3,
    "reduce-overhead": 3,
    "max-autotune": 3,
    "max-autotune-cuda1": 3,
    "max-autotune-ddp": 3,
    "max-autotune-no-cg": 1,
}
#: Configurations that shape the script's own model (its flags): skipped for the others.
SCRIPT_ONLY = frozenset(("regions", "cpu-regions"))
#: Each run: its name, bench.ddp's mode, what comes before it, and whose dirs it reuses.
RUNS = (
    ("eager", "stock", None, None),
    ("stock_cold", "stock-remote", "flush", None),
    # With stock_cold's settings: its remote caches on too (Inductor's config is part of its FX
    # keys, so a run without them misses every graph stock_cold stored locally).
    ("stock_warm_local", "stock-remote", None, "stock_cold"),
    ("stock_remote_new", "stock-remote", None, None),
    ("compileq_cold", "compileq", "cold", None),
    ("compileq_new", "compileq", None, None),
    # Asked for by name only (--runs): compileq with big graphs compiled in parts
    # (codegen/split.py, opt-in), for the split's cost and gain in the same invocation.
    ("compileq_split_cold", "compileq-split", "cold", None),
    ("compileq_split_new", "compileq-split", None, None),
    # By name only: a new machine that does not read which sizes went dynamic
    # (inductor/dynamic_profile.py off), for that feature's gain in the same invocation.
    ("compileq_new_static_first", "compileq-static-first", None, None),
    # By name only: a new machine whose graphs with an autocast or sdpa_kernel region bypass
    # AOTAutograd's cache, as stock's do (codegen/aot_regions.py off).
    ("compileq_new_autocast_traced", "compileq-autocast-traced", None, None),
    # The zoo's second looks (bench/zoo.py ``AGAIN``), run where one run says compileq is
    # slower or its losses are off: stock compiled again from nothing, with no remote cache
    # (independent of stock_cold's entries, so its own run-to-run spread, autotuning's choices
    # included), its warm local run again, and compileq cold and new again.
    ("stock_cold_again", "stock", None, None),
    ("stock_warm_local_again", "stock-remote", None, "stock_cold"),
    ("compileq_cold_again", "compileq", "cold", None),
    ("compileq_new_again", "compileq", None, None),
)
#: The runs of a cell unless --runs names others.
DEFAULT_RUNS = [name for name, *_ in RUNS[:6]]


def gpus_needed(config: str) -> int:
    nproc, args = CONFIGS[config]
    if not any(a.startswith("cuda") for a in args):
        return 0
    return 2 if nproc or "cuda:1" in args else 1


class TimeUp(SystemExit):
    """SIGTERM (the device call's ``timeout``): the matrix ends here. Not a run that failed,
    which the matrix records and goes on from."""


def _time_up(*_: object) -> None:
    raise TimeUp(143)


def ready_s(run: dict[str, Any], config: str) -> float:
    """The slowest rank's time to steady state."""
    k = READY_STEPS.get(config, 1)
    return round(float(max(sum(steps[:k]) for steps in run["ranks_steps_s"])), 3)


def step_s(run: dict[str, Any], config: str) -> float | None:
    """The slowest rank's median step once steady (the steps after ``READY_STEPS``), where
    at least two are: what a split graph's cuts cost every step."""
    k = READY_STEPS.get(config, 1)
    medians = []
    for steps in run["ranks_steps_s"]:
        steady = sorted(steps[k:])
        if len(steady) < 2:
            return None
        medians.append(steady[len(steady) // 2])
    return round(float(max(medians)), 4)


def run_cell(
    cluster: Cluster,
    workdir: Path,
    workload: str,
    config: str,
    steps: int,
    extra: list[str],
    profile: Path | None = None,
    runs: list[str] | None = None,
    saved: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One cell's runs (``runs``: only these); ``profile``: a directory for cProfile files of
    its compileq_new run; ``saved``: called with the cell so far after each run, so a device
    call cut short by its time limit keeps the runs it finished, not only whole cells."""
    nproc, config_args = CONFIGS[config]
    args = [*WORKLOADS[workload], *config_args, "--steps", str(steps), *extra]
    cell: dict[str, Any] = {}
    for name, mode, before, reuse in RUNS:
        if name not in (DEFAULT_RUNS if runs is None else runs):
            continue
        if before in ("flush", "cold"):
            cluster.flush()
        if before == "cold":
            cluster.wipe_worker_caches()
        tag = f"{workload}-{config}-{name}"
        eager = ["--eager"] if name == "eager" else []
        caches_of = f"{workload}-{config}-{reuse}" if reuse else None
        started = time.monotonic()
        try:
            cprofile = profile if name == "compileq_new" else None
            run = run_job(cluster, workdir, tag, nproc, [*args, *eager], mode, caches_of, cprofile)
        except TimeUp:
            raise
        except SystemExit as failed:  # one run's failure is a result, not the end of the matrix
            cell[name] = {"failed": str(failed)[-2000:]}
        else:
            run["ready_s"] = ready_s(run, config)
            run["step_s"] = step_s(run, config)
            run["wall_s"] = round(time.monotonic() - started, 1)
            cell[name] = run
            print(f"{tag}: ready {run['ready_s']} s", flush=True)
        if saved is not None:  # a failure too: a cut after it must not lose it
            saved(cell)
    return cell


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m bench matrix", description=__doc__)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--script-args",
        default="",
        help="more arguments for every run of the script, after the workload's (e.g. "
        "'--width 64 --layers 1' for a small model)",
    )
    parser.add_argument(
        "--cprofile-new",
        action="store_true",
        help="run each cell's compileq_new under cProfile (RUN.pstats in --out; its timings "
        "then carry the profiler's cost)",
    )
    parser.add_argument(
        "--runs",
        default=None,
        help="only these runs of each cell (e.g. compileq_cold; default: all). A run reusing "
        "another's dirs (stock_warm_local) needs that one too",
    )
    parser.add_argument(
        "--profile-codegen",
        action="store_true",
        help="the worker writes a cProfile of each graph's codegen (codegen-profiles/KEY.pstats "
        "in --out; the codegens then carry the profiler's cost)",
    )
    parser.add_argument(
        "--dump-codegen",
        action="store_true",
        help="the worker writes what each graph's codegen was given (codegen-dumps/KEY.txt in "
        "--out): why two ranks sent two graphs, read with diff",
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench-out"))
    args = parser.parse_args(argv)
    workloads, configs = args.workloads.split(","), args.configs.split(",")
    runs = args.runs.split(",") if args.runs else None
    known_runs = [name for name, *_ in RUNS]
    if unknown := (set(workloads) - set(WORKLOADS)) | (set(configs) - set(CONFIGS)):
        parser.error(
            f"unknown {sorted(unknown)}; workloads {list(WORKLOADS)}, configs {list(CONFIGS)}"
        )
    if runs is not None and (unknown := set(runs) - set(known_runs)):
        parser.error(f"unknown runs {sorted(unknown)}; runs {known_runs}")
    gpus = torch.cuda.device_count()
    if (needed := max(gpus_needed(c) for c in configs)) > gpus:
        parser.error(f"configurations {configs} need {needed} GPUs; this machine has {gpus}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import triton

    meta = {
        "device": torch.cuda.get_device_name(0) if gpus else "CPU only",
        "gpus": gpus,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python -m bench matrix", *(argv or sys.argv[1:])]),
    }
    results: dict[str, Any] = {"meta": meta, "cells": {}}
    # `timeout` (as on the device) sends SIGTERM: leave through the finally below, which stops
    # the worker, instead of dying where the signal lands.
    signal.signal(signal.SIGTERM, _time_up)
    workdir = new_workdir()
    cluster = Cluster(workdir, gpu=bool(gpus)).start()
    try:
        debug = {}
        if args.profile_codegen:
            debug["COMPILEQ_CODEGEN_PROFILE_DIR"] = str(out / "codegen-profiles")
        if args.dump_codegen:
            debug["COMPILEQ_CODEGEN_DUMP_DIR"] = str(out / "codegen-dumps")
        cluster.start_worker(None, gpus="all" if gpus else None, env=debug)
        for workload in workloads:
            for config in configs:
                if config in SCRIPT_ONLY and workload != "script":
                    print(f"{workload}/{config}: skipped (the script's model only)", flush=True)
                    continue
                extra = args.script_args.split()
                profile = out if args.cprofile_new else None
                name, again = f"{workload}/{config}", 2
                while name in results["cells"]:  # a cell asked for again: its own entry
                    name, again = f"{workload}/{config}#{again}", again + 1

                def save(cell: dict[str, Any], name: str = name) -> None:
                    results["cells"][name] = cell
                    write_atomically(out / "matrix.json", json.dumps(results, indent=1).encode())

                cell = run_cell(
                    cluster, workdir, workload, config, args.steps, extra, profile, runs, save
                )
                save(cell)
    finally:
        try:
            cluster.close()
        except Exception as gone:  # a timeout's SIGTERM reached Redis first
            # The logs are what a cut-short device call has to show: keep them.
            print(f"closing the cluster: {gone!r}", file=sys.stderr)
        join_logs(workdir, out / "matrix-logs.txt", 20000)
        # Here too, so a matrix cut short renders the runs it finished.
        write_atomically(out / "matrix.md", render([results]).encode())
    print((out / "matrix.md").read_text())
    return 0


# -- the table and the chart ----------------------------------------------------------------


#: The issue's goals, drawn on the chart: cold <= 0.7x stock cold, new machine <= 0.6x stock
#: warm local and <= 0.5x stock remote.
GOALS = {"cold": 0.7, "new/warm": 0.6, "new/remote": 0.5}


def _ready(cell: dict[str, Any], name: str) -> float | None:
    run = cell.get(name) or {}
    return run.get("ready_s")


def ratios(
    cell: dict[str, Any],
    ready: Callable[[dict[str, Any], str], float | None] = _ready,
) -> dict[str, float | None]:
    """compileq's first step over stock's: cold, new machine against stock's warm local
    cache and against its remote cache. ``ready``: a run's first step (the zoo's: the mean
    with the run's repetition)."""

    def ratio(a: str, b: str) -> float | None:
        x, y = ready(cell, a), ready(cell, b)
        return round(x / y, 2) if x is not None and y else None

    return {
        "cold": ratio("compileq_cold", "stock_cold"),
        "new/warm": ratio("compileq_new", "stock_warm_local"),
        "new/remote": ratio("compileq_new", "stock_remote_new"),
    }


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value: float | None, goal: float) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if value <= goal else f"**{value:.2f}**"


def _steps(cell: dict[str, Any]) -> str:
    """Steady step times in ms: stock's (warm local, else cold) / compileq's new machine's
    (and, where run, compileq's with big graphs compiled in parts)."""

    def ms(name: str) -> str:
        step = (cell.get(name) or {}).get("step_s")
        return "-" if step is None else f"{1000 * step:.1f}"

    stock = ms("stock_warm_local") if ms("stock_warm_local") != "-" else ms("stock_cold")
    split = ms("compileq_split_new")
    return f"{stock} / {ms('compileq_new')}" + ("" if split == "-" else f" (split {split})")


def render(files: list[dict[str, Any]]) -> str:
    """One markdown table over every cell of every file (a later file's cell wins)."""
    cells: dict[str, dict[str, Any]] = {}
    metas = []
    for data in files:
        metas.append(data["meta"])
        cells.update(data["cells"])
    lines = [
        "Time to steady state (s): the slowest rank's first step, the first three for "
        "`dynamic`, `reduce-overhead` and `max-autotune`. Ratios in bold miss the goal (cold <= 0.7x stock cold; "
        "new machine <= 0.6x stock warm local and <= 0.5x stock remote).",
        "",
        "| workload / config | eager | stock cold | cq cold | cold ratio | stock warm local "
        "| stock remote new | cq new | new / warm | new / remote | cq new - eager "
        "| codegens new | kernel fetches new | runtime tunes new | fallbacks | losses = eager "
        "| cq split cold | cq split new | step ms stock / cq |",
        "|---|" + "---|" * 18,
    ]
    for name, cell in cells.items():
        r = ratios(cell)
        new, eager = _ready(cell, "compileq_new"), _ready(cell, "eager")
        runs = [run for run in cell.values() if "failed" not in run]
        failed = [n for n, run in cell.items() if "failed" in run]
        new_run = cell.get("compileq_new") or {}
        ok = all(run.get("matches_eager") for run in runs if run is not cell.get("eager"))
        lines.append(
            f"| {name} | {_s(eager)} | {_s(_ready(cell, 'stock_cold'))} "
            f"| {_s(_ready(cell, 'compileq_cold'))} | {_x(r['cold'], GOALS['cold'])} "
            f"| {_s(_ready(cell, 'stock_warm_local'))} | {_s(_ready(cell, 'stock_remote_new'))} "
            f"| {_s(new)} | {_x(r['new/warm'], GOALS['new/warm'])} "
            f"| {_x(r['new/remote'], GOALS['new/remote'])} "
            f"| {_s(new - eager if new is not None and eager is not None else None)} "
            f"| {new_run.get('codegens', '-')} | {new_run.get('kernel_fetches', '-')} "
            f"| {new_run.get('runtime_autotunes', '-')} "
            f"| {sum(run.get('fallbacks', 0) for run in runs)} "
            f"| {'yes' if ok else 'NO'}{' (failed: ' + ', '.join(failed) + ')' if failed else ''} "
            f"| {_s(_ready(cell, 'compileq_split_cold'))} | {_s(_ready(cell, 'compileq_split_new'))} "
            f"| {_steps(cell)} |"
        )
    devices = sorted(
        {f"{m['device']} x{m['gpus']}, torch {m['torch']}, triton {m['triton']}" for m in metas}
    )
    lines += ["", "Measured on: " + "; ".join(devices) + "."]
    return "\n".join(lines) + "\n"


def pyplot() -> Any:
    """matplotlib's pyplot drawing to files (the bench extra); None where it is missing."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def chart(files: list[dict[str, Any]], path: Path) -> bool:
    """Ratios per cell as bars, the goals as lines; False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False

    cells: dict[str, dict[str, Any]] = {}
    for data in files:
        cells.update(data["cells"])
    names = list(cells)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.9 * len(names)), 4.8))
    width = 0.27
    for i, (label, goal) in enumerate(GOALS.items()):
        values = [ratios(cells[n])[label] or 0.0 for n in names]
        xs = [x + (i - 1) * width for x in range(len(names))]
        bars = ax.bar(xs, values, width, label=f"compileq {label}")
        ax.axhline(
            goal, ls="--", lw=1, color=bars.patches[0].get_facecolor() if bars.patches else "k"
        )
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xticks(range(len(names)), names, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("compileq / stock (lower is better)")
    ax.set_title("Time to steady state, compileq against stock in the same run (goals dashed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def render_files(
    argv: list[str],
    stem: str,
    render: Callable[[list[dict[str, Any]]], str] = render,
    chart: Callable[[list[dict[str, Any]], Path], bool] = chart,
) -> int:
    """``python -m bench.STEM --render FILE... [--out DIR]``: one table over the result files
    (the matrix's, or the zoo's), printed, and with ``--out`` STEM.md and STEM.png there."""
    parser = argparse.ArgumentParser(prog=f"python -m bench.{stem} --render")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--out", default=None, help=f"{stem}.md and {stem}.png here")
    args = parser.parse_args(argv)
    files = [json.loads(Path(f).read_text()) for f in args.files]
    table = render(files)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}.md").write_text(table)
        chart(files, out / f"{stem}.png")
    return 0


def render_main(argv: list[str]) -> int:
    return render_files(argv, "matrix")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--render"]:
        raise SystemExit(render_main(sys.argv[2:]))
    raise SystemExit(main())
