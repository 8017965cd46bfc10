"""Fuzz target: the PSI protocol's messages as a peer sends them (``confide.vertical.psi.intersect``).

One side runs for real over a channel whose received parts come from the input (4-byte length
frames, each a chunked :class:`~confide.vertical.channel.Channel` part: the first of a message
starts with its part count, then ``confide.vertical.wire`` bytes). The first byte picks the
side: the host (it receives the guest's hello, points and result) or the guest (the host's
hello, points and tags). A malformed or hostile message must be a :class:`ProtocolError`, a
:class:`WireFormatError` (a point that is not a valid group element: tests/unit/vertical/test_psi.py
pins that) or, for ids the peers cannot match, an :class:`InvalidParameterError`; nothing else.
"""

from __future__ import annotations

import _common

_common.quiet_threads()
with _common.instrumented(__name__):
    from confide.errors import InvalidParameterError, ProtocolError, WireFormatError
    from confide.vertical import psi
    from confide.vertical.channel import Channel

ALLOWED = (ProtocolError, WireFormatError, InvalidParameterError)
SESSION = "fuzz"
#: Each side's ids: two of three in common.
IDS = {"guest": ["r1", "r2", "r3"], "host": ["r2", "r3", "r4"]}


class OutOfInput(Exception):
    """The input holds no further message: the run ends there (not a finding)."""


class ReplayChannel(Channel):
    """A channel that sends nowhere and receives the input's frames in order."""

    def __init__(self, party: str, parts: list[bytes]) -> None:
        super().__init__()
        self.party = party
        self._parts = parts

    def _send_raw(self, recipients: list[str], key: str, payload: bytes) -> None:
        pass

    def _recv_raw(self, sender: str, key: str, timeout: float) -> bytes:
        if not self._parts:
            raise OutOfInput(key)
        return self._parts.pop(0)


def fuzz_one(data: bytes) -> None:
    """Run one side of the PSI against the input's messages."""
    if not data:
        return
    role = "host" if data[0] % 2 == 0 else "guest"
    channel = ReplayChannel("h" if role == "host" else "g", list(_common.frames(data[1:])))
    try:
        result = psi.intersect(channel, IDS[role], role=role, guest="g", hosts=["h"], session=SESSION, threads=1)
    except OutOfInput:
        return
    assert result.ndim == 1 and len(set(result.tolist())) == len(result)


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
