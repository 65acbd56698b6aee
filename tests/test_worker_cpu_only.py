"""``compileq worker --cpu-only`` without ``--arch`` (issue 36, item 4): a CPU user's worker.

It used to refuse to start ("--cpu-only needs --arch"). Without --arch it serves this machine's
CPU: its C++ objects and its CPU graphs; GPU kernels only for an arch that is named. A real
worker on a redis-server of its own (so no other test's worker can take the job), and a real
torch.compile on the CPU.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from compileq import keys
from compileq.cache import liveness
from compileq.localstack import RedisServer, stop
from tests.conftest import Env, compileq_cmd, start_redis, start_worker, stats, stop_worker

TRAIN = Path(__file__).parent / "clients" / "train_cpu.py"


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis-cpu-only"))
    yield server
    stop(server.process)


def test_a_cpu_only_worker_without_an_arch_starts_and_serves_a_cpu_job(
    own_redis: RedisServer, session_home: Path, tmp_path: Path
) -> None:
    env = Env(own_redis.url(0), session_home)
    worker = start_worker(env, tmp_path, device=("--cpu-only",))
    try:
        (info,) = liveness.workers_info(own_redis.client())
        queues = info["queues"]
        assert info["cpu_only"] is True
        # This CPU's C++ objects and graphs; no GPU kernel queue, no GPU named.
        assert any(q.startswith(keys.CPP_QUEUE_PREFIX) for q in queues), queues
        assert any(q.startswith(keys.FX_QUEUE_PREFIX) and ".cpu" in q for q in queues), queues
        assert not any(q.startswith(keys.QUEUE_PREFIX) for q in queues), queues
        assert info["toolchains"] == {}

        width = random.randrange(1001, 9000)  # a model no cache holds
        proc = subprocess.run(
            compileq_cmd("run", "--", sys.executable, str(TRAIN), str(width)),
            env=env.vars(
                TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "client" / "inductor"),
                TRITON_CACHE_DIR=str(tmp_path / "client" / "triton"),
                TMPDIR=str(tmp_path),
            ),
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result == {**result, "matches_eager": True, "compileq": True}
        counters = stats(env, tmp_path)
        # The job's graphs were generated on this worker, their C++ objects built there (on
        # a loaded machine one may still miss the deadline and compile in the client).
        assert counters.get("fx_remote_compiles", 0) >= 1, counters
        assert counters.get("cpp_remote_compiles", 0) >= 1, counters
    finally:
        stop_worker(worker)
    assert "needs --arch" not in worker.log.read_text()
