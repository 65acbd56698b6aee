"""The benchmark harness itself: its report on recorded H100 results, one scenario run as users
run it (``python -m bench``: its own redis-server, a real worker, real round trips), and the
capacity measurement (``python -m bench.capacity``) on real builds in a real Redis."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bench import autotune, worker_codegen
from bench.autotune import autotune_tables, compare_picks
from bench.capacity import UNCLASSIFIED, classify, unit_of
from bench.ddp import CPU_ARGS, GPU_ARGS, chosen_script_args, zoo_script_args
from bench.harness import process_tree
from bench.report import merge_runs

from compileq import keys
from tests.test_faults import wait_for

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


def test_capacity_classifies_every_key_family_that_keys_py_defines() -> None:
    kernel = keys.artifact("triton", "ab" * 32)
    graph = keys.artifact("fx", "cd" * 32)
    # A key of every family keys.py defines (a family added there fails here until
    # bench.capacity classifies it); channels and Celery queue names are not keys.
    families = {n: v for n, v in vars(keys).items() if n.isupper() and isinstance(v, str)}
    queues = ("QUEUE_PREFIX", "FX_QUEUE_PREFIX", "TUNE_QUEUE_PREFIX", "CPP_QUEUE_PREFIX")
    for name in ("PREFIX", "DONE_CHANNEL", *queues):
        del families[name]
    suffix = {"ARTIFACT": kernel[len(keys.ARTIFACT) :], "SIBLINGS": "triton:" + "ef" * 32}
    suffix |= dict.fromkeys(("JOB", "META", "LOCK", "BUILDING"), kernel)
    for name, prefix in families.items():
        key = prefix + suffix.get(name, "x")
        assert classify(key) != UNCLASSIFIED, (name, key)
    expected = {
        kernel: "triton",
        graph: "fx",
        keys.job(kernel): "job:triton",
        keys.meta(kernel): "meta:triton",
        keys.lock(graph): "lock:fx",
        keys.building(graph): "building:fx",
        keys.siblings("triton", "ef" * 32): "siblings:triton",
        keys.STATS: "counters",
        keys.QUEUE_STATS: "counters",
        keys.FALLBACK_REASONS: "counters",
        keys.slow("fx"): "slow",
        keys.MISSES: "misses",
        keys.WORKER_REGISTRY: "liveness",
        keys.workers(keys.QUEUE_PREFIX + "x.sm_90"): "liveness",
        keys.worker_info("w1"): "liveness",
        keys.DOCTOR + "probe": "doctor",
        keys.BROKER_DOCTOR + "probe": "doctor",
        keys.BROKER + "sentinel:mymaster": "doctor",
        keys.BROKER + "unacked": "broker",
        "pt2-fx-graph:abc": UNCLASSIFIED,  # stock Inductor's own remote cache: not compileq's
        keys.ARTIFACT + "triton": UNCLASSIFIED,  # no digest: not a key compileq writes
        keys.job("elsewhere"): UNCLASSIFIED,
    }
    assert {k: classify(k) for k in expected} == expected
    assert unit_of("meta:triton") == unit_of("triton") == "Triton kernel"
    assert unit_of("fxcode") == unit_of("job:fx") == "graph" and unit_of("counters") is None


#: In `make test-all` (a minute of the 2-core CI machine for a benchmark's own figures): CI
#: keeps the key families' classification (above) and a bench run against a real worker (the
#: queue scenario).
@pytest.mark.slow
def test_capacity_measures_real_kernels_in_redis_and_a_new_machine_reading_them(
    tmp_path: Path,
) -> None:
    # Real builds (a --cpu-only worker cross-compiles the fixture's four GPT kernels), a real
    # scan of the private Redis, a real new machine (`compileq warm`, empty local caches).
    out = tmp_path / "out"
    args = ["--workloads", "none", "--manifests", "tests/fixtures/gpt_head.jsonl"]
    args += ["--rank-starts", "1", "--idle-s", "2", "--concurrency", "2", "--out", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "bench.capacity", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "capacity.json").read_text())
    (run,) = result["workloads"]
    memory = run["memory"]
    assert "unclassified" not in memory, memory
    assert run["cold"]["kernels"] == 4 and run["cold"]["failed"] == 0
    assert memory["triton"]["keys"] == 4 and memory["triton"]["value_bytes_p50"] > 1000
    assert (
        run["stats"]["entries"] == 4
        and run["stats"]["bytes"] == memory["triton"]["value_bytes_total"]
    )  # what `compileq stats` counts is what the scan found
    assert result["per_1000"]["Triton kernel"]["memory_bytes_per_1000"] > 1000 * 1000
    rank = run["rank_start"]
    (start,) = run["rank_starts"]
    assert start["counters"].get("kernel_hits") == 4 and "kernel_misses" not in start["counters"]
    # The new machine read every kernel's entry, through the bounded read (a GET and a STRLEN
    # per key inside one script), and nothing of the paused worker's is in its figures.
    assert rank["bytes_read"] >= memory["triton"]["value_bytes_total"]
    assert start["commands_by_name"]["get"] == start["commands_by_name"]["strlen"] == 4
    assert "brpop" not in start["commands_by_name"] and rank["round_trips"] > 0
    assert result["workloads"][0]["projection"]["rank_starts"] == 8000
    assert "| kernels:gpt_head |" in (out / "capacity.md").read_text()


#: Inductor's AUTOTUNE tables as a client prints them, and as a worker's pool processes log
#: them (two graphs autotuning at once: their lines interleave).
AUTOTUNE_LOG = """AUTOTUNE mm(64x256, 256x512)
strides: [256, 1], [1, 256]
dtypes: torch.bfloat16, torch.bfloat16
  triton_mm_4 0.0061 ms 100.0% ACC_TYPE='tl.float32', BLOCK_M=32, num_stages=5, num_warps=2
  mm 0.0070 ms 87.1%
  triton_mm_1 0.0080 ms 76.0% ACC_TYPE='tl.float32', BLOCK_M=64, num_stages=2, num_warps=4
