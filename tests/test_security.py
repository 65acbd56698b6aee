"""Redis with an ACL user and TLS: the whole path (client, broker, worker) over rediss://."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from compileq.localstack import free_port, stop
from tests.conftest import FIXTURES, Env, manifest_rows, run_cli, start_worker, stop_worker
from tests.reliability import Recorder

GPT = FIXTURES / "gpt_head.jsonl"


def make_ca(tmp: Path) -> Path:
    """A CA and a server certificate for 127.0.0.1, made here for this test only."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp, check=True, capture_output=True)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=compileq-test-ca",
    )
    run(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=127.0.0.1",
    )
    (tmp / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\n")
    run(
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "1",
        "-extfile",
        "ext.cnf",
    )
    return tmp


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    certs = make_ca(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(certs / "server.crt"),
            "--tls-key-file",
            str(certs / "server.key"),
            "--tls-ca-cert-file",
            str(certs / "ca.crt"),
            "--tls-auth-clients",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
            "--user",
            "default",
            "off",
            "--user",
            "compileq",
            "on",
            ">s3cret-pw",
            "~*",
            "&*",
            "+@all",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = tls_url(port, certs, "s3cret-pw")
    deadline = time.monotonic() + 10
    while True:
        try:
            redis.Redis.from_url(url).ping()
            break
        except redis.ConnectionError:
            assert time.monotonic() < deadline and proc.poll() is None, (
                "TLS redis-server did not start"
            )
            time.sleep(0.05)
    yield port, certs
    stop(proc)


def tls_url(port: int, certs: Path, password: str) -> str:
    return (
        f"rediss://compileq:{password}@127.0.0.1:{port}/0"
        f"?ssl_cert_reqs=required&ssl_ca_certs={certs / 'ca.crt'}"
    )


def test_a_cluster_behind_tls_and_an_acl_user_builds_and_serves_kernels(
    tls_redis: tuple[int, Path], env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    port, certs = tls_redis
    secure = Env(tls_url(port, certs, "s3cret-pw"), env.home)
    worker = start_worker(secure, tmp_path)
    try:
        n = len(manifest_rows(GPT))
        first = json.loads(
            run_cli(secure, "warm", str(GPT), "--json", tmp=tmp_path).stdout.splitlines()[-1]
        )
        assert (first["remote"], first["local"], first["failed"]) == (n, 0, 0)
        second = json.loads(
            run_cli(secure, "warm", str(GPT), "--json", tmp=tmp_path).stdout.splitlines()[-1]
        )
        assert second["hits"] == n
        # The server refuses the default user: nothing reached it unauthenticated or in clear.
        with pytest.raises(redis.RedisError) as refused:
            redis.Redis(host="127.0.0.1", port=port).ping()
        reliability.record(
            "plaintext, unauthenticated connection to a TLS + ACL Redis",
            "refused by the server; the cluster works over rediss:// with its ACL user",
            f"plain connection: {type(refused.value).__name__}; over TLS: {first['remote']}/{n} "
            f"built remotely, then {second['hits']}/{n} hits",
            n - second["hits"],
        )
    finally:
        stop_worker(worker)


def test_a_wrong_password_falls_back_to_local_builds_and_says_why(
    tls_redis: tuple[int, Path], env: Env, tmp_path: Path, reliability: Recorder
) -> None:
    port, certs = tls_redis
    wrong = Env(tls_url(port, certs, "not-the-password"), env.home)
    proc = run_cli(wrong, "warm", str(GPT), "--json", tmp=tmp_path)
    report = json.loads(proc.stdout.splitlines()[-1])
    assert (report["local"], report["failed"]) == (len(manifest_rows(GPT)), 0)
    assert "compiling locally" in proc.stderr and "invalid username-password" in proc.stderr
    assert "not-the-password" not in proc.stderr  # credentials never reach the log
    reliability.record(
        "wrong Redis password (ACL user) on a client",
        "local builds, the reason logged, the password never logged",
        f"{report['local']} local, {report['failed']} failed; log says 'invalid "
        "username-password'; password absent from the log",
        len(manifest_rows(GPT)) - report["local"] + report["failed"],
    )


@pytest.mark.parametrize(
    "url, shown",
    [
        ("rediss://user:pw@host:6380/0?ssl_ca_certs=/x", "rediss://user:***@host:6380/0"),
        ("redis://:pw@host/1", "redis://:***@host/1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_urls_in_logs_never_show_passwords(url: str, shown: str) -> None:
    from compileq.config import redact

    assert redact(url) == shown
