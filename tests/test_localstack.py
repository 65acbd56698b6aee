"""The private redis-server that the demo, the benchmarks, the local cluster and the tests
start: it must be the server that answers, even when its free port was taken first."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from compileq import localstack
from compileq.errors import CompileqError
from tests.conftest import start_redis


def first_free_port_is(monkeypatch: pytest.MonkeyPatch, taken: int) -> None:
    """``localstack.free_port`` answers ``taken`` once, as if another process took the port
    between that call and the server's bind; then free ports again."""
    real_free_port = localstack.free_port
    ports: Iterator[int] = iter([taken])
    monkeypatch.setattr(localstack, "free_port", lambda: next(ports, None) or real_free_port())


def test_a_private_redis_whose_port_was_taken_by_another_server_starts_on_another_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a port found free and then taken by another test's server was pinged, the
    # other server answered, and a benchmark went on against (and flushed) that one.
    other = start_redis(tmp_path / "other")
    try:
        other.client().set("theirs", b"kept")
        first_free_port_is(monkeypatch, other.port)
        mine = localstack.start_redis(tmp_path / "mine")
        try:
            assert mine.port != other.port
            assert mine.client().info("server")["process_id"] == mine.process.pid
            assert mine.client().get("theirs") is None
        finally:
            localstack.stop(mine.process)
        assert other.process.poll() is None and other.client().get("theirs") == b"kept"
    finally:
        localstack.stop(other.process)


def test_a_private_redis_on_a_port_held_by_a_plain_socket_starts_on_another_port(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The other way to lose the race: the port is some connection's or listener's, nobody
    # answers Redis on it, and the server exits at once.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        first_free_port_is(monkeypatch, taken)
        server = start_redis(tmp_path / "redis")
        try:
            assert server.port != taken and server.client().ping()
        finally:
            localstack.stop(server.process)


def test_a_port_the_caller_names_that_is_taken_is_a_clear_error_not_another_server(
    tmp_path: Path,
) -> None:
    other = start_redis(tmp_path / "other")
    try:
        with pytest.raises(CompileqError, match=f"did not start on port {other.port}"):
            localstack.start_redis(tmp_path / "mine", port=other.port)
        assert other.process.poll() is None
    finally:
        localstack.stop(other.process)
