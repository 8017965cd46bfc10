"""Lattice mode primitives: encryption and decryption per core, bytes per value, the key work per round.

What ``protection.mode: lattice`` does per party and round (docs/crypto.md, "Lattice aggregation"):
encrypt its fixed-point words two to a coefficient mod a 62-bit prime (``LatticeRing.encrypt_packed``:
per block of 8192 values, an AES-128-CTR expansion of the public polynomial in the NTT domain, one
pointwise product, one inverse NTT, AES-CTR errors), share its fresh key t of m,
add the shares it receives, rebuild the key sum from t summed shares, and decrypt the summed
words with it. Measured here in one process, one thread (the native calls use none else):

- ``lattice.encrypt.values_per_second.t1`` and ``lattice.decrypt.values_per_second.t1`` on a vector
  of 1.25M values; anchor: Microsoft SEAL's BFV through TenSEAL (``bfv_vector``, the same ring
  dimension 4096, one thread) encrypting and decrypting the same values, measured in the same run;
- ``lattice.bytes_per_value``: the ciphertext's bytes over its values (8 bytes a word, two values a
  word); anchor: the serialized TenSEAL BFV ciphertext of 4096 values over 4096 (lower is better:
  the ratio below 1 favours us);
- ``lattice.fold.values_per_second``: the aggregator's fold of one party's ciphertext words into the
  running sum mod q (checked under q, the data plane's kernel); anchor: the data plane's float32
  fold (``agg_accumulate_f32``, what ``plain`` runs) over the same number of values;
- ``lattice.keysetup.m3.seconds``, ``lattice.keysetup.m10.seconds``: one party's key work of a
  round with 3 and 10 parties (draw the key, share it t of m, add the m - 1 shares it receives,
  rebuild the key sum from t summed shares); no anchor (the ``threshold`` mode sets its key up
  once per job, in minutes: ``benchmarks/threshold_bench.py``);
- ``lattice.decrypt_work.{100k,1_25m,4m}.seconds``: the threshold part of one party's decryption
  of a 3-party round (summing the shares, rebuilding the key sum) for vectors of 100k, 1.25M and
  4M values: it does not depend on the vector's size. Decoding the vector itself with the key sum
  is ``lattice.decrypt.values_per_second.t1``.

Run: ``python benchmarks/lattice_bench.py --write`` (about a minute).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import machine, median_of_runs, rate, record, results_table, write, write_markdown_block  # noqa: E402

from confide import _native  # noqa: E402
from confide.protect.lattice import RING_DIMENSION, default_threshold, message_bits  # noqa: E402

SEED = bytes(range(32))
VALUES = 1_250_000


def _key_round(parties: int) -> float:
    """Seconds of one party's key work in a round of ``parties`` (all keys drawn here; one party timed)."""
    ring = _native.LatticeRing(RING_DIMENSION, 16)
    t = default_threshold(parties)
    others = [ring.new_key().shares(t, parties) for _ in range(parties - 1)]
    summed_by_peer = []
    for j in range(1, t):  # the t - 1 summed shares a party receives, made by their holders
        s = np.zeros(RING_DIMENSION, dtype=np.uint16)
        for shares in others:
            _native.LatticeKeySum.add_shares(s, shares[j])
        summed_by_peer.append(s)
    start = time.perf_counter()
    mine = ring.new_key().shares(t, parties)
    summed = np.array(mine[0], dtype=np.uint16)
    for shares in others:
        _native.LatticeKeySum.add_shares(summed, shares[0])
    _native.LatticeKeySum.reconstruct(list(range(1, t + 1)), [summed, *summed_by_peer], parties)
    return time.perf_counter() - start


