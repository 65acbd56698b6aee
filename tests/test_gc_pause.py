"""The collector paused while torch's compiler stack is imported (compileq/_gc.py)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
from typing import Any

from compileq._gc import collector_paused


def test_the_collector_is_off_inside_nested_pauses_and_on_again_after_the_outermost() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner pause ended; the outer one still holds
    assert gc.isenabled()


def test_a_collector_the_program_turned_off_stays_off_after_a_pause() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_pause_ended_by_an_error_still_turns_the_collector_back_on() -> None:
    try:
        with collector_paused():
            raise ValueError("an import failed")
    except ValueError:
        pass
    assert gc.isenabled()


def test_install_imports_inductor_with_the_collector_paused_and_leaves_it_on(
    installed: Any,
) -> None:
    # The installed fixture has run compileq.install() in this process.
    assert gc.isenabled()
    # In a fresh process, where install() is what imports Inductor: no collection ran while
    # it did, and the collector is on after it.
    script = (
        "import gc, json, torch, compileq\n"
        "from compileq.config import Settings\n"
        "runs = []\n"
        "gc.callbacks.append(lambda phase, info: runs.append(1) if phase == 'start' else None)\n"
        "import sys\n"
        "assert 'torch._inductor.async_compile' not in sys.modules\n"
        "compileq.install(Settings(redis_url='redis://127.0.0.1:1/0', secret='s' * 32))\n"
        "print(json.dumps({'inductor': 'torch._inductor.async_compile' in sys.modules,\n"
        "                  'collections': len(runs), 'enabled': gc.isenabled()}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=True
    ).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["inductor"] is True
    assert result["enabled"] is True
    # Importing compileq's own modules may collect a few times before the pause; Inductor's
    # import alone triggered 450 collections unpaused.
    assert result["collections"] < 100, result
