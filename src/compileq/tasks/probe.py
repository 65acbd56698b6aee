"""The signed probe a worker publishes with each heartbeat, so ``compileq doctor`` can tell
whether a worker holds the same ``COMPILEQ_SECRET`` without either side revealing it.

The worker signs its id, a fresh nonce and its wall clock with HMAC-SHA256 under the secret;
doctor recomputes the tag with its own secret. A match proves the same secret (HMAC keys are
not recoverable from tags); a mismatch is reported as "another secret". Rejected alternative:
a challenge the worker answers, which would make doctor wait a heartbeat interval per run and
give anyone who can write to Redis an HMAC oracle over chosen messages.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from typing import Any

#: Domain separation: a probe tag can never be mistaken for an entry's or a job's tag.
_DOMAIN = b"compileq-probe-v1\0"


def _tag(secret: bytes, worker_id: str, nonce: str, wall: float) -> str:
    message = _DOMAIN + f"{worker_id}\0{nonce}\0{wall!r}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def make_probe(secret: bytes, worker_id: str) -> dict[str, Any]:
    nonce, wall = secrets.token_hex(16), time.time()
    return {"nonce": nonce, "wall": wall, "sig": _tag(secret, worker_id, nonce, wall)}


def check_probe(secret: bytes, worker_id: str, probe: object) -> bool:
    """Whether ``probe`` was signed for ``worker_id`` with ``secret``."""
    if not isinstance(probe, dict):
        return False
    nonce, wall, sig = probe.get("nonce"), probe.get("wall"), probe.get("sig")
    if not isinstance(nonce, str) or not isinstance(wall, float) or not isinstance(sig, str):
        return False
    return hmac.compare_digest(_tag(secret, worker_id, nonce, wall), sig)
