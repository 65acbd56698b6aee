"""Run a function once a module has been imported, whether that is already done or not.

Each pending hook belongs to whoever asked for it (a feature's ``Patches``): cancelling one
owner's hooks leaves every other owner's waiting. The rejected alternative, one list cancelled
as a whole, let one feature's ``disable`` drop the hooks of every other feature still enabled.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

_pending: list[_AfterImport] = []
_lock = threading.Lock()
#: Modules whose body a hook here saw run to its end: importlib still marks them as
#: initialising while the hook runs (``spec._initializing`` is cleared after ``exec_module``).
_finished: set[str] = set()


class _AfterImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, fn: Callable[[ModuleType], None], owner: object) -> None:
        self.name, self.fn, self.owner = name, fn, owner

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
            body_ran(name)
            self.fn(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def after_import(name: str, fn: Callable[[ModuleType], None], owner: object = None) -> None:
    """``fn(module)`` now if ``name`` is in ``sys.modules``, else right after it is imported.

    A module still executing its body is in ``sys.modules`` too: ``fn`` must check that what
    it needs is there, and be called again later (``compileq run`` does, see _boot). A hook
    already pending for the same ``name``, ``fn`` and ``owner`` is not added twice.
    """
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    with _lock:
        if any(h.name == name and h.fn == fn and h.owner is owner for h in _pending):
            return
        hook = _AfterImport(name, fn, owner)
        _pending.append(hook)
        sys.meta_path.insert(0, hook)


def body_ran(name: str) -> None:
    """Say that module ``name`` has run its body to the end, from a hook that runs after it
    inside the import (this module's, and ``compileq run``'s start-up hook)."""
    _finished.add(name)


def loaded(name: str) -> ModuleType | None:
    """``sys.modules[name]`` once its body has run to the end; None while it is missing or
    still executing (``compileq run`` installs from inside torch's own imports, where a module
    is in ``sys.modules`` before it has defined what it will)."""
    module = sys.modules.get(name)
    if module is None:
        return None
    spec = getattr(module, "__spec__", None)
    if getattr(spec, "_initializing", False) and name not in _finished:
        return None
    return module


def pending(owner: object) -> list[str]:
    """The modules ``owner``'s hooks still wait for."""
    with _lock:
        return [h.name for h in _pending if h.owner is owner]


def cancel(hook: _AfterImport) -> None:
    """Forget one pending hook."""
    with _lock:
        if hook in _pending:
            _pending.remove(hook)
        if hook in sys.meta_path:
            sys.meta_path.remove(hook)


def cancel_owned(owner: object) -> None:
    """Forget every pending hook of ``owner``, and only those."""
    with _lock:
        mine = [h for h in _pending if h.owner is owner]
    for hook in mine:
        cancel(hook)
