"""Lanes: one host's cores split so that several of the zoo's models run at once, each lane a
zoo of its own on a share of the cores (``python -m bench zoo --lanes N``).

A model's six runs take two to four minutes on an H200 host, most of it compiling on the CPU;
the GPU idles. A device call lasts ten minutes and a session has thirty, so the GPU zoo's
32 models at one a time would take many sessions. With lanes, each lane is a ``python -m bench
zoo`` process pinned (``sched_setaffinity``, which every process it starts inherits: its
cluster's worker and pool, the training processes and stock's compile pool, whose width
Inductor reads from the affinity) to its own contiguous block of the cores, with its own
redis-server and worker, on a GPU all lanes share. The models are dealt to the lanes in turn.
Stock and compileq run in the same lane, on the same cores, one after the other: each ratio
is measured as on a host of that many cores. What lanes change, and the tables say: the
cores per run (``cores`` in each lane's meta), and the GPU is shared, so steady step times
are noisier than on a GPU of one's own.

Rejected: one process running several models' runs concurrently in one cluster (the worker
and its cache would be shared, and one model's cold run would warm another's: a new
machine's figure means a cluster only its own cold run filled), and unpinned lanes (the
kernel's scheduler would give a lane's stock cold run the idle cores of another lane's
quiet moment, and compileq's cold run another count: a ratio of two unlike machines).

Each lane writes ``--out``/lane-K/zoo.json as any zoo does (a lane cut short keeps what it
finished); the merged ``zoo.json``, ``zoo.md`` and ``zoo.png`` are written to ``--out`` at
the end, also after a SIGTERM, which is passed on to every lane. The next invocation merges
what lanes left first and empties their dirs (``recover``).

Measured on the H200 (docs/BENCHMARKS.md, twenty-seventh and twenty-eighth sessions): four
lanes of 4 cores first gave compileq's cold first step 0.79-1.45x of stock's (median 1.0x),
where the whole 16-core host gave three of them 0.66-0.85x. The cause, read off the worker's
log: a worker of three CPUs (it left one core to the rank) that generates a graph in one pool
process builds its kernels in the other two, where stock's pool builds them in four beside its
codegen. Since a worker under 8 CPUs per GPU leaves no core (``workers/cpus.default_leave``),
4-core lanes gave 0.63-0.99x over 24 models (DistilBERT 1.45x -> 0.77x, convnext_tiny
1.08x -> 0.72x). Lanes still measure "a host of N cores per GPU", not the H200 host: the table
names each model's cores.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.harness import ROOT
from compileq._files import write_atomically


def split_cpus(cpus: list[int], lanes: int) -> list[list[int]]:
    """``cpus`` (sorted) in ``lanes`` contiguous blocks, as even as they divide; an error
    where there are fewer CPUs than lanes."""
    if lanes < 1:
        raise ValueError(f"--lanes {lanes}: at least one")
    if len(cpus) < lanes:
        raise ValueError(f"--lanes {lanes}: only {len(cpus)} CPUs to share among them")
    ordered = sorted(cpus)
    size, extra = divmod(len(ordered), lanes)
    blocks, start = [], 0
    for k in range(lanes):
        end = start + size + (1 if k < extra else 0)
        blocks.append(ordered[start:end])
        start = end
    return blocks


def deal(models: list[str], lanes: int) -> list[list[str]]:
    """The models dealt to the lanes in turn, the first to lane 0: in the order given, so the
    models one wants first are the ones each lane starts with. Lanes left without a model are
    dropped."""
    hands = [models[k::lanes] for k in range(lanes)]
    return [hand for hand in hands if hand]


def lane_argv(models: list[str], out: Path, passed: list[str]) -> list[str]:
    """One lane's command: the zoo on its models, into its own ``out``, with the options
    (size, runs, deadline, again) the parent was given."""
    return [
        sys.executable, "-m", "bench", "zoo", "--models", ",".join(models), "--out", str(out),
        *passed,
    ]  # fmt: skip


def merge(out: Path, lane_dirs: list[Path]) -> dict[str, Any]:
    """``out``/zoo.json with every lane's models added (a lane's result wins over an
    earlier invocation's), and every lane's meta kept, for the table's "measured on"."""
    path = out / "zoo.json"
    merged: dict[str, Any] = (
        json.loads(path.read_text()) if path.is_file() else {"meta": {}, "models": {}}
    )
    metas = list(merged.get("metas") or ([merged["meta"]] if merged.get("meta") else []))
    for lane in lane_dirs:
        lane_file = lane / "zoo.json"
        if not lane_file.is_file():
            continue
        data = json.loads(lane_file.read_text())
        merged["models"].update(data["models"])
        if data.get("meta") and data["meta"] not in metas:
            metas.append(data["meta"])
    merged["metas"] = metas
    merged["meta"] = metas[-1] if metas else {}
    write_atomically(path, json.dumps(merged, indent=1).encode())
    return merged


def recover(out: Path) -> dict[str, Any]:
    """What earlier lanes under ``out`` left, merged into ``out``/zoo.json (in the lanes' order,
    so within one invocation, where each model was dealt once, nothing overlaps); then their
    dirs removed. The merged results."""
    earlier = sorted(out.glob("lane-*"), key=lambda p: int(p.name.partition("-")[2] or 0))
    merged = merge(out, earlier)
    for lane in earlier:
        shutil.rmtree(lane, ignore_errors=True)
    return merged


def run(models: list[str], lanes: int, out: Path, passed: list[str]) -> list[Path]:
    """Every lane to its end (or until a SIGTERM, passed on to each); the lanes' dirs."""
    blocks = split_cpus(sorted(os.sched_getaffinity(0)), lanes)
    hands = deal(models, lanes)
    procs: list[subprocess.Popen[bytes]] = []
    dirs: list[Path] = []
    for k, (hand, cpus) in enumerate(zip(hands, blocks, strict=False)):
        lane = out / f"lane-{k}"
        lane.mkdir(parents=True, exist_ok=True)
        dirs.append(lane)
        print(f"zoo lane {k}: CPUs {cpus[0]}-{cpus[-1]}: {', '.join(hand)}", flush=True)
        with (lane / "lane.log").open("ab") as log:
            procs.append(
                subprocess.Popen(
                    lane_argv(hand, lane, passed),
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                    # Before exec: everything the lane starts inherits its CPUs.
                    preexec_fn=lambda cpus=cpus: os.sched_setaffinity(0, cpus),  # type: ignore[misc]
                )
            )

    def passed_on(signum: int, _frame: object) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, passed_on)
    try:
        for k, proc in enumerate(procs):
            if proc.wait() != 0:
                print(f"zoo lane {k}: exited {proc.returncode}: {dirs[k] / 'lane.log'}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return dirs
