"""Build announcements on the ``compileq:done`` channel: ``{"key", "ok", "error", "reason"}``.

``reason`` is the fallback reason a failure counts under on the client (a
:class:`~compileq.cache.counters.Reason` value), decided by the worker from the exception
itself: the client never reads it out of the error's text."""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from compileq import keys
from compileq._text import printable
from compileq.cache.counters import Reason


@dataclass(frozen=True)
class Done:
    key: str
    ok: bool
    error: str | None = None
    #: Why it failed, for the client's count; None with ``ok`` (or from an older worker).
    reason: Reason | None = None


def announce(client: redis.Redis, done: Done) -> None:
    client.publish(keys.DONE_CHANNEL, encode(done))


def encode(done: Done) -> str:
    """The announcement as it travels (``parse`` reads it back)."""
    reason = None if done.reason is None else done.reason.value
    return json.dumps({"key": done.key, "ok": done.ok, "error": done.error, "reason": reason})


#: Announcements are a key and a short error: anything longer was not published by compileq.
_MAX_BYTES = 64 * 1024


def parse(data: bytes | str) -> Done | None:
    """An announcement, or None for anything else on the channel (anybody may publish).
    The error is escaped here: clients log it, and it must not forge a line of their log."""
    if len(data) > _MAX_BYTES:
        return None
    try:
        obj = json.loads(data)
        key, ok, error = obj["key"], obj["ok"], obj.get("error")
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(key, str) or not isinstance(ok, bool):
        return None
    reason = obj.get("reason")
    # Anything but a known reason (a forged or newer one) counts as the worker's own error.
    typed = Reason(reason) if reason in _REASONS else (None if ok else Reason.WORKER_ERROR)
    return Done(key, ok, None if error is None else printable(str(error), 500), typed)


_REASONS = frozenset(r.value for r in Reason)
