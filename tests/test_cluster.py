"""End to end: real redis-server, real `compileq worker --cpu-only` processes, real clients."""

from __future__ import annotations

import json
import pickle
import struct
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import SecretStr

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.localstack import free_port
from compileq.tasks.app import COMPILE_TRITON, client_app
from tests.conftest import (
    FIXTURES,
    INDUCTOR_CLIENT,
    LOAD_CLIENT,
    SECRET,
    Env,
    RedisServer,
    Worker,
    client_json,
    compileq_cmd,
    manifest_rows,
    run_cli,
    stats,
    warm_json,
    wipe_cache,
)
from tests.reliability import Recorder

MLP = FIXTURES / "dynamic_mlp.jsonl"
GPT = FIXTURES / "gpt_head.jsonl"


def artifact_keys(client: redis.Redis) -> list[bytes]:
    return sorted(client.scan_iter(match=keys.artifact("triton", "") + "*"))


@pytest.mark.release
def test_kernels_compile_on_the_worker_into_real_cubins(
    env: Env, worker: Worker, empty_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    n = len(manifest_rows(MLP))
    report = warm_json(env, MLP, tmp_path)
    assert report == {**report, "kernels": n, "hits": 0, "remote": n, "local": 0, "failed": 0}
    counters = stats(env, tmp_path)
    assert counters["kernel_remote_compiles"] == n
    assert counters["kernel_local_compiles"] == 0
    assert counters["entries"] == n

    store = RedisStore(empty_cache, settings)
    for key in artifact_keys(empty_cache):
        kernel, elapsed_us = pickle.loads(store.get(key.decode()) or b"")
        assert type(kernel).__name__ == "CachingAutotuner"
        assert elapsed_us > 0
        for result in kernel.compile_results:
            cubin = bytes(result.kernel.cubin_raw)
            assert cubin[:4] == b"\x7fELF"  # a real CUDA binary, built without a GPU
            # ELF e_flags of a CUDA cubin hold the SM version the code runs on: bits 8-15 for
            # CUDA 13's ptxas, bits 0-7 for CUDA 12's (Triton 3.8's own, on torch 2.14).
            flags = struct.unpack_from("<I", cubin, 48)[0]
            assert 90 in ((flags >> 8) & 0xFF, flags & 0xFF), hex(flags)


@pytest.mark.release
def test_a_new_machine_gets_every_kernel_from_the_cache_and_compiles_nothing(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    n = len(manifest_rows(MLP))
    warm_json(env, MLP, tmp_path / "first")
    before = stats(env, tmp_path)

    # A second process, empty Inductor and Triton cache dirs, submitting as Inductor does.
    got, _ = client_json(env, INDUCTOR_CLIENT, str(MLP), caches=tmp_path / "new")
    triton_dir = tmp_path / "new" / "triton"
    assert got["kernels"] == n
    assert got["types"] == ["CachingAutotuner"]
    assert got["cubins"] >= n

    after = stats(env, tmp_path)
    assert after["kernel_hits"] - before["kernel_hits"] == n
    assert after["kernel_remote_compiles"] == before["kernel_remote_compiles"]
    assert after["kernel_local_compiles"] == before["kernel_local_compiles"] == 0
    # Nothing was compiled in that process: Triton never wrote to its cache dir.
    assert not triton_dir.exists() or not any(triton_dir.rglob("*.cubin"))

    # And `compileq warm` in yet another fresh process reports all hits.
    again = warm_json(env, MLP, tmp_path / "third")
    assert (again["hits"], again["remote"], again["local"]) == (n, 0, 0)


def test_concurrent_clients_cause_exactly_one_compile_per_kernel(
    env: Env, worker: Worker, empty_cache: redis.Redis, tmp_path: Path
) -> None:
    n = len(manifest_rows(MLP))
    with ThreadPoolExecutor(4) as pool:
        reports = list(pool.map(lambda i: warm_json(env, MLP, tmp_path / f"c{i}"), range(4)))
    for report in reports:
        assert report["failed"] == 0 and report["local"] == 0
        assert report["hits"] + report["remote"] == n
    counters = stats(env, tmp_path)
    assert counters["kernel_remote_compiles"] == n
    assert counters["kernel_local_compiles"] == 0
    assert counters["entries"] == n


def test_tampered_truncated_foreign_and_wrong_kind_entries_are_rejected_removed_and_rebuilt(
    env: Env,
    worker: Worker,
    clean_cache: redis.Redis,
    tmp_path: Path,
    settings: Settings,
    reliability: Recorder,
) -> None:
    n = len(manifest_rows(MLP))
    warm_json(env, MLP, tmp_path)
    victims = artifact_keys(clean_cache)[:4]
    tampered = bytearray(clean_cache.get(victims[0]) or b"")
    tampered[len(tampered) // 2] ^= 0x40
    clean_cache.set(victims[0], bytes(tampered))
    clean_cache.set(victims[1], (clean_cache.get(victims[1]) or b"")[:100])
    foreign = RedisStore(
        clean_cache, settings.model_copy(update={"secret": SecretStr("someone-else")})
    )
    payload = RedisStore(clean_cache, settings).get(victims[2].decode())
    assert payload is not None
    clean_cache.set(victims[2], foreign.seal(victims[2].decode(), payload))
    # A genuine entry of another kind (same digest, sealed for an FX-graph key) under this key.
    ours = RedisStore(clean_cache, settings)
    other_kind = victims[3].decode().replace(":a:triton:", ":a:fx:")
    clean_cache.set(victims[3], ours.seal(other_kind, ours.get(victims[3].decode()) or b""))

    report = warm_json(env, MLP, tmp_path / "again")
    # Every rejected entry is rebuilt by the worker. Damaged ones were deleted on read; the
    # foreign-secret one was left in place (deleting on read would let a node with a wrong
    # secret empty the cache), and the worker's verified build replaces it: a worker builds
    # only jobs signed with the cluster's secret, so that entry is stale or planted.
    assert (report["hits"], report["remote"], report["local"], report["failed"]) == (n - 4, 4, 0, 0)
    counters = stats(env, tmp_path)
    assert counters["integrity_failures"] == 3
    assert counters["foreign_secret_entries"] >= 1
    assert counters["replaced_entries"] == 1
    # The rebuilt entries are sound: a third client hits everything.
    final = warm_json(env, MLP, tmp_path / "final")
    assert (final["hits"], final["failed"]) == (n, 0)
    reliability.record(
        "tampered, truncated, foreign-secret and wrong-kind cache entries (one each)",
        "each rejected before unpickling and counted; damaged ones removed on read, the "
        "foreign-secret one left in place until a verified rebuild replaces it; a miss, never "
        "an error",
        f"integrity_failures={counters['integrity_failures']}, foreign_secret_entries="
        f"{counters['foreign_secret_entries']}, replaced_entries="
        f"{counters['replaced_entries']}; next client: {report['hits']} hits, "
        f"{report['remote']} rebuilt remotely, {report['local']} locally, {report['failed']} "
        f"failed; third client: {final['hits']}/{n} hits",
        report["failed"] + final["failed"],
        attacker="write access to Redis",
    )


def test_with_redis_down_kernels_build_locally(
    env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    n = len(manifest_rows(GPT))
    down = Env(f"redis://127.0.0.1:{free_port()}/0", env.home)
    proc = run_cli(down, "warm", str(GPT), "--json", tmp=tmp_path)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["local"], report["failed"], report["remote"]) == (n, 0, 0)
    assert proc.stderr.count("compiling locally") == 1  # said once, not once per kernel
    reliability.record(
        "Redis unreachable from the start",
        "every kernel built locally; said once",
        f"{n} kernels: {report['local']} local, {report['failed']} failed; 'compiling "
        f"locally' said {proc.stderr.count('compiling locally')}x",
        n - report["local"] + report["failed"],
    )


def test_with_no_live_worker_kernels_build_locally_and_are_cached(
    redis_server: RedisServer, env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    lonely = Env(redis_server.url(3), env.home)  # a database no worker serves
    redis_server.client(3).flushdb()
    n = len(manifest_rows(GPT))
    proc = run_cli(lonely, "warm", str(GPT), "--json", tmp=tmp_path)
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["local"], report["failed"]) == (n, 0)
    assert "no live worker" in proc.stderr
    counters = stats(lonely, tmp_path)
    assert counters["kernel_local_compiles"] == n and counters["fallbacks"] == n
    second = warm_json(lonely, GPT, tmp_path / "second")
    assert second["hits"] == n
    reliability.record(
        "no live worker for the kernels' queue",
        "built locally, cached, counted as fallbacks; the warning says why",
        f"{n} kernels: {report['local']} local; fallbacks={counters['fallbacks']}; "
        f"next client: {second['hits']}/{n} hits",
        n - second["hits"] + report["failed"],
    )


def test_a_kernel_that_fails_to_compile_is_reported_and_never_cached(
    env: Env, worker: Worker, empty_cache: redis.Redis, tmp_path: Path, reliability: Recorder
) -> None:
    row = manifest_rows(GPT)[0]
    broken = dict(row, source=row["source"].replace("tl.load(", "tl.no_such_load("))
    manifest = tmp_path / "broken.jsonl"
    manifest.write_text(json.dumps(broken) + "\n" + json.dumps(manifest_rows(GPT)[1]) + "\n")
    proc = run_cli(env, "warm", str(manifest), "--json", tmp=tmp_path, check=False)
    assert proc.returncode == 1
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["failed"], report["remote"]) == (1, 1)
    assert "no_such_load" in proc.stderr  # the kernel's own error, as stock would show it
    counters = stats(env, tmp_path)
    assert counters["kernel_remote_failures"] == 1
    assert counters["entries"] == 1  # only the good kernel
    assert not list(empty_cache.scan_iter(match=keys.LOCK + "*"))  # nobody left waiting
    reliability.record(
        "a kernel source that fails to compile",
        "the client gets the kernel's own error, as stock would; the failure is not cached",
        f"failed={report['failed']} with the kernel's own error; the good kernel built "
        f"remotely; kernel_remote_failures={counters['kernel_remote_failures']}; "
        f"entries={counters['entries']} (the good one only); no lease left",
        1 - report["remote"],  # the good kernel of the pair must still arrive
    )


def test_a_malformed_task_message_is_rejected_and_the_worker_keeps_serving(
    env: Env,
    worker: Worker,
    clean_cache: redis.Redis,
    tmp_path: Path,
    settings: Settings,
    reliability: Recorder,
) -> None:
    queue = next(clean_cache.scan_iter(match=keys.WORKERS + "*")).decode()[len(keys.WORKERS) :]
    sender = client_app(settings)
    for bad in (123, "not-a-key", keys.artifact("triton", "0" * 64)):
        sender.send_task(COMPILE_TRITON, args=[bad], queue=queue)
    deadline = time.monotonic() + 60
    while int(clean_cache.hget(keys.STATS, "rejected_tasks") or 0) < 3:
        assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
        time.sleep(0.2)
    report = warm_json(env, GPT, tmp_path)
    assert report["remote"] == len(manifest_rows(GPT))
    reliability.record(
        "malformed task messages (a number, not a key, a key with no job spec)",
        "each rejected, logged and counted; the worker keeps serving",
        f"rejected_tasks={int(clean_cache.hget(keys.STATS, 'rejected_tasks') or 0)}; then "
        f"{report['remote']}/{report['kernels']} kernels built by the same worker",
        report["kernels"] - report["remote"],
    )


def load_client(env: Env, tmp: Path, manifest: Path, *args: str) -> dict[str, Any]:
    report, _ = client_json(env, LOAD_CLIENT, str(manifest), *args, caches=tmp)
    assert (report["failed"], report["bad"]) == (0, 0), report["problems"]
    return report


def test_graph_codegen_on_a_worker_sends_kernels_to_free_siblings_and_builds_them_when_none_is(
    env: Env, worker: Worker, empty_cache: redis.Redis, tmp_path: Path
) -> None:
    # The client a worker's graph codegen uses (workers/fx.py), as its pool process sees it.
    n = len(manifest_rows(GPT))
    free = load_client(env, tmp_path / "free", GPT, "--on-worker", "free")
    assert (free["remote"], free["local"]) == (n, 0)  # built by the worker's pool processes
    assert stats(env, tmp_path)["kernel_remote_compiles"] == n

    wipe_cache(empty_cache, everything=True)
    busy = load_client(env, tmp_path / "busy", GPT, "--on-worker", "busy")
    assert (busy["remote"], busy["local"]) == (0, n)  # built in place: nobody free to wait for
    counters = stats(env, tmp_path)
    # Still a worker's build, and stored for every client; no lease left behind.
    assert (counters["kernel_remote_compiles"], counters["kernel_local_compiles"]) == (n, 0)
    assert counters["entries"] == n
    assert not list(empty_cache.scan_iter(match=keys.LOCK + "*"))


def test_graph_codegen_on_a_worker_sends_its_share_and_builds_the_rest_on_its_own_threads(
    env: Env, worker: Worker, empty_cache: redis.Redis, tmp_path: Path
) -> None:
    # A codegen given a share of 2 kernels with siblings at once (workers/fx_slots.kernel_share)
    # pulls the next miss to whichever frees first: a sibling or one of its compile threads.
    n = len(manifest_rows(GPT))
    report = load_client(env, tmp_path / "share", GPT, "--on-worker", "share:2")
    assert report["remote"] + report["local"] == n
    assert report["remote"] >= 2 and report["local"] >= 1  # both took part
    assert 1 <= report["peak_sent"] <= 2  # never more than the share with the siblings
    counters = stats(env, tmp_path / "share")
    assert (counters["kernel_remote_compiles"], counters["kernel_local_compiles"]) == (n, 0)
    assert counters["entries"] == n and counters.get("fallbacks", 0) == 0
    assert not list(empty_cache.scan_iter(match=keys.LOCK + "*"))


def test_a_worker_of_another_toolchain_never_receives_the_kernels(
    env: Env, clean_cache: redis.Redis, tmp_path: Path, worker: Worker, reliability: Recorder
) -> None:
    # A codegen-relevant variable on the client changes its toolchain, hence its queue: the
    # running worker (without it) gets nothing and the client builds locally.
    proc = run_cli(env, "warm", str(GPT), "--json", tmp=tmp_path, TRITON_DEFAULT_FP_FUSION="0")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (report["local"], report["remote"]) == (len(manifest_rows(GPT)), 0)
    assert stats(env, tmp_path)["kernel_remote_compiles"] == 0
    # The warning names the component that differs.
    assert "codegen_env (worker {}, here {'TRITON_DEFAULT_FP_FUSION': '0'})" in proc.stderr
    reliability.record(
        "a worker whose toolchain differs from the client's",
        "it never receives the client's tasks; the client builds locally, naming the difference",
        f"{report['kernels']} kernels: {report['local']} local, {report['remote']} remote; "
        "worker built 0; warning names codegen_env TRITON_DEFAULT_FP_FUSION",
        report["kernels"] - report["local"] + report["failed"],
    )


def test_cli_errors_are_clear(env: Env, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "k", "source": "x"}\nnot json\n')
    proc = run_cli(env, "warm", str(bad), tmp=tmp_path, check=False)
    assert (
        proc.returncode == 2 and "bad.jsonl:1" in proc.stderr and "DeviceProperties" in proc.stderr
    )
    proc = run_cli(env, "worker", "--cpu-only", "--arch", "hopper", tmp=tmp_path, check=False)
    assert proc.returncode == 2 and "sm_<cc>" in proc.stderr
    proc = subprocess.run(
        compileq_cmd("stats"),
        env={**env.vars(), "COMPILEQ_SECRET": ""},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "COMPILEQ_SECRET" in proc.stderr
    assert SECRET not in proc.stderr


@pytest.mark.parametrize("value", ["http://x", "redis//nope"])
def test_a_bad_redis_url_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="redis://"):
        Settings(redis_url=value)


def test_kernels_renumbered_by_an_edit_elsewhere_in_the_model_are_hits(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    rows = manifest_rows(MLP)
    first = warm_json(env, MLP, tmp_path)
    assert (first["remote"], first["failed"]) == (len(rows), 0)
    # What Inductor emits for the same kernels after an edit upstream: every name shifted.
    moved = tmp_path / "moved.jsonl"
    lines = []
    for row in rows:
        name = f"{row['name']}_shifted"
        lines.append(json.dumps({"name": name, "source": row["source"].replace(row["name"], name)}))
    moved.write_text("\n".join(lines) + "\n")
    second = warm_json(env, moved, tmp_path)
    assert (second["hits"], second["remote"], second["local"]) == (len(rows), 0, 0)
