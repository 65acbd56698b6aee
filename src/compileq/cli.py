"""The ``compileq`` command.

Exit codes: 0 done; 1 it ran but something failed (a build, a doctor check); 2 bad input
(a malformed setting, argument or manifest, or a Redis that cannot be reached), reported as one
``compileq: error:`` line on stderr, never a traceback. A traceback means a bug in compileq.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from compileq._text import printable, printable_values
from compileq.errors import CompileqError

if TYPE_CHECKING:
    from compileq.config import Settings
    from compileq.fingerprint import Target


#: Flags that override a setting: argparse's name for the flag, the setting, the flag as typed
#: (a bad value is reported under it, like any bad setting: config.load_settings).
_FLAG_SETTINGS = (
    ("redis_url", "redis_url", "--redis-url"),
    ("cpus", "worker_cpus", "--cpus"),
    ("leave_cores", "worker_leave_cores", "--leave-cores"),
)


def _settings(args: argparse.Namespace) -> Settings:
    from compileq.config import load_settings

    overrides: dict[str, object] = {}
    given_as: dict[str, str] = {}
    for dest, name, flag in _FLAG_SETTINGS:
        value = getattr(args, dest, None)
        if value is not None and value != "":  # not given: the environment's, else the default
            overrides[name], given_as[name] = value, flag
    settings = load_settings(given_as=given_as, **overrides)
    # Kept for main(): a Redis error names the URL it was talking to, without the password.
    args.redis_shown = settings.redis_display
    return settings


def cmd_worker(args: argparse.Namespace) -> int:
    from compileq.workers import supervisor

    settings = _settings(args)
    settings.secret_bytes()
    archs = [a for a in (args.arch or "").split(",") if a.strip()]
    specs = supervisor.plan(
        args.gpus,
        args.cpu_only,
        archs,
        args.concurrency,
        settings.worker_cpus,
        settings.worker_leave_cores,
    )
    specs = supervisor.with_metrics(specs, args.metrics_port)
    return supervisor.run(settings, specs, loglevel=args.loglevel)


def cmd_warm(args: argparse.Namespace) -> int:
    from compileq.scheduler.warm import read_manifest, stock_baseline, warm

    jobs = read_manifest(Path(args.manifest))
    report = stock_baseline(jobs) if args.stock else warm(jobs, _settings(args))
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(
            f"{report.kernels} kernels: {report.hits} hits, {report.remote} built remotely, "
            f"{report.local} built locally, {report.failed} failed, in {report.wall_s:.2f}s"
        )
    return 1 if report.failed else 0


def cmd_run(args: argparse.Namespace) -> int:
    import os
    from pathlib import Path

    command = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not command:
        print(
            "compileq: error: run needs a command, e.g. compileq run -- torchrun train.py",
            file=sys.stderr,
        )
        return 2
    boot = str(Path(__file__).parent / "_boot")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (boot, env.get("PYTHONPATH")) if p)
    if args.redis_url:
        env["COMPILEQ_REDIS_URL"] = args.redis_url
    # On by default here, unlike install(): `compileq run` is how a whole job is handed to
    # the cluster, and a graph with no worker for it still compiles in process.
    env["COMPILEQ_FX"] = "1" if args.fx else "0"
    try:
        os.execvpe(command[0], command, env)  # the command's exit code and signals are its own
    except OSError as e:
        print(f"compileq: error: cannot run {command[0]!r}: {e}", file=sys.stderr)
        return 127


def cmd_demo(args: argparse.Namespace) -> int:
    from compileq.demo import run_demo

    return run_demo(as_json=args.json)


def cmd_stats(args: argparse.Namespace) -> int:
    from compileq.cache.counters import reset_counters
    from compileq.cache.stats import render, snapshot
    from compileq.cache.store import RedisStore
    from compileq.connect import redis_client

    settings = _settings(args)
    store = RedisStore(redis_client(settings.redis_url, settings), settings)
    values = snapshot(store)
    # Worker ids, hosts, queue names and reasons come from Redis: escaped in text mode, so
    # none can forge a line (JSON escapes them itself).
    print(json.dumps(values) if args.json else render(printable_values(values)))
    if args.reset:
        reset_counters(store.client)
    return 0


def _targets(arch: str | None) -> list[Target] | None:
    from compileq.fingerprint import Target

    return [Target.parse(a) for a in (arch or "").split(",") if a.strip()] or None


def cmd_doctor(args: argparse.Namespace) -> int:
    from compileq.ops import doctor

    checks = doctor.run(_settings(args), _targets(args.arch))
    report = doctor.report(checks)
    print(json.dumps(report) if args.json else doctor.render(checks))
    return 0 if report["ok"] else 1


def cmd_explain(args: argparse.Namespace) -> int:
    from compileq.connect import redis_client
    from compileq.ops import explain

    settings = _settings(args)
    client = redis_client(settings.redis_url, settings)
    result: Any
    if args.last_misses is not None:
        result = explain.explain_last_misses(client, args.last_misses)
        text = explain.render_misses(result)
    elif args.key:
        result = explain.explain_key(client, args.key, args.diff)
        text = explain.render_key(result)
    elif args.diff and args.diff != "here":
        result = explain.explain_toolchains(client, args.diff, _targets(args.arch) or [])
        text = explain.render_toolchains(result)
    else:
        print(
            "compileq: error: explain needs a KEY, --last-misses [N] or --diff WORKER",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(result, default=str) if args.json else text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="compileq", description=__doc__)
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--redis-url", help="Redis URL (default: $COMPILEQ_REDIS_URL)")

    p = sub.add_parser("worker", help="run build workers on this node")
    common(p)
    p.add_argument("--gpus", help="'all' (default when GPUs exist) or indices like 0,1")
    p.add_argument("--cpu-only", action="store_true", help="cross-compile without a GPU")
    p.add_argument("--arch", help="with --cpu-only: targets to build for, e.g. sm_90,sm_80")
    p.add_argument(
        "--concurrency",
        type=int,
        help="builds at once per worker process (a graph's codegen hands its kernels to the "
        "others while one is free, so 2 or more)",
    )
    p.add_argument(
        "--cpus",
        help="run on these CPUs only, e.g. 0-15,32-47 (default: $COMPILEQ_WORKER_CPUS, else all)",
    )
    p.add_argument(
        "--leave-cores",
        type=int,
        help="physical cores left free for the training processes (default: "
        "$COMPILEQ_WORKER_LEAVE_CORES, else one per GPU served, none with --cpu-only)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus metrics on this port (one port per worker process, counting up)",
    )
    p.add_argument("--loglevel", default="INFO")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("warm", help="build every kernel of a JSONL manifest into the cache")
    common(p)
    p.add_argument("manifest", help="JSONL file, one {name, source} object per line")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--stock", action="store_true", help="baseline: build in stock Inductor's local pool only"
    )
    p.set_defaults(func=cmd_warm)

    p = sub.add_parser(
        "run", help="run a command with compileq active in every Python process it starts"
    )
    common(p)
    p.add_argument(
        "--fx",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate FX graphs' code on workers (default); --no-fx compiles graphs in process",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help="one training step: stock torch.compile against compileq")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("stats", help="show cluster-wide counters")
    common(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--reset", action="store_true", help="zero the counters after showing them")
    p.set_defaults(func=cmd_stats)

    p = sub.add_parser("doctor", help="check this machine and the cluster, with fix hints")
    common(p)
    p.add_argument("--arch", help="targets to check workers for, e.g. sm_90 (default: GPUs here)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("explain", help="show what went into a key and what made a miss")
    common(p)
    p.add_argument("key", nargs="?", help="an artifact key (compileq:a:triton:...) or its digest")
    p.add_argument(
        "--diff",
        nargs="?",
        const="here",
        metavar="AGAINST",
        help="compare with this machine (default), a live worker (id, name or host) or a key",
    )
    p.add_argument(
        "--last-misses",
        nargs="?",
        type=int,
        const=20,
        metavar="N",
        help="explain the last N kernel misses (default 20) by their nearest stored sibling",
    )
    p.add_argument("--arch", help="with --diff WORKER and no key: targets to compare")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)
    return parser


def _version() -> str:
    from compileq import __version__

    return f"compileq {__version__}"


#: The longest error line shown: enough for any of compileq's own messages.
_ERROR_LIMIT = 1000


def _error(message: str) -> int:
    # Escaped: messages quote manifest lines, file names and values read from Redis, and the
    # rule is one line.
    print(f"compileq: error: {printable(message, _ERROR_LIMIT)}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Run one command. Bad input of every known kind exits 2 with one line (here, so every
    command follows the same rule); any other exception is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        code: int = args.func(args)
        return code
    except CompileqError as e:  # ConfigError, ManifestError, ExplainError, UnsupportedTarget...
        return _error(str(e))
    except Exception as e:
        message = _input_error(e, getattr(args, "redis_shown", None))
        if message is None:
            raise  # a bug: its traceback stays
        return _error(message)


def _input_error(e: Exception, redis_shown: str | None) -> str | None:
    """The one line for a bad setting or an unreachable Redis; None for anything else.

    redis-py and pydantic are imported here, once something failed, not at the top: `compileq
    run` execs every job from this module, and they would delay each start (0.2 s on a 2-core
    machine, 0.5 s or more on a GPU VM)."""
    import redis
    from pydantic import ValidationError

    from compileq.config import Settings, settings_error

    if isinstance(e, ValidationError):
        if e.title != Settings.__name__:
            return None  # compileq has no other model: a bug
        return str(settings_error(e))  # a Settings built without load_settings()
    if not isinstance(e, (redis.ConnectionError, redis.TimeoutError)):
        return None
    # AuthenticationError is a ConnectionError; redis-py's messages name host and port, never
    # the password.
    where = f"Redis at {redis_shown or 'the configured URL'}"
    if isinstance(e, redis.AuthenticationError):
        return f"{where} refused authentication: check the user and password in the URL ({e})"
    if isinstance(e, redis.TimeoutError):
        return f"{where} did not answer in time ({e})"
    return f"{where} cannot be reached ({e})"


if __name__ == "__main__":
    sys.exit(main())
