"""Loaded at start-up by every Python process that ``compileq run`` launches.

It installs compileq the moment Inductor's ``async_compile`` module is first imported, not at
start-up: importing torch costs seconds, and many processes of a launch (shell helpers, data
loaders) never compile anything. Any ``sitecustomize`` this file shadows still runs.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_TRIGGER = "torch._inductor.async_compile"


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
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != _TRIGGER:
            return None
        sys.meta_path.remove(self)  # once; and let the real finders locate the module
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            try:
                import compileq

                compileq.install()
            except Exception as e:  # never break the user's program
                print(f"compileq: not installed: {e}", file=sys.stderr)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if os.environ.get("COMPILEQ_ENABLED", "1") not in ("0", "false", "False"):
    sys.meta_path.insert(0, _InstallWhenInductorLoads())
_run_shadowed_sitecustomize()
