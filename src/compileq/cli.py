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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from compileq import flags
from compileq._text import printable, printable_values
from compileq.errors import CompileqError, ConfigError

if TYPE_CHECKING:
    from compileq.config import Settings
    from compileq.fingerprint import Target


#: The most misses ``explain --last-misses`` takes: what compileq keeps (cache/meta.py's
#: MISS_LOG_LEN; not imported here, where every `compileq run` pays for imports).
MISSES_KEPT = 1000

#: Flags that override a setting: argparse's name for the flag, the setting, the flag as typed
#: (a bad value is reported under it, like any bad setting: config.load_settings).
_FLAG_SETTINGS = (
    ("redis_url", "redis_url", "--redis-url"),
    ("cpus", "worker_cpus", "--cpus"),
    ("leave_cores", "worker_leave_cores", "--leave-cores"),
)


#: The commands that, with no cluster named, use the local cluster (compileq/local/).
_LOCAL_COMMANDS = ("warm", "stats", "doctor", "explain", "forget-failures")


def _settings(args: argparse.Namespace) -> Settings:
    import os

    from compileq.config import load_settings

    overrides: dict[str, object] = {}
    given_as: dict[str, str] = {}
    for dest, name, flag in _FLAG_SETTINGS:
        value = getattr(args, dest, None)
        if value is not None and value != "":  # not given: the environment's, else the default
            overrides[name], given_as[name] = value, flag
    settings = load_settings(given_as=given_as, **overrides)
    if args.command in _LOCAL_COMMANDS and "redis_url" not in overrides:
        from compileq.local import control

        if not control.configured(os.environ):  # no cluster named: the local one
            settings = control.local_settings(settings, start=args.command == "warm")
            given_as["redis_url"] = "this user's local cluster: no COMPILEQ_REDIS_URL"
    # Kept for main(): a Redis error names the URL it was talking to, without the password.
    args.redis_shown = settings.redis_display
    args.redis_source = _source("redis_url", given_as)
    return settings


