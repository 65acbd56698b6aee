"""Functions of torch's that compileq wraps: each replaced once, and all put back together."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from compileq._log import log


class Patches:
    """A set of wrapped functions, named ``Owner.name`` (a class) or ``module.name``."""

    def __init__(self, without: str) -> None:
        #: What is lost when torch lacks one of them, for the log ("DDP subgraphs stay
        #: uncached").
        self.without = without
        self._originals: dict[str, tuple[Any, str, Any]] = {}

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
        for owner, name, original in self._originals.values():
            setattr(owner, name, original)
        self._originals.clear()
