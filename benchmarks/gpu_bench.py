"""GPU Paillier engine against the CPU engine (IFMA or GMP) on all of the same machine's cores, one run.

Run on a machine with a GPU (scripts/gpu-check.sh does, with the GPU tests); writes
benchmarks/results/crypto_gpu.json (or --out). Every record names the device and the CPU engine.

Records per key size B (2048, 3072):
- ``paillier.gpu.encrypt.packed.B``: full-width (packed) plaintexts to ciphertexts, ciphertexts/s,
  end to end (Python integers in and out: host conversions, copies and kernels);
  anchor the CPU engine's public-key encryption on every core, same plaintexts.
- ``paillier.gpu.encrypt.kernel.B``: the same, kernel time alone (device-resident work).
- ``paillier.gpu.vs_cpu.encrypt.B``: the ratio of the two end-to-end rates (x).
- ``paillier.gpu.decrypt.B``: CRT decryption, plaintexts/s end to end; anchor the CPU engine's.
- ``paillier.gpu.mul.B``: ciphertext products (the aggregator's sum of two vectors), products/s;
  anchor the CPU engine's ``sum`` of two vectors.

``--parts vertical`` (vertical_gpu.json): ``vertical.secureboost.synthetic_100k.gpu.seconds_per_tree``
(all cores) and ``....2_threads``, each against the CPU engine on as many threads in the same run.
``--parts hetero_nn`` (vertical_hetero_nn_gpu.json): ``vertical.hetero_nn.synthetic_100k_10k.gpu.
seconds_per_epoch`` against FLBooster's reported 71.8 s, and ``....gpu.vs_cpu``, the CPU engine's
epoch on every core in the same run over the GPU's.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from benchutil import machine, record  # noqa: E402

from confide import _native, crypto  # noqa: E402
from confide.crypto import gpu  # noqa: E402
from confide.crypto.gpu import engine as gpu_engine  # noqa: E402
from confide.crypto.gpu import gpu_backend, public_key_parts  # noqa: E402


def timed(call, repeats: int = 3) -> float:
    """Median seconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def device_info() -> dict:
    backend = gpu_backend(128)
    return {"device": backend.device_name, "capability": ".".join(map(str, backend.capability))}


def use_engine(name: str) -> None:
    os.environ["CONFIDE_ENGINE"] = name
    gpu.reset_engine()