def _source(name: str, given_as: dict[str, str]) -> str:
    """Where a setting's value came from, as doctor names it: the flag, the variable, or
    the default."""
    import os

    variable = f"COMPILEQ_{name.upper()}"
    if name in given_as:
        return given_as[name]
    return variable if os.environ.get(variable) else f"the default ({variable} unset)"


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
    if args.metrics_port is not None and args.metrics_port + len(specs) - 1 > flags.MAX_PORT:
        raise ConfigError(
            f"--metrics-port={args.metrics_port} is not valid: {len(specs)} worker processes "
            f"take one port each, counting up, and the last would be above {flags.MAX_PORT}"
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
    else:
        from compileq.local import control

        if not control.configured(env):  # no cluster named: the local one, started if need be
            env = control.join_for_job(env)
    # On by default here, unlike install(): `compileq run` is how a whole job is handed to
    # the cluster, and a graph with no worker for it still compiles in process.
    env["COMPILEQ_FX"] = "1" if args.fx else "0"
    try:
        os.execvpe(command[0], command, env)  # the command's exit code and signals are its own
    except OSError as e:
        print(f"compileq: error: cannot run {command[0]!r}: {e}", file=sys.stderr)
        return 127


def cmd_stop(args: argparse.Namespace) -> int:
    from compileq.local import control

    print(f"compileq: {control.stop()}")
    return 0


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
    values = snapshot(store, settings)
    # Worker ids, hosts, queue names and reasons come from Redis: escaped in text mode, so
    # none can forge a line (JSON escapes them itself).
    if args.json:
        print(json.dumps(values))
    else:
        print(render(printable_values(values), everything=args.all))
    if args.zero:
        reset_counters(store.client)
        if not args.json:  # JSON stays one object, the last line
            print("counters zeroed")
    return 0


def cmd_forget_failures(args: argparse.Namespace) -> int:
    from compileq.cache import verdicts
    from compileq.connect import redis_client

    settings = _settings(args)
    dropped = verdicts.forget(redis_client(settings.redis_url, settings))
    print(
        f"compileq: forgot {dropped} graph{'' if dropped == 1 else 's'} failing codegen on "
        "workers; each goes to a worker again when next compiled"
    )
    return 0


def _targets(arch: str | None) -> list[Target] | None:
    from compileq.fingerprint import Target

    return [Target.parse(a) for a in (arch or "").split(",") if a.strip()] or None


def cmd_doctor(args: argparse.Namespace) -> int:
    from compileq.ops import doctor

    settings = _settings(args)
    checks = doctor.run(settings, _targets(args.arch), source=args.redis_source)
    report = doctor.report(checks)
    print(json.dumps(report) if args.json else doctor.render(checks))
    return 0 if report["ok"] else 1


def cmd_explain(args: argparse.Namespace) -> int:
    from compileq.connect import redis_client
    from compileq.ops import explain

    settings = _settings(args)
    client = redis_client(settings.redis_url, settings)
    # A worker is one whose heartbeat record verifies with this secret (when one is set).
    secret = settings.secret_bytes() if settings.secret else None
    ttl_s = settings.heartbeat_ttl_s
    result: Any
    if args.last_misses is not None:
        result = explain.explain_last_misses(client, args.last_misses)
        text = explain.render_misses(result)
    elif args.key:
        result = explain.explain_key(client, args.key, args.diff, secret, ttl_s)
        text = explain.render_key(result)
    elif args.diff and args.diff != "here":
        result = explain.explain_toolchains(
            client, args.diff, _targets(args.arch) or [], secret, ttl_s
        )
        text = explain.render_toolchains(result)
    else:
        print(
            "compileq: error: explain needs a KEY, --last-misses [N] or --diff WORKER",
            file=sys.stderr,
        )
        return 2
    print(json.dumps(result, default=str) if args.json else text)
    return 0


#: ``compileq --help``'s text: plain, as a terminal shows it (the module docstring is for
#: readers of the code).
DESCRIPTION = """\
compileq: torch.compile's builds on a cluster of workers, with a shared signed cache.

  compileq worker --gpus all         serve builds on this node
  compileq run -- torchrun train.py  run a job with compileq active
  compileq stats                     is it working? hits, builds, fallbacks, workers
  compileq doctor                    what is wrong, and how to fix it

Exit codes: 0 done; 1 it ran but something failed (a build, a doctor check); 2 bad input
(a setting, a flag, a manifest) or a Redis that cannot be reached, as one error line."""

#: What each subcommand's ``_add_*`` function adds its parser to.
Sub: TypeAlias = "argparse._SubParsersAction[flags.OneLineParser]"
#: A subcommand: a function that adds its parser to ``sub`` and sets its ``func``.
Adder: TypeAlias = Callable[[Sub], None]


def _subcommand(sub: Sub, name: str, summary: str, more: str) -> argparse.ArgumentParser:
    """A subcommand's parser: ``summary`` in ``compileq --help``'s list, and with ``more``
    as the description its own ``--help`` opens with."""
    return sub.add_parser(
        name,
        help=summary,
        description=f"{summary[0].upper()}{summary[1:]}.\n\n{more}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _redis_flag(p: argparse.ArgumentParser, default: str = "this user's local cluster") -> None:
    p.add_argument(
        "--redis-url",
        help=f"the cluster's Redis (default: $COMPILEQ_REDIS_URL, else {default})",
    )


def _json_flag(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON object")


def _add_worker(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "worker",
        "run build workers on this node",
        "One worker process per GPU, pinned to it, or one CPU process with --cpu-only\n"
        "(cross-compiling with --arch). Runs until SIGTERM or Ctrl-C; builds under way finish first.",
    )
    _redis_flag(p, "redis://127.0.0.1:6379/0")
    p.add_argument("--gpus", help="'all' (default when GPUs exist) or indices like 0,1")
    p.add_argument(
        "--cpu-only",
        action="store_true",
        help="no GPU: build this CPU's C++ objects and CPU graphs (and, with --arch, GPU kernels)",
    )
    p.add_argument("--arch", help="with --cpu-only: GPU targets to cross-compile, e.g. sm_90,sm_80")
    p.add_argument(
        "--concurrency",
        type=flags.int_in(1, flags.MAX_CONCURRENCY),
        help="builds at once per worker process (a graph's codegen hands its kernels to the "
        "others while one is free, so 2 or more; default: one per CPU it runs on)",
    )
    p.add_argument(
        "--cpus",
        help="run on these CPUs only, e.g. 0-15,32-47 (default: $COMPILEQ_WORKER_CPUS, else all)",
    )
    p.add_argument(
        "--leave-cores",
        type=int,
        help="physical cores left free for the training processes (default: "
        "$COMPILEQ_WORKER_LEAVE_CORES, else one per GPU served where it has 8 CPUs per GPU or "
        "more, none below that or with --cpu-only)",
    )
    p.add_argument(
        "--metrics-port",
        type=flags.port,
        help="serve Prometheus metrics on this port, 1 to 65535 (one port per worker process, "
        "counting up)",
    )
    p.add_argument(
        "--loglevel",
        type=flags.log_level,
        default="INFO",
        help=f"the worker log's level: {', '.join(flags.LOG_LEVELS)} (default INFO)",
    )
    p.set_defaults(func=cmd_worker)


def _add_warm(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "warm",
        "build every kernel of a JSONL manifest into the cache",
        "Each line is one {name, source} object, as Inductor writes a Triton kernel.",
    )
    _redis_flag(p)
    p.add_argument("manifest", help="JSONL file, one {name, source} object per line")
    _json_flag(p, "the counts")
    p.add_argument(
        "--stock", action="store_true", help="baseline: build in stock Inductor's local pool only"
    )
    p.set_defaults(func=cmd_warm)


def _add_run(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "run",
        "run a command with compileq active in every Python process it starts",
        "Example: compileq run -- torchrun --nproc-per-node 8 train.py\n"
        "With no COMPILEQ_REDIS_URL or --redis-url: on this user's local cluster, started if\n"
        "need be (`compileq stop` stops it).",
    )
    _redis_flag(p)
    p.add_argument(
        "--fx",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="generate FX graphs' code on workers (default); --no-fx compiles graphs in process",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=cmd_run)


def _add_stop(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "stop",
        "stop this user's local cluster now",
        "The local cluster (redis-server and a worker, started by `compileq run` with no\n"
        "COMPILEQ_REDIS_URL) otherwise stops itself after $COMPILEQ_LOCAL_IDLE_S without a job.",
    )
    p.set_defaults(func=cmd_stop)


def _add_demo(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "demo",
        "one training step: stock torch.compile against compileq",
        "Starts a private Redis and worker, and times a cold run, a warm one and a new machine.",
    )
    _json_flag(p, "the timings")
    p.set_defaults(func=cmd_demo)


def _add_stats(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "stats",
        "show what the cache and the workers did, cluster-wide",
        "By default one row per kind of build (requests, hits, hit rate, remote and local\n"
        "builds), the fallbacks by reason, the store's size and the workers per toolchain.",
    )
    _redis_flag(p)
    p.add_argument(
        "--all", action="store_true", help="also every counter, per queue, and the slowest builds"
    )
    _json_flag(p, "every counter and table")
    p.add_argument(
        "--zero",
        "--reset",
        dest="zero",
        action="store_true",
        help="zero the counters after showing them (--reset: the same)",
    )
    p.set_defaults(func=cmd_stats)


def _add_forget_failures(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "forget-failures",
        "send graphs whose codegen failed on a worker to workers again",
        "A graph whose codegen failed on a worker compiles in process, in every process, until\n"
        "its verdict expires ($COMPILEQ_FX_FAILURE_TTL_S); `compileq stats` lists them. Once\n"
        "the cause is fixed (a module installed on the workers, a new torch), this drops them.",
    )
    _redis_flag(p)
    p.set_defaults(func=cmd_forget_failures)


def _add_doctor(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "doctor",
        "check this machine and the cluster, with fix hints",
        "One line per check (ok, warn or FAIL); exit 1 when one fails.",
    )
    _redis_flag(p)
    p.add_argument(
        "--arch",
        help="targets to check workers for, e.g. sm_90 (default: this machine's GPUs, else "
        "every target workers serve)",
    )
    _json_flag(p, "the checks")
    p.set_defaults(func=cmd_doctor)


def _add_explain(sub: Sub) -> None:
    p = _subcommand(
        sub,
        "explain",
        "show what went into a key and what made a miss",
        "compileq explain KEY [--diff [AGAINST]]   a key's components, or how they differ\n"
        "compileq explain --last-misses [N]       the last misses of every kind\n"
        "compileq explain --diff WORKER           this machine's toolchain against a worker's",
    )
    _redis_flag(p)
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
        type=flags.int_in(1, MISSES_KEPT),
        const=20,
        metavar="N",
        help=f"explain the last N misses of every kind (default 20, at most {MISSES_KEPT}): "
        "a kernel's by its nearest stored sibling",
    )
    p.add_argument("--arch", help="with --diff WORKER and no key: targets to compare")
    _json_flag(p)
    p.set_defaults(func=cmd_explain)


#: The subcommands, in ``compileq --help``'s order: a new one is one more ``_add_*`` here.
COMMANDS: list[Adder] = [
    _add_worker,
    _add_warm,
    _add_run,
    _add_stop,
    _add_demo,
    _add_stats,
    _add_doctor,
    _add_explain,
    _add_forget_failures,
]


def build_parser() -> argparse.ArgumentParser:
    parser = flags.OneLineParser(
        prog="compileq",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=_version(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in COMMANDS:
        add(sub)
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
    if isinstance(e, redis.ResponseError):
        # NOAUTH and NOPERM (an ACL), or WRONGTYPE: a key of compileq's that someone wrote
        # with another type. The tools read around those they know; this is the rest.
        return (
            f"Redis at {redis_shown or 'the configured URL'} refused a command ({e}): check "
            "the URL's user and password, or run compileq doctor"
        )
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
