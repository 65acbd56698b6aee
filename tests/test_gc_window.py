"""The collector's window around each compile (inductor/gc_window.py), on real compiles."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch._dynamo.callback import CallbackArgs, CallbackTrigger, callback_handler

import compileq
from compileq.config import Settings
from compileq.inductor import gc_window


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def window() -> Iterator[None]:
    torch._dynamo.reset()
    gc.freeze()  # as CPython 3.12 starts: objects frozen before compileq is installed
    assert gc_window.enable()
    try:
        yield
    finally:
        gc_window.disable()
        gc.unfreeze()  # what the fixture froze, where no window thawed it
        torch._dynamo.reset()


def compile_with(backend: Callable[..., Any]) -> Callable[[torch.Tensor], torch.Tensor]:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    return torch.compile(fn, backend=backend)  # type: ignore[no-any-return]


def test_a_compile_runs_with_the_objects_made_before_it_frozen_and_none_stay_frozen(
    window: None,
) -> None:
    before = Cycle()
    during: list[tuple[int, bool]] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        during.append((gc.get_freeze_count(), gc.is_tracked(before) and gc_window.active()))
        return gm.forward

    out = compile_with(backend)(torch.ones(3))
    assert torch.equal(out, torch.full((3,), 3.0))
    (frozen, tracked_and_open), *_ = during
    assert frozen > 10_000  # torch's own objects, the test's, `before`
    assert tracked_and_open
    assert gc.get_freeze_count() == 0 and not gc_window.active()


def test_an_object_that_becomes_garbage_during_a_compile_is_collected_after_it(
    window: None,
) -> None:
    holder = {"cycle": Cycle()}
    gone = weakref.ref(holder["cycle"])
    alive_in_window: list[bool] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        holder.clear()  # a cycle made before the compile becomes garbage inside it
        gc.collect()  # frozen: not walked, so not collected yet
        alive_in_window.append(gone() is not None)
        return gm.forward

    compile_with(backend)(torch.ones(3))
    assert alive_in_window == [True]  # the window was real
    gc.collect()
    assert gone() is None  # and nothing outlives it: thawed, then collected


def test_a_process_that_froze_objects_after_install_is_left_alone(window: None) -> None:
    compile_with(lambda gm, inputs: gm.forward)(torch.ones(3))  # a first window thaws all
    assert gc.get_freeze_count() == 0
    gc.freeze()  # as a program freezes before forking its data loaders
    try:
        frozen = gc.get_freeze_count()
        during: list[tuple[int, bool]] = []

        def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
            during.append((gc.get_freeze_count(), gc_window.active()))
            return gm.forward

        compile_with(backend)(torch.ones(3, 2))  # a new shape: compiled again
        # Frozen objects freed by reference counting leave the count; none joins it.
        ((count, opened),) = during
        assert count <= frozen and not opened
        assert gc.get_freeze_count() > frozen // 2  # its freeze was not undone
    finally:
        gc.unfreeze()


def test_disable_removes_the_window(window: None) -> None:
    gc_window.disable()
    assert gc_window._start not in callback_handler.start_callbacks
    during: list[bool] = []

    def backend(gm: torch.fx.GraphModule, inputs: list[torch.Tensor]) -> Any:
        during.append(gc_window.active())
        return gm.forward

    frozen = gc.get_freeze_count()
    compile_with(backend)(torch.ones(3))
    assert during == [False]
    assert gc.get_freeze_count() > frozen // 2  # the fixture's freeze stands: nothing thawed


def test_install_opens_the_window_for_inductors_forward_and_its_lazy_backward(
    settings: Settings,
) -> None:
    torch._dynamo.reset()
    seen: list[tuple[CallbackTrigger, int]] = []

    def observe(args: CallbackArgs) -> None:  # runs after compileq's own start callback
        seen.append((args.callback_trigger, gc.get_freeze_count()))

    assert compileq.install(settings)
    callback_handler.register_start_callback(observe)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    x = torch.randn(4, 8)
    model(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    try:
        # A cached graph would load its backward with its forward: this one must compile lazily.
        with torch._inductor.config.patch(force_disable_caches=True):
            out = torch.compile(model)(x)
            out.sum().backward()  # the backward graph compiles here, lazily
        for p, g in zip(model.parameters(), grads, strict=True):
            torch.testing.assert_close(p.grad, g)
    finally:
        callback_handler.remove_start_callback(observe)
        compileq.uninstall()
        torch._dynamo.reset()
    triggers = {trigger for trigger, _ in seen}
    assert {CallbackTrigger.DYNAMO, CallbackTrigger.LAZY_BACKWARD} <= triggers
    assert all(frozen > 10_000 for _, frozen in seen)
    assert gc.get_freeze_count() == 0
    assert gc_window._start not in callback_handler.start_callbacks  # uninstall took it away
