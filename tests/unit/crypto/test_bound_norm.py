"""The L2 norm proof of protection.l2_bound through the native module, and the party's side of it.

The arithmetic is tested in crates/confide-codec/src/norm.rs; here: the message a party relays
(range proofs, then the norm proof), what a peer refuses, and how an honest party meets a bound.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from confide import _native
from confide.errors import ProtocolError
from confide.protect.bound import BoundProver, _scale_into, _why

BITS, RING = 20, 32


def words_of(q: np.ndarray) -> np.ndarray:
    return (q.astype(np.int64) % 2**32).astype(np.uint32)


def test_a_relayed_norm_proof_verifies_at_its_bound_and_nowhere_else():
    q = np.random.default_rng(3).integers(-(2**18), 2**18, 130)
    words = words_of(q)
    norm = _native.bound_squared_norm(words, RING, BITS)
    assert norm == sum(int(x) ** 2 for x in q)
    l2 = math.isqrt(norm) + 1
    message = _native.bound_prove(b"ctx", words, RING, BITS, [bytes(16)], [True], l2)
    points, why = _native.bound_verify(b"ctx", message, q.size, BITS, True, l2)
    assert why == "" and len(points) == 32 * q.size
    # a peer expecting another bound, or none, refuses it as malformed; another party's statement as unproven
    assert "expected 130 within" in _native.bound_verify(b"ctx", message, q.size, BITS, True, l2 + 1)[1]
    assert "bytes follow the last proof" in _native.bound_verify(b"ctx", message, q.size, BITS, True)[1]
    assert _native.bound_verify(b"other", message, q.size, BITS, True, l2)[1] == "chunk 0"
    # the norm proof alone, bound to the range proofs' commitments
    alone = _native.bound_norm_prove(b"ctx", words, RING, BITS, [bytes(16)], [True], points, l2)
    assert _native.bound_norm_verify(b"ctx", alone, points, q.size, BITS, l2) == ""
    forged = bytearray(alone)
    forged[16 + 4 * 32 + 7] ^= 1  # inside the first response
    assert _native.bound_norm_verify(b"ctx", bytes(forged), points, q.size, BITS, l2) == "norm"
    assert "L2 norm" in _why("norm")


def test_an_update_past_the_bound_cannot_be_proven():
    q = np.array([3000, -4000, 0])
    with pytest.raises(Exception, match="squared norm 25000000 exceeds the bound's square 24990001"):
        _native.bound_prove(b"ctx", words_of(q), RING, BITS, [bytes(16)], [True], 4999)


def test_an_honest_party_scales_into_the_ball_and_a_bound_below_the_rounding_is_refused():
    vector = np.array([3.0, 4.0, 0.0], dtype=np.float32)
    assert _scale_into(vector, 10.0) is False and vector.tolist() == [3.0, 4.0, 0.0]
    assert _scale_into(vector, 1.0) is True and np.linalg.norm(vector) <= 1.0
    prover = BoundProver(SimpleNamespace(exchange=None), l2_bound=1e-6)
    with pytest.raises(ProtocolError, match=r"protection.l2_bound 1e-06 is too small for 400 values"):
        prover._l2_units(2.0**20, 400)
    assert BoundProver(SimpleNamespace(exchange=None), l2_bound=2.0)._l2_units(2.0**20, 400) == 2**21
    assert BoundProver(SimpleNamespace(exchange=None))._l2_units(2.0**20, 400) is None
