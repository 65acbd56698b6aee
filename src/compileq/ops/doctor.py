"""``compileq doctor``: is this machine set up to use the cluster, and is the cluster sound?

Each check yields one line, ``ok``, ``warn`` or ``FAIL``, with a hint saying how to fix it.
Checks that need Redis are not run when Redis is out of reach: their verdict would only repeat
the first failure.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.sentinel import MasterNotFoundError

from compileq import keys
from compileq._text import printable
from compileq.cache import verdicts
from compileq.cache.counters import Counter, Reason, read_counters, read_fallback_reasons
from compileq.cache.store import RedisStore
from compileq.cache.workers_seen import WorkersSeen, read_workers
from compileq.config import Settings, redact
from compileq.connect import redis_client
from compileq.errors import CompileqError, ConfigError
from compileq.fingerprint import Target, differences, flatten
from compileq.ops import sentinel
from compileq.sentinel_url import is_sentinel, parse_sentinel_url

OK, WARN, FAIL = "ok", "warn", "FAIL"
#: Clock skew worth a warning, and skew that fails the check. Liveness and leases run on
#: Redis's clock, so skew never misroutes a kernel; it misleads logs and TLS certificate checks.
SKEW_WARN_S, SKEW_FAIL_S = 1.0, 60.0
#: The longest detail or hint shown in text mode: a check may list every worker.
LINE_LIMIT = 2000


@dataclass(frozen=True)
class Check:
    name: str
    status: str
    detail: str
    hint: str = ""

    def line(self) -> str:
        # Details and hints quote worker ids, hosts, fallback reasons and Redis's errors, read
        # from Redis: escaped, so a newline or a terminal escape in one cannot forge a line.
        detail, hint = printable(self.detail, LINE_LIMIT), printable(self.hint, LINE_LIMIT)
        text = f"{self.status:<4}  {self.name:<14} {detail}"
        return f"{text}\n      fix: {hint}" if hint and self.status != OK else text


def run(
    settings: Settings, targets: list[Target] | None, source: str = "COMPILEQ_REDIS_URL"
) -> list[Check]:
    """Every check, in order. ``source``: where the cache Redis's URL came from (the flag,
    the variable or the default), named in its line."""
    checks: list[Check] = [_features_check(settings)]
    cache = _redis_check(
        checks, "cache redis", settings.redis_url, settings, keys.DOCTOR, f"from {source}"
    )
    if is_sentinel(settings.redis_url):
        checks.append(
            _sentinel_check("cache sentinel", settings.redis_url, settings, cache, keys.SENTINEL)
        )
    if settings.broker_url and settings.broker_url != settings.redis_url:
        broker = _redis_check(
            checks,
            "broker redis",
            settings.broker_url,
            settings,
            keys.BROKER_DOCTOR,
            "from COMPILEQ_BROKER_URL",
        )
        if is_sentinel(settings.broker_url):
            checks.append(
                _sentinel_check(
                    "broker sentinel", settings.broker_url, settings, broker, keys.BROKER_SENTINEL
                )
            )
    else:
        checks.append(
            Check("broker redis", OK if cache else FAIL, f"same URL as the cache (from {source})")
        )
    try:
        secret: bytes | None = settings.secret_bytes()
    except ConfigError as e:
        secret = None
        checks.append(Check("secret", FAIL, "COMPILEQ_SECRET is not set", str(e)))
    if cache is None:
        for name in (
            "workers",
            "version skew",
            "gpu pinning",
            "clock skew",
            "fallbacks",
            "fx failures",
            "runtime tuning",
        ):
            checks.append(Check(name, WARN, "not checked: the cache Redis is out of reach"))
        return checks
    seen = read_workers(cache, secret, settings.heartbeat_ttl_s)
    if secret is not None:
        checks.append(_secret_check(seen))
    records = _records_check(seen)
    if records is not None:
        checks.append(records)
    workers = seen.live
    chosen, how = _targets(targets, workers)
    checks.extend(_worker_checks(cache, settings, workers, chosen, how, seen.foreign_records))
    checks.append(_pinning_check(workers))
    checks.append(_clock_check(cache, workers))
    checks.append(_fallback_check(cache))
    checks.append(_fx_failures_check(cache, settings if secret is not None else None))
    checks.append(_runtime_tuning_check(cache))
    return checks


# -- torch ------------------------------------------------------------------------------------


def _features_check(settings: Settings) -> Check:
    """compileq's features on this torch, as ``compileq run`` installs them: each target each
    feature hooks imported and checked (``hooks/targets.py``). A feature whose target moved in
    this release is off, and named; a release newer than the newest tested is said."""
    from compileq import features
    from compileq.hooks.targets import TESTED_TORCH, tested, torch_release

    try:
        states = features.survey(settings)
        release = torch_release()
    except Exception as e:  # torch itself missing or broken: jobs cannot compile at all
        return Check("features", FAIL, f"torch does not import ({type(e).__name__}: {e})")
    on = [s.name for s in states if s.on]
    by_setting = [s.name for s in states if not s.on and not s.moved]
    moved = [s for s in states if s.moved]
    detail = f"torch {release}: {len(on)} of {len(states)} on" + (
        f"; off by their settings: {', '.join(by_setting)}" if by_setting else ""
    )
    untested = "" if tested(release) else f"; newer than the newest tested ({TESTED_TORCH[-1]})"
    if not moved:
        return Check("features", OK if not untested else WARN, detail + untested, _UPGRADE)
    shown = "; ".join(f"{s.name} off: this torch {s.why}" for s in moved)
    return Check("features", WARN, f"{detail}; {shown}{untested}", _UPGRADE)


_UPGRADE = (
    "a feature whose target moved in this torch is off and its jobs build as stock there; "
    "a newer compileq may support it (docs/RELEASES.md lists what is tested)"
)


# -- Redis ------------------------------------------------------------------------------------


def _redis_check(
    checks: list[Check], name: str, url: str, settings: Settings, prefix: str, source: str
) -> redis.Redis | None:
    shown = f"{redact(url)} ({source})"
    if is_sentinel(url):
        shown = f"{redact(url)} (master {settings.sentinel_master!r}, {source})"
    client = redis_client(url, settings)
    try:
        started = time.perf_counter()
        client.ping()
        rtt_ms = (time.perf_counter() - started) * 1000
        # A write under compileq's prefix: an ACL user may read but not write, which would
        # make every build fail to store.
        probe = f"{prefix}{uuid.uuid4().hex}"
        client.set(probe, b"1", px=5000)
        client.delete(probe)
    except redis.AuthenticationError as e:
        checks.append(
            Check(
                name,
                FAIL,
                f"{shown}: authentication failed ({e})",
                "put the right user and password in the URL (redis://USER:PASSWORD@host:port/db) "
                "and check the server's ACL",
            )
        )
        return None
    except redis.ResponseError as e:  # NOAUTH, NOPERM: reachable but not allowed
        checks.append(
            Check(
                name,
                FAIL,
                f"{shown}: refused ({e})",
                "give the Redis user read and write access to keys compileq:* "
                "(ACL: ~compileq:* +@all -@dangerous), or add the password to the URL",
            )
        )
        return None
    except MasterNotFoundError as e:
        checks.append(
            Check(
                name,
                FAIL,
                f"{shown}: no master ({e})",
                "start the Sentinels, check that the URL lists them (sentinel://HOST:PORT;...) "
                "and that COMPILEQ_SENTINEL_MASTER is the NAME of their `sentinel monitor "
                "NAME ...`; during a failover, try again in a few seconds",
            )
        )
        return None
    except redis.RedisError as e:
        checks.append(
            Check(
                name,
                FAIL,
                f"{shown}: unreachable ({e})",
                "start redis-server there, or point the URL at it; check firewalls, TLS "
                "(rediss://) and the port",
            )
        )
        return None
    checks.append(Check(name, OK, f"{shown} answers and accepts writes ({rtt_ms:.1f} ms)"))
    return client


def _sentinel_check(
    name: str, url: str, settings: Settings, client: redis.Redis | None, record: str
) -> Check:
    """The Sentinels' view of the master: where it is, who could replace it, and whether it
    was replaced (ops/sentinel.py). ``client``: the master, when its check passed, where the
    master doctor saw last is recorded under ``record`` + the master's name."""
    view = sentinel.observe(parse_sentinel_url(url), settings)
    if view.master is None:
        if view.unknown:
            return Check(
                name,
                FAIL,
                f"the Sentinels watch no master named {view.name!r}: " + "; ".join(view.unknown),
                "set COMPILEQ_SENTINEL_MASTER to the NAME of their `sentinel monitor NAME host "
                "port quorum`",
            )
        return Check(
            name,
            FAIL,
            "no Sentinel answered: " + "; ".join(view.errors),
            "start the Sentinels, or list the right ones in the URL (sentinel://HOST:PORT;...)",
        )
    changed = sentinel.Failover("", False)
    if client is not None:
        try:
            changed = sentinel.failover(client, record + view.name, view)
        except redis.RedisError as e:  # the master went away meanwhile: say what is known
            changed = sentinel.Failover(f"failover record not read ({e})", False)
    problems = []
    if len(view.masters) > 1:
        problems.append(
            "the Sentinels disagree on the master ("
            + ", ".join(f"{a} by {n}" for a, n in view.masters.items())
            + "): a failover is under way or they are partitioned"
        )
    if view.down:
        problems.append("the master is down (o_down): a failover is due")
    if view.errors or view.unknown:
        problems.append(
            "not answering or not watching it: " + "; ".join(view.errors + view.unknown)
        )
    if len(view.answered) - len(view.unknown) < view.quorum:
        problems.append(f"fewer Sentinels answer than the quorum ({view.quorum}): no failover")
    if "ok" not in view.replicas.values():
        problems.append("no healthy replica: a failover would have nothing to promote")
    detail = "; ".join(p for p in (sentinel.describe(view), changed.text, *problems) if p)
    hints = []
    if changed.new:
        hints.append(
            "after a failover: entries written just before it may be lost (replication is "
            "asynchronous) and a client's next miss rebuilds them; restart the old master and "
            "the Sentinels make it a replica"
        )
    if problems:
        hints.append(
            "run three Sentinels on separate hosts, at least one replica in sync, and list "
            "every Sentinel in the URL (docs/DEPLOY.md, Redis high availability)"
        )
    return Check(name, WARN if hints else OK, detail, "; ".join(hints))


