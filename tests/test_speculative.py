"""Speculative backward codegen (scheduler/speculative.py), on CPU: a training graph's backward
is sent to the worker when AOTAutograd partitions it, so the worker generates it while the
forward is generated and run. Real redis-server, a real --cpu-only worker, real torch.compile.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from tests.conftest import CLIENTS, Env, Worker, run_cli, stats
from tests.scripts import LLAMA, run_script
from tests.test_fx_remote import run_client

SMALL = ("--layers", "2")
#: DDPOptimizer splits this model into three buckets: three forwards, three backwards.
DDP = ("--width", "128", "--layers", "4", "--bucket-mb", "1")


def fx_builds(env: Env, tmp: Path) -> list[dict[str, Any]]:
    """The workers' FX codegens as ``compileq stats`` lists them: start and seconds each."""
    proc = run_cli(env, "stats", "--json", tmp=tmp)
    values = json.loads(proc.stdout.strip().splitlines()[-1])
    builds: list[dict[str, Any]] = values["slowest"]["fxcode"]
    return builds


def overlapping(builds: list[dict[str, Any]]) -> int:
    """How many pairs of builds ran at the same time."""
    spans = sorted((b["started"], b["started"] + b["seconds"]) for b in builds)
    return sum(1 for i, (_, end) in enumerate(spans) for start, _ in spans[i + 1 :] if start < end)


def test_a_graphs_backward_is_generated_on_the_worker_while_its_forward_is(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    run = run_script(env, tmp_path, "spec", LLAMA, *SMALL)
    [rank] = run.ranks
    assert rank["matches_eager"] is True and rank["graphs"] == 2
    counters = stats(env, tmp_path)
    # The backward was sent when the joint graph was partitioned; the lazy backward compile
    # found it: two codegens on the worker, none in the client, nothing generated twice.
    assert counters["fx_sent_ahead"] == 1
    assert counters["fx_remote_compiles"] == 2
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
    builds = fx_builds(env, tmp_path)
    assert len(builds) == 2
    assert overlapping(builds) == 1, builds  # forward and backward codegen at the same time

    # A new machine on this warm cluster: the forward hits, so nothing is sent ahead.
    again = run_script(env, tmp_path, "spec-new", LLAMA, *SMALL)
    assert again.ranks[0]["losses"] == rank["losses"]
    after = stats(env, tmp_path)
    assert after["fx_sent_ahead"] == 1 and after["fx_remote_compiles"] == 2


def test_without_speculation_the_backward_is_generated_after_the_forward(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    run = run_script(env, tmp_path, "lazy", LLAMA, *SMALL, extra_env={"COMPILEQ_SPECULATE": "0"})
    assert run.ranks[0]["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["fx_sent_ahead"] == 0
    assert counters["fx_remote_compiles"] == 2 and counters["fallbacks"] == 0
    assert overlapping(fx_builds(env, tmp_path)) == 0  # stock's order: one after the other


def test_a_ddp_jobs_backwards_are_sent_once_and_generated_beside_the_forwards(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    run = run_script(env, tmp_path, "ddp", LLAMA, *DDP, nproc=2)
    for rank in run.ranks:
        assert rank["matches_eager"] is True, rank
    graphs = run.ranks[0]["graphs"]
    assert graphs >= 6
    counters = stats(env, tmp_path)
    # The rank that sent a bucket's forward sends its backward ahead; the other finds that job
    # in flight or done. (A rank already in its backward pass may ask for a bucket's backward
    # before the other sends it ahead: then that one is sent by its lazy compile, once.)
    assert 1 <= counters["fx_sent_ahead"] <= graphs // 2
    assert counters["fx_remote_compiles"] == graphs  # nothing generated twice
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
    assert overlapping(fx_builds(env, tmp_path)) >= graphs // 2


def test_a_backward_that_differs_from_the_one_sent_ahead_gets_its_own_job_and_is_correct(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # retain_graph=True turns buffer donation off when the backward first runs, after the
    # graph was partitioned and its backward sent: the lazy compile keys another job.
    run = run_client(env, tmp_path, "retain", CLIENTS / "retain_graph.py")
    assert run.result["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["fx_sent_ahead"] == 1
    # forward, the backward sent ahead, and the backward as it ran: nothing compiled here.
    assert counters["fx_remote_compiles"] == 3
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
