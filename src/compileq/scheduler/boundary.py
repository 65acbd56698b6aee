"""The one rule, in one place: compileq may make a compile slower, never fail it.

Inductor enters compileq at a handful of points: the Triton pool's ``submit``, the FX compile
scheme, the graph-cache backends, the C++ build and ISA probe, and ``install()``. Each is
wrapped here, so an exception of *any* type from compileq's side of the call (a bug, a value
in Redis it could not read, an internal of another torch release) becomes what stock would
have done: a local build, logged once per place with its traceback, and counted under the
``compileq-error`` fallback reason. Errors of the compile itself (a kernel that does not
build, a graph that does not lower) still reach the user, as they would without compileq.

Rejected alternative: ``try`` blocks at each call into Redis or a worker. They covered the
failures someone had thought of (``RedisError``, ``Fallback``) and let the rest through: an
``AttributeError`` on a malformed worker record in Redis failed the user's compile.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, ParamSpec, TypeVar

from compileq._log import warn_once
from compileq.cache.counters import Counter, Reason, fallback

P = ParamSpec("P")
T = TypeVar("T")

#: Where fallbacks are counted (the installed client's store); None: only logged.
_counter: Callable[[dict[Counter, int], Any], None] | None = None


def count_with(counter: Callable[[dict[Counter, int], Any], None] | None) -> None:
    """Count internal errors through ``counter(counts, records)`` (the store's telemetry)."""
    global _counter
    _counter = counter


def internal_error(where: str, error: BaseException) -> None:
    """Log ``error`` once per place, traceback included, and count it as a fallback."""
    warn_once(
        f"internal:{where}",
        "compileq: internal error in %s (%s: %s); compiling without compileq there",
        where,
        type(error).__name__,
        error,
        exc_info=error,
    )
    counter = _counter
    if counter is not None:
        # Counting must not be the thing that fails a compile.
        with contextlib.suppress(Exception):
            counter({Counter.FALLBACKS: 1}, [fallback(Reason.INTERNAL)])


def guard(
    where: str, instead: Callable[P, T], *, genuine: Callable[P, bool] | None = None
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Run the wrapped entry point; if it raises, run ``instead`` with the same arguments.

    ``genuine(*args, **kwargs)``, asked when it raised, says whether the error came from the
    compile itself (Inductor's own in-process code, which ``instead`` would only repeat):
    then it propagates.
    """

    def decorate(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def entry(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                if genuine is not None and genuine(*args, **kwargs):
                    raise
                internal_error(where, e)
            return instead(*args, **kwargs)

        return entry

    return decorate


def or_else(where: str, source: Future[T], instead: Callable[[], Future[T]]) -> Future[T]:
    """``source``'s result; if it fails, ``instead()``'s (a build as stock would run it).

    A failed build under compileq is built again the stock way rather than failing: a kernel
    that truly does not compile then fails there with stock's own error, one build later;
    anything compileq broke on the way (a worker's output that does not load here) heals.
    """
    out: Future[T] = Future()

    def copy(done: Future[T]) -> None:
        error = done.exception()
        if error is None:
            out.set_result(done.result())
        else:
            out.set_exception(error)

    def relay(done: Future[T]) -> None:
        error = done.exception()
        if error is None:
            out.set_result(done.result())
            return
        internal_error(where, error)
        try:
            instead().add_done_callback(copy)
        except Exception as e:  # the stock pool itself refused: that is stock's error
            out.set_exception(e)

    source.add_done_callback(relay)
    return out