# -- secret -----------------------------------------------------------------------------------


def _secret_check(seen: WorkersSeen) -> Check:
    """Whether the live workers hold this secret: a worker's heartbeat record is signed with
    its secret, so a record signed and recent that does not verify here is a worker started
    with another secret (or a forgery: without the secret the two look alike). Unsigned
    records prove nothing either way and are left to the worker records' check."""
    workers, other = seen.live, seen.foreign
    if other:
        return Check(
            "secret",
            FAIL,
            f"{len(other)} of {len(workers) + len(other)} workers sign with another "
            "COMPILEQ_SECRET (or their records are forged): " + ", ".join(other),
            "give clients and workers the same COMPILEQ_SECRET and restart those workers; "
            "until then they reject every job from here",
        )
    if not workers:
        return Check("secret", WARN, "set here; no live worker to compare it with")
    return Check("secret", OK, f"all {len(workers)} live workers hold the same secret")


def _records_check(seen: WorkersSeen) -> Check | None:
    """Worker records that prove nothing (unsigned, stale, malformed, another Redis type):
    never counted as workers nor judged, only named; None when there are none."""
    if not seen.ignored and not seen.wrong_type:
        return None
    parts = []
    if seen.ignored:
        parts.append(
            f"{len(seen.ignored)} worker records in Redis are unsigned, stale or malformed "
            "and were ignored: " + ", ".join(seen.ignored[:10])
        )
    if seen.wrong_type:
        parts.append(
            "keys of another Redis type than compileq writes: " + ", ".join(seen.wrong_type[:10])
        )
    return Check(
        "worker records",
        WARN,
        "; ".join(parts),
        "not workers: left by an old compileq, or written by someone with write access to "
        "Redis; each expires, or delete it (DEL compileq:worker:<id>; ZREM compileq:workers "
        "<id>) and check who may write to this Redis",
    )


