"""Fuzz target: ``EncryptedVector.from_bytes`` under a fixed key.

Ciphertext blocks as parties and the aggregator exchange them, including the codec's TLV
parameters of packed vectors.

Bad bytes must be a ``ConfideError``. An accepted vector re-encodes to bytes that decode to the
same vector (the codec's TLV values may arrive shorter than the encoder writes them).
"""

from __future__ import annotations

import _common

_common.quiet_threads()
with _common.instrumented(__name__):
    from confide.crypto import EncryptedVector, EncryptionKey
    from confide.errors import ConfideError

ALLOWED = (ConfideError,)
KEY = EncryptionKey.from_bytes(_common.fixture("paillier_public_key.bin"))


def fuzz_one(data: bytes) -> None:
    """Parse ``data`` as a ciphertext block under the fixture key."""
    encoded = EncryptedVector.from_bytes(data, KEY).to_bytes()
    assert EncryptedVector.from_bytes(encoded, KEY).to_bytes() == encoded


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
