"""The model zoo: every model of PyTorch's own Inductor benchmark suites (timm's and
HuggingFace's model lists, ``bench/zoo_models.py``), a training step each, stock beside compileq
in one invocation (``python -m bench zoo``).

    python -m bench zoo [--models NAME,...] [--suites timm,hf] [--size tiny|gpu]
                        [--runs eager,stock_cold,...] [--again] [--lanes N] [--out DIR]
    python -m bench.zoo --render DIR/zoo.json [more.json ...] [--out DIR] [--docs BENCHMARKS.md]

Each model is ``examples/llama_script.py --model timm:NAME`` or ``hf:CLASS`` at random init
(no download), in training mode: forward, backward, AdamW step, bf16 autocast on a GPU
(float32 for GoogleFnet, whose FFT has no bf16 kernel). Its runs are the matrix's
(``bench/matrix.py``): ``eager``, ``stock_cold`` (stock's own Redis remote caches on, filling
them), ``stock_warm_local``, ``stock_remote_new``, ``compileq_cold``, ``compileq_new``, each
a fresh process tree on fresh local dirs. A model whose eager run fails (a model the installed
transformers or timm cannot build offline) is recorded as skipped, with the error's last line.
Sizes: ``tiny`` (CPU: two layers, a small batch; a 2-core machine compiles each in under a
minute), ``gpu`` (the suites' own batch sizes, fewer layers, so each compiles in 10-90 s on
an H200).

Results are kept per model in ``--out``/zoo.json, written after every run: a run cut short
(a time limit, SIGTERM) keeps what it finished, and the next invocation with the same
``--out`` goes on with the models and runs not done yet (``--again``: all of them again), so
the whole zoo is many calls, one table. ``zoo.md`` and ``zoo.png`` are rendered at the end of
every invocation. ``--lanes N`` runs N models at once, each lane on its own block of the
cores with a cluster of its own (``bench/zoo_lanes.py``: what that changes, and why pinned).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import matrix, zoo_lanes
from bench.ddp import run_job
from bench.harness import ROOT, Cluster, join_logs, new_workdir
from bench.matrix import (
    DEFAULT_RUNS,
    RUNS,
    TimeUp,
    _s,
    _time_up,
    _x,
    pyplot,
    ready_s,
    render_files,
    step_s,
)
from bench.zoo_models import MODELS, ZooModel, named, size_for
from compileq._files import write_atomically
from compileq.config import Settings, load_settings
from compileq.early_settings import variable
from compileq.errors import ConfigError
from compileq.workers import cpus

#: The issue's targets: every model at most stock (cold, and new machine against stock's warm
#: local cache), and the zoo's medians below these.
EVERY = {"cold": 1.0, "new/warm": 1.0}
MEDIAN = {"cold": 0.6, "new/warm": 0.5, "new/remote": 0.4}


def _save(out: Path, results: dict[str, Any]) -> None:
    write_atomically(out / "zoo.json", json.dumps(results, indent=1).encode())


def _load(out: Path) -> dict[str, Any]:
    path = out / "zoo.json"
    if not path.is_file():
        return {"meta": {}, "models": {}}
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def script_args(model: ZooModel, size: str, gpu: bool) -> list[str]:
    """The training script's arguments for ``model``: on ``cuda:0`` with bf16 autocast where
    there is a GPU (the script's own default is the CPU). Ten steps on a GPU, where a steady
    step is tens of milliseconds and three steps' last two (the first GPU zoo's) differed by
    half within one stock run; three on a CPU, whose steps take up to seconds."""
    steps = "10" if gpu else "3"
    return [*model.args(size), "--device", "cuda:0" if gpu else "cpu", "--steps", steps]


@dataclass(frozen=True)
class Profiled:
    """``--cprofile RUNS``: the runs named, whole processes under cProfile, each written to
    ``into``/MODEL-RUN.pstats (read with ``python -m bench.profile_report``). A profiled run is
    slower than a plain one, by more where more Python runs: its cell says ``profiled`` and no
    table should take its time for a measurement."""

    runs: frozenset[str]
    into: Path

    def dir_for(self, run: str) -> Path | None:
        if run not in self.runs:
            return None
        self.into.mkdir(parents=True, exist_ok=True)
        return self.into


def run_model(
    cluster: Cluster,
    workdir: Path,
    model: ZooModel,
    size: str,
    runs: list[str],
    saved: Callable[[dict[str, Any]], None],
    once: bool = False,
    profiled: Profiled | None = None,
) -> dict[str, Any]:
    """Every run of ``runs`` for ``model``, in order, ``saved`` after each. All of them, also
    where an earlier invocation finished some: a new machine's run means something only on
    the cluster its cold run filled, and stock's warm runs only on its cold run's dirs and
    remote caches. Then its second looks (``second_looks``), unless ``once``. ``profiled``:
    those runs under cProfile (``--cprofile``)."""
    args = script_args(model, size, cluster.gpu)
    cell: dict[str, Any] = {"suite": model.suite}
    _runs(cluster, workdir, model, args, runs, cell, saved, profiled)
    # Until no look is left: a look can call for another (the losses' look runs stock cold
    # again, and the new mean of stock's cold runs can make compileq's cold ratio read
    # slower: GPTJForCausalLM on the H200, 0.97x, then 1.01x with compileq's cold run once).
    # Each run is added once at most, so this ends.
    while not once and "skipped" not in cell and (again := second_looks(cell)):
        print(f"zoo: {model.name}: again: {', '.join(again)}", flush=True)
        _runs(cluster, workdir, model, args, again, cell, saved, profiled)
        if not any(run in cell for run in again):
            break  # none of them ran (a failed reuse): nothing new to look at
    return cell


def _runs(
    cluster: Cluster,
    workdir: Path,
    model: ZooModel,
    args: list[str],
    runs: list[str],
    cell: dict[str, Any],
    saved: Callable[[dict[str, Any]], None],
    profiled: Profiled | None = None,
) -> None:
    for name, mode, before, reuse in RUNS:
        if name not in runs:
            continue
        if reuse is not None and "failed" in cell.get(reuse, {"failed": "not run"}):
            continue  # stock_warm_local runs on stock_cold's dirs: there are none
        if before in ("flush", "cold"):
            cluster.flush()
        if before == "cold":
            cluster.wipe_worker_caches()
        stem = model.name.replace("/", "-").replace(":", "-")  # a file name
        tag = f"{stem}-{name}"
        eager = ["--eager"] if name == "eager" else []
        caches_of = f"{stem}-{reuse}" if reuse else None
        cprofile = profiled.dir_for(name) if profiled else None
        started = time.monotonic()
        try:
            run = run_job(cluster, workdir, tag, 0, [*args, *eager], mode, caches_of, cprofile)
        except TimeUp:
            raise
        except SystemExit as failed:
            cell[name] = {"failed": str(failed)[-2000:]}
            print(f"{tag}: failed: {_last_line(str(failed))}", flush=True)
            if name == "eager":  # nothing builds it here: said, and the rest not tried
                cell["skipped"] = _last_line(str(failed))
                saved(cell)
                return
        else:
            run["ready_s"] = ready_s(run, "zoo")
            run["step_s"] = step_s(run, "zoo")
            run["wall_s"] = round(time.monotonic() - started, 1)
            if cprofile is not None:
                run["profiled"] = True
            cell[name] = run
            print(f"{tag}: first step {run['ready_s']} s", flush=True)
        saved(cell)


#: compileq's repeated runs, counted with its first ones in every verdict.
AGAIN_OURS = ("compileq_cold_again", "compileq_new_again")
#: Each second look: the runs it repeats. "Two repetitions where one run says otherwise."
AGAIN = {
    "cold": ["stock_cold_again", "compileq_cold_again"],
    "new/warm": ["stock_warm_local_again", "compileq_new_again"],
    "losses": ["stock_cold_again"],
}


def parse_settings(given: list[str]) -> dict[str, str]:
    """``--setting COMPILEQ_NAME=VALUE`` pairs as an environment, checked as compileq checks
    its own before anything runs: a pair without ``=``, a name that is none of compileq's
    settings (``compileq.config.Settings`` ignores an unknown variable: a misspelt one would
    change nothing, silently) or a value compileq refuses (``load_settings``' one-line error,
    else every compileq run of the invocation would fail on it) is a ValueError, its message
    the parser's error. The last pair of a name wins."""
    fields = {variable(name): name for name in Settings.model_fields}
    settings: dict[str, str] = {}
    for pair in given:
        name, sep, value = pair.partition("=")
        if not sep or name not in fields:
            raise ValueError(
                f"--setting {pair!r}: give COMPILEQ_NAME=VALUE, NAME one of compileq's "
                "settings (compileq.config.Settings)"
            )
        settings[name] = value
    chosen = {fields[name]: value for name, value in settings.items()}
    try:
        load_settings(given_as={f: f"--setting {variable(f)}" for f in chosen}, **chosen)
    except ConfigError as e:
        raise ValueError(str(e)) from None
    return settings