SingleProcess AUTOTUNE benchmarking takes 0.3053 seconds and 1.2000 seconds precompiling for 3 choices
[2026-11-25 17:00:00,000: WARNING/ForkPoolWorker-2] AUTOTUNE mm(64x256, 256x512)
[2026-11-25 17:00:00,000: WARNING/ForkPoolWorker-3] AUTOTUNE addmm(64x512, 64x256, 256x512)
[2026-11-25 17:00:00,000: WARNING/ForkPoolWorker-2]   triton_mm_9 0.0062 ms 100.0% ACC_TYPE='tl.float32', BLOCK_M=64, num_stages=2, num_warps=4
[2026-11-25 17:00:00,000: WARNING/ForkPoolWorker-3]   mm 0.0062 ms 100.0%
[2026-11-25 17:00:00,000: WARNING/ForkPoolWorker-2] SingleProcess AUTOTUNE benchmarking takes 0.1 seconds and 0.2 seconds precompiling for 3 choices
[2026-11-25 17:00:00,000: WARNING/ForkPoolWorker-3] SingleProcess AUTOTUNE benchmarking takes 0.1 seconds and 0.4 seconds precompiling for 3 choices
"""


def test_autotune_tables_are_read_per_process_and_a_differing_pick_is_timed_by_stocks_table() -> (
    None
):
    stock, worker, other = autotune_tables(AUTOTUNE_LOG)
    assert (stock["op"], stock["bench_s"], stock["precompile_s"]) == (
        "mm(64x256, 256x512)",
        0.3053,
        1.2,
    )
    assert stock["pick"] == "ACC_TYPE='tl.float32', BLOCK_M=32, num_stages=5, num_warps=2"
    assert (other["op"], other["pick"], other["precompile_s"]) == (
        "addmm(64x512, 64x256, 256x512)",
        "mm",
        0.4,
    )
    picks = compare_picks([stock], [worker])
    assert picks["same"] == 0
    assert picks["different"][0]["this_vs_stock_best_in_stock_table"] == round(0.0080 / 0.0061, 3)


def test_the_autotune_bench_refuses_a_run_it_does_not_know_before_touching_a_gpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        autotune.main(["--runs", "stock,compileq-typo"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "unknown runs: compileq-typo" in err and "compileq-no-fx" in err


def test_each_autotune_run_is_put_beside_stock_by_time_step_speed_and_picks() -> None:
    stock_table, worker_table, _ = autotune_tables(AUTOTUNE_LOG)
    runs: dict[str, dict[str, Any]] = {
        "stock": {"done_s": 100.0, "step_ms": 2.0, "tables": [stock_table]},
        "stock-again": {"done_s": 90.0, "step_ms": 2.1, "tables": [stock_table]},
        "compileq": {"done_s": 50.0, "step_ms": 1.9, "tables": [worker_table]},
        "compileq-no-fx": {"done_s": 60.0, "step_ms": None, "tables": []},
    }
    autotune.against_stock(runs)
    assert "vs_stock_done" not in runs["stock"]
    assert (runs["stock-again"]["vs_stock_done"], runs["stock-again"]["vs_stock_step"]) == (
        0.9,
        1.05,
    )
    assert runs["stock-again"]["picks"]["same"] == 1
    assert (runs["compileq"]["vs_stock_done"], runs["compileq"]["vs_stock_step"]) == (0.5, 0.95)
    assert runs["compileq"]["picks"]["same"] == 0
    # A run whose step was not timed has no step ratio, rather than a wrong one.
    assert "vs_stock_step" not in runs["compileq-no-fx"]


MATRIX = ROOT / "docs" / "bench" / "h100-2026-11-26-matrix"


def test_the_matrix_joins_device_calls_and_marks_each_missed_goal() -> None:
    from bench import matrix

    calls = [json.loads((MATRIX / f"call{n}.json").read_text()) for n in ("1", "2", "3a", "3b")]
    table = matrix.render(calls)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines()}
    # A cell measured in two calls is the later call's; every call's cells are in.
    assert len([r for r in rows if "/" in r and r != "workload / config"]) == 9
    dynamic = calls[1]["cells"]["script/dynamic"]
    # Steady state for `dynamic` is its first three steps (the later lengths compile).
    assert matrix.ready_s(dynamic["compileq_new"], "dynamic") == round(
        sum(dynamic["compileq_new"]["ranks_steps_s"][0][:3]), 3
    )
    assert matrix.ratios(dynamic)["new/warm"] == 1.58
    assert "| **1.58** |" in rows["script/dynamic"]  # over 0.6: bold
    assert "| 0.53 |" in rows["script/ddp"]  # a met goal is plain


def bench_matrix(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m bench matrix ARGS``, its output captured; ``env``: more of its environment,
    on this one without the suite's shared Redis (the matrix starts its own)."""
    return subprocess.run(
        [sys.executable, "-m", "bench", "matrix", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**{k: v for k, v in os.environ.items() if k != "BENCH_REDIS_URL"}, **(env or {})},
    )


