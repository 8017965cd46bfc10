"""Fuzz target: ``confide.protect.keys.decode_fields``, the self-describing key-exchange messages.

Announcements, wrapped keys and threshold shares travel in this form between parties; a bad
one must be a :class:`ProtocolError` naming what is wrong.
"""

from __future__ import annotations

import _common

with _common.instrumented(__name__):
    from confide.errors import ProtocolError
    from confide.protect.keys import decode_fields

ALLOWED = (ProtocolError,)


def fuzz_one(data: bytes) -> None:
    """Decode ``data`` asking for the fields of an announcement."""
    fields = decode_fields(data, "public")
    assert isinstance(fields, dict) and "public" in fields


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
