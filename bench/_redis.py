"""A private redis-server for a benchmark run (or the one COMPILEQ_REDIS_URL names)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import redis


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    if url := os.environ.get("COMPILEQ_REDIS_URL"):
        yield url
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not found: install it or set COMPILEQ_REDIS_URL")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                workdir,
            ],
            stdout=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        try:
            for _ in range(200):
                with contextlib.suppress(redis.ConnectionError):
                    redis.Redis.from_url(url).ping()
                    break
                time.sleep(0.05)
            yield url
        finally:
            proc.terminate()
            proc.wait()
