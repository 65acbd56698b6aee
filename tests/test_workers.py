"""Worker planning, GPU selection, heartbeats and the Celery settings for long builds."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import pytest

from compileq.cache import liveness
from compileq.config import Settings
from compileq.errors import WorkerError
from compileq.fingerprint import Target
from compileq.tasks.app import celery_config
from compileq.workers import priority
from compileq.workers.fx_slots import KERNELS_PER_SIBLING, FxSlots
from compileq.workers.gpus import Gpu, from_smi_rows, parse_smi, select_gpus, visible_entries
from compileq.workers.supervisor import ChildSpec, plan
from tests.conftest import SECRET, Env, RedisServer, Worker, start_worker, stop_worker

H100 = Target("cuda", "90", 32)
GPUS = [Gpu(0, "H100", H100), Gpu(1, "H100", H100)]


def test_celery_is_configured_for_long_builds_and_json_only() -> None:
    conf = celery_config(Settings(task_soft_time_limit_s=100, task_time_limit_s=120))
    assert conf["task_acks_late"] and conf["task_reject_on_worker_lost"]
    assert conf["worker_prefetch_multiplier"] == 1
    assert (conf["task_soft_time_limit"], conf["task_time_limit"]) == (100, 120)
    assert conf["broker_transport_options"]["visibility_timeout"] > conf["task_time_limit"]
    assert conf["accept_content"] == ["json"] and conf["task_serializer"] == "json"


def test_gpus_are_chosen_by_index_or_all() -> None:
    assert select_gpus("all", GPUS) == GPUS
    assert select_gpus("1", GPUS) == [GPUS[1]]
    with pytest.raises(WorkerError, match="no GPU"):
        select_gpus("3", GPUS)
    with pytest.raises(WorkerError, match="--cpu-only"):
        select_gpus("all", [])
    with pytest.raises(WorkerError, match="indices"):
        select_gpus("first", GPUS)


# What `nvidia-smi --query-gpu=index,uuid,name,compute_cap --format=csv,noheader` printed on
# the 2 x H200 device (UUIDs shortened).
SMI_H200X2 = """0, GPU-aaaa-0, NVIDIA H200, 9.0
1, GPU-bbbb-1, NVIDIA H200, 9.0
"""
H200 = Target("cuda", "90", 32)


def test_gpus_are_listed_from_nvidia_smi_and_pinned_by_uuid() -> None:
    rows = parse_smi(SMI_H200X2)
    gpus = from_smi_rows(rows, None)
    assert gpus == [
        Gpu(0, "NVIDIA H200", H200, "GPU-aaaa-0"),
        Gpu(1, "NVIDIA H200", H200, "GPU-bbbb-1"),
    ]
    with pytest.raises(ValueError):
        parse_smi("0, GPU-a, H200\n")  # an old driver without compute_cap: torch is asked


def test_a_supervisor_given_some_gpus_numbers_and_pins_only_those() -> None:
    # Slurm gave this job GPU 1 alone: the worker's GPU 0 is that GPU, pinned by its UUID,
    # never the node's GPU 0 (another job's).
    rows = parse_smi(SMI_H200X2)
    assert from_smi_rows(rows, visible_entries({"CUDA_VISIBLE_DEVICES": "1"})) == [
        Gpu(0, "NVIDIA H200", H200, "GPU-bbbb-1")
    ]
    assert from_smi_rows(rows, ["GPU-bbbb-1", "GPU-aaaa-0"]) == [
        Gpu(0, "NVIDIA H200", H200, "GPU-bbbb-1"),
        Gpu(1, "NVIDIA H200", H200, "GPU-aaaa-0"),
    ]
    assert from_smi_rows(rows, visible_entries({"CUDA_VISIBLE_DEVICES": ""})) == []
    # A MIG instance is not a row of nvidia-smi's GPU list: torch is asked instead.
    assert from_smi_rows(rows, ["MIG-1234"]) is None


def test_a_mixed_node_is_left_to_torch_unless_cuda_orders_by_pci_bus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = parse_smi("0, GPU-a, NVIDIA A100, 8.0\n1, GPU-b, NVIDIA H100, 9.0\n")
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    assert from_smi_rows(rows, None) is None  # CUDA lists the fastest first
    assert from_smi_rows(rows, ["GPU-b"]) == [Gpu(0, "NVIDIA H100", H100, "GPU-b")]
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    assert [g.pin for g in from_smi_rows(rows, None) or []] == ["GPU-a", "GPU-b"]


def test_each_gpu_worker_process_is_pinned_to_its_gpu() -> None:
    specs = [
        ChildSpec(f"gpu{g.index}", (g.target,), 4, False, g.index, pin=g.visible_devices)
        for g in from_smi_rows(parse_smi(SMI_H200X2), None) or []
    ]
    env = [s.env(Settings(secret="s"))["CUDA_VISIBLE_DEVICES"] for s in specs]
    assert env == ["GPU-aaaa-0", "GPU-bbbb-1"]
    assert Gpu(3, "H100", H100).visible_devices == "3"  # torch's listing, no UUID known


def test_each_gpu_worker_is_told_its_gpu_model_which_names_its_autotuning_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compileq.tasks.queues import gpu_slug
    from compileq.workers import supervisor

    # nvidia-smi's answer of a 2 x H200 node (this machine has no GPU to ask).
    monkeypatch.setattr(
        supervisor, "probe_gpus", lambda: from_smi_rows(parse_smi(SMI_H200X2), None)
    )
    specs = plan("all", False, [], 4)
    assert [s.gpu_name for s in specs] == ["NVIDIA H200", "NVIDIA H200"]
    assert all("--gpu-name=NVIDIA H200" in s.argv("INFO") for s in specs)
    # What torch.cuda.get_device_name() says in a training process names the same queue.
    assert gpu_slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert gpu_slug("NVIDIA H200") == gpu_slug("nvidia h200 ") == "nvidia-h200"


def test_a_cpu_only_worker_builds_for_each_arch_it_is_given() -> None:
    (spec,) = plan(None, True, ["sm_90", "sm_80", "sm90"], 3)
    assert spec.targets == (H100, Target("cuda", "80", 32))
    assert spec.concurrency == 3 and spec.gpu is None
    assert spec.env(Settings(secret="s"))["CUDA_VISIBLE_DEVICES"] == ""
    with pytest.raises(WorkerError, match="exclude"):
        plan("0", True, ["sm_90"], None)


def hold_a_graph(slots: FxSlots, holding: Event, release: Event) -> None:
    with slots.generating():
        holding.set()
        release.wait(30)


@contextlib.contextmanager
def a_sibling_generating(slots: FxSlots) -> Iterator[None]:
    """Another process (forked, as Celery forks the pool after the worker made ``slots``)
    generating a graph for as long as the block runs."""
    fork = multiprocessing.get_context("fork")
    holding, release = fork.Event(), fork.Event()
    sibling = fork.Process(target=hold_a_graph, args=(slots, holding, release))
    sibling.start()
    try:
        assert holding.wait(30)
        yield
    finally:
        release.set()
        sibling.join(30)


def test_graph_codegen_enqueues_kernels_only_while_some_pool_process_generates_no_graph() -> None:
    slots = FxSlots(2)
    with a_sibling_generating(slots):
        assert slots.generating_now == 1 and slots.sibling_free()  # seen across processes
        with slots.generating():
            assert not slots.sibling_free()  # both generate: nobody would build the kernels
        assert slots.sibling_free()
    assert slots.generating_now == 0
    with pytest.raises(ValueError, match="at least 1"):
        FxSlots(0)


def test_a_generating_graph_may_have_its_even_part_of_the_free_siblings_kernels_with_them() -> None:
    slots = FxSlots(4)
    per = KERNELS_PER_SIBLING
    with slots.generating():  # three siblings free, one graph: all of them
        assert slots.kernel_share() == 3 * per
        with a_sibling_generating(slots):  # two free, two graphs: one each
            assert slots.kernel_share() == per
            with slots.sending() as sent:  # one reserved for a C++ object: half of one, up
                assert sent and slots.kernel_share() == per
                with slots.sending() as also, slots.generating():  # none left
                    assert also and slots.kernel_share() == 0
    assert slots.kernel_share() == 4 * per  # nobody generating: every process is a sibling


def test_a_graphs_codegen_sends_a_cpp_object_only_to_a_sibling_no_other_sent_object_holds() -> None:
    slots = FxSlots(3)
    with a_sibling_generating(slots), slots.generating():  # two of three: one sibling free
        with slots.sending() as first:
            assert first and slots.sending_now == 1
            with slots.sending() as second:
                # The free sibling builds the first: this one is built in place.
                assert not second and slots.sending_now == 1
        assert slots.sending_now == 0
        with slots.sending() as again:  # the sibling is free again once the first is back
            assert again
    with slots.sending() as free, slots.sending() as also, slots.sending() as third:
        assert free and also and third and slots.sending_now == 3
        with slots.sending() as fourth:
            assert not fourth
    assert slots.sending_now == 0 and slots.generating_now == 0


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            found += [int(child), *_descendants(int(child))]
    return found


def test_a_worker_builds_at_a_lower_priority_than_the_training_processes_beside_it(
    worker: Worker,
) -> None:
    # COMPILEQ_WORKER_NICE (10 by default): the pool Celery forked, and what it runs.
    pool = [pid for pid in _descendants(worker.process.pid) if Path(f"/proc/{pid}").exists()]
    assert len(pool) >= 3, pool  # the worker process and its pool of 2
    assert {os.getpriority(os.PRIO_PROCESS, pid) for pid in pool} == {10}
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # this test process, a "client": as started
    # Started in a session of its own (as by systemd or a container), its session's autogroup
    # is lowered too: otherwise the kernel shares the CPUs between sessions first, and nice
    # only weighs the worker's processes against each other (workers/priority.py).
    if Path(f"/proc/{worker.process.pid}/autogroup").exists():  # a kernel with autogroups
        assert priority.autogroup_nice(worker.process.pid) == 10
        # This test process: in an autogroup at 0, or (CI: a session never started anew) in
        # the root group's default one, which the kernel shows as an empty file.
        assert priority.autogroup_nice() in (0, None)


def test_an_autogroup_is_read_as_the_kernel_prints_it_even_the_empty_default_one() -> None:
    # A process whose session was never started anew (CI's test runner) is in the root group's
    # default autogroup, printed as nothing: it has no niceness of its own to read or set.
    assert priority.parse_autogroup("/autogroup-7 nice 10\n") == 10
    assert priority.parse_autogroup("/autogroup-12 nice -3\n") == -3
    assert priority.parse_autogroup("") is None
    assert priority.autogroup_nice(os.getpid()) in (0, None)
    assert priority.autogroup_nice(2**22 + 1) is None  # no such process


def test_only_a_worker_that_leads_its_session_lowers_the_session(tmp_path: Path) -> None:
    # The same call in a process that leads a session of its own and in one that shares its
    # parent's (a worker started from a shell shares the shell's, training jobs included).
    code = (
        "import sys; from pathlib import Path; from compileq.workers import priority; "
        "print(priority.lower_session(10, Path(sys.argv[1])))"
    )
    for own_session, expected in ((True, "True"), (False, "False")):
        autogroup = tmp_path / f"autogroup-{own_session}"
        autogroup.write_text("/autogroup-1 nice 0\n")
        done = subprocess.run(
            [sys.executable, "-c", code, str(autogroup)],
            capture_output=True,
            text=True,
            start_new_session=own_session,
            check=True,
        )
        assert done.stdout.strip() == expected
        assert autogroup.read_text() == ("10\n" if own_session else "/autogroup-1 nice 0\n")


def test_a_stopped_worker_withdraws_its_heartbeat(
    redis_server: RedisServer, env: Env, tmp_path: Path
) -> None:
    client = redis_server.client(4)
    client.flushdb()
    worker = start_worker(Env(redis_server.url(4), env.home), tmp_path)
    queues = {
        k.decode().removeprefix("compileq:workers:")
        for k in client.scan_iter(match="compileq:workers:*")
    }
    # Its kernel queue (sm_90), the FX codegen queue of its own CPU, and its C++ queue.
    assert len(queues) == 3 and any(q.startswith("compileq.fx.") for q in queues)
    assert any(q.startswith("compileq.cpp.") for q in queues)
    assert all(liveness.live_count(client, q, 3, SECRET.encode()) == 1 for q in queues)
    (info,) = liveness.workers_info(client)
    assert info["cpu_only"] is True and set(info["queues"]) == queues
    # SIGUSR2 writes the worker process's threads to its log (faulthandler), the heartbeat's too.
    pid = int(re.search(r"started cpu \(pid (\d+)\)", worker.log.read_text())[1])  # type: ignore[index]
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 10
    while "heartbeat.py" not in worker.log.read_text():
        assert time.monotonic() < deadline, worker.log.read_text()[-3000:]
        time.sleep(0.2)
    stop_worker(worker)
    deadline = time.monotonic() + 10
    while any(liveness.live_count(client, q, 3, SECRET.encode()) for q in queues):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert liveness.workers_info(client) == []
    log = worker.log.read_text()
    assert "heartbeat withdrawn" in log and "not serialised" not in log, log[-3000:]


def test_a_worker_that_keeps_dying_is_restarted_with_growing_delays_and_never_given_up() -> None:
    from compileq.workers.supervisor import restart_delay

    delays = [restart_delay(n) for n in range(0, 12)]
    assert delays[:6] == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0]
    assert delays[6:] == [30.0] * 6  # capped, and still a restart after many deaths


_PRELOAD = """
import json, os
from compileq.workers.prefork import preload
preload(cpu_only=True)
from triton.runtime import cache
seeded = cache.triton_key  # the memo's value (fingerprint._seed_triton_compiler)
triton_key = getattr(seeded, "__wrapped__", seeded)  # Triton's own, which its autotuner bound
read, write = os.pipe()
if os.fork() == 0:  # a pool process: its first kernel's key finds Triton's key computed
    same = triton_key() == seeded()
    os.write(write, json.dumps(triton_key.cache_info().misses if same else -1).encode())
    os._exit(0)
