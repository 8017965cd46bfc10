"""Fuzz target: ``confide.vertical.wire.decode``, the format of every vertical-FL message.

A peer's bytes must decode to a mapping or raise :class:`ProtocolError`, whatever they hold
(bad magic, lengths, JSON, buffer references, dtypes, shapes, nesting).
"""

from __future__ import annotations

import _common

with _common.instrumented(__name__):
    from confide.errors import ProtocolError
    from confide.vertical import wire

ALLOWED = (ProtocolError,)


def fuzz_one(data: bytes) -> None:
    """Decode ``data``; a decoded message must be a dict."""
    message = wire.decode(data)
    assert isinstance(message, dict)


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
