"""Kernels' first-launch timings, keyed and carried (``inductor/runtime_tuning.py``).

The key is taken from a real ``CachingAutotuner``, built for real on this CPU-only machine through
the cross-compile path (real sm_90 cubins), after its configs were compiled: the state a kernel
is in when its first launch times them. The GPU test (tests/test_gpu_ranks.py) runs the whole
path under max-autotune.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.inductor import bundled_kernels, runtime_tuning
from tests.conftest import FIXTURES, manifest_rows
from tests.scripts import build_kernel

ROW = next(r for r in manifest_rows(FIXTURES / "gpt_head.jsonl") if "_red_" in r["name"])


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    """The kernel built twice, in two processes, as on two machines."""
    tmp = tmp_path_factory.mktemp("built")
    return build_kernel(ROW, tmp / "a.pickle"), build_kernel(ROW, tmp / "b.pickle")


def key(kernel: Any, phase: str = "pick") -> str | None:
    configs = [r.config for r in kernel.compile_results]
    if phase == "pick":
        return runtime_tuning.tune_key(kernel, phase, candidates=configs, gpu="H100")
    return runtime_tuning.tune_key(kernel, phase, start=configs[0], gpu="H100")


def test_a_compiled_kernel_has_one_key_per_phase_on_every_machine_and_gpu_index(
    kernels: tuple[Any, Any],
) -> None:
    a, b = kernels
    # Inductor drops a kernel's config list once its configs are compiled: the key must not
    # need it (it did, and no timing was ever stored).
    assert getattr(a, "configs", None) is None
    pick, walk = key(a, "pick"), key(a, "coordesc")
    assert pick is not None and walk is not None and pick != walk
    assert key(b, "pick") == pick and key(b, "coordesc") == walk
    moved = bundled_kernels._pointed(a, 1)  # the same kernel as loaded on cuda:1
    assert key(moved, "pick") == pick and key(moved, "coordesc") == walk
    other_gpu = runtime_tuning.tune_key(
        a, "pick", candidates=[r.config for r in a.compile_results], gpu="A100"
    )
    assert other_gpu != pick


def test_timings_round_trip_as_inductors_tuners_key_them() -> None:
    timings = {
        (("R0_BLOCK", 64), ("XBLOCK", 1), ("num_warps", 4), ("num_stages", 1)): 0.0123,
        (("R0_BLOCK", 128), ("XBLOCK", 1), ("num_warps", 8), ("num_stages", 1)): math.inf,
    }
    assert runtime_tuning.decode(runtime_tuning.encode(timings)) == timings


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b'{"timings": {"a": 1}}',
        b'{"timings": [[[["XBLOCK", 1]], -1.0]]}',
        b'{"timings": [[[["XBLOCK", [1]]], 1.0]]}',
        b'{"timings": [[[[1, 1]], 1.0]]}',
        b'{"timings": [[[["XBLOCK", 1]], NaN]]}',
    ],
)
def test_timings_that_are_not_timings_are_refused(payload: bytes) -> None:
    with pytest.raises((ValueError, TypeError, KeyError)):
        runtime_tuning.decode(payload)


def test_a_signed_entry_that_is_not_timings_costs_one_benchmark_and_is_replaced(
    installed: Any, settings: Settings, clean_cache: redis.Redis
) -> None:
    """Read from Redis, untrusted until it decodes: a bad value is never used, and the timings
    this process then takes replace it (a plain put would leave it, a miss for every process)."""
    store = RedisStore(clean_cache, settings)
    key = keys.artifact_of(runtime_tuning.KIND, {"test": "planted"})
    store.replace(key, b"signed, but not timings")
    timings = {(("XBLOCK", 64), ("num_warps", 4), ("num_stages", 1)): 0.5}
    feature = runtime_tuning.FEATURE
    assert feature.client is not None  # installed in this process

    assert feature.lookup(key) is None
    feature.save(key, timings, replace=False)

    assert feature.lookup(key) == timings
    assert key not in feature.bad
