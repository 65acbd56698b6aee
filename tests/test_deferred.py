"""A DDP subgraph's forward compile goes on while its worker generates it
(codegen/deferred.py). On CPU: real redis-server, a real --cpu-only worker, torchrun with two
gloo ranks, real torch.compile (the job that defers and checks every forward is in
tests/test_ddp_aot.py; here, what happens when a check fails, and the checks themselves).

"Trains right" is the script's own check: an eager copy of the model takes the same steps in
each rank, and losses and parameters must match it (``matches_eager``). A stock job beside
each compileq job, for losses equal bit for bit, was dropped: it cost each test a third of its
time on the 2-core CI machine, and tests/test_user_scripts.py already holds the worker's code
equal to stock's, byte for byte.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.codegen import deferred
from compileq.config import Settings
from compileq.scheduler import roundtrip
from compileq.tasks.events import Done, announce
from tests.conftest import Env, Worker, stats
from tests.scripts import ScriptRun, run_script

CLIENTS = Path(__file__).parent / "clients"
#: Two DDP buckets (two subgraphs per rank, three layers: as many as four make, and a shorter
#: suite); a width no other test uses, so the worker generates every graph afresh.
DDP = ("--width", "104", "--layers", "3", "--bucket-mb", "1")


def _ddp_job(
    env: Env, tmp_path: Path, client: str, *args: str, **kwargs: Any
) -> tuple[ScriptRun, dict[str, int]]:
    """A client script of tests/clients/ run as a 2-rank DDP job (fresh dirs per rank), and
    how much each of the cluster's counters grew meanwhile."""
    before = stats(env, tmp_path)
    run = run_script(env, tmp_path, client, CLIENTS / client, *args, nproc=2, **kwargs)
    after = stats(env, tmp_path)
    return run, {k: after[k] - before.get(k, 0) for k in after if isinstance(after[k], int)}