def second_looks(cell: dict[str, Any]) -> list[str]:
    """The runs to repeat for a model whose first runs say compileq is slower than stock
    (cold, or new machine against stock's warm local cache) or its losses outside stock's
    spread (stock compiled again from nothing gives that spread, its autotuning's choices
    included: its warm runs replay its cold run's kernels). In RUNS order; none twice."""
    r = ratios(cell)
    wanted = {
        run
        for look, runs in AGAIN.items()
        if (losses_agree(cell) is False if look == "losses" else (r[look] or 0) > EVERY[look])
        for run in runs
        if run not in cell
    }
    return [name for name, *_ in RUNS if name in wanted]


def complete(cell: dict[str, Any] | None, runs: list[str]) -> bool:
    """Whether an earlier invocation finished this model: skipped, or every run done."""
    if not cell:
        return False
    return "skipped" in cell or all(n in cell and "failed" not in cell[n] for n in runs)


def _last_line(error: str) -> str:
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "failed"


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(prog="python -m bench zoo", description=__doc__)
    parser.add_argument("--models", default=None, help="these models only (names as listed)")
    parser.add_argument("--suites", default="timm,hf")
    parser.add_argument("--size", choices=("tiny", "gpu"), default=None, help="default: by device")
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS))
    parser.add_argument("--again", action="store_true", help="run models already done again")
    parser.add_argument(
        "--once",
        action="store_true",
        help="each run once: no second look at a model one run calls slower or off",
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="COMPILEQ_DEADLINE_S of every run (default: compileq's own); a loaded machine's "
        "codegen may outlast 60 s, and a graph then compiles in process too",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="COMPILEQ_NAME=VALUE",
        help="a compileq setting for every compileq run and its worker (repeatable), to "
        "compare compileq with one setting changed against stock; recorded in the table's "
        "meta. The runs' environment drops the caller's own COMPILEQ_ variables, so this is "
        "the way to set one",
    )
    parser.add_argument(
        "--lanes",
        type=int,
        default=1,
        help="run this many models at once, each lane on its own share of the cores "
        "(bench/zoo_lanes.py)",
    )
    parser.add_argument(
        "--cprofile",
        default=None,
        metavar="RUNS",
        help="these runs (names as in --runs) under cProfile, into OUT/pstats; slower than "
        "plain runs: a profiling invocation, not a measurement",
    )
    parser.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench-out" / "zoo"))
    args = parser.parse_args(argv)
    gpu = torch.cuda.is_available()
    size = args.size or size_for(gpu)
    runs = args.runs.split(",")
    if unknown := set(runs) - {name for name, *_ in RUNS}:
        parser.error(f"unknown runs {sorted(unknown)}")
    try:
        settings = parse_settings(args.setting)
    except ValueError as bad:
        parser.error(str(bad))
    profiled_runs = frozenset(args.cprofile.split(",")) if args.cprofile else frozenset()
    if unknown := profiled_runs - {name for name, *_ in RUNS}:
        parser.error(f"--cprofile: unknown runs {sorted(unknown)}")
    suites = set(args.suites.split(","))
    chosen = [m for m in MODELS if m.suite in suites]
    if args.models:
        found = {w: named(w) for w in args.models.split(",")}
        if unknown := {w for w, model in found.items() if model is None}:
            parser.error(
                f"unknown models {sorted(unknown)}: a name of bench/zoo_models.py, or "
                "timm:NAME or hf:CLASS for one of your own"
            )
        chosen = [model for model in found.values() if model is not None]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = _load(out)
    if args.lanes > 1:
        return _in_lanes(args, size, runs, chosen, out)
    import triton

    results["meta"] = {
        "device": torch.cuda.get_device_name(0) if gpu else "CPU only",
        "cores": len(os.sched_getaffinity(0)),
        # The cores the worker left to the ranks: as told, else its default for these cores.
        "worker_leave_cores": os.environ.get("COMPILEQ_WORKER_LEAVE_CORES")
        or str(cpus.default_leave(cpus.usable(), 1 if gpu else 0)),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "size": size,
        "deadline_s": args.deadline_s,
        "settings": settings,
        "date": time.strftime("%Y-%m-%d"),
        "command": " ".join(["python -m bench zoo", *(argv if argv is not None else sys.argv[1:])]),
    }
    signal.signal(signal.SIGTERM, _time_up)
    workdir = new_workdir()
    cluster = Cluster(workdir, gpu=gpu).start()
    cluster.settings_env.update(settings)
    if args.deadline_s is not None:
        cluster.settings_env["COMPILEQ_DEADLINE_S"] = str(args.deadline_s)
    try:
        cluster.start_worker(None)
        for model in chosen:
            if not args.again and complete(results["models"].get(model.name), runs):
                print(f"zoo: {model.name}: done in an earlier invocation", flush=True)
                continue

            def saved(cell: dict[str, Any], name: str = model.name) -> None:
                results["models"][name] = cell
                _save(out, results)

            print(f"zoo: {model.name}", flush=True)
            profiled = Profiled(profiled_runs, out / "pstats") if profiled_runs else None
            saved(run_model(cluster, workdir, model, size, runs, saved, args.once, profiled))
    finally:
        try:
            cluster.close()
        except Exception as gone:
            print(f"closing the cluster: {gone!r}", file=sys.stderr)
        join_logs(workdir, out / "zoo-logs.txt", 8000)
        write_atomically(out / "zoo.md", render([results]).encode())
        chart([results], out / "zoo.png")
    print((out / "zoo.md").read_text())
    return 0