# -- workers and toolchains -------------------------------------------------------------------


def _targets(given: list[Target] | None, workers: list[dict[str, Any]]) -> tuple[list[Target], str]:
    if given:
        return given, "--arch"
    published = _published_targets(workers)
    # The GPUs here are asked only when a worker builds for a GPU at all and this machine may
    # have one: listing them can start a torch process (1.8 s measured on a CPU-only
    # machine), which told nothing when no worker was involved.
    if published and _may_have_gpus():
        from compileq.workers.gpus import probe_gpus

        try:
            gpus = probe_gpus()
        except CompileqError:
            gpus = []
        if gpus:
            return sorted({g.target for g in gpus}), "this machine's GPUs"
    return sorted(published), NO_GPU


#: How ``_targets`` says it found no GPU here and took every target workers serve.
NO_GPU = "no GPU here: every target workers serve"


def _published_targets(workers: list[dict[str, Any]]) -> set[Target]:
    found = set()
    for worker in workers:
        toolchains = worker.get("toolchains")
        for name in toolchains if isinstance(toolchains, dict) else ():
            try:
                found.add(Target.parse(name))
            except (CompileqError, ValueError):
                continue  # a target this compileq does not know: another version's worker
    return found


def _may_have_gpus() -> bool:
    """Whether an NVIDIA GPU may be here: its driver's device file or its tool."""
    return os.path.exists("/dev/nvidia0") or shutil.which("nvidia-smi") is not None


