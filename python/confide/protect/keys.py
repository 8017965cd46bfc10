"""Authenticated key agreement between parties, wrapping, group encryption and the mask PRG.

- Each party makes an X25519 key pair per job and announces the public half signed with its
  certificate key (ECDSA P-256); the relay (the aggregator) forwards it but cannot substitute
  it, because every receiver checks the certificate against the federation CA and that its
  name is the claimed sender (algorithms.md §4.3, item 1).
- Pair keys: ``K_uv = HKDF-SHA256(X25519(sk_u, pk_v), salt = job_id,
  info = "confide-<purpose>-v1" | min(u, v) | max(u, v))``; one purpose per use (masks, wrap).
- Wrapping (the leader sending the shared Paillier key and the group key to one party):
  AES-256-GCM under the pair key, with (job, tag, sender, recipient) as associated data.
- Group encryption (decrypted shares among parties): AES-256-GCM under the group key.
- PRG: ChaCha20 keystream read as little-endian uint32 words; per (round, attempt) keys from
  HKDF-Expand and the slice index as nonce, so no (key, nonce) pair is ever used twice.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import struct

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from confide.crypto.identity import Identity, verify_signature
from confide.errors import CertificateError, ProtocolError

__all__ = ["GroupCipher", "PeerKeys", "decode_fields", "encode_fields", "prg_words", "round_key"]

_NONCE = 12


def encode_fields(**fields: object) -> bytes:
    """A small self-describing message (JSON; bytes values in base64)."""
    out = {}
    for name, value in fields.items():
        out[name] = {"b64": base64.b64encode(value).decode()} if isinstance(value, bytes) else value
    return json.dumps(out, sort_keys=True).encode()


def decode_fields(data: bytes, *required: str) -> dict:
    """Inverse of :func:`encode_fields`; a missing field is a :class:`ProtocolError` naming it."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        raise ProtocolError(f"message is not a valid fields encoding: {error}") from None
    if not isinstance(raw, dict):
        raise ProtocolError("message is not a valid fields encoding: not an object")
    fields = {}
    for name, value in raw.items():
        if isinstance(value, dict) and "b64" in value:
            try:
                value = base64.b64decode(value["b64"], validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise ProtocolError(f"message field {name!r} is not valid base64") from None
        fields[name] = value
    missing = [name for name in required if name not in fields]
    if missing:
        raise ProtocolError(f"message lacks field(s) {', '.join(missing)}")
    return fields


def _statement(job_id: str, party: str, public: bytes) -> bytes:
    return b"confide-announce-v1\x00" + job_id.encode() + b"\x00" + party.encode() + b"\x00" + public


class PeerKeys:
    """The X25519 key of this party for one job and the verified public keys of its peers."""

    def __init__(self, identity: Identity, job_id: str) -> None:
        self._identity = identity
        self._job_id = job_id
        self._private = X25519PrivateKey.generate()
        self.public = self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self._peers: dict[str, X25519PublicKey] = {}
        self._pair_cache: dict[tuple[str, bytes], bytes] = {}
        #: The verified signed announcements, by party (ours too), to hand a rejoining party.
        self.announcements: dict[str, bytes] = {}

    def announcement(self) -> bytes:
        """The signed announcement of this party's public key."""
        mine = self.announcements.get(self._identity.name)
        if mine is None:
            statement = _statement(self._job_id, self._identity.name, self.public)
            mine = encode_fields(
                public=self.public, certificate=self._identity.cert_pem, signature=self._identity.sign(statement)
            )
            self.announcements[self._identity.name] = mine
        return mine

    def accept(self, peer: str, announcement: bytes, *, replace: bool = False) -> None:
        """Verify a peer's announcement (CA, name, signature) and remember its key.

        ``replace``: the peer restarted with a new key (it rejoins); its old pair keys are dropped.
        A second, different key is otherwise a protocol error.
        """
        fields = decode_fields(announcement, "public", "certificate", "signature")
        public = fields["public"]
        if not isinstance(public, bytes) or len(public) != 32:
            raise ProtocolError(f"announcement of {peer!r}: public key must be 32 bytes")
        for name in ("certificate", "signature"):
            if not isinstance(fields[name], bytes):
                raise ProtocolError(f"announcement of {peer!r}: {name} must be bytes")
        known = self._peers.get(peer)
        if known is not None and replace:
            if known.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) == public:
                return
            known = None
        if known is not None:
            if known.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw) != public:
                raise ProtocolError(f"{peer!r} announced a second, different key for job {self._job_id!r}")
            return
        try:
            verify_signature(
                fields["certificate"],
                self._identity.ca_pem,
                _statement(self._job_id, peer, public),
                fields["signature"],
                expected_name=peer,
            )
        except CertificateError as error:
            raise CertificateError(f"announcement of {peer!r} refused: {error}") from None
        self._peers[peer] = X25519PublicKey.from_public_bytes(public)
        self._pair_cache = {k: v for k, v in self._pair_cache.items() if k[0] != peer}
        self.announcements[peer] = announcement

    def pair_key(self, peer: str, purpose: bytes) -> bytes:
        """``K_uv`` for ``purpose`` (32 bytes), identical on both sides."""
        cached = self._pair_cache.get((peer, purpose))
        if cached is not None:
            return cached
        if peer not in self._peers:
            raise ProtocolError(f"no verified key of {peer!r} (its announcement has not arrived)")
        shared = self._private.exchange(self._peers[peer])
        low, high = sorted((self._identity.name, peer))
        info = b"confide-" + purpose + b"-v1\x00" + low.encode() + b"\x00" + high.encode()
        key = HKDF(hashes.SHA256(), 32, salt=self._job_id.encode(), info=info).derive(shared)
        self._pair_cache[(peer, purpose)] = key
        return key

    def seal_to(self, peer: str, tag: str, plaintext: bytes) -> bytes:
        """Encrypt ``plaintext`` for ``peer`` alone."""
        aad = _aad(self._job_id, tag, self._identity.name, peer)
        nonce = os.urandom(_NONCE)
        return nonce + AESGCM(self.pair_key(peer, b"wrap")).encrypt(nonce, plaintext, aad)

    def open_from(self, peer: str, tag: str, sealed: bytes) -> bytes:
        """Decrypt what ``peer`` sealed for this party."""
        aad = _aad(self._job_id, tag, peer, self._identity.name)
        _check_sealed(sealed, f"message {tag!r} from {peer!r}")
        try:
            return AESGCM(self.pair_key(peer, b"wrap")).decrypt(sealed[:_NONCE], sealed[_NONCE:], aad)
        except InvalidTag:
            raise ProtocolError(f"message {tag!r} from {peer!r} fails authentication") from None


