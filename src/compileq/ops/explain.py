"""``compileq explain``: which components went into a key, and which one made a miss.

Every stored kernel has its key material recorded next to it (``compileq:meta:<key>``, written
by whoever built it from the very dict the key hashes, see ``TritonJob.key_material``), and
every client miss records the material it looked for. A miss is explained by its nearest
stored sibling: an entry of the same kernel name and source whose key differs; the components
where the two records disagree are what made the miss.

Graphs (FX, AOTAutograd) are keyed by Inductor's own opaque hash of the graph, its inputs and
Inductor's config; compileq can only record what surrounds it (this machine's toolchain and
the Inductor key itself), so for a graph explain shows those, never which part of the graph's
hash changed. ``--last-misses`` covers every kind: the misses whose key material is logged
(kernels') one by one, and every other kind's misses as counted, with what can be asked next.

Everything read back comes from Redis, where anybody may write: a key of another type, a
record that is no JSON object or whose parts have other types, all read as absent; workers
are those whose heartbeat record verifies (cache/workers_seen.py).
"""

from __future__ import annotations

from typing import Any

import redis

from compileq import keys
from compileq._text import printable as _p
from compileq.cache import meta
from compileq.cache.counters import read_counters
from compileq.cache.stats import KINDS
from compileq.cache.workers_seen import read_workers
from compileq.errors import CompileqError
from compileq.fingerprint import Target, differences, flatten


class ExplainError(CompileqError):
    """What explain was asked about cannot be found."""


def components(record: dict[str, Any]) -> dict[str, Any]:
    """A record's components as dotted names: ``target``, ``config.use_static_triton_launcher``,
    ``toolchain.triton_version``, ``toolchain.codegen_env.TRITON_DEFAULT_FP_FUSION``, ...

    The material's ``toolchain`` entry is the digest of the toolchain record beside it, so it
    is shown once, through that record's parts.
    """
    material = {k: v for k, v in _dict(record.get("material")).items() if k != "toolchain"}
    return {**flatten(material), **flatten({"toolchain": _dict(record.get("toolchain"))})}


def _dict(value: object) -> dict[str, Any]:
    """A part of a record read from Redis, as a dict: anything else reads as empty."""
    return value if isinstance(value, dict) else {}


def compare(
    mine: dict[str, Any], theirs: dict[str, Any], mine_as: str, theirs_as: str
) -> list[dict[str, Any]]:
    a, b = components(mine), components(theirs)
    return [
        {"component": name, mine_as: a.get(name), theirs_as: b.get(name)}
        for name in differences(a, b)
    ]


def resolve_key(client: redis.Redis, text: str) -> str:
    """An artifact key from a full key or its bare digest."""
    if text.startswith(keys.ARTIFACT):
        return text
    found: list[str] = [
        k.decode(errors="replace")[len(keys.META) :]
        for k in client.scan_iter(match=f"{keys.META}{keys.ARTIFACT}*:{text}", count=1000)
    ]
    if len(found) == 1:
        return found[0]
    raise ExplainError(
        f"no recorded entry ends in {text!r}" if not found else f"{text!r} is ambiguous: {found}"
    )


def record_of(client: redis.Redis, key: str) -> dict[str, Any]:
    record = meta.read_meta(client, [key])[0]
    if record is None:
        raise ExplainError(
            f"no key material recorded for {key}: it was never stored, has expired, or was "
            f"built before compileq recorded key material"
        )
    return record


def here_record(record: dict[str, Any]) -> dict[str, Any]:
    """What this machine would put in the same kernel's key: its toolchain for the record's
    target and the ``extra_config`` Inductor sends here."""
    from compileq.fingerprint import local_toolchain
    from compileq.scheduler.recognise import inductor_extra_config

    material = dict(_dict(record.get("material")))
    if material.get("kind") != "triton":
        from compileq.fingerprint import host_identity

        return {"material": material, "toolchain": host_identity()}
    if not isinstance(material.get("target"), str):
        raise ExplainError("the recorded key material names no target to compare with")
    material["config"] = inductor_extra_config()
    toolchain = local_toolchain(Target.parse(material["target"])).describe()
    return {"material": material, "toolchain": toolchain}


def find_worker(
    client: redis.Redis, selector: str, secret: bytes | None = None, ttl_s: float = 15.0
) -> dict[str, Any]:
    """A live worker whose id, name or host matches ``selector`` (exactly, else as a part):
    one whose record verifies with ``secret`` (without one: signed and recent)."""
    workers = read_workers(client, secret, ttl_s).live
    exact = [w for w in workers if selector in (w.get("id"), w.get("name"), w.get("host"))] or [
        w for w in workers if selector in str(w.get("id"))
    ]
    if not exact:
        raise ExplainError(f"no live worker matches {selector!r}")
    return exact[0]