def _worker_checks(
    client: redis.Redis,
    settings: Settings,
    workers: list[dict[str, Any]],
    targets: list[Target],
    how: str,
    foreign: list[dict[str, Any]] | None = None,
) -> list[Check]:
    """Whether live workers serve ``targets``, and how their toolchains differ from this
    machine's; ``foreign``: records signed with another secret, whose claimed toolchains
    the version skew also compares (never counted as workers)."""
    from compileq.scheduler.routing import Router

    router = Router(client, settings)
    if not targets:
        return [
            Check(
                "workers",
                FAIL,
                "no live worker, and no target to check (no GPU here, no --arch)",
                "start workers (`compileq worker --gpus all`, or `--cpu-only --arch sm_90`), "
                "or say which target to check with --arch",
            ),
            Check("version skew", WARN, "not checked: no live worker"),
        ]
    served: list[tuple[Target, str, int]] = []
    unserved: list[tuple[Target, str, int]] = []
    why: dict[Target, str] = {}
    for target in targets:
        queue = router.queue(target)
        try:
            live = router.live_count(queue)  # workers whose signed heartbeat verifies
            if not live:
                why[target] = router.why_unserved(target)
        except redis.ResponseError as e:  # WRONGTYPE: a key compileq reads, of another type
            live, why[target] = 0, f"its workers cannot be read: {e}"
        (served if live else unserved).append((target, queue, live))
    checks = []
    # Without a GPU or --arch, one matching target is enough: the machine may never build
    # for the others.
    failed = unserved and (how != NO_GPU or not served)
    if failed:
        checks.append(
            Check(
                "workers",
                FAIL,
                "no live worker builds with this machine's toolchain for "
                + "; ".join(f"{t} ({why[t]})" for t, _, _ in unserved),
                "start a worker with the same torch, Triton, assembler and TRITON_* variables, "
                "or align this machine with the workers (see version skew)",
            )
        )
    else:
        detail = ", ".join(f"{t}: {n} live" for t, _, n in served)
        checks.append(Check("workers", OK, f"{detail} for this machine's toolchain ({how})"))
    checks.append(_skew_check(router, [*workers, *(foreign or [])], targets, bool(failed)))
    return checks


