"""``tee``: slices sealed with AES-256-GCM for the aggregator's enclave (Jupiter, seed 000 §4).

Set-up: the leader (first participant) asks the aggregator for its enclave's X25519 key and
report, makes a 32-byte session key, wraps it to the enclave's key (X25519 with a fresh
ephemeral key, HKDF-SHA256, AES-256-GCM; exact format in docs/dataplane.md) and seals the
session key, the wrapped form and the report to every party under its pair key. The wrapped
key rides in the round header's ``encryption_key``; only the enclave can unwrap it.

Per slice: float32 words (or, with ``protection.wire``, float16, bfloat16 or scaled int8 words,
encoded as ``plain`` encodes them) sealed under the session key with a fresh 96-bit nonce and
the associated data (job, round, attempt, party position, slice index), so a slice cannot be
replayed into another round, slot or party. The enclave opens, widens a narrow slice to float32,
folds and re-seals; the combined slice comes back sealed float32 with position 0xFFFFFFFF, and
every party opens it. A narrow wire shrinks the upload (2 or 1 bytes a value, plus 28 bytes of
nonce and tag a slice), not the download.

With a robust strategy the enclave stacks the opened updates of a slice instead of folding them
(``AGGREGATION_KIND_TEE_FLOAT32_STACK``) and seals only the rule's estimate (``confide-agg``'s
``robust`` module): the median and the trimmed mean as each slice completes, Krum, Multi-Krum
and norm clipping once every slice is in (the host holds the blocks sealed for the enclave).

There is no SGX on the machines this runs on today: the aggregator's enclave side runs as
ordinary code in the aggregator process (``SimulatedEnclave``). The report of every job says
so (``enclave.mode == "simulation"``, ``hardware_isolation: false``): against an honest-but-
curious operator of that host, simulation protects nothing.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from confide._checks import require
from confide.errors import InvalidParameterError, ProtocolError
from confide.protect.base import Protection, RoundContext
from confide.protect.keys import GroupCipher, PeerKeys
from confide.protect.masking import GroupShared, distribute_group_secrets
from confide.protect.plain import check_wire, narrow, widened
from confide.protect.verify import VerificationError
from confide.v1 import runtime_pb2 as pb

__all__ = [
    "TEE_WIRE_KINDS",
    "TeeProtection",
    "open_slice",
    "seal_slice",
    "slice_aad",
    "wrap_session_key",
]

_WRAP_LABEL = b"confide/tee/wrap/v1"
_SLICE_LABEL = b"confide/tee/slice/v1\x00"
RESULT_POSITION = 0xFFFFFFFF
NONCE_BYTES = 12
TAG_BYTES = 16
#: protection.wire -> the aggregation kind a tee round's sealed slices travel as.
TEE_WIRE_KINDS = {
    "float32": pb.AGGREGATION_KIND_TEE_FLOAT32_SUM,
    "float16": pb.AGGREGATION_KIND_TEE_FLOAT16_SUM,
    "bfloat16": pb.AGGREGATION_KIND_TEE_BFLOAT16_SUM,
    "int8": pb.AGGREGATION_KIND_TEE_INT8_SCALED_SUM,
}


def wrap_session_key(session_key: bytes, enclave_public: bytes, session: str) -> bytes:
    """eph_pub(32) ‖ nonce(12) ‖ AES-256-GCM(kek, session_key) — only the enclave can open it."""
    if len(session_key) != 32 or len(enclave_public) != 32:
        raise ProtocolError("session key and enclave public key must be 32 bytes each")
    ephemeral = X25519PrivateKey.generate()
    eph_public = ephemeral.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    shared = ephemeral.exchange(X25519PublicKey.from_public_bytes(enclave_public))
    kek = HKDF(
        algorithm=hashes.SHA256(), length=32, salt=enclave_public + eph_public, info=_WRAP_LABEL + session.encode()
    ).derive(shared)
    nonce = os.urandom(NONCE_BYTES)
    return eph_public + nonce + AESGCM(kek).encrypt(nonce, session_key, _WRAP_LABEL + session.encode())


def slice_aad(session: str, round_number: int, attempt: int, position: int, index: int) -> bytes:
    """What a sealed slice is bound to."""
    return _SLICE_LABEL + session.encode() + b"\x00" + struct.pack("<IIII", round_number, attempt, position, index)


def seal_slice(key: AESGCM, aad: bytes, values: np.ndarray | bytes) -> bytes:
    """Nonce ‖ AES-256-GCM(words): ``values`` as float32 words, or bytes already encoded."""
    nonce = os.urandom(NONCE_BYTES)
    plain = values if isinstance(values, bytes) else np.ascontiguousarray(values, dtype="<f4").tobytes()
    return nonce + key.encrypt(nonce, plain, aad)


def open_slice(key: AESGCM, aad: bytes, sealed: bytes) -> np.ndarray:
    """float32 words of a sealed slice (raises on any tampering)."""
    from cryptography.exceptions import InvalidTag

    if len(sealed) < NONCE_BYTES + TAG_BYTES:
        raise ProtocolError(f"sealed slice holds {len(sealed)} bytes, fewer than nonce and tag")
    try:
        plain = key.decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag:
        raise ProtocolError("combined slice failed AES-GCM authentication (wrong key, round or slot)") from None
    return np.frombuffer(plain, dtype="<f4")


class TeeProtection(GroupShared, Protection):
    """AES-256-GCM slices opened only on the enclave side of the aggregator."""

    mode = "tee"
    kind = pb.AGGREGATION_KIND_TEE_FLOAT32_SUM
    aggregator_sees = (
        "AES-256-GCM ciphertexts outside the enclave; the enclave side sees every update "
        "(simulated here: no SGX, so the aggregator host could read it)"
    )
    verify_arithmetic = "float"

    def __init__(self, exchange, params) -> None:
        super().__init__(exchange, params)
        self.kind = TEE_WIRE_KINDS[check_wire(params.wire)]
        self.keys = PeerKeys(exchange.identity, exchange.job_id)
        self._group: GroupCipher | None = None
        self._aead: AESGCM | None = None
        self._wrapped = b""
        self.enclave: dict = {}

    def setup(self, participants: list[str]) -> None:
        """Leader wraps a session key to the enclave; everyone gets it under its pair key."""
        extra = {}
        if self.exchange.party_id == participants[0]:
            health = self.exchange.client.health()
            if len(health.enclave_public_key) != 32:
                raise ProtocolError("the aggregator offers no enclave key: it cannot run tee mode")
            session_key = os.urandom(32)
            extra = {
                "tee_session_key": session_key,
                "tee_wrapped": wrap_session_key(session_key, health.enclave_public_key, self.exchange.job_id),
                "tee_report": health.enclave_report.encode(),
            }
        self.adopt_secrets(
            distribute_group_secrets(self.exchange, self.keys, participants, extra, self.params.setup_timeout_s)
        )

    def adopt_secrets(self, secrets: dict[str, bytes]) -> None:
        """The enclave session key, its wrapping for the enclave, the enclave's report, the group key."""
        for name in ("tee_session_key", "tee_wrapped", "tee_report"):
            if not isinstance(secrets.get(name), bytes):
                raise ProtocolError(f"the key bundle from the leader lacks {name}")
        if len(secrets["tee_session_key"]) != 32:
            raise ProtocolError("tee session key must be 32 bytes")
        self._aead = AESGCM(secrets["tee_session_key"])
        self._wrapped = secrets["tee_wrapped"]
        self.enclave = json.loads(secrets["tee_report"].decode())
        self._group = GroupCipher(secrets["group_key"], self.exchange.job_id)
        super().adopt_secrets(secrets)

    def use_robust(self, rule: dict) -> None:
        """Slices stacked inside the enclave, which seals ``rule``'s estimate instead of their sum.

        Coordinate-wise rules (median, trimmed mean) as each slice completes; whole-update rules
        (Krum, Multi-Krum, norm clipping) once every slice is in, the host holding the blocks
        sealed for the enclave meanwhile (:mod:`confide.aggregator.robust`).
        """
        name = rule.get("rule")
        if self.params.wire != "float32":
            raise InvalidParameterError(f"strategy.name {name} needs protection.wire float32, got {self.params.wire}")
        self.kind = pb.AGGREGATION_KIND_TEE_FLOAT32_STACK
        self.robust = pb.RobustRule(**rule)

    def header_key(self) -> bytes:
        """The session key wrapped to the enclave."""
        return self._wrapped

    def encode(self, context: RoundContext, index: int, values: np.ndarray) -> bytes:
        """Seal slice ``index`` for the enclave, in the job's wire format."""
        require(self._aead, "setup first")
        aad = slice_aad(self.exchange.job_id, context.round, context.attempt, context.position, index)
        return seal_slice(self._aead, aad, narrow(values, self.params.wire, context.round))

    def verify_image(self, context: RoundContext, index: int, values: np.ndarray) -> np.ndarray:
        """The float32 values the enclave sums for this slice."""
        return widened(values, self.params.wire)

    def finish_round(self, context: RoundContext, result: Callable[[int], pb.Slice]) -> np.ndarray:
        """Open every combined slice."""
        require(self._aead, "setup first")
        out = context.output()
        for index in range(context.num_slices):
            start, stop = context.bounds(index)
            aad = slice_aad(self.exchange.job_id, context.round, context.attempt, RESULT_POSITION, index)
            payload = result(index).payload
            try:
                values = open_slice(self._aead, aad, payload)
            except ProtocolError as error:
                raise VerificationError(
                    f"round {context.round}: combined slice {index} is not what the enclave sealed ({error}); the "
                    "round is refused",
                    slices=[index],
                    round_number=context.round,
                ) from None
            if len(values) != stop - start:
                raise ProtocolError(f"combined slice {index} holds {len(values)} values, expected {stop - start}")
            self.verified(index, payload, values)
            out[start:stop] = values
        return out

    def report(self) -> dict:
        """What ran, including the enclave's own report (simulation said plainly)."""
        simulated = self.enclave.get("mode") != "sgx"
        rule = self.robust.rule.replace("_", " ") if self.robust else ""
        returns = f"the enclave returns their {rule}, not their sum"
        return {
            "mode": self.mode,
            "aggregator_sees": self.aggregator_sees + (f"; {returns}" if self.robust else ""),
            "wire": self.params.wire,
            "enclave": self.enclave,
            "enclave_simulated": simulated,
            **({"robust_rule": self.robust.rule} if self.robust is not None else {}),
            "note": (
                "tee ran as a SIMULATION: no enclave hardware; the aggregator host could read every update"
                if simulated
                else "tee ran inside enclave hardware"
            ),
        }