def test_the_ddp_bench_runs_the_scripts_arguments_on_the_gpus_unless_they_name_a_device() -> None:
    assert chosen_script_args([], gpus=1) == list(GPU_ARGS)
    assert chosen_script_args([], gpus=0) == list(CPU_ARGS)
    # The script's own default device is the CPU: arguments that name none go to the GPUs.
    assert chosen_script_args(["--fsdp"], gpus=2) == ["--device", "cuda", "--fsdp"]
    given = ["--device", "cpu", "--fsdp"]
    assert chosen_script_args(given, gpus=2) == given
    assert chosen_script_args(["--device=cuda:1"], gpus=2) == ["--device=cuda:1"]
    assert chosen_script_args(["--fsdp"], gpus=0) == ["--fsdp"]


def test_the_ddp_bench_trains_a_zoo_model_with_the_zoos_arguments_for_the_machine() -> None:
    from bench.zoo_models import MODELS

    bert = next(m for m in MODELS if m.name == "BertForMaskedLM")
    assert zoo_script_args("BertForMaskedLM", gpus=1) == bert.args("gpu")
    assert zoo_script_args("BertForMaskedLM", gpus=0) == bert.args("tiny")
    assert bert.args("gpu") != bert.args("tiny")
    # On the GPUs, with the arguments given after -- behind the zoo's.
    chosen = chosen_script_args([*zoo_script_args("BertForMaskedLM", 1), "--fsdp"], gpus=1)
    assert chosen == ["--device", "cuda", *bert.args("gpu"), "--fsdp"]
    # A model of one's own, as `bench zoo` takes it.
    assert zoo_script_args("timm:resnet18", gpus=0)[:2] == ["--model", "timm:resnet18"]
    with pytest.raises(ValueError, match="unknown model 'NoSuchModel'"):
        zoo_script_args("NoSuchModel", gpus=0)