def test_a_forward_that_fails_its_check_makes_the_frame_compile_again_as_stock_and_train_right(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # Both faults in one job, a rank each: rank 0's forward comes back with other strides,
    # rank 1's output is lost. A cold cluster: every forward is generated, so deferred.
    run, grew = _ddp_job(
        env,
        tmp_path,
        "ddp_mispredicted.py",
        *DDP,
        extra_env={"COMPILEQ_TEST_FAULT": "strides,fetch"},
    )
    # The frame compiled again made the same code: each rank still has two subgraphs' forward
    # and backward.
    subgraphs = sum(rank["graphs"] // 2 for rank in run.ranks)
    assert subgraphs == 2 * 2, run.ranks
    # Each rank's first deferred forward failed its check: the rank compiled the frame again,
    # waiting for each forward as stock does, and deferred nothing after.
    assert grew["ddp_forward_mispredictions"] == 2, grew
    assert grew["ddp_forwards_deferred"] <= subgraphs, grew
    assert grew["fx_local_compiles"] == 0 and grew["fallbacks"] == 0, grew
    assert run.stderr.count("compiling this frame again") == 2, run.stderr[-3000:]
    for said in (
        "other output strides than the traced ones",
        "could not be loaded (RuntimeError: the worker's output is lost)",
    ):
        assert said in run.stderr, (said, run.stderr[-3000:])
    for rank in run.ranks:
        assert rank["matches_eager"] is True, rank


def _restrided_and_kept(run: ScriptRun, grew: dict[str, int]) -> None:
    """A DDP job whose deferred forwards saved activations with other strides than the traced
    ones: restrided on each rank, each backward sent with them as soon as a worker had lowered
    its forward (while the frame's check still waited for a forward's output, not only once
    that forward was loaded), the frame kept (compiled once, nothing built here), and the
    training as eager's."""
    assert grew["ddp_saved_restrided"] >= 2, grew
    assert grew["ddp_saved_restrided_early"] >= 1, grew
    assert grew.get("ddp_forward_mispredictions", 0) == 0, grew
    assert grew.get("fx_local_compiles", 0) == 0 and grew.get("fallbacks", 0) == 0, grew
    assert "compiling this frame again" not in run.stderr, run.stderr[-3000:]
    for rank in run.ranks:
        assert rank["matches_eager"] is True, rank


#: In `make test-all`: a two-rank job of its own, a minute and a quarter of the 2-core machine.
#: CI keeps its path: which saved activations take the real strides (the unit tests below),
#: a backward held for padded strides (test_speculative's padded client, one process) and
#: every deferred forward checked in a real DDP job (tests/test_ddp_aot.py's cold job).
@pytest.mark.slow
def test_a_forward_whose_saved_activations_come_back_padded_keeps_its_frame_and_trains_right(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # Rows of 1032 floats: Inductor pads the saved activations (on a GPU by default; on the
    # CPU once the client turns disable_padding_cpu off), which then come back from the worker
    # with other strides than the traced ones. Found on two H200s: every such frame used to
    # compile twice.
    padded = ("--width", "1032", "--layers", "1", "--bucket-mb", "1")
    run, grew = _ddp_job(env, tmp_path, "ddp_padded.py", *padded)
    # The backward's inputs took the real strides; no frame compiled again.
    _restrided_and_kept(run, grew)
    # Each backward whose forward pads was held for the padded strides (codegen/padding.py)
    # and sent once with them, as soon as its worker had lowered the forward (by one rank; the
    # other found that job), and its first call found that job: no backward generated with
    # the traced strides for nobody (each such backward was generated twice before).
    assert grew["ddp_saved_restrided"] // len(run.ranks) >= 1, grew
    assert grew["fx_held_for_padding"] >= 1 and grew.get("fx_held_not_padded", 0) == 0, grew
    assert grew["fx_sent_ahead"] == grew["ddp_subgraph_records"], grew
    assert grew["fx_remote_compiles"] == 2 * grew["ddp_subgraph_records"], grew


#: In `make test-all`, as the padded job above: CI keeps its path in one process (the
#: convolution test of tests/test_speculative.py) and every deferred forward checked in a real
#: DDP job (tests/test_ddp_aot.py's cold job).
@pytest.mark.slow
def test_a_convolution_nets_ddp_backwards_go_once_with_the_strides_their_forwards_workers_stored(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # Inductor lays out each subgraph's activations channels-last: every backward sent with
    # the traced strides was a codegen nobody loaded (timm's ResNet on two H200s: 9 codegens
    # for 6 graphs). Now such a backward goes once, when its forward's worker has lowered it.
    conv = ("--width", "128", "--layers", "3", "--bucket-mb", "1")
    run, grew = _ddp_job(env, tmp_path, "ddp_conv.py", *conv)
    subgraphs = grew["ddp_subgraph_records"]
    assert subgraphs >= 2 and grew["ddp_forwards_deferred"] >= subgraphs, grew
    _restrided_and_kept(run, grew)  # a conv subgraph's, on each rank
    # One codegen per graph: each subgraph's forward and its backward, sent ahead once.
    assert grew["fx_sent_ahead"] == subgraphs, grew
    assert grew["fx_remote_compiles"] == 2 * subgraphs, grew
    for rank in run.ranks:
        assert rank["graphs"] == 2 * subgraphs, rank


def test_a_wait_hands_over_the_early_outputs_of_other_jobs_stored_before_or_during_it(
    settings: Settings, clean_cache: redis.Redis
) -> None:
    # A frame's check waits for one deferred forward while the workers lower the others:
    # each early output is handed over once, stored before the wait or announced during it;
    # one that does not verify (planted, unsigned) never is, and does not hold the wait.
    store = RedisStore(clean_cache, settings)
    job, before, during, planted = (keys.artifact("fx", c * 64) for c in "abcd")
    store.put(keys.early(before), b"[[8, 1]]")
    clean_cache.set(keys.early(planted), b"[[1, 1]]")
    got: list[tuple[str, bytes]] = []

    def worker() -> None:
        time.sleep(0.2)
        store.put(keys.early(during), b"[[1, 4]]")
        announce(clean_cache, Done(keys.early(during), True))
        time.sleep(0.8)  # past a poll: nothing is handed over twice
        store.put(job, b"the forward")
        announce(clean_cache, Done(job, True))

    hoped = {keys.early(k): (lambda p, k=k: got.append((k, p))) for k in (before, during, planted)}
    with roundtrip.Watcher(store, settings.connect_timeout_s) as watcher:
        thread = threading.Thread(target=worker)
        thread.start()
        waited = watcher.wait([job], time.monotonic() + 30, hoped)
        thread.join()
    assert waited.found[job].payload() == b"the forward" and not waited.late
    assert got == [(before, b"[[8, 1]]"), (during, b"[[1, 4]]")]


def test_only_saved_activations_are_restrided_and_all_or_none() -> None:
    with torch._subclasses.fake_tensor.FakeTensorMode():
        placeholders: list[object] = [3, torch.empty(4, 6), torch.empty(2, 5)]
    # Forward outputs: 0-1 user outputs, 2-3 saved tensors (placeholders 1-2, after 1 symint).
    saved = deferred.Saved(placeholders, slice(2, 4), 1)
    assert not saved.restride([(1, (1, 4))])  # a user output: the next bucket saw it
    assert not saved.restride([(2, (8, 1)), (0, (1,))])  # all or none
    assert placeholders[1].stride() == (6, 1)  # type: ignore[attr-defined]
    assert saved.restride([(2, (8, 1)), (3, (1, 2))])
    assert placeholders[1].stride() == (8, 1) and placeholders[1].shape == (4, 6)  # type: ignore[attr-defined]
    assert placeholders[2].stride() == (1, 2)  # type: ignore[attr-defined]


def test_the_assumed_strides_are_the_traced_ones_and_a_symbolic_graph_assumes_nothing() -> None:
    def f(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        return x.t().contiguous(), x.sum(0), 3

    def traced(mode: str) -> tuple[torch.fx.GraphModule, list[object]]:
        gm = make_fx(f, tracing_mode=mode)(torch.empty(4, 6))
        return gm, [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]

    assert deferred.assumed_strides(*traced("fake")) == [(4, 1), (1,), None]
    assert deferred.assumed_strides(*traced("symbolic")) is None


def test_a_forward_is_verified_only_when_every_real_stride_is_the_assumed_one() -> None:
    class Loaded:
        def __init__(self, strides: list[tuple[str, ...] | None]) -> None:
            self.output_strides = strides

    def forward(real: list[tuple[str, ...] | None]) -> deferred.Forward:
        f = deferred.Forward(lambda _: Loaded(real), [(4, 1), (1,), None])
        f.resolve()
        return f

    recorded: list[str] = []
    same = forward([("4", "1"), ("1",), None])
    same.when_verified(lambda: recorded.append("stored"))
    assert same.verified() and recorded == ["stored"]
    # Inductor gave no stride for an output: AOTAutograd keeps the traced one, as assumed.
    assert forward([None, ("1",), None]).verified()
    other = forward([("1", "4"), ("1",), None])
    other.when_verified(lambda: recorded.append("never"))
    assert not other.verified() and recorded == ["stored"]
    assert not forward([("4", "1"), ("1",)]).verified()  # another number of outputs
    assert not forward([("s0", "1"), ("1",), None]).verified()  # a symbolic stride
