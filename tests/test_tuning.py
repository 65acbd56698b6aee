"""max-autotune's candidate timings on GPU workers: what a machine without a GPU can check.

The timing itself needs a GPU (tests/test_gpu_tuning.py, on the device). Here: the content key
of a candidate (shared by every GPU index, kernel name and graph; split by sizes, configs and
GPU model), the wire, what a worker refuses, that a timing read from Redis is trusted only when
signed, that a client with no GPU worker of its model times everything itself, and that
install() hooks Inductor's two ways of timing candidates and uninstall() puts them back.
Real Redis, a real worker, real Inductor request objects.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch._inductor.autotune_process import TensorMeta, TritonGPUBenchmarkRequest

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.fingerprint import Target, local_toolchain
from compileq.inductor import autotune
from compileq.scheduler.pool import CompileqPool
from compileq.tasks.tune_jobs import TuneJob, timing_of, timing_payload
from compileq.workers import lifecycle
from compileq.workers.tune import execute_tune_triton
from tests.conftest import Worker, manifest_rows

H100 = "NVIDIA H100 80GB HBM3"
ROOT = Path(__file__).resolve().parents[1]
ROW = next(
    r
    for r in manifest_rows(ROOT / "bench/data/autotune_mlp.jsonl")
    if "'BLOCK_M': 64" in r["source"]
)
TARGET = Target("cuda", "90", 32)


class Choice:
    """What Inductor's ``TritonTemplateCaller`` is to compileq: hashable, with a ``bmreq``."""

    def __init__(self, bmreq: Any, name: str = "triton_mm") -> None:
        self.bmreq, self.name = bmreq, name


def candidate(
    tmp: Path,
    index: int = 0,
    name: str = "triton_mm",
    m: int = 512,
    num_warps: int = 4,
    tensor_name: str = "arg0_1",
) -> Any:
    """A template candidate as Inductor makes one: its module written to a file, its request."""
    source = ROW["source"].replace("index=0", f"index={index}").replace("triton_mm", name)
    path = tmp / f"{name}-{index}-{m}-{num_warps}-{tensor_name}.py"
    path.write_text(source)

    def meta(sizes: tuple[int, ...], strides: tuple[int, ...]) -> TensorMeta:
        device = torch.device("cuda", index)
        return TensorMeta(device, torch.bfloat16, sizes, strides, 0, tensor_name)

    request = TritonGPUBenchmarkRequest(
        kernel_name=name,
        input_tensor_meta=[meta((m, 4096), (4096, 1)), meta((4096, 1024), (1, 4096))],
        output_tensor_meta=meta((m, 1024), (1024, 1)),
        extra_args=[],
        module_path=str(path),
        module_cache_key=f"key-{path.stem}",
        num_stages=3,
        num_warps=num_warps,
    )
    return Choice(request, name)


def key_of(choice: Any, gpu: str = H100) -> str:
    job = autotune.job_of(choice, gpu)
    assert job is not None
    return job.key(local_toolchain(TARGET))


def test_a_candidate_has_one_key_on_every_gpu_index_under_any_kernel_or_tensor_name(
    tmp_path: Path,
) -> None:
    first = key_of(candidate(tmp_path))
    assert key_of(candidate(tmp_path, index=1)) == first
    assert key_of(candidate(tmp_path, name="triton_tem_fused_mm_7")) == first
    assert key_of(candidate(tmp_path, tensor_name="buf3")) == first


def test_sizes_configs_and_the_gpu_model_each_make_another_key(tmp_path: Path) -> None:
    first = key_of(candidate(tmp_path))
    others = {
        key_of(candidate(tmp_path, m=256)),
        key_of(candidate(tmp_path, num_warps=8)),
        key_of(candidate(tmp_path), gpu="NVIDIA A100-SXM4-80GB"),
    }
    assert first not in others and len(others) == 3


def test_the_job_a_worker_opens_is_written_for_cuda0_with_no_path_of_the_client(
    tmp_path: Path,
) -> None:
    job = autotune.job_of(candidate(tmp_path, index=1), H100)
    assert job is not None
    back = TuneJob.from_bytes(job.to_bytes())
    toolchain = local_toolchain(TARGET)
    assert back.key(toolchain) == job.key(toolchain)
    assert "index=0" in back.source and "index=1" not in back.source
    assert back.request.module_path == "" and back.request.module_cache_key == ""
    metas = [*back.request.input_tensor_meta, back.request.output_tensor_meta]
    assert {str(m.device) for m in metas} == {"cuda:0"}