def test_the_ddp_bench_refuses_a_zoo_model_it_does_not_know_before_starting_anything(
    tmp_path: Path,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.ddp", "--zoo", "NoSuchModel", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "--zoo: unknown model 'NoSuchModel'" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no cluster started, nothing written


def test_the_workers_codegens_are_summed_and_spanned_against_stocks_per_core_count(
    tmp_path: Path,
) -> None:
    # Overlapping intervals count once in the span, every second in the sum.
    assert worker_codegen.span([(0.0, 4.0), (1.0, 3.0), (5.0, 6.0)]) == 5.0
    assert worker_codegen.span([]) == 0.0

    def pair(stock_codegen: float, builds: list[list[float]], device: str = "cuda:0") -> Any:
        first = {"ranks_first_step_s": [10.0], "ready_s": 10.0, "device": device}
        return {
            "stock_cold": {**first, "phases": {"fx_codegen_and_compile": stock_codegen}},
            "compileq_cold": {
                **first,
                "ranks_first_step_s": [8.0],
                "ready_s": 8.0,
                "fx_builds": builds,
            },
        }

    lane = {
        "meta": {"device": "NVIDIA H100 80GB HBM3", "cores": 4},
        "models": {
            # A forward and its backward sent ahead, generated at once: 8 s of codegen in 5.
            "a": pair(4.0, [[1.0, 4.0], [2.0, 4.0]]),
            "b": {"suite": "hf", "eager": {}},  # no cold pair: skipped
            "c": pair(0.0, [[1.0, 1.0]]),  # stock's codegen not timed: skipped
            "d": pair(4.0, [[1.0, 2.0]], device="cpu"),  # a GPU host's CPU: skipped
        },
    }
    cpu = {"meta": {"device": "CPU only", "cores": 2}, "models": {"e": pair(2.0, [[0.0, 1.0]])}}
    table = worker_codegen.summary(worker_codegen.rows(lane) + worker_codegen.rows(cpu))
    assert table == {
        "2, CPU": {"runs": 1, "sum_over_stock": 0.5, "span_over_stock": 0.5, "cold_ratio": 0.8},
        "4, GPU": {"runs": 1, "sum_over_stock": 2.0, "span_over_stock": 1.25, "cold_ratio": 0.8},
    }
    files = [tmp_path / "lane.json", tmp_path / "cpu.json"]
    for path, results in zip(files, (lane, cpu), strict=True):
        path.write_text(json.dumps(results))
    assert worker_codegen.main([*map(str, files), "--json"]) == 0
    with pytest.raises(SystemExit):  # nothing to compare: said, not an empty table
        worker_codegen.main([str(tmp_path / "lane.json").replace("lane", "none")])


def test_the_matrix_refuses_a_configuration_this_machine_cannot_run() -> None:
    proc = bench_matrix("--configs", "ddp", "--out", "/nonexistent")
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has two GPUs")
    assert proc.returncode == 2 and "need 2 GPUs" in proc.stderr


def test_the_bench_without_psutil_names_the_extra_to_install_before_any_run(
    tmp_path: Path,
) -> None:
    # CI once ran the matrix without psutil: a traceback after the worker had started.
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "psutil.py").write_text("raise ModuleNotFoundError('psutil hidden by the test')\n")
    out = tmp_path / "out"
    proc = bench_matrix(
        "--configs", "cpu", "--runs", "eager", env={"PYTHONPATH": str(hidden), "OUT": str(out)}
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().endswith("the bench needs psutil: pip install -e '.[bench]'")
    assert not (out / "matrix.json").exists()


def runs(pid: int, marker: str) -> bool:
    """Whether a process of ``pid``'s tree has ``marker`` in its command line."""
    import psutil

    for process in process_tree(pid):
        try:
            if any(marker in arg for arg in process.cmdline()):
                return True
        except psutil.Error:  # exited meanwhile
            continue
    return False


def test_a_matrix_cut_short_by_its_time_limit_keeps_and_renders_the_runs_it_finished(
    tmp_path: Path,
) -> None:
    # A device call ends its matrix with `timeout` (SIGTERM). Whole cells only were kept
    # before: a cell cut in its fifth run lost four runs of scarce device time.
    import signal
    import time

    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench",
            "matrix",
            "--workloads",
            "script",
            "--configs",
            "cpu",
            "--runs",
            "eager,stock_cold",
            "--steps",
            "1",
            "--script-args",
            "--width 32 --layers 1",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "BENCH_REDIS_URL"},
    )
    assert proc.stdout is not None
    printed = []
    try:
        for line in proc.stdout:  # the eager run done: cut the cell inside its next run
            printed.append(line)
            if line.startswith("script-cpu-eager: ready"):
                # Inside stock's cold run, whatever this machine's speed: once its process
                # runs, and a second later (it imports torch for longer than that).
                wait_for(lambda: runs(proc.pid, "script-cpu-stock_cold"), 60, "stock's cold run")
                time.sleep(1)
                proc.send_signal(signal.SIGTERM)
                break
        printed.append(proc.communicate(timeout=120)[0])
    finally:
        proc.kill()
    assert proc.returncode == 143, "".join(printed)[-6000:]
    cell = json.loads((out / "matrix.json").read_text())["cells"]["script/cpu"]
    # The run the signal cut is not recorded as a run that failed (nor the matrix gone on).
    assert list(cell) == ["eager"] and cell["eager"]["ready_s"] > 0
    row = next(r for r in (out / "matrix.md").read_text().splitlines() if "script/cpu" in r)
    assert f"| {cell['eager']['ready_s']:.2f} |" in row