def _skew_check(
    router: Any, workers: list[dict[str, Any]], targets: list[Target], unserved: bool
) -> Check:
    skewed = []
    compared = 0
    for worker in workers:
        toolchains = worker.get("toolchains")
        for name, theirs in (toolchains if isinstance(toolchains, dict) else {}).items():
            try:
                target = Target.parse(name)
            except (CompileqError, ValueError):
                continue
            if target not in targets or not isinstance(theirs, dict):
                continue
            compared += 1
            mine = flatten(router.toolchain(target).describe())
            other = flatten(theirs)
            diff = differences(mine, other)
            if diff:
                parts = [f"{n} (worker {other.get(n)!r}, here {mine.get(n)!r})" for n in diff]
                skewed.append(f"{worker['id']} [{name}] differs in " + "; ".join(parts))
    if not compared:
        return Check("version skew", WARN, "no live worker builds for this machine's targets")
    if not skewed:
        return Check("version skew", OK, f"{compared} worker toolchains match this machine")
    return Check(
        "version skew",
        FAIL if unserved else WARN,
        " | ".join(skewed),
        "install the same torch and Triton (and assembler) on both sides and set the same "
        "TRITON_* variables; kernels only route to workers whose toolchain matches",
    )


# -- GPU pinning ------------------------------------------------------------------------------


def _pinning_check(workers: list[dict[str, Any]]) -> Check:
    gpu_workers = [w for w in workers if not w.get("cpu_only")]
    if not gpu_workers:
        return Check("gpu pinning", OK, f"no GPU workers ({len(workers)} cpu-only)")
    problems = []
    by_device: dict[tuple[str, str], list[str]] = defaultdict(list)
    for w in gpu_workers:
        visible = w.get("cuda_visible_devices")
        devices = [d for d in str(visible or "").split(",") if d.strip()]
        if len(devices) != 1:
            problems.append(f"{w['id']} sees CUDA_VISIBLE_DEVICES={visible!r}, not one GPU")
        else:
            by_device[(str(w.get("host")), devices[0])].append(w["id"])
    for (host, device), ids in by_device.items():
        if len(ids) > 1:
            problems.append(f"{', '.join(ids)} on {host} are all pinned to GPU {device}")
    if problems:
        return Check(
            "gpu pinning",
            FAIL,
            "; ".join(problems),
            "run one `compileq worker --gpus all` per node (it pins one process per GPU); do "
            "not start workers by hand with CUDA_VISIBLE_DEVICES unset or shared",
        )
    return Check("gpu pinning", OK, f"{len(gpu_workers)} GPU workers, one GPU each")


# -- fallbacks --------------------------------------------------------------------------------

#: What to do about the most frequent fallback reason (counters.Reason).
_FALLBACK_HINTS = {
    Reason.UNIMPORTABLE: "codegen needed the training script's own code on a worker, not only "
    "its names; the worker log names it (StandInCalled); such graphs compile in process",
    Reason.DEVICE: "graphs spanning several GPUs, or C++ wrapper code for cuda:k, k > 0, "
    "compile in process",
    Reason.SIZE_CAP: "raise COMPILEQ_MAX_ENTRY_BYTES (and Redis's proto-max-bulk-len with it)",
    Reason.DEADLINE: "add workers for the busy queue (compileq stats) or raise COMPILEQ_DEADLINE_S",
    Reason.WORKER_ERROR: "read the worker log: 'compileq worker: ... failed' says why",
    Reason.NO_WORKER: "start `compileq worker` on a node whose toolchain matches "
    "(`compileq doctor` above and `compileq explain --diff` say which)",
    Reason.UNSERIALIZABLE: "graphs Inductor will not pickle (torch.cond, user Triton kernels) "
    "compile in process as stock does; nothing to fix",
    Reason.REDIS: "Redis failed or was down: see the cache redis check",
    Reason.BROKER: "the broker refused or could not be reached: see the broker redis check",
    Reason.LOST: "outputs were evicted before clients read them: give Redis more memory",
    Reason.KNOWN_FAILURE: "graphs whose codegen failed on a worker before compile in process "
    "without another try: see the fx failures check",
    Reason.INTERNAL: "compileq's own code raised (a bug, or a value in Redis it could not "
    "read): the client log's 'compileq: internal error' line has the traceback; please report it",
}


