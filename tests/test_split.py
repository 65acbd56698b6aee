"""A big graph compiled in parts that the workers generate side by side (codegen/split.py).
Where the cuts go (pure functions), then on CPU: real redis-server, a real --cpu-only worker,
real torch.compile of the Llama defined in examples/llama_script.py, run as ``__main__``.
"""

from __future__ import annotations

from pathlib import Path

import redis
import torch

from compileq.codegen import split
from tests.conftest import Env, Worker, stats
from tests.scripts import LLAMA, run_script

CLIENTS = Path(__file__).parent / "clients"

#: Split on the CPU, in two parts (the 2-core machine builds each part's C++).
SPLIT = {
    "COMPILEQ_SPLIT_GRAPHS": "all",
    "COMPILEQ_SPLIT_PARTS": "2",
    "COMPILEQ_SPLIT_MIN_NODES": "20",
}
#: A width no other test uses: the worker generates every part afresh.
MODEL = ("--layers", "2", "--width", "40", "--steps", "3")


def test_cuts_go_near_even_shares_where_the_fewest_values_cross() -> None:
    # A chain of 12 operations, each read by the next; three parts of 4, each cut within a
    # quarter share (1) of 4 and 8. Every cut crosses one value.
    chain = [i + 1 for i in range(12)]
    assert split.cuts(chain, 3, 2) == [4, 8]
    # Operation 5 read again by operation 8: cuts at 6, 7 and 8 cross two values, 9 one.
    chain[5] = 8
    assert split.cuts(chain, 3, 2) == [4, 9]


def test_a_cut_goes_where_no_awkward_value_crosses_if_another_near_one_will_do() -> None:
    # A chain of 12: every cut crosses one value; the even cut (6) hands over value 5.
    chain = [i + 1 for i in range(12)]
    assert split.cuts(chain, 2, 2) == [6]
    # Value 5 awkward (say, pooled features [N, C, 1, 1]): the cut moves next to it.
    assert split.cuts(chain, 2, 2, [i == 5 for i in range(12)]) == [5]
    with torch._subclasses.fake_tensor.FakeTensorMode():
        pooled, features = torch.empty(8, 64, 1, 1), torch.empty(8, 64, 4, 4)
    assert split.awkward(pooled) and split.awkward(3) and not split.awkward(features)
    assert not split.awkward(torch.empty(5))


def test_a_convolution_net_is_not_split_and_a_transformer_may_be() -> None:
    conv = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()))
    assert split.has_convolution(conv)
    functional = torch.fx.symbolic_trace(lambda x, w: torch.nn.functional.conv2d(x, w))
    assert split.has_convolution(functional)
    linear = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()))
    assert not split.has_convolution(linear)


def test_a_graph_too_small_for_two_parts_or_with_no_value_crossing_is_not_cut() -> None:
    chain = [i + 1 for i in range(10)]
    assert split.cuts(chain, 4, 6) == []  # 10 operations: not two parts of 6
    assert split.cuts(chain, 2, 5) == [5]
    # Two independent halves, the first reaching neither the second nor the output: no cut.
    halves = [1, 2, 3, 4, 4, 6, 7, 8, 9, 10]
    assert split.cuts(halves, 2, 5) == []


def test_a_plan_puts_every_operation_in_a_part_in_graph_order() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        for _ in range(8):
            x = torch.relu(x * 2 + 1)
        return x

    gm = torch.fx.symbolic_trace(f)
    partition = split.plan(gm, 4, 6)
    assert partition is not None
    ops = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    assert [partition[n] for n in ops] == sorted(partition[n] for n in ops)
    assert set(partition.values()) == {0, 1, 2, 3}
    assert min(list(partition.values()).count(p) for p in range(4)) >= 6
    assert split.plan(gm, 4, 13) is None


def test_a_big_graph_compiled_in_parts_trains_as_eager_and_a_new_machine_generates_nothing(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    first = run_script(env, tmp_path, "cold", LLAMA, *MODEL, extra_env=SPLIT)
    rank = first.ranks[0]
    assert rank["matches_eager"] is True, rank
    cold = stats(env, tmp_path)
    # One graph, two parts: each part's forward deferred, generated on the worker with its
    # backward, checked, and kept (no frame compiled again); nothing built here.
    assert cold["graphs_split"] == 1, (cold, first.stderr[-3000:])
    assert rank["graphs"] == 4, rank
    assert cold["ddp_forwards_deferred"] == 2 and cold["fx_sent_ahead"] == 2, cold
    assert cold.get("ddp_forward_mispredictions", 0) == 0, cold
    assert cold["fx_remote_compiles"] == 4, cold
    assert cold["fx_local_compiles"] == 0 and cold["fallbacks"] == 0, cold

    second = run_script(env, tmp_path, "new", LLAMA, *MODEL, extra_env=SPLIT)
    new = stats(env, tmp_path)
    assert second.ranks[0]["losses"] == rank["losses"]
    # The parts are found in AOTAutograd's cache: no trace, no codegen, no C++ build here.
    grew = {
        c: new.get(c, 0) - cold.get(c, 0)
        for c in ("fx_misses", "aot_misses", "cpp_misses", "fx_local_compiles", "fallbacks")
    }
    assert grew == dict.fromkeys(grew, 0), (grew, second.stderr[-3000:])
    assert new["ddp_subgraph_loads"] - cold.get("ddp_subgraph_loads", 0) == 2, new


def test_a_cpu_graph_stays_whole_where_only_gpu_graphs_are_split(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    whole = {**SPLIT, "COMPILEQ_SPLIT_GRAPHS": "gpu"}
    run = run_script(env, tmp_path, "whole", LLAMA, *MODEL, extra_env=whole)
    assert run.ranks[0]["graphs"] == 2 and run.ranks[0]["matches_eager"] is True, run.ranks
    assert stats(env, tmp_path).get("graphs_split", 0) == 0


def test_a_part_that_fails_its_check_makes_the_graph_compile_whole_and_train_right(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # The first part's forward comes back "with other strides than traced" (the client's
    # fault): the graph compiles whole, as stock, not its parts one after another.
    faulty = CLIENTS / "ddp_mispredicted.py"
    run = run_script(env, tmp_path, "faulty", faulty, *MODEL, extra_env=SPLIT)
    rank = run.ranks[0]
    # Loaded: the faulty part's forward (for its check, never run), then the whole graph's
    # forward and backward; the second part was never loaded.
    assert rank["matches_eager"] is True and rank["graphs"] == 3, rank
    grew = stats(env, tmp_path)
    assert grew["ddp_forward_mispredictions"] == 1 and grew.get("graphs_split", 0) == 0, grew
    assert grew["fx_local_compiles"] == 0 and grew["fallbacks"] == 0, grew
    assert "compiling this frame again" in run.stderr, run.stderr[-3000:]
