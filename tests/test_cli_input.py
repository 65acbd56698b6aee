"""Bad input to the ``compileq`` CLI: one ``compileq: error:`` line on stderr and exit 2, never a
traceback or a password; and values read from Redis printed escaped, never raw.

Real processes, nothing mocked: each case runs the CLI as a subprocess with a minimal
environment, and the escaping case reads a worker record from a private redis-server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

import compileq
from compileq._text import printable
from compileq.cache import liveness
from compileq.cache.meta import MISS_LOG_LEN
from compileq.cli import MISSES_KEPT, build_parser
from compileq.config import Settings, load_settings
from compileq.early_settings import EARLY_FLAGS, EARLY_TEXTS, env_flag
from compileq.errors import ConfigError
from compileq.flags import CONFIG_EXIT
from compileq.localstack import RedisServer, free_port
from tests.conftest import FIXTURES, SECRET, compileq_cmd
from tests.reliability import Recorder

#: A password that must never reach the output, whatever the case.
PASSWORD = "pw-never-shown-7f3a"
#: Control characters a value in Redis could use to forge a line or drive the terminal.
FORGERY = "\nok    workers        FORGED\x1b[31m\x1b]0;title\x07\r"


def cli(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``compileq ARGS`` with only PATH, HOME and the secret set, plus ``env``."""
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp), "COMPILEQ_SECRET": SECRET}
    return subprocess.run(
        compileq_cmd(*args),
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one line a bad input prints, after checking the rule every bad input follows."""
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "errors.pydantic.dev" not in output  # pydantic's "further information" noise
    assert PASSWORD not in output
    assert proc.stderr.strip().startswith("compileq: error: "), proc.stderr[-3000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-3000:]
    return proc.stderr.strip()


@pytest.mark.parametrize(
    "variable, value, expected",
    [
        ("COMPILEQ_DEADLINE_S", "abc", "expected a number greater than 0"),
        ("COMPILEQ_MAX_ENTRY_BYTES", "-1", "expected a whole number greater than 0"),
        ("COMPILEQ_WORKER_NICE", "25", "expected a whole number at least 0 and at most 19"),
        ("COMPILEQ_WORKER_LEAVE_CORES", "-1", "expected a whole number at least 0"),
        ("COMPILEQ_ENABLED", "maybe", "expected a boolean"),
        ("COMPILEQ_REDIS_URL", "redis://host:notaport/0", "port is a number from 0 to 65535"),
        (
            "COMPILEQ_REDIS_URL",
            "sentinel://a:26379;sentinel://b:x/0",
            "sentinel 2: expected a port",
        ),
        ("COMPILEQ_BROKER_URL", "sentinel://a/0;sentinel://b/1", "the parts name different"),
    ],
)
def test_a_wrong_typed_setting_is_one_line_naming_the_variable_and_exit_2(
    tmp_path: Path, variable: str, value: str, expected: str, reliability: Recorder
) -> None:
    line = error_line(cli(tmp_path, "stats", **{variable: value}))
    assert f"{variable}=" in line and "is not valid" in line and expected in line, line
    reliability.record(
        "CLI: a wrong-typed or malformed COMPILEQ_* value",
        "one 'compileq: error:' line naming the variable, exit 2, no traceback",
        f"{variable}={value!r}: exit 2, {line!r}",
        0,
        attacker="none (a setting)",
    )


def test_a_sentinel_url_without_the_masters_name_is_one_line_naming_what_is_missing(
    tmp_path: Path, reliability: Recorder
) -> None:
    url = f"sentinel://:{PASSWORD}@127.0.0.1:26379;sentinel://127.0.0.1:26380/0"
    line = error_line(cli(tmp_path, "stats", COMPILEQ_REDIS_URL=url))
    assert line == (
        "compileq: error: COMPILEQ_SENTINEL_MASTER is not set: COMPILEQ_REDIS_URL names "
        "Sentinels, which need the name of the master they watch (their `sentinel monitor "
        "NAME ...`)"
    ), line
    reliability.record(
        "CLI: a sentinel:// Redis URL without COMPILEQ_SENTINEL_MASTER",
        "one line naming the missing variable, exit 2, no password",
        f"exit 2, {line!r}",
        0,
        attacker="none (a setting)",
    )


def test_a_port_out_of_range_given_as_an_argument_is_named_as_that_argument(
    tmp_path: Path,
) -> None:
    line = error_line(cli(tmp_path, "stats", "--redis-url", "redis://127.0.0.1:99999/0"))
    assert "--redis-url=" in line and "port is a number from 0 to 65535" in line, line
    assert "COMPILEQ_REDIS_URL" not in line  # the environment did not set it


def test_a_workers_bad_cpu_flags_are_one_line_each_naming_the_flag_or_the_cpus(
    tmp_path: Path,
) -> None:
    worker = ("worker", "--cpu-only", "--arch", "sm_90")
    line = error_line(cli(tmp_path, *worker, "--leave-cores", "-1"))
    assert "--leave-cores=-1 is not valid: expected a whole number at least 0" in line, line
    assert "COMPILEQ_WORKER_LEAVE_CORES" not in line  # the environment did not set it
    line = error_line(cli(tmp_path, *worker, "--cpus", "x-1"))
    assert "bad CPU list 'x-1'" in line, line
    line = error_line(cli(tmp_path, *worker, "--cpus", "4096"))
    assert "CPUs 4096 are not among this process's" in line, line


def test_a_url_of_another_scheme_is_refused_without_its_password_or_pydantic_noise(
    tmp_path: Path, reliability: Recorder
) -> None:
    url = f"http://user:{PASSWORD}@host/0"
    line = error_line(cli(tmp_path, "stats", COMPILEQ_REDIS_URL=url))
    assert "COMPILEQ_REDIS_URL='http://user:***@host/0'" in line, line
    assert "expected a redis://, rediss:// or unix:// URL" in line
    reliability.record(
        "CLI: a Redis URL of another scheme, with a password in it",
        "one line, exit 2, the password replaced by ***",
        f"exit 2, {line!r}",
        0,
        attacker="none (a setting)",
    )


@pytest.mark.parametrize(
    "args",
    [["stats"], ["explain", "--last-misses"], ["explain", "0123456789abcdef0123"]],
    ids=["stats", "explain-misses", "explain-key"],
)
def test_a_redis_nobody_listens_on_is_named_redacted_and_exit_2(
    tmp_path: Path, args: list[str], reliability: Recorder
) -> None:
    port = free_port()  # bound then released: nobody listens there now
    url = f"redis://user:{PASSWORD}@127.0.0.1:{port}/0"
    line = error_line(cli(tmp_path, *args, COMPILEQ_REDIS_URL=url))
    assert f"Redis at redis://user:***@127.0.0.1:{port}/0 cannot be reached" in line, line
    reliability.record(
        "CLI: stats and explain with Redis down",
        "one line naming the redacted URL, exit 2, no traceback",
        f"compileq {' '.join(args)}: exit 2, {line!r}",
        0,
    )


@pytest.mark.parametrize(
    "bad, expected",
    [
        (b'{"name": "\xff\xfe"}', "not UTF-8"),
        (b"[" * 100_000, "not JSON (nested too deeply)"),
        (b'{"name": "k", "source": "\\ud800"}', "not UTF-8 text (a lone surrogate escape)"),
    ],
    ids=["not-utf8", "nested-100000-deep", "lone-surrogate-escape"],
)
def test_a_manifest_line_that_cannot_be_read_is_named_by_file_and_line(
    tmp_path: Path, bad: bytes, expected: str, reliability: Recorder
) -> None:
    # A good kernel first and a blank line: the number must count every line of the file.
    good = (FIXTURES / "gpt_head.jsonl").read_bytes().splitlines()[0]
    manifest = tmp_path / "kernels.jsonl"
    manifest.write_bytes(good + b"\n\n" + bad + b"\n")
    line = error_line(cli(tmp_path, "warm", str(manifest)))
    assert f"{manifest}:3: {expected}" in line, line
    reliability.record(
        "CLI: a manifest line that is not UTF-8, or JSON nested 100,000 deep",
        "one line naming file and line, exit 2, no traceback",
        f"exit 2, ...{line[-60:]!r}",
        0,
        attacker="write access to the manifest",
    )


@pytest.mark.parametrize("command", [["stats"], ["doctor", "--arch", "sm_90"]])
def test_worker_values_read_from_redis_are_printed_escaped_in_text_mode(
    redis_server: RedisServer, tmp_path: Path, command: list[str], reliability: Recorder
) -> None:
    db = 13  # its own database: the session's Redis is shared with other tests' workers
    client = redis_server.client(db)
    client.flushdb()
    worker_id = f"w1{FORGERY}"
    queue = f"compileq.triton.q{FORGERY}"
    info = {"id": worker_id, "host": f"host{FORGERY}", "queues": [queue], "concurrency": 1}
    # The same writes a worker's heartbeat makes, under compileq:worker:<id>; unsigned, as
    # anybody who can write to Redis could make them.
    liveness.beat(client, worker_id, [queue], 60.0, info)
    proc = cli(tmp_path, *command, COMPILEQ_REDIS_URL=redis_server.url(db))
    assert proc.returncode in (0, 1), proc.stderr[-3000:]  # doctor fails the forged worker
    assert "Traceback" not in proc.stderr
    assert "w1\\x0aok    workers        FORGED\\x1b[31m" in proc.stdout, proc.stdout
    for raw in ("\x1b", "\x07", "\r"):
        assert raw not in proc.stdout
    assert not any(
        line.startswith("ok    workers        FORGED") for line in proc.stdout.splitlines()
    )
    reliability.record(
        "a worker record in Redis with newlines and terminal escapes in its id and host",
        "printed escaped by stats and doctor: no forged line, no escape reaches the terminal",
        f"compileq {command[0]}: exit {proc.returncode}, printed as 'w1\\x0aok ... "
        f"FORGED\\x1b[31m...', no raw control character",
        0,
        attacker="write access to Redis",
    )


def test_load_settings_gives_non_cli_callers_the_same_one_line_error() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(deadline_s="abc", redis_url=f"http://u:{PASSWORD}@h/0")
    message = str(caught.value)
    assert "\n" not in message and PASSWORD not in message
    assert "deadline_s='abc' is not valid: expected a number greater than 0" in message
    assert "redis_url='http://u:***@h/0' is not valid" in message
    # Settings built directly still raise pydantic's error, but it no longer quotes the URL.
    with pytest.raises(ValueError) as direct:
        Settings(redis_url=f"http://u:{PASSWORD}@h/0")
    assert PASSWORD not in str(direct.value)


#: A boolean setting's spellings: those in use (1, 0, true, false, True, False) and the other
#: documented words in other cases, then what no boolean setting takes (pydantic's own rule took
#: the single letters; the start-up hook took anything but 0, false and False as on).
TRUE_SPELLINGS = ("1", "true", "True", "TRUE", "yes", "Yes", "on", "ON")
FALSE_SPELLINGS = ("0", "false", "False", "FALSE", "no", "No", "off", "OFF")
NOT_BOOLEANS = ("maybe", "", " 1", "0 ", "2", "-1", "t", "f", "y", "n", "enabled")
BOOLEAN_SETTINGS = [name for name, f in Settings.model_fields.items() if f.annotation is bool]


@pytest.mark.parametrize("value", [*TRUE_SPELLINGS, *FALSE_SPELLINGS, *NOT_BOOLEANS])
def test_every_boolean_setting_accepts_and_rejects_the_same_spellings_with_or_without_pydantic(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = True if value in TRUE_SPELLINGS else False if value in FALSE_SPELLINGS else None
    assert set(EARLY_FLAGS) <= set(BOOLEAN_SETTINGS) and len(BOOLEAN_SETTINGS) >= 12
    for name in BOOLEAN_SETTINGS:
        variable = f"COMPILEQ_{name.upper()}"
        with monkeypatch.context() as env:
            env.setenv(variable, value)
            if expected is None:
                with pytest.raises(ConfigError) as caught:
                    load_settings()
                message = str(caught.value)
                assert message == (
                    f"{variable}={value!r} is not valid: expected a boolean "
                    "(1, 0, true, false, yes, no, on or off)"
                ), message
            else:
                assert getattr(load_settings(), name) is expected, variable
            # What the start-up hook and the profile fetch read without pydantic: the same.
            if name in EARLY_FLAGS:
                if expected is None:
                    with pytest.raises(ConfigError) as early:
                        env_flag(name)
                    assert str(early.value) == message
                else:
                    assert env_flag(name) is expected, variable


def test_the_settings_read_before_pydantic_are_settings_fields_with_their_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Fields of Settings, so that README's table documents them (test_docs.py).
    for name in [*EARLY_FLAGS, *EARLY_TEXTS]:
        monkeypatch.delenv(f"COMPILEQ_{name.upper()}", raising=False)
    defaults = load_settings()
    for name, default in EARLY_FLAGS.items():
        assert Settings.model_fields[name].default is default is env_flag(name), name
        assert getattr(defaults, name) is default, name
    for name in EARLY_TEXTS:
        assert Settings.model_fields[name].default is None, name
    monkeypatch.setenv("COMPILEQ_JOB_ID", "pipeline")
    assert load_settings().job_id == "pipeline"


def test_the_start_up_hook_reads_compileq_enabled_by_the_one_rule_without_pydantic(
    tmp_path: Path,
) -> None:
    # The hook `compileq run` puts in every Python process: off for every false spelling, on
    # for every true one, and a bad value is one line saying so (compileq stays off, as
    # install() would keep it). It must not import pydantic or redis-py (about 0.45 s).
    boot = Path(compileq.__file__).parent / "_boot"
    probe = (
        "import sys\n"
        "hooked = any(type(f).__name__ == '_InstallWhenInductorLoads' for f in sys.meta_path)\n"
        "print(hooked, sorted(m for m in ('pydantic', 'redis') if m in sys.modules))\n"
    )
    cases = [("0", False), ("off", False), ("False", False), ("1", True), ("yes", True)]
    for value, hooked in [*cases, ("True", True), ("maybe", False)]:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(boot)}
        proc = subprocess.run(
            [sys.executable, "-c", probe],
            env={**env, "COMPILEQ_ENABLED": value},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == f"{hooked} []", (value, proc.stdout, proc.stderr)
        if value == "maybe":
            assert proc.stderr.strip() == (
                "compileq: not installed: COMPILEQ_ENABLED='maybe' is not valid: expected a "
                "boolean (1, 0, true, false, yes, no, on or off)"
            ), proc.stderr
        else:
            assert proc.stderr == "", (value, proc.stderr)


def test_printable_escapes_control_characters_and_cuts_long_values() -> None:
    assert printable("plain host-1") == "plain host-1"
    assert printable("a\nb\x1b[31m\u2028\u202e") == "a\\x0ab\\x1b[31m\\u2028\\u202e"
    cut = printable("x" * 300 + "\n", limit=10)
    assert cut == "x" * 10 + "...[291 more chars]"


def test_run_execs_the_job_without_importing_redis_or_pydantic(tmp_path: Path) -> None:
    # `compileq run` starts every job: what it imports before its exec delays each one (0.5 s
    # of redis-py and pydantic on a GPU VM). An audit hook reports the launcher's modules at
    # the exec itself; the job then runs.
    probe = (
        "import sys, os\n"
        "from compileq import cli\n"
        "def at_exec(event, args):\n"
        "    if event == 'os.exec':\n"
        "        loaded = sorted(m for m in ('redis', 'pydantic', 'torch') if m in sys.modules)\n"
        "        print('loaded before exec:', loaded, flush=True)\n"
        "sys.addaudithook(at_exec)\n"
        "sys.exit(cli.main(['run', '--', sys.executable, '-c', 'print(\"job ran\")']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        # A cluster named: without one, `compileq run` would start this user's local cluster
        # (tests/test_local_cluster.py), which imports nothing more here either.
        env={
            **os.environ,
            "COMPILEQ_SECRET": SECRET,
            "COMPILEQ_REDIS_URL": "redis://127.0.0.1:1/0",
        },
    )
    assert proc.returncode == 0, proc.stderr
    assert "loaded before exec: []" in proc.stdout and "job ran" in proc.stdout, proc.stdout


WORKER = ("worker", "--cpu-only", "--arch", "sm_90")


@pytest.mark.parametrize(
    "args, env, expected",
    [
        (["stats"], {"COMPILEQ_SECRET": "s\udcff"}, "COMPILEQ_SECRET is not valid: expected UTF-8"),
        (
            ["stats", "--redis-url", f"redis://u:{PASSWORD}@[zz/0"],
            {},
            "--redis-url='redis://***' is not valid: expected a Redis URL whose host",
        ),
        ([], {"COMPILEQ_REDIS_URL": "redis://h\udcff/0"}, "expected a URL of UTF-8 text"),
        ([], {"COMPILEQ_REDIS_URL": f"redis://{'a' * 100_000}/0"}, "at most 4096 characters"),
        ([], {"COMPILEQ_REDIS_URL": f"redis://{'a' * 64}.b/0"}, "labels of 1 to 63"),
        (
            [],
            {"COMPILEQ_REDIS_URL": "rediss://127.0.0.1/0?ssl_cert_reqs=bogus"},
            "ssl_cert_reqs in the URL to be one of none, optional, required",
        ),
        (
            [],
            {"COMPILEQ_REDIS_URL": "sentinel://h:26379/0?ssl_cert_reqs=bogus"},
            "ssl_cert_reqs in the URL to be one of",
        ),
        (
            [],
            {"COMPILEQ_REDIS_URL": "redis://127.0.0.1/0?socket_timeout=inf"},
            "socket_timeout in the URL to be a finite number",
        ),
        (
            [],
            {"COMPILEQ_CONNECT_TIMEOUT_S": "inf"},
            "COMPILEQ_CONNECT_TIMEOUT_S='inf' is not valid",
        ),
        ([], {"COMPILEQ_DEADLINE_S": "inf"}, "COMPILEQ_DEADLINE_S='inf' is not valid"),
        ([], {"COMPILEQ_HEARTBEAT_TTL_S": "nan"}, "COMPILEQ_HEARTBEAT_TTL_S='nan' is not valid"),
        ([], {"COMPILEQ_DEADLINE_S": "1e300"}, "at most 604800"),
        ([], {"COMPILEQ_TTL_S": "100000000000000000000"}, "at most 315360000"),
        (["explain", "--last-misses", "100000000000000000000"], {}, "from 1 to 1000"),
        (["explain", "--last-misses", "0"], {}, "from 1 to 1000"),
        ([*WORKER, "--concurrency", "-3"], {}, "--concurrency: -3 is not a whole number"),
        ([*WORKER, "--metrics-port", "99999"], {}, "--metrics-port: 99999 is not a whole"),
        ([*WORKER, "--metrics-port", "-5"], {}, "--metrics-port: -5 is not a whole number"),
        ([*WORKER, "--loglevel", "BOGUS"], {}, "'BOGUS' is not one of DEBUG, INFO"),
        (["no-such-command"], {}, "invalid choice: 'no-such-command'"),
    ],
    ids=lambda v: None,
)
def test_every_bad_setting_and_flag_is_one_line_and_exit_2(
    tmp_path: Path, args: list[str], env: dict[str, str], expected: str
) -> None:
    # Bytes that are not UTF-8 reach a process's environment as they are: encoded here as
    # Python would have decoded them (surrogateescape).
    raw = {k: os.fsencode(v) for k, v in env.items()}
    base = {b"PATH": os.fsencode(os.environ["PATH"]), b"HOME": os.fsencode(str(tmp_path))}
    base[b"COMPILEQ_SECRET"] = SECRET.encode()
    proc = subprocess.run(
        compileq_cmd(*(args or ["stats"])),
        env={**base, **{k.encode(): v for k, v in raw.items()}},
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
    )
    line = error_line(proc)
    assert expected in line, line


def test_a_bad_port_is_shown_as_typed_but_a_password_in_its_place_never(tmp_path: Path) -> None:
    line = error_line(cli(tmp_path, "doctor", "--redis-url", "redis://127.0.0.1:99999/0"))
    assert "'redis://127.0.0.1:99999/0'" in line, line
    # `@host` forgotten: what stands where the port goes is the password.
    line = error_line(cli(tmp_path, "stats", COMPILEQ_REDIS_URL=f"redis://user:{PASSWORD}/0"))
    assert "'redis://user:***/0'" in line, line


def test_a_worker_process_with_a_bad_configuration_exits_once_with_the_config_code(
    tmp_path: Path,
) -> None:
    base = [sys.executable, "-m", "compileq.workers.process", "--name", "cpu"]
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "COMPILEQ_SECRET": SECRET}
    cases = [
        ([*base, "--targets", "cuda-90-w32", "--concurrency", "-3"], env, "--concurrency"),
        (
            [*base, "--targets", "cuda-90-w32", "--concurrency", "1", "--loglevel", "BOGUS"],
            env,
            "--loglevel",
        ),
        (
            [*base, "--targets", "cuda-90-w32", "--concurrency", "1"],
            {**env, "COMPILEQ_DEADLINE_S": "inf"},
            "COMPILEQ_DEADLINE_S='inf'",
        ),
    ]
    for argv, child_env, expected in cases:
        proc = subprocess.run(argv, env=child_env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == CONFIG_EXIT, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and expected in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_the_supervisor_does_not_restart_a_worker_with_a_configuration_error(
    tmp_path: Path,
) -> None:
    # A child that can never start (here: a concurrency no check before it caught, as a
    # hand-edited deployment could pass) is started once; the supervisor exits 2.
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from compileq.config import load_settings\n"
        "from compileq.fingerprint import Target\n"
        "from compileq.workers import supervisor\n"
        "spec = supervisor.ChildSpec('cpu', (Target.parse('sm_90'),), -3, True, None)\n"
        "sys.exit(supervisor.run(load_settings(worker_nice=0), [spec]))\n"
    )
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "COMPILEQ_SECRET": SECRET}
    proc = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.count("started cpu (pid") == 1, proc.stderr
    assert "cannot start with this configuration; not restarting" in proc.stderr


def test_every_subcommand_and_flag_has_help_and_the_top_help_is_plain_text() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert set(sub.choices) >= {"worker", "warm", "run", "demo", "stats", "doctor", "explain"}
    for name, command in sub.choices.items():
        assert command.description, f"{name} has no description"
        for action in command._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    listed = {a.dest: a.help for a in sub._choices_actions}
    assert all(listed.get(name) for name in sub.choices), listed
    text = parser.format_help()
    assert "``" not in text and ":class:" not in text, text
    assert "compileq stats" in text


def test_explain_keeps_as_many_misses_as_it_takes() -> None:
    assert MISSES_KEPT == MISS_LOG_LEN


FLOAT_SETTINGS = [name for name, f in Settings.model_fields.items() if f.annotation is float]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "Infinity"])
def test_no_number_setting_takes_a_non_finite_value(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(FLOAT_SETTINGS) >= 7
    for name in FLOAT_SETTINGS:
        variable = f"COMPILEQ_{name.upper()}"
        with monkeypatch.context() as env:
            env.setenv(variable, value)
            with pytest.raises(ConfigError) as caught:
                load_settings()
            assert str(caught.value).startswith(f"{variable}={value!r} is not valid"), variable
