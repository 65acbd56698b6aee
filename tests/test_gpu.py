"""What only a machine with a GPU can show (run on the device; skipped elsewhere):
GPU graphs generated in a GPU worker's pool processes, and a new machine served from them.

    python -m pytest tests/test_gpu.py
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from compileq import keys
from compileq.localstack import RedisServer
from tests.conftest import Env, Worker, start_worker, stats, stop_worker, wipe_cache
from tests.test_fx_remote import CLIENTS, COMPILES, POSITIONS, run_client

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def gpu_worker(
    env: Env, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Worker]:
    worker = start_worker(
        env, tmp_path_factory.mktemp("gpu-worker"), "--concurrency", "4", device=("--gpus", "0")
    )
    client = redis_server.client()
    deadline = time.monotonic() + 120  # another module's CPU worker may have answered first
    while not any(True for _ in client.scan_iter(match=keys.WORKERS + "compileq.fx.*cuda-*")):
        if time.monotonic() > deadline:
            break  # the tests below say what is missing
        time.sleep(0.2)
    yield worker
    stop_worker(worker)


def test_a_gpu_worker_generates_gpu_graphs_and_a_new_machine_compiles_nothing(
    env: Env, gpu_worker: Worker, redis_server: RedisServer, tmp_path: Path
) -> None:
    wipe_cache(redis_server.client())
    first = run_client(env, tmp_path, "first", POSITIONS, args=("cuda",))
    assert first.result == {**first.result, "matches_eager": True, "compileq": True}
    after_first = stats(env, tmp_path)
    # Forward and backward generated in the worker's forked pool processes, which must be able
    # to initialise CUDA; their Triton kernels were built on the worker too, none in the client,
    # by sibling pool processes taking them from the queue (concurrency 4: two were free).
    log = gpu_worker.log.read_text()
    assert after_first["fx_remote_compiles"] == 2, log[-3000:]
    assert after_first["fx_local_compiles"] == 0 and after_first["fallbacks"] == 0
    assert after_first["kernel_remote_compiles"] > 0 and after_first["kernel_local_compiles"] == 0
    assert "CUDA was initialised before the pool forked" not in log
    assert "compileq worker: built triton_" in log, log[-3000:]

    second = run_client(env, tmp_path, "second", POSITIONS, args=("cuda",))
    assert second.result == {**second.result, "matches_eager": True, "compileq": True}
    after = stats(env, tmp_path)
    assert after["fx_hits"] - after_first["fx_hits"] == 2
    assert {c: after[c] for c in COMPILES} == {c: after_first[c] for c in COMPILES}
    assert after["kernel_remote_compiles"] == after_first["kernel_remote_compiles"]


def test_a_gpu_worker_serves_the_fx_queues_of_its_gpu(
    gpu_worker: Worker, redis_server: RedisServer
) -> None:
    # It would withdraw them if CUDA had been initialised before Celery forked its pool.
    client: redis.Redis = redis_server.client()
    live = [k.decode() for k in client.scan_iter(match=keys.WORKERS + "compileq.fx.*cuda-*")]
    assert live, gpu_worker.log.read_text()[-3000:]


def test_a_layernorm_backward_fused_as_a_mix_order_reduction_is_generated_on_the_worker(
    env: Env, gpu_worker: Worker, redis_server: RedisServer, tmp_path: Path
) -> None:
    # timm's convnext_tiny: the worker's codegen read the poisoned V.interpreter and the
    # backward compiled again in the client (workers/fx_input.py).
    wipe_cache(redis_server.client())
    run = run_client(env, tmp_path, "first", CLIENTS / "layernorm_rows.py", args=("cuda",))
    assert run.result == {**run.result, "matches_eager": True, "compileq": True}
    counters = stats(env, tmp_path)
    assert counters["fx_remote_compiles"] == 2, gpu_worker.log.read_text()[-3000:]
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0, run.stderr[-3000:]
    assert "poisoned" not in gpu_worker.log.read_text()
