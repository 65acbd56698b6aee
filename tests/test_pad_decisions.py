"""Matmul padding decisions, taken once and shared through the store (``inductor/pad_decisions.py``).

compileq is installed in this process against the session's redis-server, and Inductor's own
``pad_mm`` functions are called as its pass calls them. Another process (another rank, another
machine) is this one with an empty local cache: ``TORCHINDUCTOR_CACHE_DIR`` pointed at a new
directory, its ``LocalCache``'s path computed again. The pass itself times matmuls only
on a GPU: the matrix's DDP cells on two GPUs run it (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from compileq import keys
from compileq.cache.counters import Counter, read_counters
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.inductor import pad_decisions


@pytest.fixture
def pad_mm(installed: Any, clean_cache: redis.Redis) -> Iterator[Any]:
    from torch._inductor.codecache import CacheBase
    from torch._inductor.fx_passes import pad_mm

    yield pad_mm
    CacheBase.get_local_cache_path.cache_clear()  # the test's directories are gone


def another_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str) -> None:
    """What a new process has: nothing in Inductor's local cache (whose path a process
    computes once)."""
    from torch._inductor.codecache import CacheBase

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / name))
    CacheBase.get_local_cache_path.cache_clear()


def a_matmul() -> str:
    """A padding key as Inductor writes one (its content does not matter to the store)."""
    return f"mm (1000, 2048) (2048, 1) bf16 {uuid.uuid4().hex}"


def test_the_first_processs_padding_decision_stands_for_every_later_one(
    pad_mm: Any, clean_cache: redis.Redis, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key = a_matmul()
    another_process(monkeypatch, tmp_path, "first")
    assert pad_mm.is_padded_faster(key, 2.0, 1.0) is True  # padded 2x faster: pad

    # A rank that timed the same matmul at the same moment and found padding slower: it keeps
    # the stored decision, and its own local cache says so from then on.
    another_process(monkeypatch, tmp_path, "second")
    assert pad_mm.is_padded_faster(key, 1.0, 2.0) is True
    assert pad_mm.get_cached_should_pad(key) is True

    # A process that had not timed it finds the decision and times nothing.
    another_process(monkeypatch, tmp_path, "third")
    assert pad_mm.get_cached_should_pad(key) is True
    counters = read_counters(clean_cache)
    assert counters[Counter.PAD_DECISION_TIMINGS.value] == 2
    assert counters[Counter.PAD_DECISION_HITS.value] == 1


def test_a_decision_not_to_pad_is_shared_as_one_to_pad_is(
    pad_mm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    key = a_matmul()
    another_process(monkeypatch, tmp_path, "first")
    assert pad_mm.is_padded_faster(key, 1.0, 1.0) is False  # within 1.1x: keep
    another_process(monkeypatch, tmp_path, "second")
    assert pad_mm.get_cached_should_pad(key) is False
    assert pad_mm.is_padded_faster(key, 3.0, 1.0) is False


def test_a_matmul_nobody_timed_is_timed_here(
    pad_mm: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    another_process(monkeypatch, tmp_path, "first")
    assert pad_mm.get_cached_should_pad(a_matmul()) is None


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed-junk"])
def test_a_planted_decision_is_never_taken_and_costs_one_timing(
    signed: bool,
    pad_mm: Any,
    settings: Settings,
    clean_cache: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """Read from Redis, untrusted until verified: a value anybody could write (unsigned), or
    signed but no decision, is absent to every process; the next timing replaces it."""
    key = a_matmul()
    stored = pad_decisions.store_key(key)
    assert stored.startswith(keys.ARTIFACT)
    if signed:
        RedisStore(clean_cache, settings).replace(stored, b"yes please")
    else:
        clean_cache.set(stored, pad_decisions.encode(True))

    another_process(monkeypatch, tmp_path, "first")
    assert pad_mm.get_cached_should_pad(key) is None
    assert pad_mm.is_padded_faster(key, 1.0, 2.0) is False  # this process's own timing

    another_process(monkeypatch, tmp_path, "second")
    assert pad_mm.get_cached_should_pad(key) is False  # the planted value is gone
    if signed:
        assert read_counters(clean_cache)[Counter.INTEGRITY_FAILURES.value] >= 1


def test_a_decision_is_keyed_by_the_gpu_model_and_torch() -> None:
    import torch

    key = a_matmul()
    assert pad_decisions.store_key(key) == pad_decisions.store_key(key)
    assert pad_decisions.store_key(key) != pad_decisions.store_key(key + " ")
    # The margin a padded matmul must win by decides too, and Inductor's key leaves it out.
    from torch._inductor import config

    default = pad_decisions.store_key(key)
    margin = {"shape_padding_multiplier": {"value": 1.3}}
    with config.patch(post_grad_fusion_options=margin):
        assert pad_decisions.store_key(key) != default
    assert pad_decisions._gpu_name() == (
        torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    )


@pytest.mark.parametrize("payload", [b"", b"PAD", b"pad ", b"\x00", b"true"])
def test_only_a_decision_decodes(payload: bytes) -> None:
    assert pad_decisions.decode(payload) is None
    assert pad_decisions.decode(pad_decisions.encode(True)) is True
    assert pad_decisions.decode(pad_decisions.encode(False)) is False