def _in_lanes(
    args: argparse.Namespace,
    size: str,
    runs: list[str],
    chosen: list[ZooModel],
    out: Path,
) -> int:
    """``--lanes N``: the models not done yet, dealt to N lanes; one table over them all.
    What an earlier invocation's lanes left (one cut short before its merge) is merged first,
    and their dirs emptied: a lane's zoo.json then holds this invocation's models only, and
    an earlier lane's cut-short cell can never overwrite a later lane's finished one."""
    results = zoo_lanes.recover(out)
    todo = [
        m.name for m in chosen if args.again or not complete(results["models"].get(m.name), runs)
    ]
    passed = ["--size", size, "--runs", ",".join(runs)]
    if args.again:
        passed.append("--again")
    if args.once:
        passed.append("--once")
    if args.cprofile:
        passed += ["--cprofile", args.cprofile]
    if args.deadline_s is not None:
        passed += ["--deadline-s", str(args.deadline_s)]
    for setting in args.setting:
        passed += ["--setting", setting]
    try:
        lanes = zoo_lanes.run(todo, args.lanes, out, passed) if todo else []
    except ValueError as bad:
        raise SystemExit(f"python -m bench zoo: {bad}") from None
    merged = zoo_lanes.merge(out, lanes)
    write_atomically(out / "zoo.md", render([merged]).encode())
    chart([merged], out / "zoo.png")
    print((out / "zoo.md").read_text())
    return 0


