"""compileq's features (features.py) and the one ledger of what they replace in torch
(hooks/ledger.py): install() and uninstall() in this process, with real torch and a real
redis-server, and the ledger on its own."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import compileq
from compileq.codegen import remote
from compileq.config import Settings
from compileq.features import FEATURES
from compileq.hooks import import_hooks
from compileq.hooks.ledger import ABSENT, LEDGER, Ledger, Patches, ident, raw
from compileq.inductor import autotune, index_free

# Every module whose functions a feature wraps, imported first: the hooks then wrap at once,
# and every target below can be read before install().
for _name in (
    "torch._dynamo.backends.distributed",
    "torch._dynamo.pgo",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch._functorch._aot_autograd.graph_compile",
    "torch._functorch._aot_autograd.runtime_wrappers",
    "torch._inductor.autotune_process",
    "torch._inductor.compile_fx",
    "torch._inductor.compile_fx_subproc",
    "torch._inductor.output_code",
    "torch._inductor.select_algorithm",
):
    importlib.import_module(_name)


def known_targets() -> list[tuple[Any, str]]:
    """What compileq is known to replace (with FX codegen, profiles and every cache on)."""
    import torch._functorch.config as functorch_config
    from torch._dynamo import pgo
    from torch._dynamo.backends import distributed
    from torch._functorch._aot_autograd import autograd_cache, graph_compile, runtime_wrappers
    from torch._inductor import (
        async_compile,
        autotune_process,
        codecache,
        compile_fx,
        compile_fx_subproc,
        cpu_vec_isa,
        output_code,
        remote_cache,
        select_algorithm,
    )
    from torch._inductor import config as inductor_config

    targets: list[tuple[Any, str]] = [
        (async_compile.AsyncCompile, "process_pool"),
        (inductor_config, "compile_threads"),
        (inductor_config, "fx_graph_remote_cache"),
        (functorch_config, "enable_remote_autograd_cache"),
        (codecache.FxGraphCache, "_save_graph"),
        (codecache.FxGraphCache, "_lookup_graph"),
        (codecache.FxGraphCache, "cache_hit_post_compile"),
        (codecache.FxGraphCache, "load_with_key"),
        (codecache.FxGraphCachePickler, "__init__"),
        (codecache, "compiled_fx_graph_hash"),
        (codecache, "_worker_compile_cpp"),
        (cpu_vec_isa.VecISA, "check_build"),
        (output_code.CompiledFxGraph, "prepare_for_serialization"),
        (autograd_cache, "autograd_cache_key"),
        (autograd_cache, "check_node_safe"),
        (autograd_cache.AOTAutogradCache, "save"),
        (autograd_cache.AOTAutogradCache, "try_load"),
        (autograd_cache.AOTAutogradCache, "_lookup"),
        (runtime_wrappers.FakifiedOutWrapper, "post_compile"),
        (compile_fx, "fx_compile_mode"),
        (compile_fx, "_compile_fx_inner"),
        (compile_fx, "compile_fx"),
        (compile_fx, "fx_codegen_and_compile"),
        (compile_fx_subproc, "_SubprocessFxCompile"),
        (select_algorithm.AlgorithmSelectorCache, "benchmark_in_current_process"),
        (autotune_process, "benchmark_in_sub_process"),
        (graph_compile, "_aot_stage2a_partition"),
        (graph_compile, "aot_stage2_autograd"),
        (graph_compile, "_aot_stage2b_bw_compile"),
        (distributed.DDPOptimizer, "compile_fn"),
        (distributed.SubmodCompiler, "run_node"),
        (pgo, "get_cache_key"),
        (pgo, "get_remote_cache"),
        (pgo.CodeId, "make"),
    ]
    for name in ("RemoteFxGraphCache", "RemoteAOTAutogradCache", "RemoteAutotuneCache"):
        targets.append((getattr(remote_cache, name), "backend_override_cls"))
    try:
        from triton import knobs

        targets.append((knobs.cache, "manager_class"))
    except ImportError:  # a torch without Triton: nothing of Triton's to replace
        pass
    return targets


def same(now: Any, before: Any) -> bool:
    """The very object again (a config flag: the same value)."""
    return now is before or (not callable(before) and now == before)


def snapshot() -> dict[tuple[int, str], tuple[Any, str, Any]]:
    return {(id(owner), name): (owner, name, raw(owner, name)) for owner, name in known_targets()}


def changed(before: dict[tuple[int, str], tuple[Any, str, Any]]) -> list[str]:
    """The known targets that are not what they were (named for the assertion's message)."""
    return [
        ident(owner, name)
        for owner, name, original in before.values()
        if not same(raw(owner, name), original)
    ]


def originals() -> dict[tuple[int, str], tuple[Any, str, Any]]:
    """What the ledger says each replaced attribute was before compileq: its oldest entry's."""
    found: dict[tuple[int, str], tuple[Any, str, Any]] = {}
    for entry in LEDGER:
        found.setdefault((id(entry.owner), entry.name), (entry.owner, entry.name, entry.original))
    return found


@pytest.fixture
def everything_on(settings: Settings) -> Iterator[Settings]:
    """Settings with every feature wanted; compileq uninstalled after, whatever happened."""
    try:
        yield settings.model_copy(update={"fx": True, "profiles": True})
    finally:
        compileq.uninstall()


def test_uninstall_puts_back_every_attribute_the_ledger_and_the_known_list_name(
    everything_on: Settings,
) -> None:
    before = snapshot()
    assert compileq.install(everything_on)
    ledger = originals()
    # The ledger holds every known target compileq replaced, with what was there before.
    replaced = set(changed(before))
    assert "AsyncCompile.process_pool" in replaced and "FxGraphCache._save_graph" in replaced
    assert replaced <= {entry.ident for entry in LEDGER}, replaced
    for key, (owner, name, original) in ledger.items():
        if key in before:
            assert same(original, before[key][2]), (owner, name)
    compileq.uninstall()
    assert list(LEDGER) == []
    for owner, name, original in ledger.values():
        assert same(raw(owner, name), original), (owner, name)
    assert changed(before) == []


def test_installing_twice_and_uninstalling_twice_in_a_row_leaves_torch_as_it_was(
    everything_on: Settings,
) -> None:
    before = snapshot()
    for _ in range(2):
        assert compileq.install(everything_on)
        entries = list(LEDGER)
        assert compileq.install(everything_on)  # a second call only hooks again
        assert list(LEDGER) == entries  # the very entries: nothing wrapped again
        compileq.uninstall()
        compileq.uninstall()
        assert list(LEDGER) == [] and changed(before) == []


def test_fx_switched_off_by_a_later_install_takes_only_the_fx_hooks_away(
    everything_on: Settings,
) -> None:
    from torch._inductor import codecache, compile_fx, compile_fx_subproc

    before = snapshot()
    stock_mode = compile_fx.fx_compile_mode
    stock_scheme = compile_fx_subproc._SubprocessFxCompile
    assert compileq.install(everything_on, fx=True)
    assert remote.active()
    # Two features wrap Inductor's FX-cache put: deferred forwards above GPU-index-free keys.
    save_graph = [e.by for e in LEDGER if e.ident == "FxGraphCache._save_graph"]
    assert save_graph == ["index-free", "deferred"]

    assert compileq.install(everything_on, fx=False)
    assert not remote.active()
    assert compile_fx.fx_compile_mode == stock_mode
    assert compile_fx_subproc._SubprocessFxCompile is stock_scheme
    assert not any(e.by in ("remote-fx", "speculative", "deferred") for e in LEDGER)
    # The rest stays: index_free's wrapper is the put now, on the true original.
    assert [e.by for e in LEDGER if e.ident == "FxGraphCache._save_graph"] == ["index-free"]
    put = next(e for e in LEDGER if e.ident == "FxGraphCache._save_graph")
    assert raw(codecache.FxGraphCache, "_save_graph") is put.replacement
    assert put.original is before[(id(codecache.FxGraphCache), "_save_graph")][2]
    assert index_free.active() and autotune.active()
    assert "AsyncCompile.process_pool" in changed(before)

    compileq.uninstall()
    assert list(LEDGER) == [] and changed(before) == []


def test_every_feature_has_its_own_name_in_the_ledger() -> None:
    names = [feature.name for feature in FEATURES]
    assert len(names) == len(set(names))


# -- the ledger on its own ----------------------------------------------------------------------


def tagged(tag: str) -> Any:
    """A wrapper maker: its function calls what it wraps and adds ``tag``."""

    def make(original: Any) -> Any:
        return lambda: original() + tag

    return make


@pytest.mark.parametrize("first_off", ["lower", "upper"])
def test_two_features_wrapping_one_function_go_in_either_order_to_the_true_original(
    first_off: str,
) -> None:
    ledger = Ledger()
    owner = SimpleNamespace(f=lambda: "stock")
    stock = owner.f
    lower, upper = Patches("lower", ledger=ledger), Patches("upper", ledger=ledger)
    lower.wrap(owner, "f", tagged("+lower"))
    upper.wrap(owner, "f", tagged("+upper"))
    assert owner.f() == "stock+lower+upper"
    gone, stays = (lower, upper) if first_off == "lower" else (upper, lower)
    gone.undo()
    assert owner.f() == f"stock+{stays.by}"
    assert [e.by for e in ledger] == [stays.by] and stays.all_of(["SimpleNamespace.f"])
    stays.undo()
    assert owner.f is stock and list(ledger) == []


def test_a_flag_an_object_did_not_have_of_its_own_is_deleted_again() -> None:
    class Owner:
        flag = "inherited"

    ledger = Ledger()
    patches = Patches("feature", ledger=ledger)
    patches.set(Owner, "missing", 1)
    patches.set(Owner, "flag", "ours")  # Owner's own: put back as it was
    child: Any = type("Child", (Owner,), {})
    patches.set(child, "flag", "child's")  # inherited: deleted again
    assert [e.original for e in ledger] == [ABSENT, "inherited", ABSENT]
    patches.undo()
    assert not hasattr(Owner, "missing") and Owner.flag == "inherited"
    assert "flag" not in vars(child) and child.flag == "inherited"


def test_wrapping_twice_for_one_feature_wraps_once() -> None:
    ledger = Ledger()
    owner = SimpleNamespace(f=lambda: "stock")
    patches = Patches("feature", ledger=ledger)
    patches.wrap(owner, "f", tagged("+once"))
    patches.wrap(owner, "f", tagged("+twice"))
    assert owner.f() == "stock+once" and len(list(ledger)) == 1


def test_a_swap_for_one_block_is_in_the_ledger_only_within_it_even_nested_out_of_order() -> None:
    ledger = Ledger()
    owner = SimpleNamespace(f="stock")
    wire = Patches("fx-wire", ledger=ledger)  # one owner, two blocks at once (two threads)
    first, second = wire.swapped(owner, "f", "first"), wire.swapped(owner, "f", "second")
    first.__enter__()
    second.__enter__()
    assert owner.f == "second" and [e.replacement for e in ledger] == ["first", "second"]
    first.__exit__(None, None, None)  # the first block ends while the second is still inside
    assert owner.f == "second" and [e.original for e in ledger] == ["stock"]
    second.__exit__(None, None, None)
    assert owner.f == "stock" and list(ledger) == []


def test_the_worker_sides_replacements_of_torch_go_through_the_ledger_too() -> None:
    # The wire's pickler, swapped in for one pickling in client and worker alike.
    from torch.fx._graph_pickler import GraphPickler

    from compileq.tasks.fx_wire import wire

    stock = GraphPickler.__dict__["dumps"]
    with wire(1):
        assert [e.ident for e in LEDGER if e.by == "fx-wire"] == ["GraphPickler.dumps"]
        assert GraphPickler.__dict__["dumps"] is not stock
    assert GraphPickler.__dict__["dumps"] is stock
    assert not [e for e in LEDGER if e.by == "fx-wire"]


def test_the_triton_key_seeded_for_torch_211_is_a_ledger_entry_undone_with_its_feature() -> None:
    from torch._inductor.runtime import triton_compat

    from compileq import fingerprint

    stock = raw(triton_compat, "triton_key")
    keys = Patches("inductor-keys", ledger=Ledger())
    fingerprint._seed_triton_compat("memoised", set_attr=keys.set)
    try:
        assert triton_compat.triton_key() == "memoised"
        assert keys.all_of(["torch._inductor.runtime.triton_compat.triton_key"])
    finally:
        keys.undo()
    assert raw(triton_compat, "triton_key") is stock


def test_a_function_wrapped_before_its_first_call_is_put_back_at_that_call() -> None:
    module: Any = ModuleType("compileq_test_module")
    module.double = lambda x: 2 * x
    stock = module.double
    ledger = Ledger()
    patches = Patches("feature", ledger=ledger)
    ran: list[bool] = []
    patches.before_first_call(module, "double", lambda: ran.append(True))
    assert module.double is not stock and patches.wrapped(module, "double")
    assert module.double(21) == 42
    assert ran == [True] and module.double is stock and list(ledger) == []
    assert module.double(1) == 2 and ran == [True]


def test_cancelling_one_features_import_hooks_leaves_anothers_waiting() -> None:
    mine, theirs = Patches("mine"), Patches("theirs")
    never = "compileq_test_a_module_nobody_imports"
    try:
        mine.after_import(never, lambda module: None)
        theirs.after_import(never, lambda module: None)
        assert import_hooks.pending(mine) == [never] == import_hooks.pending(theirs)
        mine.undo()
        assert import_hooks.pending(mine) == [] and import_hooks.pending(theirs) == [never]
    finally:
        theirs.undo()
    assert import_hooks.pending(theirs) == []
