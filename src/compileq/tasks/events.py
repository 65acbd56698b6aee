"""Build announcements on the ``compileq:done`` channel: ``{"key", "ok", "error"}``."""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from compileq import keys
from compileq._text import printable


@dataclass(frozen=True)
class Done:
    key: str
    ok: bool
    error: str | None = None


def announce(client: redis.Redis, done: Done) -> None:
    client.publish(
        keys.DONE_CHANNEL, json.dumps({"key": done.key, "ok": done.ok, "error": done.error})
    )


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
    return Done(key, ok, None if error is None else printable(str(error), 500))
