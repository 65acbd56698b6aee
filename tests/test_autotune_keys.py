"""Triton autotuning results: one entry per kernel for every GPU index, kept on this machine.

A kernel of ``cuda:k`` is built by a worker from its source written for ``cuda:0``; the built
``CachingAutotuner`` carries where its autotuning result goes. These tests build real kernels
on a real (cross-compiling) worker and use Inductor's own save and lookup.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import pytest
from torch._inductor.codecache import _load_triton_kernel_from_source
from torch._inductor.runtime.cache_dir_utils import cache_dir
from torch._inductor.runtime.compile_tasks import _worker_compile_triton
from torch._inductor.runtime.triton_heuristics import check_autotune_cache

from compileq.scheduler.pool import CompileqPool
from compileq.scheduler.recognise import inductor_extra_config
from tests.conftest import FIXTURES, Worker, manifest_rows

ROW = next(r for r in manifest_rows(FIXTURES / "gpt_head.jsonl") if "_red_" in r["name"])
#: A reduction kernel with its autotune caches on: as Inductor writes it on a GPU machine with
#: compileq installed (``autotune_remote_cache``), tuned at its first run (coordinate descent,
#: so that it has an autotune cache although the worker's heuristics leave one config here).
SOURCE = (
    ROW["source"]
    .replace("'autotune_remote_cache': None", "'autotune_remote_cache': True")
    .replace("inductor_meta={", "inductor_meta={'coordinate_descent_tuning': True, ")
)


@pytest.fixture
def pool(installed: CompileqPool, worker: Worker, clean_cache: object) -> CompileqPool:
    return installed


def build(pool: CompileqPool, index: int) -> Any:
    source = SOURCE.replace(
        "DeviceProperties(type='cuda', index=0", f"DeviceProperties(type='cuda', index={index}"
    )
    load = functools.partial(_load_triton_kernel_from_source, ROW["name"], source)
    kernel, _ = pool.submit(_worker_compile_triton, load, {}, inductor_extra_config()).result(
        timeout=180
    )
    return kernel


def autotune_cache(kernel: Any) -> Any:
    return kernel.save_cache_hook.__self__


def test_kernels_of_every_gpu_index_share_one_autotune_entry(pool: CompileqPool) -> None:
    on_0, on_1 = build(pool, 0), build(pool, 1)
    assert (on_0.triton_meta["device"], on_1.triton_meta["device"]) == (0, 1)
    keys = {autotune_cache(k).remote_cache[1] for k in (on_0, on_1)}
    assert len(keys) == 1
    # What cuda:0 tuned, cuda:1 finds (Inductor's own save at a first run, and its lookup).
    config = on_0.compile_results[0].config
    autotune_cache(on_0).save(config, time_taken_ns=1_000_000)
    for local in {autotune_cache(k).local_cache[1] for k in (on_0, on_1)}:
        os.remove(local)  # as on a new machine: only the cluster's entry is left
    configs, _, info = check_autotune_cache(
        [c.config for c in on_1.compile_results], on_1.filename, on_1.inductor_meta
    )
    assert info["autotune_cache_state"] == "hit" and len(configs) == 1
    assert configs[0].kwargs == config.kwargs


def test_a_kernel_built_on_a_worker_keeps_its_autotune_result_in_this_machines_cache_dir(
    pool: CompileqPool, worker: Worker
) -> None:
    kernel = build(pool, 1)
    here = cache_dir()
    worker_dir = str(worker.log.parent)
    local = autotune_cache(kernel).local_cache[1]
    assert local.startswith(here + os.sep) and not local.startswith(worker_dir)
    assert kernel.filename.startswith(here + os.sep)
    autotune_cache(kernel).save(kernel.compile_results[0].config, time_taken_ns=1_000_000)
    assert os.path.isfile(local)  # Inductor's next run here looks exactly there
    assert not list(worker.log.parent.rglob("*.best_config"))
