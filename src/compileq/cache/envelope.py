"""The bytes of one cache entry: ``MAGIC | HMAC-SHA256 tag | zstd(payload)``.

The tag covers the magic, the entry's own Redis key and the compressed body, so an entry
copied under another key (or another kind, which is part of the key) fails the check just as
a flipped byte does. Nothing is decompressed, let alone unpickled, before the tag matches.
"""

from __future__ import annotations

import hashlib
import hmac

import zstandard

from compileq.errors import IntegrityError

MAGIC = b"CQ\x01"
_TAG = hashlib.sha256().digest_size
_HEADER = len(MAGIC) + _TAG
_LEVEL = 3  # zstd's default: kernels (ELF + pickle) shrink ~3x at ~200 MB/s.


def _tag(secret: bytes, key: str, body: bytes) -> bytes:
    return hmac.new(secret, MAGIC + key.encode() + b"\0" + body, hashlib.sha256).digest()


def seal(secret: bytes, key: str, payload: bytes) -> bytes:
    body = zstandard.ZstdCompressor(level=_LEVEL).compress(payload)
    return MAGIC + _tag(secret, key, body) + body


def verify(secret: bytes, key: str, blob: bytes) -> bytes:
    """The authenticated, still compressed body; :class:`IntegrityError` if not sealed by us.

    Split from decompression because a lookup only needs to know an entry is sound: for a
    batch of 1,000 kernels zstd costs twice the HMAC, and most hits are never read.
    """
    if len(blob) < _HEADER or not blob.startswith(MAGIC):
        raise IntegrityError(f"{key}: not a compileq entry (bad header or truncated)")
    tag, body = blob[len(MAGIC) : _HEADER], blob[_HEADER:]
    if not hmac.compare_digest(tag, _tag(secret, key, body)):
        raise IntegrityError(f"{key}: authentication failed (tampered, truncated or other secret)")
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
