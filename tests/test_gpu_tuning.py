"""max-autotune's candidate timings on GPU workers (run on the device; skipped elsewhere).

Two GPU workers (on a one-GPU machine both pinned to GPU 0, where they take turns: see
workers/tune.py), each with its own cache dirs as on two nodes. The script-defined MLP of
``examples/mlp_autotune.py`` runs as ``__main__`` under stock and under ``compileq run``, each
a fresh process on empty cache dirs. A training process generating its graphs itself
(``--no-fx``) sends the candidates to the workers; a worker generating a graph times them
itself; both store the timings for everyone, and each GEMM's whole table once complete.

    python -m pytest tests/test_gpu_tuning.py
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from bench.autotune import autotune_tables, compare_picks, drop_all_but_timings

from compileq import keys
from compileq.localstack import RedisServer
from compileq.tasks.tune_jobs import KIND, TABLE_KIND
from tests.conftest import Env, Worker, compileq_cmd, start_worker, stats, stop_worker, wipe_cache

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "mlp_autotune.py"
SMALL = ("--dim", "256", "--hidden", "512", "--layers", "1", "--batch", "64")
_TIMED = re.compile(r"compileq worker: timed \S+ (\S+):")


@pytest.fixture(scope="module")
def gpu_workers(
    env: Env, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Worker]]:
    gpus = torch.cuda.device_count()
    workers = [
        start_worker(
            env,
            tmp_path_factory.mktemp(f"tune-worker-{i}"),
            "--concurrency",
            "4",
            device=("--gpus", str(i % gpus)),
        )
        for i in range(2)
    ]
    client = redis_server.client()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        queues = list(client.scan_iter(match=keys.WORKERS + keys.TUNE_QUEUE_PREFIX + "*"))
        if sum(client.zcard(q) for q in queues) >= 2:
            break
        time.sleep(0.2)
    yield workers
    for worker in workers:
        stop_worker(worker)


def run_script(
    env: Env, tmp: Path, name: str, *compileq: str, **more: str
) -> tuple[dict[str, Any], str]:
    """One fresh process on empty cache dirs: ``compileq run ARGS -- script`` if ``compileq``
    names arguments (``"run"`` alone for none), else stock."""
    cmd = [sys.executable, str(SCRIPT), *SMALL]
    if compileq:
        cmd = compileq_cmd(*compileq, "--", *cmd)
    proc = subprocess.run(
        cmd,
        env=env.vars(
            TORCHINDUCTOR_CACHE_DIR=str(tmp / name / "inductor"),
            TRITON_CACHE_DIR=str(tmp / name / "triton"),
            TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED="all",
            **more,
        ),
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-5000:]
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    return result, proc.stderr


def test_a_clients_candidates_are_timed_once_across_the_gpu_workers_and_picks_match_stock(
    env: Env, gpu_workers: list[Worker], redis_server: RedisServer, tmp_path: Path
) -> None:
    wipe_cache(redis_server.client())
    stock, stock_err = run_script(env, tmp_path, "stock")
    offsets = [w.log.stat().st_size for w in gpu_workers]
    ours, err = run_script(env, tmp_path, "compileq", "run", "--no-fx")
    logs = [w.log.read_text()[offset:] for w, offset in zip(gpu_workers, offsets, strict=True)]
    counters = stats(env, tmp_path)
    timed = [_TIMED.findall(log) for log in logs]
    every = [k for keys_ in timed for k in keys_]
    tail = "\n".join(log[-3000:] for log in logs)
    # Every candidate timed once in the cluster, by both workers between them.
    assert counters["tune_remote"] > 0, tail
    assert counters["tune_remote"] == len(every) == len(set(every)), tail
    assert all(timed), [len(t) for t in timed]
    assert counters["tune_local"] == 0 and counters["fallbacks"] == 0, counters
    # The same first loss as stock's. Per GEMM a candidate stock also timed was picked, and the
    # workers' best times are stock's, within a factor of 2 at the median: these GEMMs take
    # 5-10 microseconds, where stock's own timings and picks differ from run to run (a second
    # process timing in stock's own way, in a worker, picked configs stock's table gave 1.7x
    # and 2x; stock once timed the first GEMM's best at 2.1x what it is); the picks on GEMMs
    # that matter are in bench/autotune.py and docs/BENCHMARKS.md.
    assert math.isclose(ours["losses"][0], stock["losses"][0], rel_tol=1e-2)
    stock_tables, tables = autotune_tables(stock_err), autotune_tables(err + "\n".join(logs))
    assert stock_tables and len(tables) == len(stock_tables), (err[-3000:], tail)
    picks = compare_picks(stock_tables, tables)
    assert all(d["this_vs_stock_best_in_stock_table"] is not None for d in picks["different"])
    best = {t["op"]: t["rows"][0]["ms"] for t in stock_tables}
    ratios = sorted(t["rows"][0]["ms"] / best[t["op"]] for t in tables)
    assert 0.5 <= statistics.median(ratios) <= 2.0, (ratios, picks)


def test_a_workers_codegen_times_candidates_itself_and_a_new_machine_finds_them_all(
    env: Env, gpu_workers: list[Worker], redis_server: RedisServer, tmp_path: Path
) -> None:
    client = redis_server.client()
    wipe_cache(client)
    first, _ = run_script(env, tmp_path, "first", "run")
    before = stats(env, tmp_path)
    stored = list(client.scan_iter(match=keys.artifact(KIND, "") + "*"))
    # Graphs generated on the workers: their candidates timed there, none sent, all stored.
    assert before["fx_remote_compiles"] == 2 and before["tune_remote"] == 0, before
    assert 0 < len(stored) <= before["tune_local"], before
    # Every entry but the timings dropped, and codegen in the new machine's own process (a
    # worker's would find its local autotune cache): every graph is generated and every GEMM
    # autotuned again, with the same Inductor config, so the same candidates.
    drop_all_but_timings(client)
    again, err = run_script(env, tmp_path, "again", "run", "--no-fx")
    after = stats(env, tmp_path)
    assert after["tune_remote"] == 0, err[-3000:]
    assert after["tune_hits"] - before["tune_hits"] >= len(stored), err[-3000:]
    assert after["tune_local"] == before["tune_local"]
    # Not bit-equal on the H100 (2.06390 against 2.06384, every timing the same): which other
    # choice differs between generating a graph here and on a worker is not established.
    assert math.isclose(again["losses"][0], first["losses"][0], rel_tol=1e-3)


def test_a_gemms_table_lets_a_new_machine_time_no_choice_at_all(
    env: Env, redis_server: RedisServer, tmp_path: Path
) -> None:
    """The first process stores each GEMM's table once every choice has a time (timed by it,
    or by the module's GPU workers if they run); a new machine generating the same graphs finds
    every table and times no choice, ATen's included."""
    client = redis_server.client()
    wipe_cache(client)
    first, _ = run_script(env, tmp_path, "first", "run", "--no-fx")
    stored = list(client.scan_iter(match=keys.artifact(TABLE_KIND, "") + "*"))
    before = stats(env, tmp_path)
    assert stored, before
    drop_all_but_timings(client, keep_tables=True)
    again, err = run_script(env, tmp_path, "again", "run", "--no-fx")
    after = stats(env, tmp_path)
    found = after.get("tune_table_hits", 0) - before.get("tune_table_hits", 0)
    assert found >= len(stored), (after, err[-3000:])  # a GEMM met twice finds its table twice
    assert after.get("tune_local", 0) == before.get("tune_local", 0), after
    assert math.isclose(again["losses"][0], first["losses"][0], rel_tol=1e-3)