def _decrypt_work(values: int, repeats: int = 50) -> float:
    """The threshold part of a 3-party decryption: sum the shares received, rebuild the key sum (best of N)."""
    ring = _native.LatticeRing(RING_DIMENSION, 16)
    keys = [ring.new_key() for _ in range(3)]
    words = np.zeros(-(-values // 2), dtype=np.uint64)
    for k in keys:  # the vector exists (its size is what is varied), the work below does not touch it
        ring.fold_packed(words, ring.encrypt_packed(SEED, 0, k, np.zeros(values, dtype=np.uint32), message_bits(3), 3))
    shares = [k.shares(2, 3) for k in keys]
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        summed = []
        for j in range(2):
            s = np.zeros(RING_DIMENSION, dtype=np.uint16)
            for share in shares:
                _native.LatticeKeySum.add_shares(s, share[j])
            summed.append(s)
        _native.LatticeKeySum.reconstruct([1, 2], summed, 3)
        best = min(best, time.perf_counter() - start)
    return best


def run_once() -> list[dict]:
    import tenseal as ts

    bits = message_bits(3)
    rng = np.random.default_rng(5)
    words = rng.integers(0, 1 << bits, size=VALUES, dtype=np.uint32)
    ring = _native.LatticeRing(RING_DIMENSION, 16)
    key = ring.new_key()
    key_sum = _native.LatticeKeySum.reconstruct([1], [key.shares(1, 1)[0]], 1)
    cipher = ring.encrypt_packed(SEED, 0, key, words, bits, 3)
    assert np.array_equal(ring.decrypt_packed(SEED, 0, key_sum, cipher, bits, 3, VALUES), words)
    ours_enc = rate(lambda: ring.encrypt_packed(SEED, 0, key, words, bits, 3), VALUES, min_seconds=1.0)
    ours_dec = rate(lambda: ring.decrypt_packed(SEED, 0, key_sum, cipher, bits, 3, VALUES), VALUES, min_seconds=1.0)
    total = np.zeros_like(cipher)
    fold = rate(lambda: ring.fold_packed(total, cipher), VALUES, min_seconds=1.0)
    floats, acc = rng.standard_normal(VALUES).astype(np.float32), np.zeros(VALUES, dtype=np.float32)
    plain_fold = rate(lambda: _native.agg_accumulate_f32(acc, floats, 1.0), VALUES, min_seconds=1.0)

    context = ts.context(ts.SCHEME_TYPE.BFV, poly_modulus_degree=RING_DIMENSION, plain_modulus=1032193, n_threads=1)
    block = [int(v) % 500_000 for v in words[:RING_DIMENSION]]  # under p / 2: BFV decrypts centred
    seal_cipher = ts.bfv_vector(context, block)
    assert seal_cipher.decrypt() == block
    seal_enc = rate(lambda: ts.bfv_vector(context, block), RING_DIMENSION, min_seconds=1.0)
    seal_dec = rate(lambda: seal_cipher.decrypt(), RING_DIMENSION, min_seconds=1.0)
    seal_bytes = len(seal_cipher.serialize()) / RING_DIMENSION
    anchor = "Microsoft SEAL BFV via TenSEAL 0.3.18, n 4096, one thread"
    params = {
        "values": VALUES,
        "ring_dimension": RING_DIMENSION,
        "message_bits": bits,
        "threads": 1,
        "lanes": 2,
        "note": "ours: a secret-key RLWE sample (one polynomial a block of 8192 values, two a coefficient); "
        "SEAL's BFV: public-key encryption (two polynomials), with its batching encoder",
    }
    out = [
        record("lattice.encrypt.values_per_second.t1", ours_enc, "values/s", anchor, seal_enc, params),
        record("lattice.decrypt.values_per_second.t1", ours_dec, "values/s", anchor, seal_dec, params),
        record(
            "lattice.fold.values_per_second",
            fold,
            "values/s",
            "the data plane's float32 fold (agg_accumulate_f32), the same values",
            plain_fold,
            {"values": VALUES, "words": int(cipher.size), "threads": 1},
        ),
        record(
            "lattice.bytes_per_value",
            cipher.nbytes / VALUES,
            "bytes",
            anchor + ", serialized",
            seal_bytes,
            {"note": "lower is better; the key shares add 2 x 8 KiB per peer and round, whatever the model"},
        ),
    ]
    for parties in (3, 10):
        seconds = min(_key_round(parties) for _ in range(5))
        out.append(
            record(
                f"lattice.keysetup.m{parties}.seconds",
                seconds,
                "s",
                params={"parties": parties, "threshold": default_threshold(parties), "of": "one party, best of 5"},
                digits=7,
            )
        )
    for label, values in (("100k", 100_000), ("1_25m", 1_250_000), ("4m", 4_000_000)):
        seconds = _decrypt_work(values)
        out.append(
            record(
                f"lattice.decrypt_work.{label}.seconds",
                seconds,
                "s",
                params={"values": values, "parties": 3, "of": "sum shares + rebuild the key sum, best of 50"},
                digits=7,
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write results/lattice.json and the docs table")
    parser.add_argument("--runs", type=int, default=3, help="whole runs; each record is the median")
    args = parser.parse_args()
    results = median_of_runs([run_once() for _ in range(args.runs)])
    for line in results_table(results, value=",.4g", anchor=",.4g"):  # 4 significant digits shown
        print(line)
    if args.write:
        path = write("lattice", machine(), results)
        write_markdown_block(
            "lattice",
            "Lattice mode primitives",
            [*results_table(results, value=",.4g", anchor=",.4g")],
            script="lattice_bench",
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
