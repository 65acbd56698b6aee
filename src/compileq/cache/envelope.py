"""The bytes of one cache entry: ``MAGIC | key id | HMAC-SHA256 tag | zstd(payload)``.

The tag covers the magic, the entry's own Redis key and the compressed body, so an entry
copied under another key (or another kind, which is part of the key) fails the check just as
a flipped byte does. Nothing is decompressed, let alone unpickled, before the tag matches.

The key id (8 bytes of an HMAC of a constant under the secret; it reveals nothing of the
secret) tells "sealed with another secret" apart from "damaged". The store deletes damaged
entries but leaves another secret's alone: without the distinction, one node started with a
wrong ``COMPILEQ_SECRET`` judged every good entry it read corrupt and deleted it, emptying the
cluster's cache.
"""

from __future__ import annotations

import functools
import hashlib
import hmac

import zstandard

from compileq.errors import ForeignSecret, IntegrityError

MAGIC = b"CQ\x02"
_KEY_ID = 8
_TAG = hashlib.sha256().digest_size
_HEADER = len(MAGIC) + _KEY_ID + _TAG
_LEVEL = 3  # zstd's default: kernels (ELF + pickle) shrink ~3x at ~200 MB/s.


@functools.lru_cache(maxsize=8)
def key_id(secret: bytes) -> bytes:
    """Which secret sealed an entry, without revealing it."""
    return hmac.new(secret, b"compileq key id", hashlib.sha256).digest()[:_KEY_ID]


def _tag(secret: bytes, key: str, body: bytes) -> bytes:
    return hmac.new(secret, MAGIC + key.encode() + b"\0" + body, hashlib.sha256).digest()


def seal(secret: bytes, key: str, payload: bytes) -> bytes:
    body = zstandard.ZstdCompressor(level=_LEVEL).compress(payload)
    return MAGIC + key_id(secret) + _tag(secret, key, body) + body


def verify(secret: bytes, key: str, blob: bytes) -> bytes:
    """The authenticated, still compressed body; :class:`IntegrityError` if not sealed by us.

    Split from decompression because a lookup only needs to know an entry is sound: for a
    batch of 1,000 kernels zstd costs twice the HMAC, and most hits are never read.
    """
    if len(blob) < _HEADER or not blob.startswith(MAGIC):
        raise IntegrityError(f"{key}: not a compileq entry (bad header or truncated)")
    sealed_by = blob[len(MAGIC) : len(MAGIC) + _KEY_ID]
    if sealed_by != key_id(secret):
        raise ForeignSecret(
            f"{key}: sealed with another secret (key id {sealed_by.hex()}, this process "
            f"{key_id(secret).hex()}): is COMPILEQ_SECRET the same on every node?"
        )
    tag, body = blob[len(MAGIC) + _KEY_ID : _HEADER], blob[_HEADER:]
    if not hmac.compare_digest(tag, _tag(secret, key, body)):
        raise IntegrityError(f"{key}: authentication failed (tampered or truncated)")
    return body


def decompress(key: str, body: bytes, max_bytes: int) -> bytes:
    """Decompress a body that :func:`verify` returned."""
    try:
        # max_output_size only binds frames that omit their size; check the declared one too.
        declared = zstandard.frame_content_size(body)
        if declared > max_bytes:
            raise zstandard.ZstdError(f"declares {declared} bytes, over the cap of {max_bytes}")
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=max_bytes)
    except zstandard.ZstdError as e:  # authentic but undecodable: a bug, still never unpickled
        raise IntegrityError(f"{key}: authentic entry failed to decompress: {e}") from e


def open_sealed(secret: bytes, key: str, blob: bytes, max_bytes: int) -> bytes:
    """Verify, then decompress: the payload of a sealed blob."""
    return decompress(key, verify(secret, key, blob), max_bytes)