class GroupCipher:
    """AES-256-GCM under the group key every participant holds."""

    def __init__(self, key: bytes, job_id: str) -> None:
        if len(key) != 32:
            raise ProtocolError(f"group key must be 32 bytes, got {len(key)}")
        self._aead = AESGCM(key)
        self._job_id = job_id

    def seal(self, tag: str, sender: str, plaintext: bytes) -> bytes:
        """Encrypt for every holder of the group key."""
        nonce = os.urandom(_NONCE)
        return nonce + self._aead.encrypt(nonce, plaintext, _aad(self._job_id, tag, sender, "*"))

    def open(self, tag: str, sender: str, sealed: bytes) -> bytes:
        """Decrypt a group message from ``sender``."""
        _check_sealed(sealed, f"group message {tag!r} from {sender!r}")
        try:
            return self._aead.decrypt(sealed[:_NONCE], sealed[_NONCE:], _aad(self._job_id, tag, sender, "*"))
        except InvalidTag:
            raise ProtocolError(f"group message {tag!r} from {sender!r} fails authentication") from None


def _check_sealed(sealed: bytes, what: str) -> None:
    if not isinstance(sealed, bytes) or len(sealed) < _NONCE + 16:
        raise ProtocolError(f"{what} is too short to be sealed ({len(sealed)} bytes, minimum {_NONCE + 16})")


def _aad(job_id: str, tag: str, sender: str, recipient: str) -> bytes:
    return "\x00".join(("confide-aad-v1", job_id, tag, sender, recipient)).encode()


def round_key(key: bytes, label: bytes, round_number: int, attempt: int) -> bytes:
    """A per-(round, attempt) PRG key: HKDF-Expand(key, label | round | attempt)."""
    info = label + b"\x00" + struct.pack("<II", round_number, attempt)
    return HKDFExpand(hashes.SHA256(), 32, info=info).derive(key)


def prg_words(key: bytes, nonce: int, count: int) -> np.ndarray:
    """``count`` uint32 words of the ChaCha20 keystream of (key, nonce)."""
    full_nonce = b"\x00\x00\x00\x00" + nonce.to_bytes(12, "little")
    encryptor = Cipher(algorithms.ChaCha20(key, full_nonce), mode=None).encryptor()
    return np.frombuffer(encryptor.update(bytes(4 * count)), dtype="<u4")