# -- what a model's runs say -------------------------------------------------------------------


def _ready(cell: dict[str, Any], name: str) -> float | None:
    """A run's first step, the mean with its repetition where there is one (``AGAIN``)."""
    times = [t for run in (name, f"{name}_again") if (t := (cell.get(run) or {}).get("ready_s"))]
    return round(statistics.fmean(times), 3) if times else None


def ratios(cell: dict[str, Any]) -> dict[str, float | None]:
    """The matrix's ratios, each side the mean of its runs."""
    return matrix.ratios(cell, _ready)


def _gap(cell: dict[str, Any], name: str) -> float | None:
    """Run ``name``'s largest loss difference from stock's cold run, over every step; None
    where either run has no losses."""
    stock = (cell.get("stock_cold") or {}).get("losses")
    losses = (cell.get(name) or {}).get("losses")
    if not stock or not losses:
        return None
    return max(abs(a - b) for a, b in zip(losses[0], stock[0], strict=False))


def loss_gap(cell: dict[str, Any]) -> tuple[float, float] | None:
    """compileq's largest loss difference from stock's cold run, over compileq's runs and
    every step, and stock's own between its runs (its run-to-run spread: its warm runs replay
    its cold run's kernels; ``stock_cold_again``, where run, compiled them again); None where
    a run is missing."""
    ours = [
        g
        for n in ("compileq_cold", "compileq_new", *AGAIN_OURS)
        if (g := _gap(cell, n)) is not None
    ]
    spread = [
        g
        for n in ("stock_warm_local", "stock_remote_new", "stock_cold_again")
        if (g := _gap(cell, n)) is not None
    ]
    if not ours:
        return None
    return max(ours), max(spread, default=0.0)