def test_anything_but_a_triton_template_on_a_cuda_gpu_stays_in_process(tmp_path: Path) -> None:
    on_cpu = candidate(tmp_path)
    on_cpu.bmreq.output_tensor_meta = TensorMeta(
        torch.device("cpu"), torch.bfloat16, (512, 1024), (1024, 1), 0
    )
    assert autotune.job_of(on_cpu, H100) is None
    assert autotune.job_of(Choice(None), H100) is None
    assert autotune.job_of(object(), H100) is None


def test_a_stored_timing_reads_back_and_a_failed_candidate_reads_as_infinitely_slow() -> None:
    assert timing_of(timing_payload(0.0123, "w")) == 0.0123
    assert timing_of(timing_payload(math.inf, "w", "OutOfResources")) == math.inf
    for bad in (b"", b"[]", b'{"ms": -1}', b'{"ms": true}', b'{"ms": "1"}', b"\xff"):
        assert timing_of(bad) is None, bad


def test_a_timing_planted_in_redis_without_the_secret_is_not_believed(
    installed: CompileqPool, clean_cache: Any, tmp_path: Path
) -> None:
    client = installed.client
    name = key_of(candidate(tmp_path))
    clean_cache.set(name, json.dumps({"ms": 0.0001}))
    assert autotune._read(client, [name]) == {}
    clean_cache.delete(name)
    client.store.put(name, timing_payload(0.25, "a worker"))
    assert autotune._read(client, [name]) == {name: 0.25}


def test_with_no_gpu_worker_of_its_model_a_client_times_every_candidate_itself(
    installed: CompileqPool, worker: Worker, clean_cache: Any, tmp_path: Path
) -> None:
    # The session's worker cross-compiles for sm_90 without a GPU: it serves no tune queue.
    choices = [candidate(tmp_path), candidate(tmp_path, num_warps=8)]
    assert autotune.tune(installed.client, choices, H100).timings == {}
    client = installed.client.store.client
    assert int(client.hget(keys.STATS, "tune_local") or 0) == 2
    assert not list(client.scan_iter(match=keys.JOB + "*"))
    assert not list(client.scan_iter(match=keys.LOCK + "*"))


def _client(settings: Settings, on_worker: Callable[[], bool] | None = None, **more: Any) -> Any:
    """A client with ``settings`` changed by ``more``; ``on_worker``: one in a worker's codegen."""
    from torch._inductor.async_compile import AsyncCompile

    from compileq.scheduler.client import KernelClient
    from compileq.scheduler.local import LocalBuilder

    changed = settings.model_copy(update=more)
    return KernelClient(changed, LocalBuilder(AsyncCompile.process_pool), on_worker=on_worker)


def test_a_workers_codegen_times_what_the_store_lacks_itself_and_stores_it_for_everyone(
    settings: Settings, clean_cache: Any, tmp_path: Path
) -> None:
    in_worker, elsewhere = _client(settings, on_worker=bool), _client(settings)
    try:
        choices = [candidate(tmp_path), candidate(tmp_path, num_warps=8)]
        # No GPU worker serves H100s here, yet nothing is sent: a worker's codegen times them.
        tuned = autotune.tune(in_worker, choices, H100)
        assert tuned.timings == {} and set(tuned.share) == set(choices)
        assert not list(clean_cache.scan_iter(match=keys.JOB + "*"))
        autotune.share(in_worker, tuned.share, {choices[0]: 0.0125, choices[1]: math.inf})
        # Any other process (another rank, a client generating the same GEMM) finds both.
        found = autotune.tune(elsewhere, choices, H100)
        assert found.timings == {choices[0]: 0.0125, choices[1]: math.inf}
        assert found.share == {}
        assert int(clean_cache.hget(keys.STATS, "tune_hits") or 0) == 2
    finally:
        in_worker.close()
        elsewhere.close()


def aten_mm() -> Any:
    """Inductor's own ATen choice for the GEMM (``ExternKernelCaller`` of ``aten_mm``)."""
    from torch._inductor.ir import FixedLayout
    from torch._inductor.kernel.mm import aten_mm as choice
    from torch._inductor.select_algorithm import ExternKernelCaller

    layout = FixedLayout(torch.device("cuda", 0), torch.bfloat16, [512, 1024], [1024, 1])
    return ExternKernelCaller(choice, [], layout)


