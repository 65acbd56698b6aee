"""The signed envelope around every cache entry and job spec."""

from __future__ import annotations

import pytest

from compileq.cache.envelope import open_sealed, seal
from compileq.errors import ForeignSecret, IntegrityError

KEY = "compileq:a:triton:abc"
PAYLOAD = b"payload " * 1000


def test_a_sealed_entry_opens_with_the_same_secret_and_key() -> None:
    blob = seal(b"s", KEY, PAYLOAD)
    assert open_sealed(b"s", KEY, blob, 10**6) == PAYLOAD
    assert len(blob) < len(PAYLOAD)  # compressed


def test_a_flipped_byte_fails_authentication() -> None:
    blob = bytearray(seal(b"s", KEY, PAYLOAD))
    blob[-5] ^= 0x01
    with pytest.raises(IntegrityError, match="authentication failed"):
        open_sealed(b"s", KEY, bytes(blob), 10**6)


def test_a_truncated_entry_fails() -> None:
    blob = seal(b"s", KEY, PAYLOAD)
    for cut in (0, 2, 20, len(blob) - 1):
        with pytest.raises(IntegrityError):
            open_sealed(b"s", KEY, blob[:cut], 10**6)


def test_an_entry_sealed_with_another_secret_fails_as_foreign_not_as_damaged() -> None:
    with pytest.raises(ForeignSecret, match="another secret"):
        open_sealed(b"mine", KEY, seal(b"theirs", KEY, PAYLOAD), 10**6)


def test_a_flipped_byte_under_our_own_key_id_is_damage_not_a_foreign_secret() -> None:
    blob = bytearray(seal(b"s", KEY, PAYLOAD))
    blob[-5] ^= 0x01
    with pytest.raises(IntegrityError) as raised:
        open_sealed(b"s", KEY, bytes(blob), 10**6)
    assert not isinstance(raised.value, ForeignSecret)


def test_an_entry_copied_under_another_key_or_kind_fails() -> None:
    blob = seal(b"s", KEY, PAYLOAD)
    with pytest.raises(IntegrityError):
        open_sealed(b"s", "compileq:a:fx:abc", blob, 10**6)


def test_decompression_is_capped() -> None:
    with pytest.raises(IntegrityError, match="decompress"):
        open_sealed(b"s", KEY, seal(b"s", KEY, PAYLOAD), 100)