def eager_gap(cell: dict[str, Any]) -> float | None:
    """Eager's largest loss difference from stock's cold run: how far stock's own kernels take
    the losses from PyTorch's, the scale against which a miss of stock's spread is read."""
    return _gap(cell, "eager")


def losses_agree(cell: dict[str, Any]) -> bool | None:
    """Whether compileq's losses are within stock's spread (or a relative 1e-4 of the loss,
    float sums in another order)."""
    gaps = loss_gap(cell)
    if gaps is None:
        return None
    stock = cell["stock_cold"]["losses"][0]
    return gaps[0] <= max(gaps[1], 1e-4 * max(abs(x) for x in stock))


def verdicts(cell: dict[str, Any]) -> dict[str, Any]:
    """What the targets ask of one model: no fallback, no codegen in the training process, no
    graph generated on a new machine, losses within stock's spread; over every compileq run,
    repetitions included."""
    ours = [cell.get(n) or {} for n in ("compileq_cold", "compileq_new", *AGAIN_OURS)]
    news = [cell[n] for n in ("compileq_new", "compileq_new_again") if n in cell]
    generated = [run["codegens"] for run in news if "codegens" in run]
    return {
        "fallbacks": sum(run.get("fallbacks", 0) for run in ours),
        "in_process": sum(run.get("fx_local_compiles", 0) for run in ours),
        "generated_new": max(generated) if generated else None,
        "losses_agree": losses_agree(cell),
    }


