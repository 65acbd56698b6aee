"""A worker whose COMPILEQ_SECRET is not the client's: it refuses, the client builds locally."""

from __future__ import annotations

import json
from pathlib import Path

import redis

from compileq.cache.counters import read_counters
from tests.conftest import (
    FIXTURES,
    Env,
    RedisServer,
    manifest_rows,
    run_cli,
    start_worker,
    stop_worker,
    warm_json,
)
from tests.reliability import Recorder
from tests.test_faults import all_kernels_sound

GPT = FIXTURES / "gpt_head.jsonl"
MLP = FIXTURES / "dynamic_mlp.jsonl"
OTHER_SECRET = "another-secret-" + "y" * 20


def test_a_worker_with_another_secret_gets_no_job_and_keeps_serving_its_own(
    redis_server: RedisServer, env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    redis_server.client(8).flushdb()
    ours = Env(redis_server.url(8), env.home)
    theirs = Env(ours.redis_url, env.home, {"COMPILEQ_SECRET": OTHER_SECRET})
    worker = start_worker(theirs, tmp_path, "--concurrency", "1")
    try:
        n = len(manifest_rows(GPT))
        proc = run_cli(ours, "warm", str(GPT), "--json", tmp=tmp_path)
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        # Its heartbeat does not verify under our secret: it is not live for us, so nothing
        # is offered to it (it would refuse the job's signature) and all is built here.
        assert (report["local"], report["remote"], report["failed"]) == (n, 0, 0)
        said = [line for line in proc.stderr.splitlines() if "another secret" in line]
        assert len(said) == 1 and "COMPILEQ_SECRET" in said[0], proc.stderr[-3000:]
        counters = read_counters(redis.Redis.from_url(ours.redis_url))
        assert counters["rejected_tasks"] == 0 and counters["rejected_records"] >= 1
        assert counters["fallbacks"] == counters["kernel_local_compiles"] == n
        assert counters["kernel_remote_compiles"] == 0
        assert worker.log.read_text().count("rejected task") == 0
        assert all_kernels_sound(ours.redis_url, GPT)

        # The same worker still builds for clients that share its secret.
        own = tmp_path / "own.jsonl"
        own.write_text("".join(json.dumps(row) + "\n" for row in manifest_rows(MLP)[:3]))
        served = warm_json(theirs, own, tmp_path)
        assert (served["remote"], served["failed"]) == (3, 0)
        assert worker.process.poll() is None
        reliability.record(
            "wrong COMPILEQ_SECRET on the worker side",
            "its heartbeat does not verify: the client sends it nothing and builds locally "
            "at once, saying why once, counted; worker keeps serving jobs signed with its own "
            "secret",
            f"{n} kernels: {report['local']} local, {report['failed']} failed; "
            f"rejected_tasks={counters['rejected_tasks']}, "
            f"rejected_records={counters['rejected_records']}, "
            f"fallbacks={counters['fallbacks']}; afterwards {served['remote']}/3 of its own "
            "secret's jobs built by it",
            n - report["local"] + report["failed"],
        )
    finally:
        stop_worker(worker)


def test_a_missing_secret_is_refused_on_either_side_with_a_clear_error(
    env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    import compileq
    from compileq.config import Settings

    unset = {"COMPILEQ_SECRET": ""}
    worker = run_cli(
        env, "worker", "--cpu-only", "--arch", "sm_90", tmp=tmp_path, check=False, **unset
    )
    client = run_cli(env, "warm", str(GPT), tmp=tmp_path, check=False, **unset)
    for proc in (worker, client):
        assert proc.returncode == 2 and "COMPILEQ_SECRET is not set" in proc.stderr, proc.stderr
    # In a training job, install() without a secret stays off and Inductor keeps its own pool.
    installed = compileq.install(Settings(redis_url=env.redis_url, secret=None))
    assert installed is False
    reliability.record(
        "COMPILEQ_SECRET missing on the worker or the client",
        "the worker refuses to start and the CLI client exits, naming the setting; "
        "compileq.install() stays off so a training job builds with stock Inductor",
        f"worker exit {worker.returncode}, client exit {client.returncode}, both naming "
        f"COMPILEQ_SECRET; install() returned {installed}",
        0,
    )
