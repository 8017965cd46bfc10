"""Fuzz target: the threshold mode's messages between key holders.

The first byte picks the decoder: a threshold public key (``ThresholdPublicKey.from_bytes``), a
partial decryption under the fixture modulus (``PartialDecryption.from_bytes``), a message of
partial decryptions by slice (``_unpack_blobs``) or a dealt key share (``_dealt_key``). A
malformed message must be a :class:`ProtocolError`.
"""

from __future__ import annotations

import _common

with _common.instrumented(__name__):
    from confide.crypto import EncryptionKey
    from confide.crypto.threshold import PartialDecryption, ThresholdPublicKey
    from confide.errors import ProtocolError
    from confide.protect import threshold

ALLOWED = (ProtocolError,)
N = EncryptionKey.from_bytes(_common.fixture("paillier_public_key.bin")).n


def fuzz_one(data: bytes) -> None:
    """Decode ``data[1:]`` with the decoder ``data[0]`` picks."""
    if not data:
        return
    which, body = data[0] % 4, data[1:]
    if which == 0:
        public = ThresholdPublicKey.from_bytes(body)
        assert ThresholdPublicKey.from_bytes(public.to_bytes()) == public
    elif which == 1:
        partial = PartialDecryption.from_bytes(body, N)
        assert all(0 < value < N * N for value in partial.values)
    elif which == 2:
        blobs = threshold._unpack_blobs(body)
        assert all(isinstance(index, int) and isinstance(blob, bytes) for index, blob in blobs.items())
    else:
        threshold._dealt_key(body, 2)


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
