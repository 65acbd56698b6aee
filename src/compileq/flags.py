"""Command-line flags checked where they are typed: one ``compileq: error:`` line and a known
exit code, for ``compileq`` and for the worker process the supervisor starts.

A configuration error gets its own exit code, :data:`CONFIG_EXIT`, so that the supervisor can
tell a child that can never start (a bad flag or setting) from one that died (a crash, a
broker that went away): it restarts the second kind for ever and the first kind never. The
rejected alternative, giving up on any child that dies quickly a few times, stopped whole
fleets for good when the broker was away for a minute (workers/supervisor.py).

Only the standard library here: ``compileq run`` imports the CLI before every job it starts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

#: A worker process's exit code for a configuration it cannot start with (sysexits' EX_CONFIG).
CONFIG_EXIT = 78
#: The exit code of ``compileq`` for bad input (README's command section).
USAGE_EXIT = 2
#: The log levels ``--loglevel`` takes (Python's and Celery's names), in any case.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: The highest TCP port.
MAX_PORT = 65535
#: The most builds at once ``--concurrency`` takes per worker process.
MAX_CONCURRENCY = 4096


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr (argparse's own prints the
    usage first) and exit with ``exit_code``; its sub-parsers are made of the same class."""

    def __init__(self, *args: object, exit_code: int = USAGE_EXIT, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.exit_code = exit_code

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog.split()[0]}: error: {message}", file=sys.stderr)
        sys.exit(self.exit_code)


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from ``low`` to ``high``, saying so when it is not."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number from {low} to {high}"
            ) from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not a whole number from {low} to {high}")
        return value

    parse.__name__ = f"a whole number from {low} to {high}"
    return parse


def port(text: str) -> int:
    """An argparse type: a TCP port a server may listen on (1 to 65535)."""
    return int_in(1, MAX_PORT)(text)


def log_level(text: str) -> str:
    """An argparse type: one of :data:`LOG_LEVELS`, any case, returned in capitals."""
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return level
