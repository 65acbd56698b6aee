"""The one rule for a boolean ``COMPILEQ_*`` setting, and the settings read before pydantic is.

:class:`compileq.config.Settings` reads every ``COMPILEQ_*`` variable and documents it, and its
boolean fields parse with :func:`parse_bool`. Importing it costs about 0.45 s, though (pydantic,
pydantic-settings and redis-py; ``python -X importtime -c "import compileq.config"`` on the
2-core CPU machine), and ``compileq run``'s start-up hook runs in every Python process of a job
before torch, most of which never compile. So the hook and the profile fetch it starts read
their three settings here (:data:`EARLY_FLAGS`, :data:`EARLY_TEXTS`), by the same rule and with
the same defaults as ``Settings`` (tests/test_cli_input.py holds them equal). Only the standard library and
compileq's own leaf modules are imported.
"""

from __future__ import annotations

import os

from compileq._text import printable
from compileq.errors import ConfigError

PREFIX = "COMPILEQ_"
#: The spellings of a boolean setting, compared ignoring case: the words the error message has
#: always listed. Not pydantic's single letters (t, f, y, n), which no one was told of.
TRUE = frozenset({"1", "true", "yes", "on"})
FALSE = frozenset({"0", "false", "no", "off"})
#: What a boolean setting must be, in words (Settings' messages say the same).
BOOLEAN = "a boolean (1, 0, true, false, yes, no, on or off)"

#: The boolean settings read before pydantic may be imported (by the start-up hook), each a
#: ``Settings`` field, with its default there.
EARLY_FLAGS: dict[str, bool] = {"enabled": True, "profiles": False}
#: The text settings read so (by the profile fetch, for the job's id), unset: None, as there.
EARLY_TEXTS = ("job_id",)


def parse_bool(value: str) -> bool:
    """A boolean setting's value, by the one rule; ValueError for any other spelling (padded
    with spaces, or empty, included: pydantic refused those too)."""
    word = value.lower()
    if word in TRUE:
        return True
    if word in FALSE:
        return False
    raise ValueError(f"expected {BOOLEAN}")


def variable(name: str) -> str:
    """The environment variable of the ``Settings`` field ``name``."""
    return f"{PREFIX}{name.upper()}"


def env_flag(name: str) -> bool:
    """The boolean setting ``name`` (a key of :data:`EARLY_FLAGS`) from the environment, else
    its default; :class:`ConfigError` worded as ``load_settings`` words it for a bad value."""
    default = EARLY_FLAGS[name]
    value = os.environ.get(variable(name))
    if value is None:
        return default
    try:
        return parse_bool(value)
    except ValueError as e:
        shown = printable(repr(value), 80)
        raise ConfigError(f"{variable(name)}={shown} is not valid: {e}") from None


def env_text(name: str) -> str | None:
    """The text setting ``name`` (one of :data:`EARLY_TEXTS`) from the environment, else None."""
    if name not in EARLY_TEXTS:
        raise KeyError(name)
    return os.environ.get(variable(name))
