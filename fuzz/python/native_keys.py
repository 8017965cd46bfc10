"""Fuzz target: Paillier key bytes through the Python API.

``EncryptionKey.from_bytes`` and ``DecryptionKey.import_secret``, the native decoders behind
them and the one error mapping.

The first byte picks the public (even) or the secret (odd) form. Bad bytes must be a
``ConfideError`` (the native errors are mapped into that family); an accepted key re-encodes to
the input.
"""

from __future__ import annotations

import _common

_common.quiet_threads()
with _common.instrumented(__name__):
    from confide.crypto import DecryptionKey, EncryptionKey
    from confide.errors import ConfideError

ALLOWED = (ConfideError,)


def fuzz_one(data: bytes) -> None:
    """Parse ``data[1:]`` as a public or a secret key."""
    if not data:
        return
    body = data[1:]
    if data[0] % 2 == 0:
        assert EncryptionKey.from_bytes(body).to_bytes() == body
    else:
        assert DecryptionKey.import_secret(body).export_secret() == body


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
