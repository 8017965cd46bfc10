"""Protection modes for horizontal aggregation, as protocols between parties.

=========== ================================= ============================== =================
mode        aggregator learns                 parties share                  cost
=========== ================================= ============================== =================
plain       every update                      nothing                        baseline
secagg      only the sum                      pairwise X25519 keys           ~plain
paillier    nothing                           one Paillier key (leader)      packed HE
groupmask   nothing                           one group key (leader)         ~plain
tee         nothing outside the enclave       session key (leader → enclave) AES-256-GCM
threshold   nothing                           shares of one Paillier key     packed HE, t of m
                                              (distributed key generation)   decrypt (no CRT)
lattice     nothing                           Shamir shares of fresh RLWE    ~secagg bytes; an
                                              keys, every round              NTT per block
=========== ================================= ============================== =================

``tee`` runs against a simulated enclave where no SGX exists, and its report says so.

:func:`make_protection` builds one; a mode name it does not know is an error, never a
fallback to plaintext.
"""

from __future__ import annotations

from confide.errors import InvalidParameterError
from confide.protect.base import Exchange, Protection, ProtectionParams, RoundContext
from confide.protect.lattice import LatticeProtection
from confide.protect.masking import GroupMask, SecAgg
from confide.protect.paillier import PaillierProtection
from confide.protect.plain import Plain
from confide.protect.tee import TeeProtection
from confide.protect.threshold import ThresholdProtection

__all__ = ["MODES", "Exchange", "Protection", "ProtectionParams", "RoundContext", "make_protection"]

MODES: dict[str, type[Protection]] = {
    "plain": Plain,
    "secagg": SecAgg,
    "paillier": PaillierProtection,
    "groupmask": GroupMask,
    "tee": TeeProtection,
    "threshold": ThresholdProtection,
    "lattice": LatticeProtection,
}


def make_protection(mode: str, exchange: Exchange, params: ProtectionParams, **extra) -> Protection:
    """The protection object for ``mode`` (one of :data:`MODES`)."""
    if mode not in MODES:
        raise InvalidParameterError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "paillier":
        return PaillierProtection(exchange, params, **extra)
    return MODES[mode](exchange, params)
