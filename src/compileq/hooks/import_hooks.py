"""Run a function once a module has been imported, whether that is already done or not."""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

_pending: list[_AfterImport] = []


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, fn: Callable[[ModuleType], None]) -> None:
        self.name, self.fn = name, fn

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        cancel(self)  # once; and let the real finders locate the module
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            self.fn(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """``fn(module)`` now if ``name`` is in ``sys.modules``, else right after it is imported.

    A module still executing its body is in ``sys.modules`` too: ``fn`` must check that what
    it needs is there, and be called again later (``compileq run`` does, see _boot).
    """
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    hook = _AfterImport(name, fn)
    _pending.append(hook)
    sys.meta_path.insert(0, hook)


def before_first_call(module: ModuleType, name: str, fn: Callable[[], object]) -> None:
    """Run ``fn()`` once, right before the first call of ``module.name``; then the function
    is put back. For functions their callers look up in ``module`` at each call. Nothing
    happens if ``module`` does not define ``name`` yet, or if it is waiting already."""
    original = getattr(module, name, None)
    if original is None or getattr(original, "_compileq_first_call", False):
        return

    def first(*args: Any, **kwargs: Any) -> Any:
        setattr(module, name, original)
        fn()
        return original(*args, **kwargs)

    first._compileq_first_call = True  # type: ignore[attr-defined]
    setattr(module, name, first)


def cancel(hook: _AfterImport | None = None) -> None:
    """Forget one pending hook, or all of them."""
    for pending in [hook] if hook is not None else list(_pending):
        if pending in _pending:
            _pending.remove(pending)
        if pending in sys.meta_path:
            sys.meta_path.remove(pending)