def summary(files: list[dict[str, Any]]) -> dict[str, Any]:
    """Over every model measured: how many, the medians of each ratio, and the misses."""
    cells = _cells(files)
    measured = {n: c for n, c in cells.items() if "skipped" not in c and ratios(c)["cold"]}
    medians = {}
    for label in MEDIAN:
        values = [r for c in measured.values() if (r := ratios(c)[label]) is not None]
        medians[label] = round(statistics.median(values), 2) if values else None
    over = sorted(
        n
        for n, c in measured.items()
        if any((r := ratios(c)[k]) is not None and r > EVERY[k] for k in EVERY)
    )
    unclean = sorted(
        n
        for n, c in measured.items()
        if (v := verdicts(c))["fallbacks"] or v["in_process"] or v["generated_new"]
        or v["losses_agree"] is False
    )  # fmt: skip
    return {
        "models": len(cells),
        "measured": len(measured),
        "complete": sum(_finished(c) == len(DEFAULT_RUNS) for c in measured.values()),
        "timm": sum(c.get("suite") == "timm" for c in measured.values()),
        "hf": sum(c.get("suite") == "hf" for c in measured.values()),
        "skipped": sorted(n for n, c in cells.items() if "skipped" in c),
        "medians": medians,
        "slower_than_stock": over,
        "not_clean": unclean,
    }


def _finished(cell: dict[str, Any]) -> int:
    """How many of the zoo's six runs a cell has (a skipped model: all it will ever have)."""
    if "skipped" in cell:
        return len(DEFAULT_RUNS)
    return sum(isinstance(cell.get(run), dict) and "ready_s" in cell[run] for run in DEFAULT_RUNS)


