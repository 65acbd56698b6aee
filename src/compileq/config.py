"""compileq's settings, typed and read from ``COMPILEQ_*`` environment variables."""

from __future__ import annotations

import functools
import os
import typing
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.connection import parse_url

from compileq._text import printable
from compileq.errors import ConfigError


class Settings(BaseSettings):
    """One place for every knob. ``Settings()`` reads the environment; keyword arguments win."""

    # hide_input_in_errors: a ValidationError's text would otherwise quote the value, and a
    # URL's value carries its password; load_settings() shows values itself, redacted.
    model_config = SettingsConfigDict(
        env_prefix="COMPILEQ_", extra="ignore", hide_input_in_errors=True
    )

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis holding the cache, locks and counters."
    )
    broker_url: str | None = Field(
        None, description="Celery broker; defaults to redis_url. Use a Redis without eviction."
    )
    secret: SecretStr | None = Field(
        None, description="HMAC key shared by clients and workers; required."
    )
    deadline_s: float = Field(
        60.0,
        gt=0,
        description="How long a client waits for a remote build before compiling locally.",
    )
    task_soft_time_limit_s: float = Field(300.0, gt=0, description="Worker soft limit per build.")
    task_time_limit_s: float = Field(360.0, gt=0, description="Worker hard limit per build.")
    max_entry_bytes: int = Field(64 * 2**20, gt=0, description="Largest artifact stored, in bytes.")
    ttl_s: int | None = Field(None, gt=0, description="Expiry of cache entries; none by default.")
    heartbeat_interval_s: float = Field(5.0, gt=0, description="How often workers say they live.")
    heartbeat_ttl_s: float = Field(15.0, gt=0, description="A worker silent this long is dead.")
    connect_timeout_s: float = Field(2.0, gt=0, description="Redis connect/socket timeout.")
    retry_after_s: float = Field(
        15.0, gt=0, description="After Redis fails, compile locally this long before trying again."
    )
    enabled: bool = Field(True, description="COMPILEQ_ENABLED=0 makes install() a no-op.")
    graph_cache: bool = Field(
        True,
        description="Serve Inductor's FX-graph, AOTAutograd, autotune and C++ caches from Redis.",
    )

    fx: bool = Field(
        False,
        description="Generate FX graphs' code on workers (`compileq run` turns it on; see --no-fx).",
    )

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        # The messages never quote the URL: it may hold a password (load_settings shows it
        # redacted). The URL is parsed here as redis-py will parse it, so a bad port is a
        # setting's error now, not a ValueError from deep inside the first connection.
        if value is None:
            return value
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("expected a redis://, rediss:// or unix:// URL")
        try:
            _ = urlsplit(value).port  # raises on a port that is no number or out of range
        except ValueError:
            raise ValueError(
                "expected a Redis URL whose port is a number from 0 to 65535"
            ) from None
        try:
            parse_url(value)  # type: ignore[no-untyped-call]  # unannotated in redis-py
        except ValueError as e:  # its query arguments: "Invalid value for 'db' in ..."
            raise ValueError(f"expected a Redis URL redis-py can read ({e})") from None
        return value

    @property
    def redis_display(self) -> str:
        """``redis_url`` fit for logs: the password and query (TLS file paths) left out."""
        return redact(self.redis_url)

    @property
    def broker(self) -> str:
        return self.broker_url or self.redis_url

    @property
    def visibility_timeout_s(self) -> int:
        # kombu re-delivers an unacked message after this long; it must outlast the hard limit,
        # or a slow build would be handed to a second worker while the first still runs.
        return int(self.task_time_limit_s) + 60

    def secret_bytes(self) -> bytes:
        if self.secret is None or not self.secret.get_secret_value():
            raise ConfigError(
                "COMPILEQ_SECRET is not set: clients and workers need the same secret to sign "
                "and verify cache entries and jobs (for example: export COMPILEQ_SECRET=$(openssl "
                "rand -hex 32))"
            )
        return self.secret.get_secret_value().encode()


