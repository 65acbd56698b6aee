"""The benchmark harness itself: its report on recorded H100 results, and one scenario run as
users run it (``python -m bench``: its own redis-server, a real worker, real round trips)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.report import merge_runs

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "docs" / "bench" / "h100" / "session3"


def first_steps(name: str) -> dict[str, Any]:
    entry: dict[str, Any] = json.loads((H100 / name).read_text())["first_steps"][0]
    return entry


def test_the_report_pools_runs_from_separate_calls_into_one_median_per_workload() -> None:
    # compileq's half alone, then a repetition of both, on one machine: one GPT table.
    half, both = first_steps("gpt-compileq.json"), first_steps("gpt-queue.json")
    (gpt,) = merge_runs([half, both])
    assert gpt["all_s"]["cq_cold"] == half["all_s"]["cq_cold"] + both["all_s"]["cq_cold"]
    assert gpt["median_s"]["cq_cold"] == statistics.median(gpt["all_s"]["cq_cold"])
    assert gpt["all_s"]["stock_cold"] == both["all_s"]["stock_cold"]
    assert gpt["reps"] == 1  # stock ran once: one complete repetition of everything
    # Losses are compared with stock's again once its runs are in (a half alone has none).
    assert half["loss_equal_stock"] == {} and gpt["loss_equal_stock"]["cq_edit"] is True


def test_the_report_gives_every_target_a_verdict_and_updates_its_docs_section(
    tmp_path: Path,
) -> None:
    docs = tmp_path / "BENCHMARKS.md"
    docs.write_text("# Benchmarks\n")
    files = [str(H100 / f) for f in ("gpt-compileq.json", "gpt-queue.json", "herd-gpt.json")]
    for _ in range(2):  # a rerun replaces its section instead of appending another
        proc = subprocess.run(
            [sys.executable, "-m", "bench.report", *files, "--docs", str(docs)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
    text = docs.read_text()
    assert text.count("<!-- bench:nvidia-h100-80gb-hbm3:start -->") == 1
    targets = [line for line in text.splitlines() if line.startswith(("| gpt:", "| herd:"))]
    assert len(targets) == 8  # four for the workload's first steps, four for the herd
    assert all(line.endswith(("| **met** |", "| **not met** |")) for line in targets)
    assert "| gpt: cold, one rank: compileq / stock <= 1.05x | 1.07x | **not met** |" in targets


def test_the_queue_scenario_runs_against_a_real_worker_and_writes_its_results(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    args = ["--scenarios", "queue", "--reps", "5", "--round-trips", "20", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    queue = json.loads((out / "results.json").read_text())["queue"]
    hit, trips = queue["hit_path"], queue["round_trip"]
    assert hit["kernels"] == 15 and 0 < hit["compileq_hit_ms"][0] <= hit["compileq_hit_ms"][1]
    assert hit["lookup_1000_ms"][0] > 0 and hit["stock_hit_ms"][0] > 0
    assert trips["burst_done"] == trips["burst"] == 20 and trips["tasks_per_s"] > 0
    assert len(trips["latency_ms_each"]) == trips["sequential"]
    assert "**queue overhead**" in (out / "bench.md").read_text()
    # The worker's log is kept beside the results, for a build that failed.
    assert "compileq worker" in (out / "workers.log").read_text()
