"""Build announcements on the ``compileq:done`` channel: ``{"key", "ok", "error"}``."""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from compileq import keys


@dataclass(frozen=True)
class Done:
    key: str
    ok: bool
    error: str | None = None


def announce(client: redis.Redis, done: Done) -> None:
    client.publish(
        keys.DONE_CHANNEL, json.dumps({"key": done.key, "ok": done.ok, "error": done.error})
    )


def parse(data: bytes | str) -> Done | None:
    try:
        obj = json.loads(data)
        return Done(str(obj["key"]), bool(obj["ok"]), obj.get("error"))
    except (ValueError, KeyError, TypeError):
        return None
