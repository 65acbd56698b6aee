"""Functions of torch's that compileq wraps: each replaced once, and all put back together."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from compileq._log import log
from compileq.hooks import import_hooks


class Patches:
    """A set of wrapped functions, named ``Owner.name`` (a class) or ``module.name``."""

    def __init__(self, without: str) -> None:
        #: What is lost when torch lacks one of them, for the log ("DDP subgraphs stay
        #: uncached").
        self.without = without
        self._originals: dict[str, tuple[Any, str, Any]] = {}
        #: Module name -> the function that wraps what it needs there (set by ``enable``).
        self._on_import: dict[str, Callable[[Any], None]] = {}

    def enable(self, on_import: dict[str, Callable[[Any], None]]) -> None:
        """Wrap, in each module named, what its function wraps: now, or once imported."""
        self._on_import = on_import
        self.hook()

    def hook(self) -> None:
        """``enable``'s wrapping again, nothing unless enabled: for install()'s second call
        under ``compileq run``, which installs while torch may still be loading a module
        (its function then finds what it wraps not yet defined, and returns)."""
        for module, wrap_there in self._on_import.items():
            import_hooks.after_import(module, wrap_there)

    @property
    def enabled(self) -> bool:
        return bool(self._on_import)

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Replace ``owner.name`` with ``make(original)``, once; nothing if torch lacks it.
        For a class, ``original`` is the raw attribute (a ``staticmethod`` stays one)."""
        ident = self.ident(owner, name)
        if isinstance(owner, type):
            original = owner.__dict__.get(name)
        else:
            original = getattr(owner, name, None)
        if original is None:
            log.info("compileq: this torch has no %s; %s", ident, self.without)
            return
        if ident in self._originals:
            return
        self._originals[ident] = (owner, name, original)
        setattr(owner, name, make(original))

    def wrap_static(self, owner: type, name: str, make: Callable[[Any], Any]) -> None:
        """``wrap`` for a ``staticmethod`` of ``owner``: ``make`` gets its function."""
        self.wrap(owner, name, lambda method: staticmethod(make(method.__func__)))

    @staticmethod
    def ident(owner: Any, name: str) -> str:
        return f"{getattr(owner, '__name__', owner)}.{name}"

    def all_of(self, idents: Iterable[str]) -> bool:
        """Whether every one of these is wrapped (a change that needs them all is made only
        then)."""
        return set(idents) <= set(self._originals)

    def undo(self) -> None:
        """Put every original back; ``hook`` does nothing until enabled again."""
        for owner, name, original in self._originals.values():
            setattr(owner, name, original)
        self._originals.clear()
        self._on_import = {}
