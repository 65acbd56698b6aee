"""The Redis a benchmark run uses: COMPILEQ_REDIS_URL, or a private redis-server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from compileq.localstack import private_redis


@contextlib.contextmanager
def redis_url() -> Iterator[str]:
    if url := os.environ.get("COMPILEQ_REDIS_URL"):
        yield url
        return
    with private_redis() as server:
        yield server.url()
