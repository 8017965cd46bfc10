"""Stateless work a party sends to its compute engine (:meth:`LocalCompute.map`).

Every function here takes public material only (:func:`confide.compute.base.check_shippable`
runs on its arguments): the Paillier work on workers is the public-key path, so no secret key
ever leaves the party process.
"""

from __future__ import annotations

from typing import Any

__all__ = ["encrypt_public", "encrypt_raw_on"]

#: Per worker process: encryption keys with their fixed-base tables, by wire bytes (built once).
_KEYS: dict[bytes, Any] = {}


def encrypt_public(public_key: bytes, plaintexts: list[bytes]) -> bytes:
    """Encrypt raw plaintexts with the public key (DJN fixed-base tables, one thread): vector bytes."""
    from confide import _native

    key = _KEYS.get(public_key)
    if key is None:
        key = _native.EncryptionKey.from_bytes(public_key)
        key.precompute()
        _KEYS.clear()  # one job's key at a time
        _KEYS[public_key] = key
    return key.encrypt_raw(plaintexts, "fixed_base", 1).to_bytes()


def encrypt_raw_on(engine, encryption_key, plaintexts: list[bytes], *, min_chunk: int = 2048):
    """Encrypt ``plaintexts`` on ``engine``'s workers with the public key: one CiphertextVector.

    The plaintexts are cut into about two chunks per worker (at least ``min_chunk`` each); the
    chunks' ciphertexts are put back in order.
    """
    from confide import _native

    count = len(plaintexts)
    if count == 0:
        return encryption_key.encrypt_raw([], "fixed_base", 1)
    chunks = max(1, min(2 * engine.workers, -(-count // min_chunk)))
    size = -(-count // chunks)
    public = encryption_key.to_bytes()
    parts = engine.map(encrypt_public, [(public, plaintexts[i : i + size]) for i in range(0, count, size)])
    vectors = [_native.CiphertextVector.from_bytes(part, encryption_key) for part in parts]
    if len(vectors) == 1:
        return vectors[0]
    elements = [vector.element_bytes(i) for vector in vectors for i in range(len(vector))]
    return _native.CiphertextVector.from_elements(elements, encryption_key)
