"""The Triton binaries a training process compiles in its own process (``inductor/triton_binaries.py``).

Coordinate descent and a best config reloaded from the autotune cache compile in the training
process, outside the pool. Here a real kernel's configs are compiled for real in such a process
(cross-compiled to the fixture's sm_90 cubins on this CPU-only machine), each process on an empty
Triton cache dir, against the session's redis-server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.inductor import triton_binaries
from tests.conftest import CLIENTS, FIXTURES, Env, client_json, manifest_rows, stats

CLIENT = CLIENTS / "triton_binary_client.py"
ROW = manifest_rows(FIXTURES / "gpt_head.jsonl")[0]
COUNTERS = ("triton_binary_hits", "triton_binary_misses", "triton_binary_builds")


def compile_in_process(env: Env, tmp: Path, name: str) -> tuple[dict[str, Any], dict[str, int]]:
    """One fresh training process compiling the kernel's configs itself; what it printed, and
    how the Triton binary counters grew."""
    row = tmp / "row.json"
    row.write_text(json.dumps(ROW))
    before = stats(env, tmp)
    out, _ = client_json(env, CLIENT, str(row), caches=tmp / name)
    after = stats(env, tmp)
    return out, {c: after[c] - before[c] for c in COUNTERS}


def test_a_group_packs_and_unpacks_to_the_same_files_with_this_machines_dir() -> None:
    files = {"k.cubin": b"\x00\x01cubin", "k.json": b'{"dir": "/there/abc"}', "k.ptx": b"ptx"}
    payload = triton_binaries.pack(files, "/there/abc")
    assert b"/there/abc" not in payload  # the storing machine's dir is not shipped
    back = triton_binaries.unpack(payload, "k.json", "/here/abc")
    assert back == {**files, "k.json": b'{"dir": "/here/abc"}'}


@pytest.mark.parametrize(
    "files",
    [
        {"../k.json": b"{}"},
        {"k.json": b"{}", "/etc/k.cubin": b"x"},
        {"k.json": b"{}", "other.cubin": b"x"},
        {"k.cubin": b"x"},  # no metadata
    ],
)
def test_a_group_naming_files_outside_itself_is_refused(files: dict[str, bytes]) -> None:
    payload = triton_binaries.pack(files, "/d")
    with pytest.raises(ValueError):
        triton_binaries.unpack(payload, "k.json", "/d")
    with pytest.raises(ValueError):
        triton_binaries.unpack(payload[:-1] if len(payload) > 8 else b"", "k.json", "/d")


def test_a_kernel_compiled_in_one_process_is_written_from_the_store_in_the_next(
    env: Env, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    first, grew = compile_in_process(env, tmp_path, "first")
    assert first["installed"] is True and first["configs"] >= 1 and first["cubins"] >= 1
    assert grew["triton_binary_builds"] >= 1 and grew["triton_binary_hits"] == 0, grew
    stored = list(clean_cache.scan_iter(match=keys.artifact(triton_binaries.KIND, "*")))
    assert len(stored) == grew["triton_binary_builds"]

    second, grew = compile_in_process(env, tmp_path, "second")

    # Every compile found in the store, none run, and the cubins are in this process's cache.
    assert grew == {
        "triton_binary_hits": len(stored),
        "triton_binary_misses": 0,
        "triton_binary_builds": 0,
    }, grew
    assert second["configs"] == first["configs"] and second["cubins"] == first["cubins"]


def test_a_signed_entry_that_is_not_a_group_costs_one_compile_and_is_replaced(
    env: Env, settings: Settings, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    compile_in_process(env, tmp_path, "first")
    store = RedisStore(clean_cache, settings)
    stored = list(clean_cache.scan_iter(match=keys.artifact(triton_binaries.KIND, "*")))
    for key in stored:
        store.replace(key.decode(), b"signed, but no group")

    _, grew = compile_in_process(env, tmp_path, "planted")
    assert grew["triton_binary_hits"] == 0
    assert grew["triton_binary_builds"] == len(stored), grew

    _, grew = compile_in_process(env, tmp_path, "after")
    assert grew["triton_binary_hits"] == len(stored) and grew["triton_binary_builds"] == 0, grew
