"""Fuzz target: opening sealed messages (``GroupCipher.open``) and peer announcements (``PeerKeys.accept``).

The first byte picks which. A sealed group message that is short or forged must be a
:class:`ProtocolError`; an announcement (fields, then a PEM certificate and a signature checked
against the federation CA) must be a :class:`ProtocolError` or a :class:`CertificateError`.
"""

from __future__ import annotations

import tempfile

import _common

with _common.instrumented(__name__):
    from confide.errors import CertificateError, ProtocolError
    from confide.protect.keys import GroupCipher, PeerKeys
    from confide.transport.certs import Identity, init_federation

ALLOWED = (ProtocolError, CertificateError)
JOB = "fuzz-job"
_state: dict = {}


def _receiver() -> PeerKeys:
    """Party a's keys in a federation made once per process (a fresh CA: seeds never verify)."""
    if "keys" not in _state:
        with tempfile.TemporaryDirectory() as directory:
            init_federation(directory, parties=["a", "b"])
            _state["keys"] = PeerKeys(Identity.load(directory, "a"), JOB)
        _state["group"] = GroupCipher(bytes(range(32)), JOB)
    return _state["keys"]


def fuzz_one(data: bytes) -> None:
    """Open ``data[1:]`` as a group message (even first byte) or accept it as b's announcement."""
    keys = _receiver()
    if not data:
        return
    if data[0] % 2 == 0:
        _state["group"].open("fuzz/tag", "b", data[1:])
    else:
        keys.accept("b", data[1:])


if __name__ == "__main__":
    _common.main(fuzz_one, ALLOWED)
