"""Stand-ins for the user's code on compileq's FX wire.

A graph's compile input names user code: ``node.meta["fwd_nn_module_stack"]`` holds
``(path, __main__.Block)`` pairs for every module a backward node came from, and Inductor's
pickler filter does not drop that key. Pickle writes a class or function *by reference*
(module and qualified name), and a worker cannot import the training script's ``__main__``, a
``models/llama.py`` on the client's path, a closure or a lambda: unpickling failed there and
every such graph was compiled back in the client.

Codegen reads names from that metadata, never behaviour, so on the wire any class or function
outside :data:`PORTABLE_ROOTS` travels as ``stand_in(kind, module, qualname)``. On the worker
that builds a class (or a function) with the same ``__module__``, ``__qualname__`` and
``__name__``, so whatever codegen prints or compares reads the same strings; calling a stand-in
function raises :class:`StandInCalled`, so a graph that needs the code itself (a user
op's Python body, say) fails on the worker and is compiled in the client, as before.

Rejected alternative: shipping the user's module source to the worker and importing it there.
That runs the training script's top level (its ``if __name__ == "__main__"`` guard would not
even hold) on a shared worker, for metadata that needs only a name.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import Any

#: Top-level packages every worker has, at the version routing guarantees (the toolchain
#: digest covers torch and Triton): their objects travel by reference as Inductor wrote them.
PORTABLE_ROOTS = frozenset({"torch", "triton", "sympy", "mpmath", "functorch", "compileq"}) | (
    frozenset(sys.stdlib_module_names)
)

CLASS, FUNCTION = "class", "function"

_made: dict[tuple[str, str, str], Any] = {}
_lock = threading.Lock()
#: Where stand-ins resolve to the real object when it is importable here: the client reading a
#: worker's output back. Never on a worker, whose ``__main__`` is compileq's, not the user's.
_state = threading.local()


class StandIn:
    """Base of every stand-in class: constructible from whatever a pickle hands it."""

    __compileq_stand_in__ = True

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        return object.__new__(cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.__compileq_args__ = args


class StandInCalled(RuntimeError):
    """Codegen called a function of the user's that only its name travelled for."""


def travels_by_reference(obj: object) -> bool:
    """Whether pickling ``obj`` by reference (module + qualified name) works on a worker.

    Only classes and functions are asked: those are what pickle writes by reference.
    """
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str):
        return True  # pickle finds it some other way (or fails here, as stock would)
    return module.split(".", 1)[0] in PORTABLE_ROOTS


def needs_stand_in(obj: object) -> bool:
    if isinstance(obj, type):
        if getattr(obj, "__compileq_stand_in__", False):
            return True  # one of ours, pickled again by the worker for its output
    elif not isinstance(obj, types.FunctionType):
        return False
    return not travels_by_reference(obj)


def reduce(obj: Any) -> tuple[Any, tuple[str, str, str]]:
    """The pickle reduction of a class or function that needs a stand-in."""
    kind = CLASS if isinstance(obj, type) else FUNCTION
    return stand_in, (kind, str(obj.__module__), str(obj.__qualname__))


def stand_in(kind: str, module: str, qualname: str) -> Any:
    """What the pickle names: the real object where :func:`resolving` and it is importable,
    else a stand-in, one per name for the life of the process (so identity comparisons
    within a graph hold)."""
    if getattr(_state, "resolve", False):
        real = _lookup(module, qualname)
        if real is not None:
            return real
    with _lock:
        made = _made.get((kind, module, qualname))
        if made is None:
            made = _made[(kind, module, qualname)] = _make(kind, module, qualname)
    return made


class resolving:
    """Within: stand-ins resolve to real objects importable in this process (the client)."""

    def __enter__(self) -> None:
        self._saved = getattr(_state, "resolve", False)
        _state.resolve = True

    def __exit__(self, *exc: object) -> None:
        _state.resolve = self._saved


def _lookup(module: str, qualname: str) -> Any:
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        if found is None or part.startswith("<"):
            return None
        found = getattr(found, part, None)
    if isinstance(found, (type, types.FunctionType)) and found.__qualname__ == qualname:
        return found
    return None


def _make(kind: str, module: str, qualname: str) -> Any:
    name = qualname.rsplit(".", 1)[-1]
    if kind == CLASS:
        return type(name, (StandIn,), {"__module__": module, "__qualname__": qualname})

    def called(*args: Any, **kwargs: Any) -> Any:
        raise StandInCalled(
            f"codegen called {module}.{qualname}, the client's code, which does not travel "
            f"to workers; the client compiles this graph"
        )

    called.__name__, called.__qualname__, called.__module__ = name, qualname, module
    called.__compileq_stand_in__ = True  # type: ignore[attr-defined]
    return called
