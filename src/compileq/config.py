"""compileq's settings, typed and read from ``COMPILEQ_*`` environment variables."""

from __future__ import annotations

import functools
import os
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from compileq.errors import ConfigError


class Settings(BaseSettings):
    """One place for every knob. ``Settings()`` reads the environment; keyword arguments win."""

    model_config = SettingsConfigDict(env_prefix="COMPILEQ_", extra="ignore")

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
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got {value!r}")
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
    """A Redis URL without its password or query string, for logs and messages."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc = f"{netloc}:{parts.port}"
    if parts.username:
        netloc = (
            f"{parts.username}:***@{netloc}" if parts.password else f"{parts.username}@{netloc}"
        )
    elif parts.password:
        netloc = f":***@{netloc}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


@functools.cache
def get_settings() -> Settings:
    """The process's settings, read once from the environment."""
    return Settings()


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