class Measure:
    """Stands in for Inductor's benchmark: records what it was asked to time."""

    def __init__(self, ms: float) -> None:
        self.ms = ms
        self.asked: list[Any] = []

    def __call__(self, rest: list[Any]) -> dict[Any, float]:
        self.asked += rest
        return {c: self.ms + i / 1000 for i, c in enumerate(rest)}


def tables(client: Any) -> list[bytes]:
    from compileq.tasks.tune_jobs import TABLE_KIND

    return list(client.scan_iter(match=keys.artifact(TABLE_KIND, "") + "*"))


def test_a_gemms_whole_table_is_stored_once_timed_and_a_later_process_times_nothing_not_even_aten(
    settings: Settings, clean_cache: Any, tmp_path: Path
) -> None:
    first, later = _client(settings), _client(settings)
    try:
        choices = [candidate(tmp_path), candidate(tmp_path, num_warps=8), aten_mm()]
        # No GPU worker serves H100s here: the first process times all three itself.
        measured = Measure(0.02)
        timings = autotune.timed(first, choices, measured, gpu=H100)
        assert measured.asked == choices and len(tables(clean_cache)) == 1
        # Another rank or machine, with the same choices made afresh (another graph's names,
        # another GPU index): every time from the table, none measured, the same pick.
        again = [
            candidate(tmp_path, index=1, name="triton_tem_fused_mm_3"),
            candidate(tmp_path, index=1, num_warps=8, name="triton_tem_fused_mm_3"),
            aten_mm(),
        ]
        nothing = Measure(9.0)
        found = autotune.timed(later, again, nothing, gpu=H100)
        assert nothing.asked == []
        assert list(found.values()) == list(timings.values())
        stats = clean_cache.hgetall(keys.STATS)
        assert int(stats[b"tune_table_hits"]) == 1 and int(stats[b"tune_hits"]) == 2
    finally:
        first.close()
        later.close()


def test_a_table_of_other_choices_or_planted_without_the_secret_is_not_used(
    settings: Settings, clean_cache: Any, tmp_path: Path
) -> None:
    client = _client(settings)
    try:
        choices = [candidate(tmp_path), aten_mm()]
        autotune.timed(client, choices, Measure(0.02), gpu=H100)
        # One more candidate config: another GEMM table, so every choice is timed again.
        more = [*choices, candidate(tmp_path, num_warps=8)]
        measured = Measure(0.03)
        autotune.timed(client, more, measured, gpu=H100)
        assert measured.asked == more and len(tables(clean_cache)) == 2
        # A table written straight into Redis, unsigned, claiming the GEMM is free.
        for key in tables(clean_cache):
            clean_cache.set(key, json.dumps({"ms": {}}))
        measured = Measure(0.04)
        autotune.timed(client, more, measured, gpu=H100)
        assert measured.asked == more
    finally:
        client.close()


def test_a_stored_table_reads_back_only_when_it_times_every_choice() -> None:
    from compileq.tasks.tune_jobs import table_of, table_payload

    payload = table_payload({"a": 0.5, "b": math.inf}, "w")
    assert table_of(payload, ["a", "b"]) == {"a": 0.5, "b": math.inf}
    assert table_of(payload, ["b"]) == {"b": math.inf}
    assert table_of(payload, ["a", "c"]) is None  # a choice the table lacks
    for bad in (b"", b"[]", b'{"ms": []}', b'{"ms": {"a": -1}}', b'{"ms": {"a": true}}'):
        assert table_of(bad, ["a"]) is None, bad