def redact(url: str) -> str:
    """A Redis URL without its password or query string, for logs and messages.

    Safe on malformed URLs too, since those are the ones error messages show: an ``@`` that
    did not land in the netloc (a password holding ``/``, ``?`` or ``#``, or no ``//``) hides
    everything before it, and a port that is no number (``redis://user:password/0``, the
    ``@host`` forgotten) is hidden, as it may be the password.
    """
    parts = urlsplit(url)
    if "@" in url and "@" not in parts.netloc:
        head, sep, _ = url.partition("://")
        scheme = f"{head}://" if sep and "@" not in head else ""
        rest = url.rpartition("@")[2].split("?", 1)[0].split("#", 1)[0]
        return f"{scheme}***@{rest}"
    netloc = parts.hostname or ""
    if ":" in netloc:  # IPv6: urlsplit took the brackets off
        netloc = f"[{netloc}]"
    try:
        port = parts.port
    except ValueError:
        netloc = f"{netloc}:***"
    else:
        if port:
            netloc = f"{netloc}:{port}"
    if parts.username:
        netloc = (
            f"{parts.username}:***@{netloc}" if parts.password else f"{parts.username}@{netloc}"
        )
    elif parts.password:
        netloc = f":***@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


#: What a setting's value must be, by the type it is read as.
_EXPECTED = {
    float: "a number",
    int: "a whole number",
    bool: "a boolean (1, 0, true, false, yes, no, on or off)",
    str: "a string",
}
_URL_FIELDS = ("redis_url", "broker_url")


def _expected(name: str, error: Mapping[str, Any]) -> str:
    """What ``name`` must be, in words: pydantic's own messages name its types ("Input should
    be a valid number"), not ours, and leave out the bound when parsing failed first."""
    if error.get("type") == "value_error":  # one of our validators: its message says it
        return str((error.get("ctx") or {}).get("error") or error.get("msg"))
    field = Settings.model_fields.get(name)
    if field is None:
        return str(error.get("msg"))
    # ``int | None`` is read as an int; the None is the default, never a typed value.
    kinds = [t for t in typing.get_args(field.annotation) if t is not type(None)]
    kind = kinds[0] if kinds else field.annotation
    text = _EXPECTED.get(kind) if isinstance(kind, type) else None
    if text is None:
        return str(error.get("msg"))
    bounds = [f"greater than {m.gt}" for m in field.metadata if getattr(m, "gt", None) is not None]
    return " ".join(["expected", text, *bounds])


def _shown(name: str, value: Any) -> str:
    """A setting's bad value for a message: secrets never, URLs without their password."""
    if name == "secret":
        return ""
    if name in _URL_FIELDS and isinstance(value, str):
        return f"={printable(repr(redact(value)), 80)}"
    return f"={printable(repr(value), 80)}"


def settings_error(
    error: ValidationError, given_as: Mapping[str, str] | None = None
) -> ConfigError:
    """One line for ``Settings``' validation error, naming each bad setting as the user set
    it: ``COMPILEQ_DEADLINE_S='abc' is not valid: expected a number greater than 0``.

    ``given_as`` names settings passed as arguments rather than read from the environment
    (``{"redis_url": "--redis-url"}``); a setting in it is named so, one not in it by its
    environment variable.
    """
    given_as = given_as or {}
    parts = []
    for detail in error.errors(include_url=False):
        loc = detail.get("loc") or ("?",)
        name = str(loc[0])
        label = given_as.get(name, f"COMPILEQ_{name.upper()}")
        shown = _shown(name, detail.get("input"))
        parts.append(f"{label}{shown} is not valid: {_expected(name, detail)}")
    return ConfigError("; ".join(parts))


def load_settings(*, given_as: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """``Settings(**overrides)``, raising :class:`ConfigError` with one line naming every bad
    value instead of pydantic's multi-line ``ValidationError``, so every caller (the CLI,
    ``install()``, workers) reports a bad environment the same way. ``given_as``: see
    :func:`settings_error`."""
    try:
        return Settings(**overrides)
    except ValidationError as e:
        # A keyword argument is named as such unless the caller says where it came from; a
        # setting not passed came from the environment, whatever given_as says.
        names = {k: (given_as or {}).get(k, k) for k in overrides}
        raise settings_error(e, names) from None


@functools.cache
def get_settings() -> Settings:
    """The process's settings, read once from the environment (:class:`ConfigError` if one is
    malformed)."""
    return load_settings()


def reset_settings() -> None:
    """Forget cached settings (after changing ``os.environ`` in the same process)."""
    get_settings.cache_clear()


def env_overrides(settings: Settings) -> dict[str, str]:
    """The environment that gives a child process the same settings."""
    env = {"COMPILEQ_REDIS_URL": settings.redis_url}
    if settings.broker_url:
        env["COMPILEQ_BROKER_URL"] = settings.broker_url
    if settings.secret is not None:
        env["COMPILEQ_SECRET"] = settings.secret.get_secret_value()
    return env


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    return {**os.environ, **env_overrides(settings), **extra}
