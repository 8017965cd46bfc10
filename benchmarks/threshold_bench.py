"""Threshold Paillier benchmark: what t-of-m decryption and a dealer-free key cost, against ``paillier``.

In one run, on this host:

- ``threshold.partial_decrypt.2048.ms_per_ciphertext``: one party's partial decryption (a
  ~4,400-bit exponent mod N^2, native engine, every core) against the CRT decryption the
  ``paillier`` mode's key holders use (anchor). The ratio is the price of nobody knowing p, q.
- ``threshold.round.<shape>.crypto_seconds``: one party's crypto per round at the runtime
  shapes (1,000 and 100,000 values, 3 parties, t = 2): encrypt its update (public key), its
  t/m share of partial decryptions, the proofs it checks and the combination of its 1/m of
  the slices; anchor: the same party's crypto in ``paillier`` (CRT encryption, decrypt 1/m).
- ``threshold.keygen.2048.m<m>.seconds``: distributed key generation with every party in a
  thread of this process (so all m parties share this host's cores: a federation of m
  machines runs it faster); anchor: python-paillier generating one 2048-bit key alone.
  The number of candidate moduli is random (geometric), so quote the median of runs.

Prints its records; ``benchmarks/privacy_bench.py`` runs them with the DP records and writes
benchmarks/results/privacy.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import record, results_table  # noqa: E402

from confide.crypto import (  # noqa: E402
    BatchCryptCodec,
    DecryptionKey,
    decrypt_packed,
    encrypt_packed,
    sum_encrypted,
)
from confide.crypto import threshold as th  # noqa: E402

PARTIES, T = 3, 2
SHAPES = {"1k": 1_000, "100k": 100_000}


def median_seconds(call, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def per_ciphertext(keys, crt_key: DecryptionKey, count: int = 48) -> list[dict]:
    public = keys[0].public
    values = np.random.default_rng(0).normal(0, 0.1, count * 100)
    codec = BatchCryptCodec(bits=16, max_parties=PARTIES, alpha=0.5)
    vector = encrypt_packed(values, codec, public.encryption_key())
    ours = median_seconds(lambda: vector._native.power((2 * public.delta * keys[0].share).to_bytes(600, "big")))
    crt_vector = encrypt_packed(values, codec, crt_key)
    anchor = median_seconds(lambda: decrypt_packed(crt_vector, crt_key))
    n = vector.num_ciphertexts
    params = {"ciphertexts": n, "key_bits": 2048, "exponent_bits": (2 * public.delta * keys[0].share).bit_length()}
    return [
        record(
            "threshold.partial_decrypt.2048.ms_per_ciphertext",
            1000 * ours / n,
            "ms",
            "paillier CRT decryption (ms per ciphertext)",
            1000 * anchor / n,
            params,
        )
    ]


def round_crypto(keys, crt_key: DecryptionKey, values: int) -> tuple[float, float]:
    """(threshold, paillier) seconds of one party's crypto in one round."""
    rng = np.random.default_rng(1)
    updates = [rng.normal(0, 0.01, values) for _ in range(PARTIES)]
    codec = BatchCryptCodec(bits=16, max_parties=PARTIES, alpha=0.05)
    public = keys[0].public
    encryption_key = public.encryption_key()
    encryption_key.precompute()
    crt_key.precompute()
    # The 1/m of the aggregate this party combines (packed vectors cannot be sliced: encrypt that part).
    part = max(1, values // PARTIES)
    mine = sum_encrypted([encrypt_packed(u[:part], codec, encryption_key) for u in updates])
    others = [th.partial_decrypt(k, mine) for k in keys[1:T]]

    def threshold_round():
        encrypt_packed(updates[0], codec, encryption_key)
        own = th.partial_decrypt(keys[0], mine)  # the slices it combines
        th.partial_decrypt(keys[0], mine)  # t = 2: the slices of the combiner before it, as many
        for partial in others:
            th.verify_partial(public, mine, partial)
        th.decrypt_packed_threshold(public, mine, [own, *others])

    crt_mine = sum_encrypted([encrypt_packed(u[:part], codec, crt_key) for u in updates])

    def paillier_round():
        encrypt_packed(updates[0], codec, crt_key)
        decrypt_packed(crt_mine, crt_key)

    return median_seconds(threshold_round), median_seconds(paillier_round)


def keygen_seconds(parties: int, threshold: int) -> float:
    start = time.perf_counter()
    th.generate_locally(parties, threshold, bits=2048)
    return time.perf_counter() - start


def threshold_records(keygen_runs: int = 3, keygen_parties: tuple[int, ...] = (3, 10)) -> list[dict]:
    """Every ``threshold.*`` record of this run."""
    keys = th.deal_threshold_keys(PARTIES, T, bits=2048)
    crt_key = DecryptionKey.generate(2048)
    results = per_ciphertext(keys, crt_key)
    for shape, values in SHAPES.items():
        ours, anchor = round_crypto(keys, crt_key, values)
        results.append(
            record(
                f"threshold.round.{shape}.crypto_seconds",
                ours,
                "s",
                "paillier round crypto (same party, same shape)",
                anchor,
                {"values": values, "parties": PARTIES, "threshold": T, "goal_ratio_at_most": 2.0},
            )
        )
        print(f"round {shape}: threshold {ours:.3f} s, paillier {anchor:.3f} s ({ours / anchor:.2f}x)", flush=True)
    from phe import paillier

    anchor = median_seconds(lambda: paillier.generate_paillier_keypair(n_length=2048), 3)
    for parties in keygen_parties:
        threshold = (parties + 1) // 2
        runs = [keygen_seconds(parties, threshold) for _ in range(keygen_runs if parties <= 3 else 1)]
        print(f"keygen m={parties} t={threshold}: {[round(r, 1) for r in runs]} s", flush=True)
        results.append(
            record(
                f"threshold.keygen.2048.m{parties}.seconds",
                statistics.median(runs),
                "s",
                "python-paillier key generation, one party alone (s)",
                anchor,
                {"parties": parties, "threshold": threshold, "runs_seconds": [round(r, 2) for r in runs]},
            )
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keygen-runs", type=int, default=3, help="runs of the 3-party key generation")
    parser.add_argument("--keygen-parties", default="3,10", help="party counts of the key-generation records")
    args = parser.parse_args()
    results = threshold_records(args.keygen_runs, tuple(int(p) for p in args.keygen_parties.split(",")))
    print("\n".join(results_table(results, value=",.3f", anchor=",.3f")))


if __name__ == "__main__":
    main()
