"""DDPOptimizer's subgraphs through AOTAutograd's cache (codegen/ddp_aot.py), which stock
torch bypasses for them: a DDP job on new machines loads every subgraph instead of tracing it
again. On CPU: real redis-server, a real --cpu-only worker, torchrun with two gloo ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.codegen import ddp_aot
from compileq.config import Settings
from tests.conftest import Env, RedisServer, Worker, restore_cache, stats
from tests.scripts import LLAMA, ColdJob, cold_job, run_script

#: Three DDP buckets, so DDPOptimizer compiles three subgraphs per rank. Not the width of
#: test_user_scripts.py's DDP job: the session's worker would hold its kernels already, and
#: that test checks that cold codegens overlap, which builds served from its disk do not.
DDP = ("--width", "120", "--layers", "4", "--bucket-mb", "1")
TRACING = "aot_trace_joint_graph"


def records(client: redis.Redis) -> list[bytes]:
    return sorted(client.scan_iter(match=keys.artifact(ddp_aot.KIND, "*")))


@pytest.fixture(scope="module")
def cold(
    env: Env, worker: Worker, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> ColdJob:
    """The DDP job on a cold cluster, run once for this module's tests (a minute of a 2-core
    machine); each test starts from the cache it left (restore_cache)."""
    tmp = tmp_path_factory.mktemp("ddp-aot")
    return cold_job(env, redis_server.client(), tmp, "cold", LLAMA, *DDP, nproc=2)


def test_a_ddp_job_on_new_machines_loads_every_subgraph_and_traces_none(
    env: Env, cold: ColdJob, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    restore_cache(clean_cache, cold.left)
    first = cold.run
    subgraphs = first.ranks[0]["graphs"] // 2  # each: a forward and a backward
    assert subgraphs == 3
    before = stats(env, tmp_path)
    assert before["ddp_subgraph_loads"] == 0
    # One record per subgraph: both gloo ranks compile for "cpu", so their keys agree, and
    # the second rank to trace a subgraph finds its record stored.
    assert before["ddp_subgraph_records"] == subgraphs == len(records(clean_cache))

    second = run_script(env, tmp_path, "new", LLAMA, *DDP, nproc=2)
    after = stats(env, tmp_path)
    assert after["ddp_subgraph_loads"] == 2 * subgraphs  # both ranks, every one
    assert after["ddp_subgraph_records"] == before["ddp_subgraph_records"]
    assert after["fx_remote_compiles"] == before["fx_remote_compiles"]
    assert after["fallbacks"] == 0
    for old, new in zip(first.ranks, second.ranks, strict=True):
        assert new["matches_eager"] is True, new
        assert new["losses"] == old["losses"]
        # Nothing traced: AOTAutograd's joint graph was never built on the new machines.
        assert new["compile_phases"].get(TRACING, 0.0) == 0.0, new["compile_phases"]
        assert old["compile_phases"].get(TRACING, 0.0) > 0.0


def by_bucket(client: redis.Redis, settings: Settings) -> list[bytes]:
    """The records, first bucket first: the first takes the token ids (an int64 output it
    saves for its backward), the last returns the logits (the vocabulary, 256, last)."""
    store = RedisStore(client, settings)

    def outputs(key: bytes) -> list[Any]:
        return cast(list[Any], json.loads(store.get(key.decode()) or b"[]"))

    def place(key: bytes) -> int:
        tensors = [o for o in outputs(key) if isinstance(o, dict)]
        if any(o["dtype"] == "int64" for o in tensors):
            return 0
        return 2 if tensors[0]["shape"][-1] == 256 else 1

    return sorted(records(client), key=place)


def test_a_subgraph_whose_record_is_lost_or_forged_compiles_while_the_others_load(
    env: Env, cold: ColdJob, clean_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    restore_cache(clean_cache, cold.left)
    first = cold.run
    # The last bucket loads; its backward runs first, before the two lazy backward compiles,
    # which must each find their own bucket's metadata (ddp_aot: the bucket counter).
    lost, forged, kept = by_bucket(clean_cache, settings)
    clean_cache.delete(lost)
    # Shapes of one subgraph's outputs, as an attacker with Redis access would write them:
    # not sealed with the cluster's secret, so not read.
    clean_cache.set(forged, b'[{"shape": [1], "stride": [1], "dtype": "float32"}]')
    before = stats(env, tmp_path)

    # Two subgraphs compile again, one loads; the buckets that compiled their backwards lazily
    # did so with their own metadata: the losses say so.
    second = run_script(env, tmp_path, "mixed", LLAMA, *DDP, nproc=2)
    after = stats(env, tmp_path)
    # The kept one loads on both ranks. The rank first at a lost or forged subgraph compiles
    # and records it; the other, if it gets there after that record, loads it (seen once on
    # the 2-core machine: 3 loads): each is recorded once either way.
    loads = after["ddp_subgraph_loads"] - before["ddp_subgraph_loads"]
    assert 2 <= loads <= 4, loads
    assert after["ddp_subgraph_records"] - before["ddp_subgraph_records"] == 2
    assert after["integrity_failures"] > before["integrity_failures"]
    assert after["fallbacks"] == 0
    for old, new in zip(first.ranks, second.ranks, strict=True):
        assert new["matches_eager"] is True, new
        assert new["losses"] == old["losses"]
    # Compiled again, both are recorded again (the forgery's place); the kept one untouched.
    assert clean_cache.exists(lost, forged, kept) == 3
