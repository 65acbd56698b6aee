"""`compileq doctor` against real clusters: a sound one, and ones with each fault it must catch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from compileq.cache.counters import Counter, incr, reset_counters
from compileq.localstack import free_port, start_redis, stop
from compileq.ops import doctor as doctor_checks
from tests.conftest import SECRET, Env, RedisServer, Worker, run_cli, start_worker, stop_worker


def doctor(env: Env, tmp: Path, **more: str) -> tuple[int, dict[str, dict[str, Any]], str]:
    proc = run_cli(env, "doctor", "--arch", "sm_90", "--json", tmp=tmp, check=False, **more)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["ok"] is (proc.returncode == 0)
    return proc.returncode, {c["name"]: c for c in report["checks"]}, proc.stdout + proc.stderr


def test_doctor_passes_a_sound_cluster_and_catches_a_client_with_another_secret(
    env: Env, worker: Worker, tmp_path: Path
) -> None:
    code, checks, _ = doctor(env, tmp_path)
    assert code == 0, checks
    for name in ("cache redis", "broker redis", "secret", "workers", "version skew"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["gpu pinning"]["status"] == "ok"  # cpu-only workers only
    assert checks["clock skew"]["status"] in ("ok", "warn")  # a loaded machine may lag a beat

    code, checks, output = doctor(env, tmp_path, COMPILEQ_SECRET="not-the-cluster-secret")
    assert code == 1 and checks["secret"]["status"] == "FAIL"
    assert "another COMPILEQ_SECRET" in checks["secret"]["detail"]
    assert SECRET not in output and "not-the-cluster-secret" not in output  # never revealed


def test_doctor_catches_a_wrong_secret_a_version_skew_and_then_a_stopped_worker(
    redis_server: RedisServer, env: Env, tmp_path: Path
) -> None:
    redis_server.client(7).flushdb()
    skewed = Env(
        redis_server.url(7),
        env.home,
        {"COMPILEQ_SECRET": "another-secret", "TRITON_DEFAULT_FP_FUSION": "0"},
    )
    worker = start_worker(skewed, tmp_path)
    try:
        here = Env(redis_server.url(7), env.home)
        code, checks, output = doctor(here, tmp_path)
        assert code == 1
        assert checks["secret"]["status"] == "FAIL" and "another-secret" not in output
        assert checks["workers"]["status"] == "FAIL"
        assert checks["version skew"]["status"] == "FAIL"
        # The component is named, with both values.
        assert (
            "codegen_env.TRITON_DEFAULT_FP_FUSION (worker '0', here None)"
            in (checks["version skew"]["detail"])
        )
        assert checks["version skew"]["hint"]
    finally:
        stop_worker(worker)
    code, checks, _ = doctor(Env(redis_server.url(7), env.home), tmp_path)
    assert code == 1 and checks["workers"]["status"] == "FAIL"
    assert "no live worker builds for cuda-90-w32" in checks["workers"]["detail"]


def test_doctor_tells_cache_and_broker_redis_apart_and_catches_a_missing_password(
    redis_server: RedisServer, env: Env, tmp_path: Path
) -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    code, checks, _ = doctor(env, tmp_path, COMPILEQ_BROKER_URL=dead)
    assert code == 1
    assert checks["cache redis"]["status"] == "ok"
    assert checks["broker redis"]["status"] == "FAIL"
    assert "unreachable" in checks["broker redis"]["detail"] and checks["broker redis"]["hint"]

    locked = start_redis(tmp_path / "locked")
    try:
        locked.client().config_set("requirepass", "pw-of-the-cluster")
        code, checks, output = doctor(Env(locked.url(0), env.home), tmp_path)
        assert code == 1 and checks["cache redis"]["status"] == "FAIL"
        assert "pw-of-the-cluster" not in output
        assert "password" in checks["cache redis"]["hint"]
        # Nothing that needs Redis is judged: it would only repeat the first failure.
        assert checks["workers"]["status"] == "warn"
    finally:
        stop(locked.process)


def gpu_worker(wid: str, host: str, visible: str | None) -> dict[str, Any]:
    return {"id": wid, "host": host, "cpu_only": False, "cuda_visible_devices": visible}


def test_gpu_pinning_fails_for_shared_or_unpinned_gpus_and_passes_one_gpu_each() -> None:
    # What GPU workers publish with their heartbeat (no GPU on CI to start real ones).
    sound = [gpu_worker("a:gpu0:1", "a", "0"), gpu_worker("a:gpu1:2", "a", "1")]
    assert doctor_checks._pinning_check(sound).status == "ok"
    shared = [*sound, gpu_worker("a:gpu0:3", "a", "0"), gpu_worker("b:gpu0:4", "b", "0")]
    check = doctor_checks._pinning_check(shared)
    assert check.status == "FAIL" and "a:gpu0:1, a:gpu0:3 on a are all pinned to GPU 0" in (
        check.detail
    )
    assert "b:gpu0:4" not in check.detail  # another host's GPU 0 is another GPU
    unpinned = doctor_checks._pinning_check([gpu_worker("c:gpu0:5", "c", None)])
    assert unpinned.status == "FAIL" and "not one GPU" in unpinned.detail


def test_clock_skew_of_a_worker_is_measured_against_redis_time(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    ahead = {"id": "w:cpu:1", "wall": now + 90.0, "beat": now}
    check = doctor_checks._clock_check(client, [ahead])
    assert check.status == "FAIL" and "worst w:cpu:1 +90.0" in check.detail
    check = doctor_checks._clock_check(client, [{**ahead, "wall": now + 0.01}])
    assert check.status == "ok"


def test_doctor_names_the_url_it_used_and_lists_no_gpus_it_does_not_need(
    redis_server: RedisServer, env: Env, tmp_path: Path
) -> None:
    db = 15  # its own database, without workers
    redis_server.client(db).flushdb()
    # The variable names one Redis, the flag another: the flag wins and is named.
    proc = run_cli(
        env,
        "doctor",
        "--redis-url",
        redis_server.url(db),
        "--json",
        tmp=tmp_path,
        check=False,
        COMPILEQ_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
    )
    assert proc.returncode == 1, proc.stderr[-3000:]  # no worker: the workers check fails
    checks = {c["name"]: c for c in json.loads(proc.stdout.splitlines()[-1])["checks"]}
    assert checks["cache redis"]["status"] == "ok"
    assert "(from --redis-url)" in checks["cache redis"]["detail"]
    assert checks["broker redis"]["detail"] == "same URL as the cache (from --redis-url)"
    # No worker serves a GPU target here, so the GPUs of this machine were never listed.
    assert "GPU(s) listed" not in proc.stderr, proc.stderr


def test_kernels_benchmarked_at_first_launch_in_a_client_are_a_warning_until_zeroed(
    redis_server: RedisServer,
) -> None:
    """Issue 35: runtime autotuning on a client can never hide again."""
    client = redis_server.client()
    reset_counters(client)
    check = doctor_checks._runtime_tuning_check(client)
    assert check.status == "ok" and "no kernel benchmarked" in check.detail
    incr(client, {Counter.RUNTIME_AUTOTUNES: 3, Counter.RUNTIME_TUNE_HITS: 5})
    check = doctor_checks._runtime_tuning_check(client)
    assert check.status == "warn"
    assert "3 kernel tunings benchmarked" in check.detail and "5 found" in check.detail
    assert "compileq stats --zero" in check.hint
    reset_counters(client)
    assert doctor_checks._runtime_tuning_check(client).status == "ok"
