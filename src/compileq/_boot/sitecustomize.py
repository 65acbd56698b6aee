"""Loaded at start-up by every Python process that ``compileq run`` launches.

It installs compileq the moment Inductor's ``async_compile`` module is first imported, not at
start-up: importing torch costs seconds, and many processes of a launch (shell helpers, data
loaders) never compile anything. It calls install() once more when ``compile_fx`` has loaded:
``compile_fx`` itself imports ``async_compile``, and the FX codegen hook can only be set on a
``compile_fx`` that has finished loading. Any ``sitecustomize`` this file shadows still runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_TRIGGERS = {"torch._inductor.async_compile", "torch._inductor.compile_fx"}


def _run_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if not entry or os.path.abspath(entry) == here:
            continue
        candidate = os.path.join(entry, "sitecustomize.py")
        if os.path.isfile(candidate):
            with open(candidate) as f:
                code = compile(f.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


class _InstallWhenInductorLoads(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.waiting = set(_TRIGGERS)
        self.busy = False

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if self.busy:
            return None
        if name not in self.waiting:
            return None
        self.waiting.discard(name)  # once per module
        if not self.waiting:
            sys.meta_path.remove(self)
        # Let the real finders locate the module (this finder declines the nested call).
        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            try:
                from compileq._gc import collector_paused
            except Exception:  # never break the user's import
                run_module(module)
            else:
                with collector_paused():  # the rest of Inductor's import: compileq/_gc.py
                    run_module(module)
            try:
                import compileq
                from compileq.hooks import import_hooks

                import_hooks.body_ran(name)  # importlib marks it as loading until we return
                compileq.install()
            except Exception as e:  # never break the user's program
                print(f"compileq: not installed: {e}", file=sys.stderr)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


#: Inductor's own helper processes: its compile-worker pool and its autotuning subprocess. They
#: are started with this process's ``sys.path`` as PYTHONPATH, so this file runs in them too;
#: compileq has no place there (the compile worker builds what it is sent, as stock), and the
#: compile worker sets ``torch_key`` itself at its start, which fails once compileq has seeded
#: it: the worker died and its parent waited forever on the kernels it was sent.
_INDUCTOR_HELPERS = ("/_inductor/compile_worker/__main__.py", "/_inductor/__autotune_main__.py")


def _inductor_helper() -> bool:
    argv = getattr(sys, "orig_argv", sys.argv)  # the interpreter's own command line (3.10+)
    return any(arg.replace(os.sep, "/").endswith(_INDUCTOR_HELPERS) for arg in argv[1:] if arg)


def _importable() -> bool:
    """Whether this interpreter can import compileq; if not, one line saying so and why.

    ``compileq run`` puts this file's dir on PYTHONPATH, so every Python of the job runs it,
    also one that compileq is not installed for (``compileq run -- python3 ...`` from a venv,
    with a system ``python3`` first on PATH). There compileq cannot be active: said once, with
    where it is installed, instead of the first import's error (``no profile prefetch: No
    module named 'compileq'``, which read as if compileq ran and only a prefetch failed)."""
    if importlib.util.find_spec("compileq") is not None:
        return True
    # <site dir>/compileq/_boot/sitecustomize.py: the dir that holds the compileq package.
    installed = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    print(
        f"compileq: not active in this process: {sys.executable or 'this Python'} cannot import "
        f"compileq (it is installed under {installed}, for another Python); run the job with "
        "that Python, or install compileq into this one",
        file=sys.stderr,
    )
    return False


def _enabled() -> bool:
    """``COMPILEQ_ENABLED`` by Settings' own rule (``compileq.early_settings``), read without
    Settings: pydantic and redis-py would cost every process of the job about 0.45 s."""
    try:
        from compileq.early_settings import env_flag

        return env_flag("enabled")
    except Exception as e:  # a bad value, which install() would refuse too; never break the program
        print(f"compileq: not installed: {e}", file=sys.stderr)
        return False


if not _inductor_helper() and _importable() and _enabled():
    sys.meta_path.insert(0, _InstallWhenInductorLoads())
    try:  # the job's profile starts coming while this process imports torch
        from compileq.inductor import profiles

        profiles.prefetch()
    except Exception as e:  # never break the user's program
        print(f"compileq: no profile prefetch: {e}", file=sys.stderr)
_run_shadowed_sitecustomize()