def worker_record(worker: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    material = _dict(record.get("material"))
    target = str(material.get("target"))
    toolchain = _dict(worker.get("toolchains")).get(target)
    if not isinstance(toolchain, dict):
        raise ExplainError(f"worker {worker.get('id')} does not build for {target}")
    return {"material": material, "toolchain": toolchain}


def explain_key(
    client: redis.Redis,
    text: str,
    against: str | None = None,
    secret: bytes | None = None,
    ttl_s: float = 15.0,
) -> dict[str, Any]:
    """The components of a key; with ``against`` (``here``, a worker, or another key) the
    components that differ. ``secret``, ``ttl_s``: how a worker's record is verified."""
    key = resolve_key(client, text)
    record = record_of(client, key)
    out: dict[str, Any] = {
        "key": key,
        "components": components(record),
        "built_by": record.get("by"),
        "host": record.get("host"),
        "seconds": record.get("seconds"),
    }
    if key.startswith(keys.artifact("fx", "")) or key.startswith(keys.artifact("aot", "")):
        out["note"] = GRAPH_NOTE
    if against is None:
        return out
    if against == "here":
        other, label = here_record(record), "here"
    elif against.startswith(keys.ARTIFACT) or _looks_like_digest(against):
        other_key = resolve_key(client, against)
        other, label = record_of(client, other_key), other_key
    else:
        worker = find_worker(client, against, secret, ttl_s)
        other, label = worker_record(worker, record), str(worker.get("id"))
    out["against"] = label
    out["differences"] = compare(record, other, "key", "other")
    return out


GRAPH_NOTE = (
    "graph keys are Inductor's own hash of the graph, its inputs and Inductor's config; "
    "compileq records the toolchain around it but cannot say which part of the graph changed"
)


def _looks_like_digest(text: str) -> bool:
    return len(text) >= 16 and all(c in "0123456789abcdef" for c in text)


def explain_toolchains(
    client: redis.Redis,
    selector: str,
    targets: list[Target],
    secret: bytes | None = None,
    ttl_s: float = 15.0,
) -> dict[str, Any]:
    """This machine's toolchain against a live worker's, per target the worker builds."""
    from compileq.fingerprint import local_toolchain

    worker = find_worker(client, selector, secret, ttl_s)
    published = _dict(worker.get("toolchains"))
    names = [str(t) for t in targets] or sorted(published)
    rows: list[dict[str, Any]] = []
    for name in names:
        theirs = published.get(name)
        if not isinstance(theirs, dict):
            rows.append({"target": name, "error": "the worker does not build for it"})
            continue
        try:
            mine = local_toolchain(Target.parse(name)).describe()
        except CompileqError as e:  # a target this compileq does not know
            rows.append({"target": name, "error": str(e)})
            continue
        a, b = flatten({"toolchain": mine}), flatten({"toolchain": theirs})
        rows.append(
            {
                "target": name,
                "differences": [
                    {"component": n, "here": a.get(n), "worker": b.get(n)}
                    for n in differences(a, b)
                ],
            }
        )
    return {"worker": worker.get("id"), "targets": rows}


def explain_last_misses(client: redis.Redis, n: int) -> dict[str, Any]:
    """The last ``n`` misses whose key material is logged, each by its nearest stored sibling
    and what differs (``misses``); and per kind, the misses counted since the counters were
    zeroed (``counted``), which for kinds other than Triton kernels are not logged one by one.
    ``problems``: what could not be read (a key of another type)."""
    problems: list[str] = []
    try:
        logged = meta.last_misses(client, n)
    except redis.ResponseError:  # WRONGTYPE: not the list compileq writes
        logged, problems = [], [f"{keys.MISSES} holds another Redis type than compileq writes"]
    rows = [_explain_miss(client, miss, problems) for miss in logged]
    counters = read_counters(client)
    counted = {
        kind.label: counters.get(kind.misses.value, 0)
        for kind in KINDS
        if kind.misses is not None and counters.get(kind.misses.value, 0)
    }
    return {"misses": rows, "counted": counted, "problems": problems}


def _explain_miss(client: redis.Redis, miss: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    material = _dict(miss.get("material"))
    row: dict[str, Any] = {
        "kind": str(material.get("kind")),
        "key": miss.get("key"),
        "name": miss.get("name"),
        "client": miss.get("client"),
        "time": miss.get("time"),
        "nearest": None,
        "differences": [],
    }
    if not isinstance(material.get("source"), str):
        row["reason"] = "its record names no source: no stored sibling can be looked up"
        return row
    try:
        stored = meta.sibling_keys(client, str(material.get("kind")), material["source"])
    except redis.ResponseError:  # WRONGTYPE
        problems.append("a siblings index holds another Redis type than compileq writes")
        stored = []
    siblings = [k for k in stored if k != miss.get("key")]
    best: tuple[int, str, list[dict[str, Any]]] | None = None
    for key, record in zip(siblings, meta.read_meta(client, siblings), strict=True):
        if record is None:
            continue
        diff = compare(miss, record, "miss", "stored")
        if best is None or len(diff) < best[0]:
            best = (len(diff), key, diff)
    if best is None:
        row["reason"] = (
            "a first build: no other entry of this kernel's source is stored; it "
            "is stored now under the key it missed"
            if miss.get("key") in stored
            else "no entry of this kernel's source is stored with any settings: "
            "never built, expired or evicted"
        )
    else:
        row["nearest"], row["differences"] = best[1], best[2]
    return row


#: What to do about misses counted but not logged one by one (graphs, C++ objects, modules).
UNLOGGED_HINT = (
    "their keys are Inductor's own hashes, not logged one by one: `compileq explain KEY` "
    "shows what a stored entry was built from, and `compileq doctor` whether this machine's "
    "toolchain matches the workers'"
)


# The renderers below print keys, hosts, worker ids, component names and values read from
# Redis: each goes through _p (compileq._text.printable), so a newline or a terminal escape in
# one cannot forge a line. Values are shown as repr() first, which keeps quotes and types.


def render_key(info: dict[str, Any]) -> str:
    lines = [
        f"{_p(str(info['key']))} (built by {_p(str(info.get('built_by')))} "
        f"on {_p(str(info.get('host')))})"
    ]
    components = {_p(str(k)): _p(repr(v)) for k, v in info["components"].items()}
    width = max((len(k) for k in components), default=0)
    lines += [f"  {k:<{width}}  {v}" for k, v in components.items()]
    if "note" in info:
        lines.append(f"note: {info['note']}")
    if "against" in info:
        against = _p(str(info["against"]))
        lines.append(f"against {against}:")
        if not info["differences"]:
            lines.append("  no component differs")
        for d in info["differences"]:
            lines.append(
                f"  {_p(str(d['component']))}: key {_p(repr(d['key']))}, "
                f"{against} {_p(repr(d['other']))}"
            )
    return "\n".join(lines)


def render_toolchains(info: dict[str, Any]) -> str:
    lines = [f"this machine against worker {_p(str(info['worker']))}"]
    for row in info["targets"]:
        target = _p(str(row["target"]))
        if "error" in row:
            lines.append(f"  {target}: {row['error']}")
        elif not row["differences"]:
            lines.append(f"  {target}: same toolchain")
        else:
            for d in row["differences"]:
                lines.append(
                    f"  {target}: {_p(str(d['component']))} here {_p(repr(d['here']))}, "
                    f"worker {_p(repr(d['worker']))}"
                )
    return "\n".join(lines)


def render_misses(result: dict[str, Any]) -> str:
    rows, counted = result["misses"], result["counted"]
    lines = [f"note: {_p(p)}" for p in result.get("problems", [])]
    if not rows and not counted:
        return "\n".join([*lines, "no misses recorded since the counters were last zeroed"])
    for row in rows:
        lines.append(
            f"miss {_p(str(row['name']))} ({_p(str(row['key']))}) by {_p(str(row['client']))}"
        )
        if row["nearest"] is None:
            lines.append(f"  {row['reason']}")
            continue
        lines.append(f"  nearest stored: {_p(str(row['nearest']))}")
        if not row["differences"]:
            lines.append("  no component differs (the entry was stored after this miss)")
        for d in row["differences"]:
            lines.append(
                f"  differs in {_p(str(d['component']))}: miss {_p(repr(d['miss']))}, "
                f"stored {_p(repr(d['stored']))}"
            )
    if counted:
        lines.append("misses counted since the counters were last zeroed:")
        lines += [f"  {label}: {n}" for label, n in counted.items()]
        if any(label != KINDS[0].label for label in counted):
            lines.append(f"  (other than Triton kernels, {UNLOGGED_HINT})")
    return "\n".join(lines)