def bench_size(bits: int, batch: int, cpu_batch: int, repeats: int) -> list[dict]:
    key = crypto.DecryptionKey.generate(bits)
    native = key._native
    public = native.encryption_key
    n, h_s, rand_bits = public_key_parts(public)
    p, q = (int.from_bytes(x, "big") for x in native.primes_bytes())
    kern = gpu_engine.PaillierKernels(gpu_backend, n, h_s, rand_bits, p, q)
    device = device_info()
    cpu_engine = f"cpu:{_native.engine()}"
    params = {
        "bits": bits,
        "batch": batch,
        "cpu_batch": cpu_batch,
        **device,
        "cpu_engine": cpu_engine,
        "cpu_threads": os.cpu_count(),
        "window": kern.window,
    }
    public.precompute()
    native.precompute()
    out = []

    # 1. The product path: confide.crypto.encrypt_packed / decrypt_packed (BatchCrypt, 16-bit, 3 parties).
    codec = crypto.BatchCryptCodec(bits=16, max_parties=3, alpha=1.0)
    _, slots = _native.codec_layout_of("batchcrypt", 16, 3, 1.0, bits, codec.quantizer)
    rng = np.random.default_rng(1)
    values = rng.uniform(-1, 1, batch * slots).astype(np.float32)
    cpu_values = values[: cpu_batch * slots]
    use_engine("gpu")
    crypto.encrypt_packed(values[: 4096 * slots], codec, key)  # compile, table, warm-up
    gpu_pack = timed(lambda: crypto.encrypt_packed(values, codec, key), repeats)
    vector = crypto.encrypt_packed(values, codec, key)
    gpu_unpack = timed(lambda: crypto.decrypt_packed(vector, key), 1)
    decoded = crypto.decrypt_packed(vector, key)
    assert gpu.engine_report()["crypto_engine"].startswith("gpu:")
    small = crypto.encrypt_packed(cpu_values, codec, key)
    small_gpu = crypto.decrypt_packed(small, key)
    use_engine("cpu")
    assert np.array_equal(crypto.decrypt_packed(small, key), small_gpu), "GPU and CPU decryptions differ"
    cpu_pack = timed(lambda: crypto.encrypt_packed(cpu_values, codec, key), repeats)
    cpu_vector = crypto.encrypt_packed(cpu_values, codec, key)
    cpu_unpack = timed(lambda: crypto.decrypt_packed(cpu_vector, key), repeats)
    assert np.abs(decoded - values).max() < 1e-3, "GPU packed round trip is off"
    pack_params = {**params, "codec": "batchcrypt", "bits_per_value": 16, "parties": 3, "slots": slots}
    gpu_rate, cpu_rate = batch / gpu_pack, cpu_batch / cpu_pack
    out += [
        record(f"paillier.gpu.encrypt.packed.{bits}", gpu_rate, "ciphertexts/s", cpu_engine, cpu_rate, pack_params),
        record(f"paillier.gpu.vs_cpu.encrypt.{bits}", gpu_rate / cpu_rate, "x", None, None, pack_params),
        record(
            f"paillier.gpu.decrypt.packed.{bits}",
            batch / gpu_unpack,
            "ciphertexts/s",
            cpu_engine,
            cpu_batch / cpu_unpack,
            pack_params,
        ),
    ]

    # 2. The kernels alone on device-ready limbs (no packing, no Python integers).
    limbs = kern.mod_n2.limbs
    plain = gpu_engine.be_rows_to_limbs(
        np.frombuffer(
            b"".join(secrets.randbelow(n).to_bytes(limbs * 2, "big") for _ in range(batch)), dtype=np.uint8
        ).reshape(batch, limbs * 2),
        limbs // 2,
    )
    kern.encrypt_limbs(plain[:, :1024])
    kern.backend.kernel_seconds = 0.0
    gpu_raw = timed(lambda: kern.encrypt_limbs(plain), repeats)
    kernel = kern.backend.kernel_seconds / repeats
    cpu_plain = [secrets.randbelow(n).to_bytes(limbs * 2, "big") for _ in range(cpu_batch)]
    cpu_raw = timed(lambda: public.encrypt_raw(cpu_plain, "fixed_base", 0), repeats)
    out += [
        record(
            f"paillier.gpu.encrypt.raw.{bits}",
            batch / gpu_raw,
            "ciphertexts/s",
            cpu_engine,
            cpu_batch / cpu_raw,
            params,
        ),
        record(
            f"paillier.gpu.encrypt.kernel.{bits}",
            batch / kernel,
            "ciphertexts/s",
            cpu_engine,
            cpu_batch / cpu_raw,
            params,
        ),
    ]

    # 3. Decryption and ciphertext products through the integer API (host conversions included).
    half = batch // 2
    ints = [secrets.randbelow(n) for _ in range(half)]
    ciphertexts = kern.encrypt_raw(ints)
    assert kern.decrypt_raw(ciphertexts[:256]) == ints[:256], "GPU decryption is not exact"
    cpu_vector = public.encrypt_raw(cpu_plain, "fixed_base", 0)
    gpu_dec = timed(lambda: kern.decrypt_raw(ciphertexts), repeats)
    cpu_dec = timed(lambda: native.decrypt_raw(cpu_vector, 0), repeats)
    other = ciphertexts[::-1]
    gpu_mul = timed(lambda: kern.mul_many(ciphertexts, other), repeats)
    cpu_mul = timed(lambda: _native.CiphertextVector.sum([cpu_vector, cpu_vector], 0), repeats)
    out += [
        record(f"paillier.gpu.decrypt.{bits}", half / gpu_dec, "plaintexts/s", cpu_engine, cpu_batch / cpu_dec, params),
        record(f"paillier.gpu.mul.{bits}", half / gpu_mul, "products/s", cpu_engine, cpu_batch / cpu_mul, params),
    ]
    return out


