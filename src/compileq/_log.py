"""The ``compileq`` logger and a helper to say a thing once per process."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("compileq")

_said: set[str] = set()
_said_lock = threading.Lock()


def first_time(topic: str) -> bool:
    """True the first time ``topic`` comes up in this process, False ever after."""
    with _said_lock:
        if topic in _said:
            return False
        _said.add(topic)
    return True


def warn_once(
    topic: str, message: str, *args: object, exc_info: BaseException | None = None
) -> None:
    """Log a warning the first time ``topic`` comes up in this process, and never again.

    A fallback can trigger for every kernel of a graph; one line tells the user, a thousand
    bury the rest of the log.
    """
    if first_time(topic):
        log.warning(message, *args, exc_info=exc_info)
