"""A DDP job as users run it (torchrun, two gloo ranks, each on its own cache dirs, the model
defined in the script): each subgraph generated once for the whole job, and new machines
loading every DDPOptimizer subgraph through AOTAutograd's cache (codegen/ddp_aot.py), which
stock torch bypasses for them, instead of tracing it again. On CPU: real redis-server, the
session's real --cpu-only worker.

One cold job serves every test here (the ``cold`` fixture, a minute and more of a 2-core
machine): what it did is asserted on the counters and builds it left, and each test that runs
a second job starts from the cache it left (restore_cache). It was two jobs of the same shape
in two modules (test_user_scripts held the cold job's own lines), two minutes of the suite.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.codegen import ddp_aot, symbolic_sizes
from compileq.config import Settings
from tests.conftest import Env, RedisServer, Worker, restore_cache, stats
from tests.scripts import LLAMA, ColdJob, cold_job, fx_builds, overlapping, run_script
from tests.test_fx_remote import COMPILES

#: Wide enough for DDP to split the model into three buckets (DDPOptimizer: three subgraphs),
#: and a width no other test compiles: the session's worker must not hold these graphs on its
#: disk already, since the cold job's codegens are checked to overlap.
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


@pytest.mark.release
def test_a_cold_ddp_job_generates_each_subgraph_once_on_the_worker_with_its_codegens_overlapping(
    env: Env, cold: ColdJob, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    restore_cache(clean_cache, cold.left)
    first = cold.run
    for rank in first.ranks:
        assert rank["matches_eager"] is True, rank
    counters = stats(env, tmp_path)
    graphs = first.ranks[0]["graphs"]
    assert graphs == 6  # forward and backward of three DDP buckets
    assert first.ranks[1]["graphs"] == graphs
    # One codegen per distinct graph for the whole job: the other rank found each graph, or
    # its job in flight, and generated nothing itself.
    assert counters["fx_remote_compiles"] == graphs
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
    # Each bucket's forward compile went on without waiting for its worker (deferred.py), and
    # every forward's output strides were the traced ones: no frame was compiled twice.
    assert counters["ddp_forwards_deferred"] >= graphs // 2
    assert counters["ddp_forward_mispredictions"] == 0
    # Each bucket's backward went to the worker beside the later forwards (speculative.py):
    # sent ahead by the rank that sent its forward, the other finding that job in flight or
    # done. (A rank already in its backward pass may ask for a bucket's backward before the
    # other sends it ahead: then that one is sent by its lazy compile, once.)
    assert 1 <= counters["fx_sent_ahead"] <= graphs // 2
    assert overlapping(fx_builds(env, tmp_path)) >= graphs // 2


@pytest.mark.release
def test_a_ddp_job_on_new_machines_loads_every_subgraph_traces_none_and_compiles_nothing(
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

    # The same job again on fresh local dirs, as on new machines: nothing compiles anywhere.
    second = run_script(env, tmp_path, "new", LLAMA, *DDP, nproc=2)
    after = stats(env, tmp_path)
    assert after["ddp_subgraph_loads"] == 2 * subgraphs  # both ranks, every one
    assert after["ddp_subgraph_records"] == before["ddp_subgraph_records"]
    assert {c: after[c] for c in COMPILES} == {c: before[c] for c in COMPILES}
    assert after["kernel_local_compiles"] == before["kernel_local_compiles"]
    assert after["fx_hits"] - before["fx_hits"] == 4 * subgraphs  # both ranks, every graph
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


def test_a_recorded_output_made_again_keeps_inductors_static_mark_and_so_the_next_key() -> None:
    # Inductor marks a GPU graph's static inputs on the example tensors (and then keys their
    # storage): a subgraph's output the backward's compile marked went into the next
    # subgraph's key marked, and came back from the record unmarked, so the next subgraph
    # missed on every new machine (transformers' rotary tables on an H200).
    import torch
    from torch._inductor.codecache import extract_tensor_metadata_for_cache_key

    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    with mode:
        marked, plain = torch.empty(1, 32, 64), torch.empty(4, 8).requires_grad_(True)
    marked._is_inductor_static = True  # type: ignore[attr-defined]
    described = ddp_aot._describe([marked, plain, None, 3])
    assert described is not None
    checked = ddp_aot._checked(json.loads(json.dumps(described)))
    assert checked == described
    made = ddp_aot._make(checked, mode)
    for old, new in zip((marked, plain), made[:2], strict=True):
        assert extract_tensor_metadata_for_cache_key(new) == extract_tensor_metadata_for_cache_key(
            old
        )
    assert not hasattr(made[1], "_is_inductor_static") and made[1].requires_grad
    # A record from before the mark is read as it was; a mark other than true is not.
    old_record = [{k: v for k, v in described[0].items() if k != "static"}]
    assert ddp_aot._checked(old_record) == old_record
    assert ddp_aot._checked([{**described[0], "static": 1}]) is None


def symbolic_inputs(skip: int) -> tuple[Any, list[Any]]:
    """A subgraph's fake inputs in a shape environment of their own: a weight (static), tokens
    whose length is symbolic, and that length. ``skip``: how many other sizes this process
    made symbolic first, so its length's symbol has another name."""
    import torch
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = torch._subclasses.fake_tensor.FakeTensorMode(shape_env=ShapeEnv())
    dynamic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    for n in range(skip):
        mode.from_tensor(torch.empty(100 + n, 1), symbolic_context=dynamic)
    tokens = mode.from_tensor(torch.empty(6, 8), symbolic_context=dynamic)
    static = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC] * 2)
    weight = mode.from_tensor(torch.empty(8, 4), symbolic_context=static)
    return mode, [weight, tokens, tokens.shape[0]]


