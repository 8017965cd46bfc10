"""Crypto demo: three hospitals sum model updates that the aggregator cannot read.

Runs on generated data in one process (the networked runtime comes with the federated
runtime issue). Steps: the leader hospital generates the Paillier key; each hospital
reports max/min of its update; dACIQ picks the clipping threshold; each hospital clips,
quantizes, packs and encrypts; the aggregator multiplies ciphertexts; a hospital decrypts
and decodes the sum.
"""

from __future__ import annotations

import time

import numpy as np

from confide.crypto import (
    ENGINE,
    GMP_VERSION,
    BatchCryptCodec,
    DecryptionKey,
    daciq_threshold,
    decrypt_packed,
    encrypt_packed,
    sum_encrypted,
)

HOSPITALS = ["hospital-a", "hospital-b", "hospital-c"]
PARAMETERS = 200_000  # a small CNN's worth of gradients


def main() -> None:
    """Run the demo and print each step."""
    rng = np.random.default_rng(2026)
    updates = {name: rng.normal(0.0, 0.01, PARAMETERS).astype(np.float32) for name in HOSPITALS}
    print(f"Confide crypto demo: {len(HOSPITALS)} hospitals, {PARAMETERS:,} float32 parameters each")
    print(f"arithmetic engine: {ENGINE} (GMP {GMP_VERSION})")

    start = time.perf_counter()
    key = DecryptionKey.generate(2048)
    key.precompute()
    print(
        f"leader generated a 2048-bit Paillier key {key.encryption_key.key_id[:16]}... "
        f"and its encryption tables in {time.perf_counter() - start:.2f} s"
    )

    maxima = np.array([u.max() for u in updates.values()], dtype=np.float64)
    minima = np.array([u.min() for u in updates.values()], dtype=np.float64)
    alpha = daciq_threshold(maxima, minima, PARAMETERS, bits=16, parties=len(HOSPITALS))
    codec = BatchCryptCodec(bits=16, max_parties=len(HOSPITALS), alpha=alpha)
    slot_bits, slots = codec.layout(2048)
    print(f"dACIQ clipping threshold alpha = {alpha:.5f}; {slots} values per ciphertext ({slot_bits}-bit slots)")

    encrypted = []
    for name, update in updates.items():
        start = time.perf_counter()
        vector = encrypt_packed(update, codec, key)
        seconds = time.perf_counter() - start
        wire = len(vector.to_bytes())
        encrypted.append(vector)
        print(
            f"  {name}: {vector.num_ciphertexts:,} ciphertexts, {wire / 2**20:.2f} MiB "
            f"({wire / PARAMETERS:.2f} B/value), {PARAMETERS / seconds:,.0f} values/s"
        )

    start = time.perf_counter()
    total = sum_encrypted(encrypted)
    print(
        f"aggregator multiplied {len(encrypted)} x {total.num_ciphertexts:,} ciphertexts "
        f"in {time.perf_counter() - start:.3f} s without any key"
    )

    start = time.perf_counter()
    decoded = decrypt_packed(total, key)
    seconds = time.perf_counter() - start
    exact = np.sum([np.clip(u.astype(np.float64), -alpha, alpha) for u in updates.values()], axis=0)
    error = np.abs(decoded - exact)
    print(f"hospital-a decrypted the sum: {PARAMETERS / seconds:,.0f} values/s")
    print(
        f"max |decoded - clipped plaintext sum| = {error.max():.2e} "
        f"(quantization step {alpha / ((2**15 - 1) // len(HOSPITALS)):.2e})"
    )
    clipped = sum(int(np.sum(np.abs(u) > alpha)) for u in updates.values())
    print(f"values clipped by dACIQ: {clipped} of {PARAMETERS * len(HOSPITALS):,}")


if __name__ == "__main__":
    main()