os.wait()
print(json.dumps({"parent": triton_key.cache_info().currsize,
                  "child_misses": json.loads(os.read(read, 100))}))
"""


def _last_json_line(script: str, **env: str) -> Any:
    """``script`` run by a fresh Python (a worker's preload, then a fork): its last line, JSON."""
    out = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.splitlines()[-1])


def test_a_worker_computes_tritons_key_before_forking_its_pool_processes(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    seen = _last_json_line(_PRELOAD, XDG_CACHE_HOME=str(tmp_path))
    assert seen == {"parent": 1, "child_misses": 1}  # the parent's one miss, none in the child


def test_the_full_collections_during_a_codegen_are_counted_for_its_log_line() -> None:
    import gc

    from compileq.workers.fx import _collections

    with _collections() as seen:
        gc.collect(1)  # a younger generation: timed, not counted as full
        gc.collect()
    assert seen.full == 1 and seen.seconds > 0
    assert seen.callback not in gc.callbacks  # the hook leaves with the codegen


_FIRST_GRAPH = """
import json, os, sys
os.environ["TORCHINDUCTOR_FORCE_DISABLE_CACHES"] = "1"
from compileq.workers.prefork import preload
preload(cpu_only=True)
import torch
read, write = os.pipe()
if os.fork() == 0:  # a pool process's first graph
    before = set(sys.modules)
    compiled = torch.compile(lambda x: (x.sin() + x.cos()).sum(dim=1).sqrt(), backend="inductor")
    compiled(torch.randn(8, 16))
    new = sorted(m for m in set(sys.modules) - before if ".codegen." in m or "cpp_extension" in m)
    os.write(write, json.dumps(new).encode())
    os._exit(0)
os.wait()
print(os.read(read, 100000).decode())
"""


def test_a_pool_processs_first_graph_finds_inductors_code_generators_imported(
    tmp_path: Path,
) -> None:
    # Imported in the worker's main process before Celery forks (prefork.prime_codegen): a
    # fresh pool process's first forward took about 0.3 s less on the CPU machine.
    imported = _last_json_line(_FIRST_GRAPH, TORCHINDUCTOR_CACHE_DIR=str(tmp_path))
    # Only the graph's own generated modules (torch._inductor.runtime.compile_tasks.<hash>)
    # may be new; no code generator or C++ build helper.
    assert [m for m in imported if "compile_tasks" not in m] == [], imported


def test_a_codegen_postpones_full_collections_and_leaves_the_thresholds_as_they_were() -> None:
    import gc

    from compileq.workers.fx import _full_collections_postponed

    generations: list[int] = []

    def seen(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    before = gc.get_threshold()
    gc.callbacks.append(seen)
    try:
        with _full_collections_postponed():
            for _ in range(300_000):  # cycles, as a codegen makes: young collections run
                node: list[Any] = []
                node.append(node)
        during = list(generations)
    finally:
        gc.callbacks.remove(seen)
    assert during and 2 not in during, sorted(set(during))
    assert gc.get_threshold() == before


def _topology(root: Path, siblings: dict[int, str]) -> Path:
    """A /sys/devices/system/cpu as Linux writes it: each CPU's SMT siblings."""
    for cpu, listed in siblings.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(listed + "\n")
    return root


def test_a_cpu_list_reads_as_linux_writes_it_and_a_bad_one_is_refused() -> None:
    from compileq.workers import cpus

    assert cpus.parse("0-3,8, 10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert cpus.describe({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"
    for bad in ("", "a", "3-1", "-1", "1-"):
        with pytest.raises(WorkerError, match="bad CPU list"):
            cpus.parse(bad)


def test_a_worker_leaves_whole_physical_cores_with_their_smt_siblings(tmp_path: Path) -> None:
    from compileq.workers import cpus

    # Four cores with two threads each, numbered as on most x86 hosts: core k is k and k+4.
    topology = _topology(tmp_path, {c: f"{c % 4},{c % 4 + 4}" for c in range(8)})
    every = set(range(8))
    assert cpus.cores(every, topology) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert cpus.leaving(every, 2, topology) == {2, 3, 6, 7}  # no rank shares a core with a build
    assert cpus.leaving(every, 0, topology) == every
    assert cpus.leaving(every, 9, topology) == {3, 7}  # the worker keeps a core to build on
    with pytest.raises(WorkerError, match="cannot leave"):
        cpus.leaving(every, -1, topology)


def test_a_gpu_worker_leaves_a_core_per_gpu_only_where_it_has_eight_cpus_per_gpu() -> None:
    from compileq.workers import cpus

    assert cpus.default_leave(set(range(16)), 1) == 1  # one H200 on 16 cores
    assert cpus.default_leave(set(range(32)), 2) == 2
    assert cpus.default_leave(set(range(8)), 1) == 1
    # Under 8 per GPU the builds are what the first step waits for: no core is left.
    assert cpus.default_leave(set(range(4)), 1) == 0
    assert cpus.default_leave(set(range(12)), 2) == 0
    assert cpus.default_leave(set(range(4)), 0) == 0


def test_a_gpu_node_worker_leaves_a_core_per_gpu_and_sizes_its_pools_on_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from compileq.workers import cpus, supervisor

    monkeypatch.setattr(
        supervisor, "probe_gpus", lambda: from_smi_rows(parse_smi(SMI_H200X2), None)
    )
    mine = sorted(cpus.usable())
    specs = plan("all", False, [], None, cpu_list=cpus.describe(set(mine)))
    # Two GPUs: a core each left where there are 8 CPUs per GPU (this machine's cores have no
    # SMT siblings), none on a smaller host; the rest shared.
    kept = cpus.leaving(set(mine), cpus.default_leave(set(mine), 2))
    assert {s.cpus or tuple(mine) for s in specs} == {tuple(sorted(kept))}
    assert all(s.concurrency == max(1, len(kept) // 2) for s in specs)
    assert all(f"--cpus={cpus.describe(kept)}" in s.argv("INFO") for s in specs if s.cpus)
    # Told how many, it leaves them whatever the host (and keeps one core to build on).
    told = plan("all", False, [], None, cpu_list=cpus.describe(set(mine)), leave_cores=2)
    assert {s.cpus for s in told} == {tuple(sorted(cpus.leaving(set(mine), 2)))}
    (spec,) = plan(None, True, ["sm_90"], None)  # a build node: every CPU, nothing pinned
    assert spec.cpus == () and spec.concurrency == len(mine)
    with pytest.raises(WorkerError, match="not among"):
        plan("all", False, [], None, cpu_list=f"{max(mine) + 1}")


def test_a_worker_given_cpus_runs_its_pool_and_compilers_on_them_only(
    redis_server: RedisServer, env: Env, tmp_path: Path
) -> None:
    last = max(os.sched_getaffinity(0))
    worker = start_worker(Env(redis_server.url(5), env.home), tmp_path, "--cpus", str(last))
    try:
        pool = [pid for pid in _descendants(worker.process.pid) if Path(f"/proc/{pid}").exists()]
        assert len(pool) >= 3, pool  # the worker process and its pool of 2
        assert {frozenset(os.sched_getaffinity(pid)) for pid in pool} == {frozenset({last})}
        assert f"on CPUs {last}" in worker.log.read_text()
    finally:
        stop_worker(worker)
