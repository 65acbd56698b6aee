"""Why a build stays in this process instead of going to a worker: a typed reason.

:class:`Fallback` is raised where the reason is known (routing finds no worker, the broker
refuses the job, the deadline passes, the worker announces a failure) and carries the
:class:`~compileq.cache.counters.Reason` ``compileq stats`` counts it under, so whoever catches
it counts and logs it without knowing where it came from. It lives below ``codegen`` and
``inductor`` alike: FX graphs and C++ objects both fall back through the round trip
(``roundtrip.py``).

Rejected alternative (what this replaced): a topic string per fallback (``"fx-no-worker:<queue>"``)
mapped back to a reason by its prefix, with the worker's message searched for marks. A new
topic, or one spelled differently by another job kind, fell through to ``worker-error``
silently; an enum at the raise site cannot.
"""

from __future__ import annotations

from compileq.cache.counters import Reason
from compileq.errors import CompileqError


class Fallback(CompileqError):
    """Built here, as stock builds it, for ``reason``; ``detail`` says what happened.

    ``scope`` tells apart fallbacks of one reason that each deserve their own log line (the
    queue that has no live worker); ``topic`` is what the once-per-process log line is keyed
    by, to which the catcher prefixes its job kind.
    """

    def __init__(self, reason: Reason, detail: str, scope: str = "") -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.scope = scope

    @property
    def topic(self) -> str:
        return f"{self.reason.value}:{self.scope}" if self.scope else self.reason.value
