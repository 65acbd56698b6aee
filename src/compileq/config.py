"""compileq's settings, typed and read from ``COMPILEQ_*`` environment variables."""

from __future__ import annotations

import functools
import ipaddress
import os
import typing
from collections.abc import Mapping
from typing import Annotated, Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from compileq._text import printable
from compileq.early_settings import BOOLEAN, parse_bool
from compileq.errors import ConfigError
from compileq.sentinel_url import (
    SENTINEL_SCHEME,
    check_host,
    check_query,
    check_text,
    is_sentinel,
    parse_sentinel_url,
)


def _flag(value: object) -> object:
    # A string (the environment's) by compileq's one rule (early_settings.parse_bool), which
    # the start-up hook applies without pydantic; pydantic's own also takes t, f, y and n. A
    # bool passed in code goes on to pydantic as it is.
    return parse_bool(value) if isinstance(value, str) else value


#: The type of every boolean setting.
Flag = Annotated[bool, BeforeValidator(_flag)]

#: The longest duration any setting may name: a week outlasts every compile, and a bound keeps
#: a value like 1e300 from overflowing where it becomes a socket timeout or a Redis expiry.
MAX_SECONDS = 7 * 86400
#: The longest entry expiry (ten years): Redis's EX takes no more than a 64-bit count of ms.
MAX_TTL_S = 10 * 365 * 86400


