"""Stateless work a party sends to its compute engine (:meth:`LocalCompute.map`).

Every function here is checked by :func:`confide.compute.base.check_shippable` on its
arguments: the Paillier work on workers is the public-key path, so no key that decrypts ever
leaves the party process. The PSI tasks take the party's own ids and its per-intersection
blinding scalar, which guards only those ids (:class:`confide.vertical.psi._WorkerBlinder` says
why that may cross).
"""

from __future__ import annotations

from typing import Any

__all__ = ["encrypt_public", "encrypt_raw_on", "psi_blind", "psi_hash_and_blind"]

#: Per worker process: encryption keys with their fixed-base tables, by wire bytes (built once).
_KEYS: dict[bytes, Any] = {}


def encrypt_public(public_key: bytes, plaintexts: list[bytes]) -> bytes:
    """Encrypt raw plaintexts with the public key (DJN fixed-base tables, one thread): vector bytes."""
    from confide import _native
    from confide.crypto import gpu

    key = _KEYS.get(public_key)
    if key is None:
        key = _native.EncryptionKey.from_bytes(public_key)
        key.precompute()
        _KEYS.clear()  # one job's key at a time
        _KEYS[public_key] = key
    return gpu.encrypt_raw(key, plaintexts, "fixed_base", 1).to_bytes()


def encrypt_raw_on(engine, encryption_key, plaintexts: list[bytes], *, min_chunk: int = 2048):
    """Encrypt ``plaintexts`` on ``engine``'s workers with the public key: one CiphertextVector.

    The plaintexts are cut into about two chunks per worker (at least ``min_chunk`` each); the
    chunks' ciphertexts are put back in order.
    """
    from confide import _native
    from confide.crypto import gpu

    count = len(plaintexts)
    if count == 0:
        return gpu.encrypt_raw(encryption_key, [], "fixed_base", 1)
    public = encryption_key.to_bytes()
    chunks = engine.ranges(count, min_chunk=min_chunk)
    parts = engine.map(encrypt_public, [(public, plaintexts[a:b]) for a, b in chunks])
    vectors = [_native.CiphertextVector.from_bytes(part, encryption_key) for part in parts]
    if len(vectors) == 1:
        return vectors[0]
    elements = [vector.element_bytes(i) for vector in vectors for i in range(len(vector))]
    return _native.CiphertextVector.from_elements(elements, encryption_key)


def psi_hash_and_blind(scalar: bytes, dst: bytes, data: bytes, offsets) -> bytes:
    """k·H(id) of a chunk of this party's ids (``data``, ``offsets`` as the native call takes them)."""
    from confide._native import PsiKey

    return PsiKey.from_bytes(scalar).hash_and_blind(dst, data, offsets, 1)


def psi_blind(scalar: bytes, points: bytes) -> bytes:
    """k·P of a chunk of the peer's 32-byte points."""
    from confide._native import PsiKey

    return PsiKey.from_bytes(scalar).blind(points, 1)
