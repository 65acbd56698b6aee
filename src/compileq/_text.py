"""Making untrusted strings safe to print on one line of a terminal or a log.

Worker ids, hosts, fallback reasons and key names are read back from Redis, which anybody who
can write to it controls; a manifest's lines and a user's URLs are typed by hand. Printed raw,
a newline in one of them forges a line of the report or log below it, and an escape sequence
(``\\x1b[...``) recolours, moves the cursor or retitles the terminal. :func:`printable` spells
every such character out instead.
"""

from __future__ import annotations

from typing import Any

#: How long a value shown in a report may be (escapes included); the rest is counted, not shown.
LIMIT = 200


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(s: str, limit: int = LIMIT) -> str:
    """``s`` with every character Python does not call printable (controls, line and paragraph
    separators, bidi overrides, lone surrogates) written as ``\\xNN``, ``\\uNNNN`` or
    ``\\UNNNNNNNN``, cut to about ``limit`` characters with a count of what was left out.

    Backslashes are kept as they are: the result is for reading, not for parsing back, and
    doubling them would garble every Windows path.
    """
    if len(s) <= limit and s.isprintable():
        return s  # the common case, without building the string again
    out: list[str] = []
    size = 0
    for i, ch in enumerate(s):
        piece = ch if ch.isprintable() else _escape(ch)
        if size + len(piece) > limit:
            out.append(f"...[{len(s) - i} more chars]")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


def printable_values(value: Any, limit: int = LIMIT) -> Any:
    """``value`` (JSON-like: dicts, lists, scalars) with :func:`printable` applied to every
    string in it, dict keys included; for renderers that format whole records read from Redis."""
    if isinstance(value, str):
        return printable(value, limit)
    if isinstance(value, dict):
        return {printable_values(k, limit): printable_values(v, limit) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [printable_values(v, limit) for v in value]
    return value