def _seconds(default: float, description: str) -> Any:
    """A duration setting: a finite number of seconds, above 0 and at most a week.
    ``allow_inf_nan=False``: pydantic's floats take ``inf`` and ``nan`` otherwise, and
    ``COMPILEQ_DEADLINE_S=inf`` passed validation only to overflow at the first lease."""
    return Field(default, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description=description)


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
    deadline_s: float = _seconds(
        60.0,
        "How long a client waits for a remote build before compiling locally; a build a live "
        "worker is running by then is waited for until it ends (at most the worker's hard "
        "time limit, `task_time_limit_s`).",
    )
    task_soft_time_limit_s: float = _seconds(300.0, "Worker soft limit per build.")
    task_time_limit_s: float = _seconds(360.0, "Worker hard limit per build.")
    # 448 MiB: the largest payload whose sealed form (zstd's worst case adds 1/256, plus the
    # header) still fits one Redis value (proto-max-bulk-len, 512 MiB by default). Inductor's
    # precompiled C++ header is ~155 MB (23 MB sealed); 64 MiB, the old default, refused it.
    # Measured against a real redis-server (2-core VM): 160 MB put 1.1 s and get 0.8 s for that
    # header, 1.4 s and 2.9 s for random bytes (client peak +460 MB, Redis peak 504 MB). Rejected
    # alternative: entries in chunks, whose parts LRU evicts apart, for no entry yet over 155 MB.
    max_entry_bytes: int = Field(
        448 * 2**20, gt=0, description="Largest artifact stored, in bytes."
    )
    ttl_s: int | None = Field(
        None, gt=0, le=MAX_TTL_S, description="Expiry of cache entries; none by default."
    )
    heartbeat_interval_s: float = _seconds(5.0, "How often workers say they live.")
    heartbeat_ttl_s: float = _seconds(15.0, "A worker silent this long is dead.")
    connect_timeout_s: float = _seconds(2.0, "Redis connect/socket timeout.")
    retry_after_s: float = _seconds(
        15.0,
        "After Redis fails, compile locally this long before trying again (with Sentinel, at "
        "most this long: the Sentinels are asked at once).",
    )
    enabled: Flag = Field(
        True,
        description="COMPILEQ_ENABLED=0 makes install() a no-op, and `compileq run`'s start-up "
        "hook do nothing (it reads this through early_settings, without pydantic).",
    )
    graph_cache: Flag = Field(
        True,
        description="Serve Inductor's FX-graph, AOTAutograd, autotune and C++ caches, and Triton's C "
        "modules, from Redis.",
    )

    tune_on_workers: Flag = Field(
        True,
        description="max-autotune: store Triton candidates' timings for the cluster, and have a "
        "process that generates its own graphs send the candidates to GPU workers of its GPU "
        "model (see inductor/autotune.py).",
    )

    fx: Flag = Field(
        False,
        description="Generate FX graphs' code on workers (`compileq run` turns it on; see --no-fx).",
    )
    profiles: Flag = Field(
        False,
        description="Save each job's compiled artifacts as its profile at exit, and fetch the "
        "profile while a new process imports (see inductor/profiles.py). Opt-in: measured on "
        "CPU and H100, a profile gains nothing yet over compileq's remote lookups.",
    )
    job_id: str | None = Field(
        None,
        description="Names the job whose profile a process saves and loads, in place of the "
        "script, its content and its non-path arguments (see inductor/profiles.py).",
    )
    ddp_aot_cache: Flag = Field(
        True,
        description="With graph_cache: serve DDPOptimizer's subgraphs from AOTAutograd's cache, "
        "which stock torch bypasses for them (see codegen/ddp_aot.py).",
    )
    index_free_keys: Flag = Field(
        True,
        description="With graph_cache: key Inductor's FX-graph and AOTAutograd entries as for "
        "cuda:0, so every GPU index shares one entry per graph (see inductor/index_free.py).",
    )
    gc_window: Flag = Field(
        True,
        description="Keep Python's full garbage collections off the objects that exist before "
        "each compile, for the compile's length (see inductor/gc_window.py).",
    )
    aot_regions: Flag = Field(
        True,
        description="With graph_cache: let AOTAutograd's cache take graphs with an autocast or "
        "sdpa_kernel region, which stock traces again at every start (see "
        "codegen/aot_regions.py).",
    )
    dynamic_profile: Flag = Field(
        True,
        description="With graph_cache: keep Dynamo's record of which sizes went dynamic under "
        "the job's identity in the store, so a new machine compiles such a frame dynamic at "
        "once (see inductor/dynamic_profile.py).",
    )
    speculate: Flag = Field(
        True,
        description="With fx: send a training graph's backward to the workers when AOTAutograd "
        "partitions it, beside its forward, not at its first backward call.",
    )
    fx_failure_ttl_s: int = Field(
        7 * 86400,
        ge=0,
        le=MAX_TTL_S,
        description="With fx: how long the cluster remembers a graph whose codegen failed on a "
        "worker; meanwhile every process compiles it in process at once, without another try "
        "(see cache/verdicts.py). A week by default, so a cause that goes away heals; 0 "
        "remembers none. Read by the workers, which write the verdicts.",
    )
    defer_forwards: Flag = Field(
        True,
        description="With fx: under DDP, let each subgraph's forward compile go on while its "
        "worker generates it, and load them all at the end of the frame's compile.",
    )
    split_graphs: typing.Literal["off", "gpu", "all"] = Field(
        "off",
        description="With fx and defer_forwards: compile a big graph outside DDP in parts, as "
        "DDP's graph splitting does, so that the workers generate its parts side by side "
        "(see codegen/split.py). gpu: graphs on a GPU; all: CPU graphs too. Off by default: "
        "measured on an H200, a cold compile gains a fifth, but a new machine loads the parts "
        "slower than one graph and a small model's step takes longer (docs/BENCHMARKS.md).",
    )
    split_parts: int = Field(
        4,
        ge=2,
        le=16,
        description="With split_graphs: the most parts one graph is compiled in.",
    )
    split_min_nodes: int = Field(
        40,
        ge=1,
        description="With split_graphs: the fewest operations (Dynamo's graph nodes) a part "
        "may have; a graph of fewer than twice as many is compiled whole.",
    )
    worker_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="The niceness `compileq worker` builds at (its pool, compilers and "
        "assemblers inherit it): on a GPU node, the training processes' own tracing is the "
        "critical path, and the worker yields them the CPUs. 0 leaves it as started.",
    )
    keep_stack_chunks: Flag = Field(
        True,
        description="Keep the chunks of Python's frame stack that a compile frees, instead of "
        "unmapping and mapping them again at every call across a chunk's boundary "
        "(see stack_chunks.py); needs a C compiler, else nothing changes.",
    )
    worker_cpus: str = Field(
        "",
        description="The CPUs `compileq worker` runs on, as a list like 0-15,32-47 (its "
        "pool and compilers inherit it); empty: every CPU it may use.",
    )
    worker_leave_cores: int | None = Field(
        None,
        ge=0,
        description="Physical cores (each with its SMT siblings) `compileq worker` leaves "
        "free for the training processes; unset: one per GPU it serves where it has 8 CPUs "
        "per GPU or more (none below that, where its builds are what the first step waits "
        "for, nor with --cpu-only). See workers/cpus.py.",
    )
    cpp_fanout: Flag = Field(
        True,
        description="Send a C++ object Inductor must build to a worker with the same compiler, "
        "torch and CPU (any node), and build it here only if none can.",
    )
    codegen_profile_dir: str | None = Field(
        None,
        description="A directory where each worker process writes a cProfile of every graph "
        "it generates (KEY.pstats, read with `python -m bench.profile_report`): where one "
        "graph's codegen goes. Off by default: the profiler slows the codegen it measures.",
    )
    codegen_dump_dir: str | None = Field(
        None,
        description="A directory where each worker process writes what every graph it "
        "generates was given (KEY.txt: the job's header, Inductor's arguments, each input's "
        "layout, the graph's code): why two processes sent two graphs, read with diff.",
    )
    progress: typing.Literal["auto", "always", "never"] = Field(
        "auto",
        description="The client's progress line and its summary at exit, on stderr: auto on "
        "a terminal only, always also into a file or pipe (the summary), never.",
    )
    local_idle_s: float = Field(
        900.0,
        gt=0,
        allow_inf_nan=False,
        description="The local cluster (`compileq run` with no COMPILEQ_REDIS_URL) stops "
        "itself after this long without a job; read when it starts (see compileq/local/).",
    )
    # Declared after the URLs: its validator reads them, and pydantic validates in this order.
    # validate_default: an unset master is exactly the mistake to catch.
    sentinel_master: str | None = Field(
        None,
        validate_default=True,
        description="Name of the master the Sentinels watch (`sentinel monitor NAME ...`); "
        "required when a URL is sentinel://.",
    )

    @field_validator("redis_url", "broker_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        # The messages never quote the URL: it may hold a password (load_settings shows it
        # redacted). The URL is parsed here as redis-py will parse it, so a bad port is a
        # setting's error now, not a ValueError from deep inside the first connection.
        if value is None:
            return value
        if value.startswith(SENTINEL_SCHEME):
            parse_sentinel_url(value)
            return value
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(
                "expected a redis://, rediss:// or unix:// URL, or the Sentinels' "
                "sentinel://HOST:PORT[;sentinel://HOST:PORT...]/DB"
            )
        check_text(value)
        try:
            split = urlsplit(value)
        except ValueError:  # "Invalid IPv6 URL": a '[' or ']' out of place
            raise ValueError(
                "expected a Redis URL whose host is a name or address ([...] only around an "
                "IPv6 address; percent-encode brackets in a password)"
            ) from None
        try:
            _ = split.port  # raises on a port that is no number or out of range
        except ValueError:
            raise ValueError(
                "expected a Redis URL whose port is a number from 0 to 65535"
            ) from None
        if not value.startswith("unix://"):
            check_host(split.hostname)
        check_query(value)
        return value

    @field_validator("sentinel_master", "job_id", "worker_cpus")
    @classmethod
    def _utf8(cls, value: str | None) -> str | None:
        # Text sent to Redis or hashed into keys: a variable holding bytes that are not UTF-8
        # reaches Python as lone surrogates, which fail only when first encoded.
        if value is not None:
            try:
                value.encode()
            except UnicodeEncodeError:
                raise ValueError(
                    "expected UTF-8 text (it holds bytes that are not UTF-8)"
                ) from None
        return value

    @field_validator("secret")
    @classmethod
    def _secret_text(cls, value: SecretStr | None) -> SecretStr | None:
        # Never quoted: the message says what is wrong with it, not what it is. A variable
        # holding bytes that are not UTF-8 reaches Python as lone surrogates, which failed
        # (UnicodeEncodeError) only when the first entry was signed.
        if value is not None:
            try:
                value.get_secret_value().encode()
            except UnicodeEncodeError:
                raise ValueError(
                    "expected UTF-8 text (it holds bytes that are not UTF-8; "
                    "openssl rand -hex 32 makes a good one)"
                ) from None
        return value

    @field_validator("sentinel_master")
    @classmethod
    def _master_named(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("expected the name of the master the Sentinels watch, not blank")
        if value is None:
            # A URL that failed its own validation is absent here: its error says enough.
            urls = [info.data.get("redis_url"), info.data.get("broker_url")]
            names = ["COMPILEQ_REDIS_URL", "COMPILEQ_BROKER_URL"]
            sentinel = [n for n, u in zip(names, urls, strict=True) if is_sentinel(u)]
            if sentinel:
                raise ValueError(
                    f"{' and '.join(sentinel)} names Sentinels, which need the name of the "
                    "master they watch (their `sentinel monitor NAME ...`)"
                )
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
    ``@host`` forgotten) is hidden, as it may be the password. A Sentinel URL is redacted
    part by part: each ``;``-separated sentinel may carry credentials.
    """
    if url.startswith(SENTINEL_SCHEME) and ";" in url:
        return ";".join(_redact_one(part) for part in url.split(";"))
    return _redact_one(url)


def _redact_one(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:  # "Invalid IPv6 URL": nothing after the scheme can be placed safely
        head, sep, _ = url.partition("://")
        return f"{head}://***" if sep else "***"
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
        netloc = f"{netloc}:{_bad_port(parts)}"
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


def _bad_port(parts: SplitResult) -> str:
    """A port that is no number or out of range, as a message may show it: as written when
    the host is an address or ``localhost`` (``redis://127.0.0.1:99999/0``, a typo), else
    ``***``: in ``redis://user:password/0`` (the ``@host`` forgotten) the "port" is the
    password, and a user name is never an address."""
    written = parts.netloc.rpartition("@")[2].rpartition(":")[2]
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            return "***"
    return printable(written, 20)


#: What a setting's value must be, by the type it is read as.
_EXPECTED = {
    float: "a number",
    int: "a whole number",
    bool: BOOLEAN,
    str: "a string",
}
_URL_FIELDS = ("redis_url", "broker_url")
#: A ``Field``'s bounds, in words (pydantic keeps each as its own metadata entry).
_BOUNDS = (("gt", "greater than"), ("ge", "at least"), ("lt", "less than"), ("le", "at most"))


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
    bounds = [
        f"{words} {getattr(m, bound)}"
        for m in field.metadata
        for bound, words in _BOUNDS
        if getattr(m, bound, None) is not None
    ]
    return " ".join(["expected", text, " and ".join(bounds)]).rstrip()


def _shown(name: str, value: Any) -> str:
    """A setting's bad value for a message: secrets never, URLs without their password."""
    if name == "secret" or value is None:
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
        # None reaches a validator only as a default: the setting was left out.
        verdict = "is not set" if detail.get("input") is None else "is not valid"
        parts.append(f"{label}{shown} {verdict}: {_expected(name, detail)}")
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
    if settings.sentinel_master:
        env["COMPILEQ_SENTINEL_MASTER"] = settings.sentinel_master
    if settings.secret is not None:
        env["COMPILEQ_SECRET"] = settings.secret.get_secret_value()
    return env


def child_env(settings: Settings, **extra: str) -> dict[str, str]:
    return {**os.environ, **env_overrides(settings), **extra}