def test_a_symbolic_output_is_recorded_over_the_inputs_and_made_again_with_another_processes_symbols() -> (
    None
):
    # Under DDP with a length that changes, the frame's subgraphs have symbolic sizes: their
    # outputs are recorded as expressions over the inputs, and made again on a new machine's
    # inputs, whose symbols have other names (another process numbers them its own way).
    import torch

    inputs = symbolic_inputs
    mode, first = inputs(0)
    length = first[2]
    with mode:
        hidden = (first[1] @ first[0]).repeat(2, 1).t()  # (4, 2 * length), strides (1, 4)
        outputs = [
            hidden,
            length * 3 - 1,
            None,
            7,
            torch.empty(4, 8),
            torch.sym_max(length // 2, 5),
        ]
    described = ddp_aot._describe(outputs, symbolic_sizes.symbols_of(first))
    assert described is not None
    record = ddp_aot._checked(json.loads(json.dumps(described)))
    assert record == described

    # Under a key for every GPU index (index_free), the record is moved between indices: a
    # symbolic int, which has no device, stays as it is.
    assert ddp_aot._moved(record, 0, 1) == record

    other_mode, other = inputs(3)  # a new machine: its length is another symbol
    made = ddp_aot._make(cast(list[Any], ddp_aot._resolved(record, other)), other_mode)
    other_length = other[2].node.expr
    assert other_length != length.node.expr
    assert [str(n.node.expr) if isinstance(n, torch.SymInt) else n for n in made[0].shape] == [
        4,
        f"2*{other_length}",
    ]
    assert made[0].stride() == hidden.stride() and made[0].dtype == hidden.dtype
    assert str(made[1].node.expr) == f"3*{other_length} - 1"
    assert made[2:4] == [None, 7] and made[4].shape == (4, 8)
    assert made[5].node.expr == torch.sym_max(other[2] // 2, 5).node.expr  # Max, FloorDiv

    # Inputs that do not fit the record (the length static here) make no outputs: the
    # subgraph compiles. A size held by no input is not recorded at all.
    static = [other[0], torch.empty(6, 8), 6]
    assert ddp_aot._resolved(record, static) is None
    with mode:
        unknown = torch.empty(mode.shape_env.create_unbacked_symint())
    assert ddp_aot._describe([unknown], symbolic_sizes.symbols_of(first)) is None
    assert ddp_aot._describe([hidden]) is None  # no inputs known: symbolic sizes unsaid
    # Expressions read from Redis are checked as the rest: an unknown operation, a reference
    # that is not one, or nesting past the limit make the record unread.
    for forged in (
        ["eval", 1, 2],
        ["in", -1],
        ["in", 0, 0, 0],
        ["+", 1],
        ["//", 1, 2, 3],
        ["**", ["in", 0], 10**9],
    ):
        assert ddp_aot._checked([{**record[0], "shape": [4, forged]}]) is None
    deep: Any = 1
    for _ in range(40):
        deep = ["+", deep, 1]
    assert ddp_aot._checked([{"symint": deep}]) is None


def test_a_signed_record_that_is_malformed_or_does_not_fit_costs_one_compile_and_is_replaced(
    clean_cache: redis.Redis, settings: Settings
) -> None:
    # Sealed with the cluster's secret, so it verifies, but unusable: a first-writer put by the
    # compile that follows would keep it, and every machine would miss the subgraph for as
    # long as it lives. The compile's own record replaces it.
    from types import SimpleNamespace

    from compileq.cache.counters import read_counters, reset_counters

    store = RedisStore(clean_cache, settings)
    reset_counters(clean_cache)
    ddp_aot.enable(store)
    try:
        for n, bad in enumerate(([{"symint": ["in", 9]}], [{"shape": "x"}], {"not": "a list"})):
            key = f"asubgraph{n}"
            name = ddp_aot._record_key(key)
            mode, inputs = symbolic_inputs(0)
            assert store.put(name, json.dumps(bad).encode())
            assert ddp_aot._outputs(key, inputs) is None  # a miss: the subgraph compiles
            ddp_aot._remember_inputs(key, inputs)
            with mode:
                out = inputs[1].repeat(2, 1)
            ddp_aot._record(SimpleNamespace(cache_info=SimpleNamespace(cache_key=key)), [out])
            _, other = symbolic_inputs(2)
            [made] = cast(list[Any], ddp_aot._outputs(key, other))
            assert str(made["shape"][0].node.expr) == f"2*{other[2].node.expr}", made
    finally:
        ddp_aot.disable()
    assert read_counters(clean_cache)["ddp_subgraph_records"] == 3