def test_a_workers_codegen_takes_its_gpus_lock_only_to_time_a_gpu_op(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch._inductor.ir import FixedLayout

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where build/gpu_lock.py keeps its lock files
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-test")
    tempfile.tempdir = None  # re-read TMPDIR
    in_worker = _client(settings, on_worker=bool)
    try:
        on_gpu = FixedLayout(torch.device("cuda", 1), torch.bfloat16, [4, 4], [4, 1])
        on_cpu = FixedLayout(torch.device("cpu"), torch.float32, [4, 4], [4, 1])
        with autotune._this_gpu(in_worker, on_cpu):
            assert not list(tmp_path.glob("compileq-gpu-*.lock"))
        with autotune._this_gpu(in_worker, on_gpu):
            assert [p.name for p in tmp_path.glob("compileq-gpu-*.lock")] == [
                "compileq-gpu-GPU-test.lock"
            ]
    finally:
        in_worker.close()
        tempfile.tempdir = None


@pytest.fixture
def tune_worker_beating(settings: Settings, clean_cache: Any) -> Iterator[str]:
    """A signed heartbeat of a worker serving the H100 tune queue, with no process behind it:
    a worker that died after its last beat, or whose messages are lost."""
    from compileq.cache import liveness
    from compileq.tasks.queues import tune_queue

    queue = tune_queue(local_toolchain(TARGET), H100)
    info = {"id": "gone", "queues": [queue]}
    liveness.beat(clean_cache, "gone", [queue], 30.0, info, settings.secret_bytes())
    yield queue
    liveness.leave(clean_cache, "gone", [queue])


def test_a_client_waits_no_longer_than_its_deadline_for_a_worker_that_never_answers(
    settings: Settings, tune_worker_beating: str, tmp_path: Path
) -> None:
    client = _client(settings, deadline_s=2.0)
    try:
        started = time.monotonic()
        assert autotune.tune(client, [candidate(tmp_path)], H100).timings == {}
        assert 2.0 <= time.monotonic() - started < 15
        assert int(client.store.client.hget(keys.STATS, "tune_local") or 0) == 1
    finally:
        client.close()


def test_a_client_whose_broker_is_down_times_candidates_itself_without_waiting(
    settings: Settings, tune_worker_beating: str, tmp_path: Path
) -> None:
    from compileq.localstack import free_port

    down = f"redis://127.0.0.1:{free_port()}/0"
    client = _client(settings, deadline_s=60.0, broker_url=down)
    try:
        started = time.monotonic()
        choices = [candidate(tmp_path), candidate(tmp_path, num_warps=8)]
        assert autotune.tune(client, choices, H100).timings == {}
        assert time.monotonic() - started < 30  # kombu's publish retries, not the deadline
        assert not list(client.store.client.scan_iter(match=keys.LOCK + "*"))
    finally:
        client.close()


@pytest.fixture
def gpu_context(settings: Settings, clean_cache: Any) -> Any:
    """This process as a worker's pool process pinned to an H100 (timing nothing: the jobs
    below are refused before anything is loaded)."""
    import redis

    store = RedisStore(redis.Redis.from_url(settings.redis_url), settings)
    context = lifecycle.WorkerContext(
        settings, store, {TARGET: local_toolchain(TARGET)}, gpu_name=H100
    )
    saved = lifecycle._context
    lifecycle.configure(context)
    yield context
    lifecycle._context = saved


def _send(context: Any, job: TuneJob, sealed: bool = True) -> str:
    name = job.key(local_toolchain(TARGET))
    store = context.store
    blob = store.seal(keys.job(name), job.to_bytes()) if sealed else job.to_bytes()
    store.client.set(keys.job(name), blob)
    return name


def test_a_worker_refuses_a_job_for_another_gpu_model(gpu_context: Any, tmp_path: Path) -> None:
    job = autotune.job_of(candidate(tmp_path), "NVIDIA A100-SXM4-80GB")
    assert job is not None
    name = _send(gpu_context, job)
    assert execute_tune_triton(name) == "rejected"
    assert gpu_context.store.get_many([name]) == [None]


def test_a_worker_refuses_an_unsigned_job_without_opening_it(
    gpu_context: Any, tmp_path: Path
) -> None:
    job = autotune.job_of(candidate(tmp_path), H100)
    assert job is not None
    name = _send(gpu_context, job, sealed=False)
    assert execute_tune_triton(name) == "rejected"
    assert int(gpu_context.store.client.hget(keys.STATS, "integrity_failures") or 0) == 1


def test_install_hooks_both_ways_inductor_times_candidates_and_uninstall_restores_them(
    settings: Settings,
) -> None:
    from torch._inductor import autotune_process, select_algorithm

    import compileq

    cls = select_algorithm.AlgorithmSelectorCache
    current = cls.__dict__["benchmark_in_current_process"]
    sub = autotune_process.benchmark_in_sub_process
    assert compileq.install(settings)
    try:
        assert autotune.active()
        assert cls.__dict__["benchmark_in_current_process"] is not current
        assert autotune_process.benchmark_in_sub_process is not sub
    finally:
        compileq.uninstall()
    assert not autotune.active()
    assert cls.__dict__["benchmark_in_current_process"] is current
    assert autotune_process.benchmark_in_sub_process is sub
