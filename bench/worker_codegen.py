"""A cold first step's graph codegens on the worker against stock's in the training process, by
the cores each model had, read from zoo results already measured (``zoo.json``).

    python -m bench.worker_codegen docs/bench/zoo-h200-2026-12-01/lanes4x4.json ... [--json]

For every model with both cold runs: the seconds stock's first step spent in
``fx_codegen_and_compile`` (every graph's lowering, code and kernel builds, one after another in
the rank), and the worker's codegens of the same graphs (``fx_builds``: each job's start and
seconds, read from the store after the run): their **sum** (what each graph cost on the
worker) and their **span** (the union of their intervals: how long at least one ran, which is
what the rank can wait for). Grouped by the cores of the run (a lane's, or the host's), with
the median ratio of compileq's cold first step to stock's beside them.

Why a reader and not another device call: every zoo run since the twenty-sixth session kept
both figures, so the question "is the worker's codegen of a graph slower than the rank's
own?" has 120-odd answers on disk already. The rejected alternative, timing a codegen twice on
one graph (in process, then on a worker), measures one graph on one machine state; these
files hold every model of both lists on three core counts.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Row:
    """One model's cold pair in one results file."""

    model: str
    cores: int
    gpu: bool
    stock_codegen_s: float
    worker_sum_s: float
    worker_span_s: float
    cold_ratio: float

    @property
    def label(self) -> str:
        return f"{self.cores}, {'GPU' if self.gpu else 'CPU'}"


def span(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by at least one of ``intervals`` (start, end)."""
    total, covered_to = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > covered_to:
            total += end - max(start, covered_to)
            covered_to = end
    return total


def rows(results: dict[str, Any]) -> list[Row]:
    """The cold pairs of one ``zoo.json`` with a worker codegen recorded and stock's codegen
    timed (a model whose stock run failed, or a run on a GPU host's CPU, has neither). The cold
    ratio is the zoo table's own (:func:`bench.zoo.ratios`: each side the mean with its
    repetition, where the zoo ran one)."""
    from bench.zoo import ratios

    meta = results.get("meta", {})
    gpu = meta.get("device", "CPU only") != "CPU only"
    out = []
    for model, cell in results.get("models", {}).items():
        stock, cold = cell.get("stock_cold"), cell.get("compileq_cold")
        if not (isinstance(stock, dict) and isinstance(cold, dict)):
            continue
        if gpu and not str(stock.get("device", "")).startswith("cuda"):
            # The twenty-sixth session's first calls on a GPU host ran the script's default
            # device, its CPUs (their runs predate the device field): neither a lane nor a GPU.
            continue
        here = stock.get("phases", {}).get("fx_codegen_and_compile", 0.0)
        builds = [(s, s + seconds) for s, seconds in cold.get("fx_builds", [])]
        ratio = ratios(cell)["cold"]
        if here <= 0 or not builds or ratio is None:
            continue
        worker_sum = sum(e - s for s, e in builds)
        cores = int(meta.get("cores", 0))
        out.append(Row(model, cores, gpu, here, worker_sum, span(builds), ratio))
    return out


def summary(all_rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per core count: runs, and the medians of sum / stock, span / stock and the cold ratio."""
    by: dict[tuple[int, bool], list[Row]] = {}
    for row in all_rows:
        by.setdefault((row.cores, row.gpu), []).append(row)

    def median(values: Iterable[float]) -> float:
        return round(statistics.median(values), 2)

    return {
        group[0].label: {
            "runs": len(group),
            "sum_over_stock": median(r.worker_sum_s / r.stock_codegen_s for r in group),
            "span_over_stock": median(r.worker_span_s / r.stock_codegen_s for r in group),
            "cold_ratio": median(r.cold_ratio for r in group),
        }
        for _key, group in sorted(by.items())
    }


def render(table: dict[str, dict[str, float]]) -> str:
    lines = [
        "| cores per run | runs | worker's codegens, sum / stock's | span / stock's | cold first step / stock's |",
        "| --- | --- | --- | --- | --- |",
    ]
    for cores, t in table.items():
        lines.append(
            f"| {cores} | {t['runs']:.0f} | {t['sum_over_stock']:.2f} | "
            f"{t['span_over_stock']:.2f} | {t['cold_ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker_codegen", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="zoo.json files of `bench zoo`")
    parser.add_argument("--json", action="store_true", help="the table as JSON")
    args = parser.parse_args(argv)
    found: list[Row] = []
    for path in args.files:
        try:
            found.extend(rows(json.loads(path.read_text())))
        except (OSError, ValueError) as bad:
            parser.error(f"{path}: {bad}")
    if not found:
        parser.error("no cold pair with both codegens timed in these files")
    table = summary(found)
    print(json.dumps(table) if args.json else render(table))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