def _fallback_check(client: redis.Redis) -> Check:
    """Builds and graphs that went local since the counters were last reset, and why."""
    total = read_counters(client)[Counter.FALLBACKS.value]
    reasons = read_fallback_reasons(client)
    if not total:
        return Check("fallbacks", OK, "none since the counters were last reset")
    if not reasons:
        return Check(
            "fallbacks", WARN, f"{total} builds or graphs went local (reason not recorded)"
        )
    top, count = max(reasons.items(), key=lambda kv: (kv[1], kv[0]))
    others = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()) if r != top)
    detail = f"{total} builds or graphs went local; most for {top!r} ({count})" + (
        f", then {others}" if others else ""
    )
    known = {r.value: r for r in Reason}
    hint = _FALLBACK_HINTS.get(known[top], "") if top in known else ""
    return Check("fallbacks", WARN, detail, hint + " (zero the counters: compileq stats --zero)")


def _fx_failures_check(client: redis.Redis, settings: Settings | None) -> Check:
    """The graphs the cluster remembers as failing codegen on workers (``cache/verdicts.py``):
    each compiles in process in every process that meets it, until its verdict expires.
    ``settings``: None where there is no secret to verify the verdicts with."""
    if settings is None:
        return Check("fx failures", WARN, "not checked: no COMPILEQ_SECRET to verify them with")
    found = verdicts.remembered(RedisStore(client, settings))
    if not found:
        return Check("fx failures", OK, "no graph is remembered as failing codegen on workers")
    reasons: dict[str, int] = defaultdict(int)
    for verdict in found:
        reasons[verdict.reason.value] += 1
    detail = (
        f"{len(found)} graphs fail codegen on workers ("
        + ", ".join(f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1]))
        + f"; newest: {found[0].describe()}); they compile in process without another try "
        "until their verdicts expire (COMPILEQ_FX_FAILURE_TTL_S on the workers)"
    )
    return Check(
        "fx failures",
        WARN,
        detail,
        "the worker log's 'FX codegen of <key> failed' line has the whole error: report it "
        "(an unimportable graph needs the training script's own code: install it on the "
        "workers); once fixed, `compileq forget-failures` sends them to workers again",
    )


def _runtime_tuning_check(client: redis.Redis) -> Check:
    """Kernels that benchmarked their configs at first launch in a training process
    (``inductor/runtime_tuning.py``): the one compile cost no other counter shows."""
    counters = read_counters(client)
    tuned = counters[Counter.RUNTIME_AUTOTUNES.value]
    found = counters[Counter.RUNTIME_TUNE_HITS.value]
    if not tuned:
        return Check(
            "runtime tuning",
            OK,
            f"no kernel benchmarked its configs at first launch in a client ({found} found "
            "their timings in the store)",
        )
    return Check(
        "runtime tuning",
        WARN,
        f"{tuned} kernel tunings benchmarked at first launch in clients, {found} found their "
        "timings in the store",
        "expected once per kernel on a cold cluster; if it grows with every job whose graphs "
        "hit, timings are not reaching the clients (same Redis, GPU model, torch and Triton "
        "as the first job?) (zero the counters: compileq stats --zero)",
    )


# -- clocks -----------------------------------------------------------------------------------


def _clock_check(client: redis.Redis, workers: list[dict[str, Any]]) -> Check:
    before = time.time()
    seconds, micros = client.time()
    after = time.time()
    here = (before + after) / 2 - (seconds + micros / 1e6)
    skews = {"this machine": here}
    for w in workers:
        wall, beat = w.get("wall"), w.get("beat")
        if isinstance(wall, (int, float)) and isinstance(beat, float):
            skews[str(w["id"])] = wall - beat
    worst_name, worst = max(skews.items(), key=lambda kv: abs(kv[1]))
    detail = f"against Redis's clock: this machine {here:+.3f}s" + (
        f", worst {worst_name} {worst:+.3f}s" if worst_name != "this machine" else ""
    )
    status = OK if abs(worst) < SKEW_WARN_S else WARN if abs(worst) < SKEW_FAIL_S else FAIL
    hint = (
        "synchronise clocks (chrony or systemd-timesyncd); routing uses Redis's clock and is "
        "unaffected, but logs and TLS certificate checks are not"
    )
    return Check("clock skew", status, detail, hint)


def report(checks: list[Check]) -> dict[str, Any]:
    return {"ok": all(c.status != FAIL for c in checks), "checks": [asdict(c) for c in checks]}


def render(checks: list[Check]) -> str:
    return "\n".join(c.line() for c in checks)
