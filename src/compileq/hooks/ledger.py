"""The one ledger of what compileq changed in torch and Triton, and each feature's view of it.

Every replacement of a torch or Triton attribute (a wrapped function, a class or flag set in
its place) is one :class:`Entry`: the object, the attribute, what was there before, and the
feature that made it. Undoing a feature takes its entries away, latest first. Where two
features replaced the same attribute (``deferred`` and ``index_free`` both wrap
``FxGraphCache._save_graph``), each entry wraps the one below it; taking away one that is not
on top stacks the ones above it again on what was below it (:meth:`Ledger.remove`), so any
order of disabling leaves exactly the features still enabled, and the last one leaves the true
original. That is why an entry keeps its ``make`` (what built its replacement from the value
below): a replacement is never patched in place.

The rejected alternative, each feature remembering its own originals (``_original_*`` globals,
a ``_saved`` tuple), put another feature's wrapper back whenever two features wrapped one
attribute and were disabled in the order they were enabled: it stayed installed for good.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from compileq._log import log
from compileq.hooks import import_hooks


class _Absent:
    """What an attribute was before compileq set it, where the object had none of its own
    (inherited from a class, or a data descriptor's default): undoing deletes compileq's."""

    def __repr__(self) -> str:
        return "<absent>"


ABSENT: Any = _Absent()


def raw(owner: Any, name: str) -> Any:
    """``owner.name`` as stored, not as looked up: a class's ``staticmethod`` or
    ``classmethod`` object itself; ``ABSENT`` where ``owner`` has none of its own."""
    own = getattr(owner, "__dict__", None)
    if own is not None and name in own:
        return own[name]
    if isinstance(owner, type):
        return ABSENT
    if not isinstance(owner, ModuleType):
        declared = next((c.__dict__[name] for c in type(owner).__mro__ if name in c.__dict__), None)
        if hasattr(declared, "__set__"):
            return ABSENT  # a data descriptor's default (Triton's knobs): undone by deleting ours
    # torch's config modules keep their values outside the module's own dict.
    return getattr(owner, name, ABSENT)


def _write(owner: Any, name: str, value: Any) -> None:
    if value is not ABSENT:
        setattr(owner, name, value)
        return
    with contextlib.suppress(AttributeError):  # nothing of compileq's left to delete
        delattr(owner, name)


def ident(owner: Any, name: str) -> str:
    """``Owner.name`` for a class, ``package.module.name`` for a module."""
    return f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"


@dataclass(eq=False)
class Entry:
    """One replacement: ``owner.name`` was ``original`` and is ``replacement``, made by
    ``make(original)`` for the feature ``by``."""

    owner: Any
    name: str
    original: Any
    replacement: Any
    by: str
    make: Callable[[Any], Any]

    @property
    def ident(self) -> str:
        return ident(self.owner, self.name)


class Ledger:
    """Every replacement compileq made in this process, in the order made."""

    def __init__(self) -> None:
        self._entries: list[Entry] = []
        self._lock = threading.RLock()

    def __iter__(self) -> Iterator[Entry]:
        """Every entry, oldest first (a copy): for tests, and anything listing what compileq changed."""
        with self._lock:
            return iter(list(self._entries))

    def find(self, by: str, owner: Any, name: str) -> Entry | None:
        with self._lock:
            for entry in self._entries:
                if entry.by == by and entry.owner is owner and entry.name == name:
                    return entry
        return None

    def torchs_own(self, owner: Any, name: str) -> Any:
        """What ``owner.name`` was before compileq replaced it (its oldest entry's original);
        what it is now where compileq has not."""
        with self._lock:
            for entry in self._entries:
                if entry.owner is owner and entry.name == name:
                    return entry.original
        return raw(owner, name)

    def owned(self, by: str) -> list[Entry]:
        with self._lock:
            return [e for e in self._entries if e.by == by]

    def replace(self, by: str, owner: Any, name: str, make: Callable[[Any], Any]) -> Entry:
        """Set ``owner.name`` to ``make(what it is now)``, once per feature: a second call
        for the same attribute returns the entry made first."""
        with self._lock:
            found = self.find(by, owner, name)
            return found if found is not None else self.push(by, owner, name, make)

    def push(self, by: str, owner: Any, name: str, make: Callable[[Any], Any]) -> Entry:
        """Set ``owner.name`` to ``make(what it is now)`` as one more entry, even where ``by``
        has one there already: for a replacement that lasts one block (``Patches.swapped``),
        which may be nested, or made by two threads at once; each is removed on its own."""
        with self._lock:
            original = raw(owner, name)
            entry = Entry(owner, name, original, make(original), by, make)
            _write(owner, name, entry.replacement)
            self._entries.append(entry)
            return entry

    def remove(self, entries: Iterable[Entry]) -> None:
        """Take these entries' replacements away; entries above them on the same attribute
        (other features') stay, made again on what is now below them. Entries not in the
        ledger (taken away already) are skipped."""
        with self._lock:
            doomed = {id(e) for e in entries if any(e is mine for mine in self._entries)}
            if not doomed:
                return
            attributes: list[tuple[Any, str]] = []
            for entry in reversed(self._entries):  # the latest change is undone first
                key = (entry.owner, entry.name)
                if id(entry) in doomed and not any(
                    owner is key[0] and name == key[1] for owner, name in attributes
                ):
                    attributes.append(key)
            for owner, name in attributes:
                self._restack(owner, name, doomed)
            self._entries = [e for e in self._entries if id(e) not in doomed]

    def _restack(self, owner: Any, name: str, doomed: set[int]) -> None:
        stack = [e for e in self._entries if e.owner is owner and e.name == name]
        first = next(i for i, e in enumerate(stack) if id(e) in doomed)
        if raw(owner, name) is not stack[-1].replacement:
            log.debug("compileq: %s replaced since; restored all the same", ident(owner, name))
        value = stack[first].original
        for entry in stack[first + 1 :]:
            if id(entry) in doomed:
                continue
            entry.original, entry.replacement = value, entry.make(value)
            value = entry.replacement
        _write(owner, name, value)


#: The ledger: every feature's replacements are in it.
LEDGER = Ledger()


class Patches:
    """One feature's replacements in the ledger, and the import hooks it asked for.

    Named ``Owner.name`` (a class) or ``package.module.name`` (a module) in ``all_of``.
    """

    def __init__(self, by: str, without: str = "", ledger: Ledger = LEDGER) -> None:
        self.by = by
        #: What is lost when torch lacks one of them, for the log ("DDP subgraphs stay
        #: uncached").
        self.without = without
        self._ledger = ledger

    def wrap(self, owner: Any, name: str, make: Callable[[Any], Any]) -> bool:
        """Replace ``owner.name`` with ``make(original)``, once; nothing if torch lacks it.
        For a class, ``original`` is the raw attribute (a ``staticmethod`` stays one).
        Whether it is wrapped now."""
        if raw(owner, name) is ABSENT:
            log.info("compileq: this torch has no %s; %s", ident(owner, name), self.without)
            return False
        self._ledger.replace(self.by, owner, name, make)
        return True

    def wrap_static(self, owner: type, name: str, make: Callable[[Any], Any]) -> bool:
        """``wrap`` for a ``staticmethod`` of ``owner``: ``make`` gets its function."""
        return self.wrap(owner, name, lambda method: staticmethod(make(method.__func__)))

    def set(self, owner: Any, name: str, value: Any) -> None:
        """Set ``owner.name`` to ``value`` (a flag, a class), whatever it was or whether it
        was at all; the undo puts back what it was, or deletes it."""
        self._ledger.replace(self.by, owner, name, lambda _: value)

    @contextlib.contextmanager
    def swapped(self, owner: Any, name: str, value: Any) -> Iterator[None]:
        """``owner.name`` is ``value`` within the block only, in the ledger meanwhile (so a
        test walking it sees it); leaving the block takes it away, whatever was stacked on
        the same attribute since (``Ledger.remove``)."""
        entry = self._ledger.push(self.by, owner, name, lambda _: value)
        try:
            yield
        finally:
            self._ledger.remove([entry])

    def before_first_call(self, module: ModuleType, name: str, fn: Callable[[], object]) -> None:
        """Run ``fn()`` once, right before the first call of ``module.name``; then the
        function is put back. For functions their callers look up in ``module`` at each call.
        Nothing happens if ``module`` does not define ``name`` yet, or if it is waiting
        already."""
        if raw(module, name) is ABSENT or self.wrapped(module, name):
            return
        made: list[Entry] = []

        def make(original: Any) -> Any:
            def first(*args: Any, **kwargs: Any) -> Any:
                self._ledger.remove(made)
                fn()
                return original(*args, **kwargs)

            return first

        made.append(self._ledger.replace(self.by, module, name, make))

    def after_import(self, module: str, fn: Callable[[Any], None]) -> None:
        """``fn(module)`` now, or once ``module`` is imported (see ``import_hooks``); the
        hook is this feature's: ``undo`` cancels it, and no other feature's."""
        import_hooks.after_import(module, fn, owner=self)

    def wrapped(self, owner: Any, name: str) -> bool:
        return self._ledger.find(self.by, owner, name) is not None

    def original(self, owner: Any, name: str) -> Any:
        """What this feature's replacement of ``owner.name`` stands on (None if none)."""
        entry = self._ledger.find(self.by, owner, name)
        return None if entry is None else entry.original

    def all_of(self, idents: Iterable[str]) -> bool:
        """Whether every one of these is wrapped (a change that needs them all is made only
        then)."""
        return set(idents) <= {e.ident for e in self._ledger.owned(self.by)}

    @property
    def any(self) -> bool:
        """Whether anything is replaced, or an import hook waits."""
        return bool(self._ledger.owned(self.by) or import_hooks.pending(self))

    def undo(self) -> None:
        """Cancel this feature's pending import hooks and take its replacements away."""
        import_hooks.cancel_owned(self)
        self._ledger.remove(self._ledger.owned(self.by))