def test_joined_logs_keep_every_graph_a_worker_generated_beside_each_logs_tail(
    tmp_path: Path,
) -> None:
    # A zoo lane's one worker serves all its models; its tail alone showed only the last
    # model's codegens, so a slow cold run earlier in the lane (swin_base's) had no timings.
    from bench.harness import join_logs

    early = [
        "[05:31:02: INFO] compileq worker: generated graph compileq:a:fx:aa in 41.20s (lower 9.1)",
        "[05:31:40: WARNING] compileq worker: FX codegen of compileq:a:fx:bb failed: boom",
    ]
    filler = [f"[05:3{i % 10}:00: INFO] task {i} succeeded" for i in range(2000)]
    (tmp_path / "worker-01-gpu-cores.log").write_text("\n".join([*early, *filler]) + "\n")
    (tmp_path / "swin-compileq_cold.log").write_text('{"rank": 0}\n')
    joined = tmp_path / "zoo-logs.txt"
    join_logs(tmp_path, joined, 500)
    text = joined.read_text()
    assert text.index("==> swin-compileq_cold.log <==") < text.index("==> worker-01")
    worker = text.split("==> worker-01-gpu-cores.log <==\n", 1)[1]
    assert worker.startswith("\n".join(early) + "\n")  # whole, though far above the tail
    assert worker.rstrip().endswith("task 1999 succeeded") and "task 100 succeeded" not in worker
