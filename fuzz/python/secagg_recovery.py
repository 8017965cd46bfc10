"""Fuzz target: SecAgg recovery messages (shares and reveals) and Shamir reconstruction.

A survivor decodes each peer's reveal (``decode_fields``) and rebuilds secrets from the shares
in it (``confide.crypto.shamir.reconstruct``); whatever a peer or the relay sends, the outcome
must be a secret or a :class:`ProtocolError` naming what is wrong.
"""

from __future__ import annotations

import _common

with _common.instrumented(__name__):
    from confide.crypto import shamir
    from confide.errors import ProtocolError
    from confide.protect.keys import decode_fields

ALLOWED = (ProtocolError,)


def fuzz_one(data: bytes) -> None:
    """Decode ``data`` as a reveal and rebuild one secret from every share in it."""
    fields = decode_fields(data)
    shares = {x: value for x, (_, value) in enumerate(sorted(fields.items()), start=1) if isinstance(value, bytes)}
    if shares:
        secret = shamir.reconstruct(shares, len(shares), "fuzzed")
        assert len(secret) == 32


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