def bench_vertical(rows: int, features: int, trees: int, depth: int) -> list[dict]:
    """SecureBoost per tree with the GPU engine against the CPU engine, on 2 threads and on all cores."""
    import vertical_bench as vb

    from confide.vertical import secureboost as sb

    X_g, X_h, y, n_test = vb.load("synthetic_100k", rows, features)
    device = device_info()
    runs = {}
    for engine, threads in (("gpu", 2), ("cpu", 2), ("gpu", 0), ("cpu", 0)):
        use_engine(engine)
        params = sb.SecureBoostParams(n_trees=trees, max_depth=depth, learning_rate=0.3, n_bins=32, threads=threads)
        result = vb.secureboost_ours(X_g, X_h, y, n_test, params)
        report = gpu.engine_report()
        runs[engine, threads] = result
        print(
            f"secureboost {rows}x{features} engine={report['crypto_engine']} threads={threads or os.cpu_count()}: "
            f"{result['seconds_per_tree']:.3f} s/tree (encrypt {result['encrypt_s']:.3f}, histograms "
            f"{result['hist_s']:.3f}, fold {result['fold_s']:.3f}, decrypt {result['decrypt_s']:.3f}), "
            f"AUC {result['auc']:.4f}, gpu batches {report['gpu_batches']}",
            flush=True,
        )
    common = {
        "rows": rows - n_test,
        "features": features,
        "split": "50/50",
        "trees": trees,
        "depth": depth,
        "bins": 32,
        "key_bits": 2048,
        **device,
        "cpu_engine": f"cpu:{_native.engine()}",
        "gpu_runs": "guest gradient encryption, host histograms and guest decryption on the GPU; "
        "cipher compression (fold) and re-randomization on the CPU",
    }
    out = []
    for threads, label in ((2, "2_threads"), (0, "all_cores")):
        g, c = runs["gpu", threads], runs["cpu", threads]
        params = {
            **common,
            "threads": threads or os.cpu_count(),
            "encrypt_s_gpu": round(g["encrypt_s"], 4),
            "encrypt_s_cpu": round(c["encrypt_s"], 4),
            "histograms_s_gpu": round(g["hist_s"], 4),
            "histograms_s_cpu": round(c["hist_s"], 4),
            "fold_s_gpu": round(g["fold_s"], 4),
            "fold_s_cpu": round(c["fold_s"], 4),
            "decrypt_s_gpu": round(g["decrypt_s"], 4),
            "decrypt_s_cpu": round(c["decrypt_s"], 4),
            "auc_gpu": round(g["auc"], 5),
            "auc_cpu": round(c["auc"], 5),
        }
        name = "vertical.secureboost.synthetic_100k.gpu.seconds_per_tree"
        if threads:
            name += ".2_threads"
        out.append(record(name, g["seconds_per_tree"], "s", f"cpu_engine_{label}", c["seconds_per_tree"], params))
    return out


