"""Redis Sentinel URLs (kombu's ``sentinel://`` form): what one says, and the URL kombu reads.

Beside connect.py, which builds the clients from them, but its own module: config.py validates
``COMPILEQ_REDIS_URL`` and ``COMPILEQ_BROKER_URL`` with :func:`parse_sentinel_url`, and
connect.py imports config.py, so the parser inside connect.py would make the two import each
other (pyproject's import contract forbids that circle). Nothing here imports compileq's
settings; ``ops/sentinel.py`` is the operator's view of the Sentinels themselves.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

from redis.connection import parse_url

SENTINEL_SCHEME = "sentinel://"
#: Sentinel's own port, kombu's default for a sentinel:// URL without one.
SENTINEL_PORT = 26379
#: TLS parameters a sentinel:// URL may carry (redis-py's names); any of them turns TLS on,
#: for the Sentinels and the Redis servers they name alike.
_TLS_PARAMS = ("ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


#: The longest URL taken: a host name is at most 253 characters; ten of them and room for
#: credentials and TLS file paths fit well inside.
MAX_URL_CHARS = 4096
#: The TLS verify modes redis-py knows (it checks them only when it first connects).
_CERT_REQS = ("none", "optional", "required")


def check_text(url: str) -> None:
    """ValueError unless ``url`` is UTF-8 text of a sane length (a variable holding other
    bytes reaches Python as lone surrogates, which failed deep inside the first connection)."""
    try:
        url.encode()
    except UnicodeEncodeError:
        raise ValueError(
            "expected a URL of UTF-8 text (it holds bytes that are not UTF-8)"
        ) from None
    if len(url) > MAX_URL_CHARS:
        raise ValueError(f"expected a URL of at most {MAX_URL_CHARS} characters")


def check_host(host: str | None) -> None:
    """ValueError unless ``host`` is an address or a name a resolver takes (labels of 1 to 63
    characters, 253 in all): checked here because redis-py's IDNA error (``label too long``)
    came as a traceback from the first connection."""
    if not host:
        return  # redis-py's default host
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValueError(
            "expected a host that is an address or a DNS name (labels of 1 to 63 "
            "characters, 253 in all)"
        ) from None


def check_query(url: str) -> None:
    """Read ``url`` (redis://, rediss:// or unix://) as redis-py will, then check what redis-py
    itself checks only when it first connects: finite timeouts and a known ``ssl_cert_reqs``.
    ValueError naming the parameter, never quoting the URL."""
    try:
        options = parse_url(url)  # type: ignore[no-untyped-call]  # unannotated in redis-py
    except ValueError as e:  # its query arguments: "Invalid value for 'db' in ..."
        raise ValueError(f"expected a Redis URL redis-py can read ({e})") from None
    for name, value in options.items():
        if isinstance(value, float) and not (math.isfinite(value) and value > 0):
            raise ValueError(f"expected {name} in the URL to be a finite number above 0")
    reqs = options.get("ssl_cert_reqs")
    if reqs is not None and reqs not in _CERT_REQS:
        raise ValueError(f"expected ssl_cert_reqs in the URL to be one of {', '.join(_CERT_REQS)}")


def is_sentinel(url: str | None) -> bool:
    return bool(url) and str(url).startswith(SENTINEL_SCHEME)


@dataclass(frozen=True)
class SentinelUrl:
    """What a ``sentinel://`` URL says, in kombu's form:
    ``sentinel://[USER:PASSWORD@]HOST:PORT[;sentinel://HOST:PORT...]/DB[?ssl_...]``.

    The credentials are the Redis servers' (master and replicas), as kombu reads them; the
    Sentinels themselves are asked without a password. The DB and the query may be written
    on any one part (kombu's documentation puts them last), or on several that agree.
    """

    sentinels: tuple[tuple[str, int], ...]
    db: int
    userinfo: str  # as written (still percent-encoded), for kombu's URL; "" without one
    username: str | None
    password: str | None
    tls: tuple[tuple[str, str], ...]  # the TLS query parameters, as written

    def kombu_url(self) -> str:
        """The URL for kombu, which reads credentials and DB from the *first* part only
        (checked in kombu 5.7's ``Connection``): each part here carries the DB, and the first
        the credentials. TLS travels as ``broker_use_ssl``, not in the URL."""
        login = f"{self.userinfo}@" if self.userinfo else ""
        return ";".join(
            f"{SENTINEL_SCHEME}{login if i == 0 else ''}{_netloc(host, port)}/{self.db}"
            for i, (host, port) in enumerate(self.sentinels)
        )


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_sentinel_url(url: str) -> SentinelUrl:
    """Read a ``sentinel://`` URL; ValueError naming what is wrong, never quoting the URL
    (it may hold a password)."""
    sentinels: list[tuple[str, int]] = []
    dbs: set[int] = set()
    logins: set[str] = set()
    tls: dict[str, str] = {}
    check_text(url)
    for number, part in enumerate(url.split(";"), 1):
        where = f"sentinel {number}"
        if not part.startswith(SENTINEL_SCHEME):
            raise ValueError(f"{where}: expected sentinel://HOST:PORT (parts joined by ';')")
        try:
            split = urlsplit(part)
        except ValueError:  # "Invalid IPv6 URL"
            raise ValueError(
                f"{where}: expected a host that is a name or address ([...] only around an "
                "IPv6 address)"
            ) from None
        try:
            port = split.port or SENTINEL_PORT
        except ValueError:
            raise ValueError(f"{where}: expected a port that is a number from 0 to 65535") from None
        if not split.hostname:
            raise ValueError(f"{where}: expected a host (sentinel://HOST:PORT)")
        try:
            check_host(split.hostname)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        sentinels.append((split.hostname, port))
        path = split.path.strip("/")
        if path:
            if not path.isdigit():
                raise ValueError(f"{where}: expected /DB to be a database number")
            dbs.add(int(path))
        if "@" in split.netloc:
            logins.add(split.netloc.rpartition("@")[0])
        for name, value in parse_qsl(split.query, keep_blank_values=True):
            if name not in _TLS_PARAMS:
                raise ValueError(
                    f"{where}: unknown parameter {name!r} (a sentinel:// URL takes only "
                    f"{', '.join(_TLS_PARAMS)})"
                )
            if tls.setdefault(name, value) != value:
                raise ValueError(f"{where}: {name} differs from an earlier part's")
        if split.fragment:
            raise ValueError(f"{where}: unexpected '#' (percent-encode it in a password)")
    if len(dbs) > 1:
        raise ValueError("the parts name different databases; write /DB once, at the end")
    if len(logins) > 1:
        raise ValueError("the parts carry different credentials; write USER:PASSWORD@ once")
    userinfo = next(iter(logins), "")
    user, _, password = userinfo.partition(":")
    if tls:
        # Read as redis-py reads a rediss:// URL's, so a bad value fails here, not later.
        query = "&".join(f"{k}={v}" for k, v in tls.items())
        check_query(f"rediss://localhost/0?{query}")
    return SentinelUrl(
        sentinels=tuple(sentinels),
        db=next(iter(dbs), 0),
        userinfo=userinfo,
        username=unquote(user) or None,
        password=unquote(password) if ":" in userinfo else None,
        tls=tuple(tls.items()),
    )
