"""``compileq doctor`` on a Sentinel deployment: who is master, who could take over, and
whether a failover happened.

Every Sentinel named in the URL is asked on its own (``SENTINEL MASTER``, ``SENTINEL
REPLICAS``), so a Sentinel that is down or disagrees shows. A failover is read from two
sources that survive a doctor run that did not see it happen:

- the master's ``config-epoch`` on the Sentinels: 0 until the first failover, and raised by
  each one; with the time the Sentinels have watched the current master (``role-reported-time``);
- a record doctor leaves on the master (``compileq:sentinel:<name>``: address and epoch): a
  later run that finds another address or epoch names the failover, from where to where.
  Subscribing to the Sentinels' ``+switch-master`` was rejected: doctor is a one-shot
  command and would only see failovers during its own run.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

import redis

from compileq.config import Settings
from compileq.connect import master_name, sentinels
from compileq.sentinel_url import SentinelUrl


@dataclass
class View:
    """What the Sentinels said about one master."""

    name: str
    listed: int  # Sentinels in the URL
    answered: list[str] = field(default_factory=list)  # host:port of those that answered
    errors: list[str] = field(default_factory=list)  # why the others did not
    unknown: list[str] = field(default_factory=list)  # answered, but watch no such master
    masters: Counter[str] = field(default_factory=Counter)  # master address -> Sentinels
    down: bool = False  # a Sentinel holds the master objectively down (o_down)
    epoch: int = 0
    quorum: int = 0
    watched_s: float | None = None  # how long the Sentinels have seen this master as master
    replicas: dict[str, str] = field(default_factory=dict)  # address -> "ok" or what is wrong

    @property
    def master(self) -> str | None:
        return self.masters.most_common(1)[0][0] if self.masters else None


def observe(target: SentinelUrl, settings: Settings) -> View:
    """Ask every Sentinel of ``target`` about the master ``COMPILEQ_SENTINEL_MASTER``."""
    name = master_name(settings)
    view = View(name, len(target.sentinels))
    manager = sentinels(target, settings)
    try:
        for (host, port), client in zip(target.sentinels, manager.sentinels, strict=True):
            where = f"{host}:{port}"
            try:
                # redis-py parses SENTINEL MASTER (typed values, str keys) but not SENTINEL
                # REPLICAS (bytes keys and values): both are read as text here.
                state = _text(client.execute_command("SENTINEL MASTER", name))  # type: ignore[no-untyped-call]
                raw = client.execute_command("SENTINEL REPLICAS", name)  # type: ignore[no-untyped-call]
                replicas = [_text(r) for r in raw] if isinstance(raw, list) else []
            except redis.ResponseError as e:  # "No such master with that name"
                view.answered.append(where)
                view.unknown.append(f"{where} ({e})")
                continue
            except redis.RedisError as e:
                view.errors.append(f"{where}: {e}")
                continue
            try:
                epoch, quorum = int(state["config-epoch"]), int(state["quorum"])
                watched = int(state["role-reported-time"]) / 1000
                address = f"{state['ip']}:{int(state['port'])}"
            except (KeyError, ValueError):
                view.errors.append(f"{where}: an unreadable SENTINEL MASTER reply")
                continue
            view.answered.append(where)
            view.masters[address] += 1
            view.down = view.down or "o_down" in _flags(state)
            view.epoch, view.quorum = max(view.epoch, epoch), max(view.quorum, quorum)
            view.watched_s = watched if view.watched_s is None else min(view.watched_s, watched)
            for replica in replicas:
                address = f"{replica.get('ip')}:{replica.get('port')}"
                view.replicas[address] = _replica_state(replica, view.replicas.get(address))
    finally:
        for client in manager.sentinels:
            client.close()
    return view


def _text(reply: object) -> dict[str, str]:
    """A Sentinel's description of an instance, keys and values as text; empty if no dict."""
    if not isinstance(reply, dict):
        return {}
    return {_str(k): _str(v) for k, v in reply.items()}


def _str(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _flags(state: dict[str, Any]) -> set[str]:
    """An instance's flags (``master``, ``s_down``, ``disconnected``...) as Sentinel wrote them."""
    return set(str(state.get("flags", "")).split(","))


def _replica_state(replica: dict[str, Any], before: str | None) -> str:
    """``ok``, or why the replica could not take over; once one Sentinel saw it healthy, ok."""
    if before == "ok":
        return before
    if _flags(replica) & {"s_down", "o_down", "disconnected"}:
        return "down"
    if str(replica.get("master-link-status")) != "ok":
        return "not in sync"
    return "ok"


@dataclass(frozen=True)
class Failover:
    """Whether and how the master changed: ``text`` is empty when it never did."""

    text: str
    new: bool  # since doctor last looked


def failover(client: redis.Redis, key: str, view: View) -> Failover:
    """Compare the master the Sentinels name with the one doctor recorded last time on the
    master itself, and record the current one. The record is written to the master, so it is
    replicated like any key; a failover that lost the record reads as one never looked at."""
    master = view.master or ""
    raw = cast("dict[bytes, bytes]", client.hgetall(key))
    seen = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in raw.items()}
    before, epoch_before = seen.get("master", ""), seen.get("epoch", "")
    at_before = float(seen["at"]) if seen.get("at", "").replace(".", "", 1).isdigit() else None
    seconds, micros = client.time()
    now = seconds + micros / 1e6
    if (before, epoch_before) != (master, str(view.epoch)):
        client.hset(key, mapping={"master": master, "epoch": view.epoch, "at": f"{now:.0f}"})
    watched = f"; master for {view.watched_s:.0f}s" if view.watched_s is not None else ""
    if before and (before != master or epoch_before != str(view.epoch)):
        ago = f" {now - at_before:.0f}s ago" if at_before is not None else ""
        return Failover(
            f"failed over from {before} to {master} since doctor last looked{ago} "
            f"(config epoch {epoch_before or '?'} -> {view.epoch}{watched})",
            True,
        )
    if view.epoch > 0:
        return Failover(f"has failed over before (config epoch {view.epoch}{watched})", False)
    return Failover("", False)


def describe(view: View) -> str:
    """One line: the master, its replicas, the Sentinels that answered."""
    master = view.master or "unknown"
    replicas = ", ".join(f"{a} {s}" for a, s in sorted(view.replicas.items())) or "none"
    sentinels = f"{len(view.answered) - len(view.unknown)} of {view.listed} Sentinels answer"
    quorum = f", quorum {view.quorum}" if view.quorum else ""
    return f"master {view.name!r} at {master}; replicas: {replicas}; {sentinels}{quorum}"