def bench_hetero_nn(rows: int, columns: int, epochs: int) -> list[dict]:
    """Hetero NN epochs on FLBooster's synthetic shape, GPU engine against the CPU engine on all cores."""
    import statistics

    import vertical_bench as vb

    from confide.vertical import hetero_nn as nn
    from confide.vertical.channel import LocalChannel, run_parties

    started = time.perf_counter()
    X, y = vb.synthetic_wide(rows, columns)
    half = columns // 2
    parts = {"guest": X[:, :half], "host": X[:, half:]}
    print(f"hetero_nn: data {rows} x {columns} made in {time.perf_counter() - started:.1f} s", flush=True)
    device = device_info()
    runs = {}
    for engine in ("gpu", "cpu"):
        use_engine(engine)
        params = nn.HeteroNNParams(epochs=epochs, batch_size=1024, learning_rate=0.01, interactive_learning_rate=0.1)
        channels = LocalChannel.group(["guest", "host"], timeout_s=3600)
        out = run_parties(
            {
                "guest": lambda p=params, c=channels: nn.train_guest(c["guest"], ["host"], parts["guest"], y, p, "t"),
                "host": lambda p=params, c=channels: nn.train_host(c["host"], "guest", parts["host"], p, "t"),
            }
        )
        history, host_history = out["guest"].history, out["host"].history
        report = gpu.engine_report()
        runs[engine] = {
            "seconds": statistics.median(h["seconds"] for h in history),
            "guest_crypto_s": statistics.median(h["crypto_seconds"] for h in history),
            "host_crypto_s": statistics.median(h["crypto_seconds"] for h in host_history),
            "engine": report["crypto_engine"],
            "gpu_batches": report["gpu_batches"],
        }
        print(f"hetero_nn {rows}x{columns} engine={engine}: {runs[engine]}", flush=True)
    g, c = runs["gpu"], runs["cpu"]
    params = {
        "rows": rows,
        "columns": columns,
        "split": f"{half}/{columns - half}",
        "bottom": "Dense(8, tanh) each",
        "interactive_units": 8,
        "batch_size": 1024,
        "epochs_measured": epochs,
        "key_bits": 2048,
        **device,
        "cpu_engine": f"cpu:{_native.engine()}",
        "cpu_threads": os.cpu_count(),
        "gpu_runs": "interactive-layer encryptions and decryptions on the GPU; encrypted products on the CPU",
        "guest_crypto_s_gpu": round(g["guest_crypto_s"], 3),
        "host_crypto_s_gpu": round(g["host_crypto_s"], 3),
        "guest_crypto_s_cpu": round(c["guest_crypto_s"], 3),
        "host_crypto_s_cpu": round(c["host_crypto_s"], 3),
        "cpu_engine_seconds_per_epoch": round(c["seconds"], 3),
        "gpu_batches": g["gpu_batches"],
    }
    base = f"vertical.hetero_nn.synthetic_{rows // 1000}k_{columns // 1000}k.gpu"
    return [
        record(f"{base}.seconds_per_epoch", g["seconds"], "s", "flbooster_reported_4x_rtx3090", 71.8, params),
        record(f"{base}.vs_cpu", c["seconds"] / g["seconds"], "x", "cpu_engine_all_cores", c["seconds"], params),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, nargs="+", default=[2048, 3072])
    parser.add_argument("--batch", type=int, default=1 << 17)
    parser.add_argument("--cpu-batch", type=int, default=1 << 14)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="crypto,vertical", help="crypto, vertical, hetero_nn (comma-separated)")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--trees", type=int, default=3)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--nn-rows", type=int, default=100_000)
    parser.add_argument("--nn-columns", type=int, default=10_000)
    parser.add_argument("--nn-epochs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "crypto_gpu.json")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    info = {**machine(), "gpu": device_info()}
    if "crypto" in parts:
        results = []
        for bits in args.bits:
            results.extend(bench_size(bits, args.batch, args.cpu_batch, args.repeats))
            for r in results[-7:]:
                print(json.dumps(r), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        print(f"wrote {args.out}")
    if "vertical" in parts:
        results = bench_vertical(args.rows, args.features, args.trees, args.depth)
        for r in results:
            print(json.dumps(r), flush=True)
        path = args.out.with_name("vertical_gpu.json")
        path.write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        print(f"wrote {path}")
    if "hetero_nn" in parts:
        results = bench_hetero_nn(args.nn_rows, args.nn_columns, args.nn_epochs)
        for r in results:
            print(json.dumps(r), flush=True)
        path = args.out.with_name("vertical_hetero_nn_gpu.json")
        path.write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
