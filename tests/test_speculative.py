"""Speculative backward codegen (codegen/speculative.py), on CPU: a training graph's backward
is sent to the worker when AOTAutograd partitions it, so the worker generates it while the
forward is generated and run (a DDP job's buckets: tests/test_ddp_aot.py). Real
redis-server, a real --cpu-only worker, real torch.compile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis

from compileq import keys
from compileq.cache.store import RedisStore
from compileq.config import Settings
from compileq.tasks import fx_strides
from tests.conftest import CLIENTS, Env, Worker, stats, wipe_cache
from tests.scripts import LLAMA, fx_builds, overlapping, run_script
from tests.test_faults import wait_for
from tests.test_fx_remote import run_client

SMALL = ("--layers", "2")


def speculated(env: Env, tmp_path: Path, client: str, run_name: str = "") -> dict[str, Any]:
    """``compileq run`` of a client script (a model of its own, one training step, its own
    empty local caches under ``run_name``): its step equals eager's and nothing was compiled
    in the client or fell back; the counters after."""
    run = run_client(env, tmp_path, run_name or client, CLIENTS / f"{client}.py")
    assert run.result["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0, counters
    return counters


def test_a_graphs_backward_is_generated_on_the_worker_while_its_forward_is(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    run = run_script(env, tmp_path, "spec", LLAMA, *SMALL)
    [rank] = run.ranks
    assert rank["matches_eager"] is True and rank["graphs"] == 2
    counters = stats(env, tmp_path)
    # The backward was sent when the joint graph was partitioned; the lazy backward compile
    # found it: two codegens on the worker, none in the client, nothing generated twice.
    assert counters["fx_sent_ahead"] == 1
    assert counters["fx_remote_compiles"] == 2
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
    builds = fx_builds(env, tmp_path)
    assert len(builds) == 2
    assert overlapping(builds) == 1, builds  # forward and backward codegen at the same time

    # A new machine on this warm cluster: the forward hits, so nothing is sent ahead.
    again = run_script(env, tmp_path, "spec-new", LLAMA, *SMALL)
    assert again.ranks[0]["losses"] == rank["losses"]
    after = stats(env, tmp_path)
    assert after["fx_sent_ahead"] == 1 and after["fx_remote_compiles"] == 2


def test_under_reduce_overhead_the_backward_sent_ahead_is_the_one_the_lazy_compile_loads(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # The mode turns CUDA graphs on; the forward's post-compile turns them off again for a CPU
    # graph (on a GPU it names the forward's device instead), and both values are in the
    # backward's key. Sent ahead before that post-compile, the backward was keyed for the
    # values before it: the worker generated it twice (3 codegens for 2 graphs).
    run = run_script(env, tmp_path, "ro", LLAMA, *SMALL, "--mode", "reduce-overhead")
    [rank] = run.ranks
    assert rank["matches_eager"] is True and rank["graphs"] == 2
    counters = stats(env, tmp_path)
    assert counters["fx_sent_ahead"] == 1
    assert counters["fx_remote_compiles"] == 2, counters
    assert counters["fx_local_compiles"] == 0 and counters["fallbacks"] == 0
    assert overlapping(fx_builds(env, tmp_path)) == 1


def test_without_speculation_the_backward_is_generated_after_the_forward(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    run = run_script(env, tmp_path, "lazy", LLAMA, *SMALL, extra_env={"COMPILEQ_SPECULATE": "0"})
    assert run.ranks[0]["matches_eager"] is True
    counters = stats(env, tmp_path)
    assert counters["fx_sent_ahead"] == 0
    assert counters["fx_remote_compiles"] == 2 and counters["fallbacks"] == 0
    assert overlapping(fx_builds(env, tmp_path)) == 0  # stock's order: one after the other


def test_a_backward_that_differs_from_the_one_sent_ahead_gets_its_own_job_and_is_correct(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path
) -> None:
    # retain_graph=True turns buffer donation off when the backward first runs, after the
    # graph was partitioned and its backward sent: the lazy compile keys another job.
    counters = speculated(env, tmp_path, "retain_graph")
    assert counters["fx_sent_ahead"] == 1
    # forward, the backward sent ahead, and the backward as it ran: nothing compiled here.
    assert counters["fx_remote_compiles"] == 3


def test_a_backward_sent_ahead_can_enter_the_mode_patch_its_forward_is_inside() -> None:
    """``torch.compile(mode="max-autotune")`` decorates Inductor's inner compile with one config
    patch for the forward and the backward; the backward sent from inside the forward's compile
    calls it again. torch 2.11 refused that second entry (the H100 matrix's cold runs under a
    mode lost their speculation); here both see the mode, and the first entry stays whole."""
    from torch._inductor import config

    from compileq.codegen.speculative import _outside_the_forward_compile

    before = (config.max_autotune, config.coordinate_descent_tuning)
    seen: list[tuple[str, bool, bool]] = []

    @config.patch({"max_autotune": True, "coordinate_descent_tuning": True})
    def inner_compile(graph: str) -> None:
        seen.append((graph, config.max_autotune, config.coordinate_descent_tuning))
        if graph == "forward":
            with _outside_the_forward_compile():
                inner_compile("backward")
            seen.append(("forward, after", config.max_autotune, config.coordinate_descent_tuning))

    inner_compile("forward")
    assert seen == [
        ("forward", True, True),
        ("backward", True, True),
        ("forward, after", True, True),
    ]
    assert (config.max_autotune, config.coordinate_descent_tuning) == before
    inner_compile("backward")  # the patch is as good as new for the next compile
    assert (config.max_autotune, config.coordinate_descent_tuning) == before


def test_a_second_entry_into_a_patch_of_torch_2_11s_kind_enters_a_new_patch_of_its_changes() -> (
    None
):
    """torch 2.11's ``config.patch`` keeps the values it replaced in one dict of its closure
    (``prior``) and refuses to be entered twice; torch 2.13 (this machine's) stacks them. The
    same call, built in 2.11's shape here, is entered twice as a decorated backward compile
    inside a forward's."""
    from contextlib import ContextDecorator

    from torch._inductor import config

    from compileq.codegen.speculative import _outside_the_forward_compile

    def patch_of_2_11(changes: dict[str, Any]) -> ContextDecorator:
        prior: dict[str, Any] = {}

        class ConfigPatch(ContextDecorator):
            def __init__(self) -> None:
                self.changes = changes

            def __enter__(self) -> None:
                assert not prior, "entered twice"
                prior.update({key: getattr(config, key) for key in self.changes})
                for key, value in self.changes.items():
                    setattr(config, key, value)

            def __exit__(self, *exc: object) -> None:
                for key, value in prior.items():
                    setattr(config, key, value)
                prior.clear()

        return ConfigPatch()

    before = config.max_autotune
    seen: list[tuple[str, bool]] = []

    mode = patch_of_2_11({"max_autotune": not before})

    @mode
    def inner_compile(graph: str) -> None:
        seen.append((graph, config.max_autotune))
        if graph == "forward":
            with _outside_the_forward_compile():
                inner_compile("backward")
            seen.append(("forward, after", config.max_autotune))

    inner_compile("forward")
    assert seen == [
        ("forward", not before),
        ("backward", not before),
        ("forward, after", not before),
    ]
    assert config.max_autotune == before
    with mode, pytest.raises(AssertionError, match="entered twice"):  # without compileq's help
        inner_compile("backward")
    assert config.max_autotune == before


def test_a_backward_whose_forward_may_pad_what_it_saves_waits_for_the_real_strides_and_goes_once(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    # Inductor pads the forward's saved activation (its rows are 1,032 floats), as the rule of
    # codegen/padding.py foresees: the backward is held until the worker has lowered the
    # forward and stored its strides, then sent once, with the padded ones.
    counters = speculated(env, tmp_path, "padded_cpu")
    assert counters["fx_held_for_padding"] == 1, counters
    assert counters.get("fx_held_not_padded", 0) == 0, counters
    # The forward and the backward sent with the real strides, which the lazy compile
    # loaded: no backward generated with the traced strides for nobody (3 codegens before).
    assert counters["fx_sent_ahead"] == 1, counters
    assert counters["fx_remote_compiles"] == 2, counters

    # A hold for nothing: a cold cluster whose early output for that forward says the traced
    # strides (forged here; on a GPU, a buffer the rule took for padded that Inductor did not
    # pad). Counted, and it costs one codegen at most, never the step: the backward goes with
    # the traced strides, and again with the real ones once the forward is compiled.
    counters = _again_with_early_strides_as_traced(
        env, tmp_path, clean_cache, settings, "padded_cpu"
    )
    assert counters["fx_held_for_padding"] == 1 and counters["fx_held_not_padded"] == 1, counters
    assert counters["fx_sent_ahead"] == 2, counters
    _third_codegen(env, tmp_path)


def test_a_convolution_nets_backward_goes_with_the_strides_the_forwards_worker_stored_early(
    env: Env, worker: Worker, clean_cache: redis.Redis, tmp_path: Path, settings: Settings
) -> None:
    counters = speculated(env, tmp_path, "conv_cpu")
    assert counters["fx_sent_ahead"] == 1
    assert counters["fx_remote_compiles"] == 2, counters
    # Sent once the worker had lowered the forward (its output strides stored early), not
    # once the forward's whole codegen was in: the two codegens ran at the same time.
    builds = fx_builds(env, tmp_path)
    assert overlapping(builds) == 1, builds

    # A cold cluster whose early output for that forward verifies but says nothing of the
    # layout (a worker's bug; the first writer wins, so the worker cannot mend it) costs one
    # codegen, never the step: the backward goes with the traced strides (a graph nobody
    # loads), and again with the real ones once the forward is compiled, which the lazy
    # compile loads.
    counters = _again_with_early_strides_as_traced(env, tmp_path, clean_cache, settings, "conv_cpu")
    assert counters["fx_sent_ahead"] == 2, counters
    _third_codegen(env, tmp_path)


def _again_with_early_strides_as_traced(
    env: Env, tmp_path: Path, cache: redis.Redis, settings: Settings, client: str
) -> dict[str, Any]:
    """``client`` run again on a cold cluster whose early output for its forward (the strides
    the worker stored once it had lowered it, read here) says only the traced strides."""
    builds = fx_builds(env, tmp_path)
    [forward] = [b["key"] for b in builds if cache.exists(keys.early(b["key"]))]
    store = RedisStore(cache, settings)
    [entry] = store.get_many([keys.early(forward)])
    assert entry is not None
    real = fx_strides.parse(entry.payload())
    assert real is not None and any(s is not None for s in real)
    wipe_cache(cache)
    store.put(keys.early(forward), fx_strides.encode([None] * len(real)))
    return speculated(env, tmp_path, client, run_name=f"{client}-as-traced")


def _third_codegen(env: Env, tmp_path: Path) -> None:
    """The backward sent with the traced strides is generated too, and nothing more: nobody
    waits for it, so on a loaded machine its codegen may still run once the job has ended
    (the suite saw 2 of 3 counted at the job's end)."""
    wait_for(
        lambda: stats(env, tmp_path)["fx_remote_compiles"] >= 3,
        120,
        "the worker to generate the backward sent with the traced strides",
    )
    assert stats(env, tmp_path)["fx_remote_compiles"] == 3