def _winners(files: list[dict[str, Any]]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Each model's cell and its file's meta: a later file's, unless it finished fewer runs
    (a call cut short mid-model does not hide what an earlier one finished)."""
    won: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for data in files:
        for name, cell in data["models"].items():
            if name not in won or _finished(cell) >= _finished(won[name][0]):
                won[name] = (cell, data.get("meta") or {})
    return won


def _cells(files: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: cell for name, (cell, _meta) in _winners(files).items()}


def _cores(files: list[dict[str, Any]]) -> dict[str, str]:
    """Each model's cores, and the cores its worker was told to leave to the ranks where it
    was told: from the meta of the file whose cell won (a file merged from lanes has the same
    cores in each lane's meta)."""
    cores: dict[str, str] = {}
    winners = _winners(files)
    # A table over several devices (an H100 call among H200 ones) names each row's.
    several = len({str(meta.get("device")) for _cell, meta in winners.values()}) > 1
    for name, (_cell, meta) in winners.items():
        left = meta.get("worker_leave_cores")
        cores[name] = f"{meta.get('cores', '-')}" + (
            f" (left {left})" if left not in (None, "default") else ""
        )
        if several:
            cores[name] += f", {_short_device(str(meta.get('device')))}"
    return cores


def _short_device(device: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "H100": the word with a digit after the vendor's name."""
    words = [w for w in device.split() if w.upper() != "NVIDIA"]
    return next((w for w in words if any(c.isdigit() for c in w)), device)


def render(files: list[dict[str, Any]]) -> str:
    """One markdown table over every model of every file (a later file's model wins)."""
    cells = _cells(files)
    cores = _cores(files)
    s = summary(files)
    med = s["medians"]
    lines = [
        f"{s['measured']} models measured ({s['timm']} timm, {s['hf']} HuggingFace; "
        f"{s['complete']} with all six runs), {len(s['skipped'])} skipped. Medians: cold {_s(med['cold'])}x of stock cold, new "
        f"machine {_s(med['new/warm'])}x of stock warm local and {_s(med['new/remote'])}x of "
        "stock remote (targets: 0.6, 0.5, 0.4). First step in seconds, each run a fresh process "
        "on fresh local dirs; ratios in bold are slower than stock.",
        "",
        "| model | suite | cores | eager | stock cold | cq cold | cold ratio | stock warm local "
        "| stock remote new | cq new | new / warm | new / remote | fallbacks | in process "
        "| generated new | losses within stock's spread | step ms stock / cq |",
        "|---|" + "---|" * 16,
    ]
    for name, cell in sorted(cells.items()):
        if "skipped" in cell:
            lines.append(
                f"| {name} | {cell.get('suite', '-')} | {cores[name]} | skipped: {cell['skipped']} |"
            )
            continue
        r, v = ratios(cell), verdicts(cell)
        failed = [n for n, run in cell.items() if isinstance(run, dict) and "failed" in run]
        agree = {True: "yes", False: "NO", None: "-"}[v["losses_agree"]]
        if v["losses_agree"] is False and (gaps := loss_gap(cell)):
            # How far off, beside stock's spread and eager's distance from stock.
            agree += f" ({gaps[0]:.1e}; stock {gaps[1]:.1e}, eager {_e(eager_gap(cell))})"

        def ms(run: str, cell: dict[str, Any] = cell) -> str:
            step = (cell.get(run) or {}).get("step_s")
            return "-" if step is None else f"{1000 * step:.1f}"

        lines.append(
            f"| {name} | {cell.get('suite', '-')} | {cores[name]} | {_s(_ready(cell, 'eager'))} "
            f"| {_s(_ready(cell, 'stock_cold'))} | {_s(_ready(cell, 'compileq_cold'))} "
            f"| {_x(r['cold'], EVERY['cold'])} | {_s(_ready(cell, 'stock_warm_local'))} "
            f"| {_s(_ready(cell, 'stock_remote_new'))} | {_s(_ready(cell, 'compileq_new'))} "
            f"| {_x(r['new/warm'], EVERY['new/warm'])} | {_s(r['new/remote'])} "
            f"| {v['fallbacks']} | {v['in_process']} | {v['generated_new'] if v['generated_new'] is not None else '-'} "
            f"| {agree}{' (failed: ' + ', '.join(failed) + ')' if failed else ''} "
            f"| {ms('stock_warm_local')} / {ms('compileq_new')} |"
        )
    metas = sorted(
        {
            f"{m.get('device')}, {m.get('cores')} cores, torch {m.get('torch')}, "
            f"triton {m.get('triton')}, {m.get('size')} sizes"
            + (
                f", the worker leaving {m['worker_leave_cores']} cores"
                if m.get("worker_leave_cores") not in (None, "default")
                else ""
            )
            for m in (meta for d in files for meta in d.get("metas") or [d["meta"]])
            if m
        }
    )
    repeated = [
        f"{name} ({', '.join(n.removesuffix('_again') for n in cell if n.endswith('_again'))})"
        for name, cell in sorted(cells.items())
        if any(n.endswith("_again") for n in cell)
    ]
    if repeated:
        lines += ["", "Run twice where one run said slower or off (the mean shown): "
                  + "; ".join(repeated) + "."]  # fmt: skip
    lines += ["", "Measured on: " + "; ".join(metas) + "."]
    return "\n".join(lines) + "\n"


def _e(value: float | None) -> str:
    return "-" if value is None else f"{value:.1e}"


def chart(files: list[dict[str, Any]], path: Path) -> bool:
    """Each model's ratios, sorted, the targets drawn; False without matplotlib."""
    plt = pyplot()
    if plt is None:
        return False
    cells = {n: c for n, c in _cells(files).items() if ratios(c)["cold"] is not None}
    if not cells:
        return False
    names = sorted(cells, key=lambda n: ratios(cells[n])["cold"] or 0.0)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.45 * len(names)), 4.8))
    width = 0.4
    for i, label in enumerate(("cold", "new/warm")):
        values = [ratios(cells[n])[label] or 0.0 for n in names]
        xs = [x + (i - 0.5) * width for x in range(len(names))]
        bars = ax.bar(xs, values, width, label=f"compileq {label}")
        color = bars.patches[0].get_facecolor() if bars.patches else "k"
        ax.axhline(MEDIAN[label], ls="--", lw=1, color=color)
    ax.axhline(1.0, color="gray", lw=1)
    ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("compileq / stock (lower is better)")
    ax.set_title(
        "The zoo: first step, compileq against stock in the same run (median targets dashed)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    if sys.argv[1:2] == ["--render"]:
        raise SystemExit(render_files(sys.argv[2:], "zoo", render, chart))
    raise SystemExit(main())
