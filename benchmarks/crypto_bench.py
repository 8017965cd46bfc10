"""Crypto core benchmark: Confide's Paillier and packing against python-paillier (phe) and,
where it installs, SecretFlow HEU (ZPaillier encryption, IPCL decryption), all in one run.

Writes benchmarks/results/crypto.json and the table in docs/benchmarks.md.
Ratios are ours / anchor measured in this run (higher is better for us).
phe is single-threaded, so its figure anchors both our 1- and 2-thread records;
``paillier.<op>.<bits>.scaling`` gives our 2-thread / 1-thread speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import machine, median_of_runs, rate, record, results_table, write, write_markdown_block  # noqa: E402

from confide.crypto import (  # noqa: E402
    ENGINE,
    GMP_VERSION,
    BatchCryptCodec,
    DecryptionKey,
    FLBoosterCodec,
    decrypt_packed,
    encrypt_packed,
    sum_encrypted,
)

SCALAR = 731234  # a 20-bit fixed-point weight, as in anchors-measured.md
PLAIN = 123456789
OPS = ("encrypt.public", "encrypt.holder", "decrypt", "add", "scalar_mul")


def keygen_rate(generate, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        generate()
        times.append(time.perf_counter() - start)
    return 1.0 / statistics.median(times)


def ours(bits: int, threads: int, key: DecryptionKey, batch: int) -> dict[str, float]:
    public = key.encryption_key
    values = np.full(batch, PLAIN, dtype=np.int64)
    scalars = np.full(batch, SCALAR, dtype=np.int64)
    a, b = key.encrypt(values), key.encrypt(values)
    return {
        "encrypt.public": rate(lambda: public.encrypt(values, threads=threads), batch),
        "encrypt.holder": rate(lambda: key.encrypt(values, threads=threads), batch),
        "decrypt": rate(lambda: key.decrypt(a, threads=threads), batch),
        "add": rate(lambda: sum_encrypted([a, b], threads=threads), batch),
        "scalar_mul": rate(lambda: a.mul_scalar(scalars, threads=threads), batch),
    }


def phe_rates(bits: int, keygen_repeats: int) -> dict[str, float]:
    from phe import paillier

    public, private = paillier.generate_paillier_keypair(n_length=bits)
    x, y = public.encrypt(PLAIN), public.encrypt(PLAIN)
    assert private.decrypt(x + y) == 2 * PLAIN
    encrypt = rate(lambda: public.encrypt(PLAIN), 1)
    return {
        "keygen": keygen_rate(lambda: paillier.generate_paillier_keypair(n_length=bits), keygen_repeats),
        "encrypt.public": encrypt,
        # phe has no key-holder (CRT) encryption: its only encryption is the anchor.
        "encrypt.holder": encrypt,
        "decrypt": rate(lambda: private.decrypt(x), 1),
        "add": rate(lambda: x + y, 1),
        "scalar_mul": rate(lambda: x * SCALAR, 1),
    }


HEU_SCRIPT = r"""
import json, os, sys, time, statistics
import numpy as np
os.sched_setaffinity(0, {0})
from heu import numpy as hnp, phe
sys.path.insert(0, sys.argv[1])
from benchutil import rate
out = {}
for scheme, op in (("ZPaillier", "encrypt"), ("IPCL", "decrypt")):
    try:
        kit = hnp.setup(getattr(phe.SchemaType, scheme), 2048)
        encoder = kit.bigint_encoder()
        encryptor, decryptor = kit.encryptor(), kit.decryptor()
        batch = 512 if op == "encrypt" else 128
        plain = kit.array(np.full(batch, 123456789, dtype=np.int64), encoder)
        if op == "encrypt":
            out[scheme] = rate(lambda: encryptor.encrypt(plain), batch)
        else:
            cipher = encryptor.encrypt(plain)
            assert int(decryptor.decrypt(cipher).to_numpy(encoder)[0]) == 123456789
            out[scheme] = rate(lambda: decryptor.decrypt(cipher), batch)
    except Exception as error:  # noqa: BLE001 - report, do not crash the run
        out[scheme] = f"{type(error).__name__}: {error}"
print(json.dumps(out))
"""


def heu_rates() -> dict:
    try:
        import heu  # noqa: F401
    except ImportError:
        return {"error": "sf-heu is not installed"}
    proc = subprocess.run(
        [sys.executable, "-c", HEU_SCRIPT, str(Path(__file__).resolve().parent)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_pinned(function, *args):
    """Run with the process pinned to one core (per-core figures), then restore."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        return function(*args)
    finally:
        os.sched_setaffinity(0, before)


def packed(key: DecryptionKey, phe_encrypt: float, phe_decrypt: float) -> list[dict]:
    results = []
    parties = 16
    codec = BatchCryptCodec(bits=16, max_parties=parties, alpha=1.0, seed=1)
    bits_, slots = codec.layout(2048)
    length = slots * 400
    values = np.random.default_rng(0).normal(0, 0.3, length).astype(np.float32)
    params = {"bits": 2048, "threads": 2, "quantization_bits": 16, "parties": parties, "slots": slots}
    encrypt = rate(lambda: encrypt_packed(values, codec, key, threads=2), length)
    results.append(
        record(
            "packed.encrypt.2048.t2",
            encrypt,
            "values/s",
            "phe per-value encrypt",
            phe_encrypt,
            {**params, "key": "holder (CRT)"},
        )
    )
    public = key.encryption_key
    encrypt_public = rate(lambda: encrypt_packed(values, codec, public, threads=2), length)
    results.append(
        record(
            "packed.encrypt.public.2048.t2",
            encrypt_public,
            "values/s",
            "phe per-value encrypt",
            phe_encrypt,
            {**params, "key": "public"},
        )
    )
    vector = encrypt_packed(values, codec, key, threads=2)
    total = sum_encrypted([vector] * parties, threads=2)
    decrypt = rate(lambda: decrypt_packed(total, key, threads=2), length)
    results.append(
        record(
            "packed.decrypt.2048.t2",
            decrypt,
            "values/s",
            "phe per-value decrypt",
            phe_decrypt,
            {**params, "summed": parties},
        )
    )
    aggregate = rate(lambda: sum_encrypted([vector] * parties, threads=2), length * (parties - 1))
    results.append(
        record(
            "packed.aggregate.2048.t2",
            aggregate,
            "values/s",
            None,
            None,
            {**params, "note": "values folded into the running sum per second"},
        )
    )
    wire = len(vector.to_bytes()) / length
    results.append(record("packed.bytes_per_value.2048", wire, "bytes", "phe ciphertext per value", 512.0, params))
    fl_codec = FLBoosterCodec(bits=30, max_parties=4, alpha=1.0)
    fl = encrypt_packed(values, fl_codec, key, threads=2)
    results.append(
        record(
            "packed.flbooster.bytes_per_value.2048",
            len(fl.to_bytes()) / length,
            "bytes",
            "phe ciphertext per value",
            512.0,
            {"quantization_bits": 30, "parties": 4},
        )
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bits", default="2048,3072")
    parser.add_argument("--skip-heu", action="store_true")
    parser.add_argument(
        "--portable",
        default=str(Path(__file__).resolve().parent.parent / "build" / "wheel-venv"),
        help="a venv with the portable wheel installed (make build/wheel-venv/.installed); its cost against this build",
    )
    parser.add_argument("--runs", type=int, default=3, help="whole runs; each record is the median over them")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sizes = [int(b) for b in args.bits.split(",")]
    info = {**machine(), "gmp": GMP_VERSION, "engine": ENGINE}
    try:
        import gmpy2
        import phe

        info["anchors"] = {"phe": phe.__version__, "gmpy2": gmpy2.version(), "gmpy2_gmp": gmpy2.mp_version()}
    except ImportError:
        sys.exit("phe and gmpy2 are required: make bench installs them")
    runs = []
    for run in range(args.runs):
        print(f"== run {run + 1} of {args.runs}", flush=True)
        runs.append(one_run(args, sizes, info))
    results = median_of_runs(runs)
    info["runs"] = args.runs
    path = write("crypto", info, results)
    print(f"wrote {path} (medians of {args.runs} runs)")
    write_markdown(info, results)


def one_run(args, sizes: list[int], info: dict) -> list[dict]:
    """Every record of the bench, measured once."""
    results: list[dict] = []
    phe_by_bits: dict[int, dict[str, float]] = {}
    for bits in sizes:
        print(f"== {bits} bits", flush=True)
        anchor = run_pinned(phe_rates, bits, 5 if bits == 2048 else 2)
        phe_by_bits[bits] = anchor
        own_keygen = run_pinned(keygen_rate, lambda bits=bits: DecryptionKey.generate(bits), 5 if bits == 2048 else 3)
        results.append(record(f"paillier.keygen.{bits}", own_keygen, "keys/s", "phe", anchor["keygen"], {"bits": bits}))
        key = DecryptionKey.generate(bits)
        start = time.perf_counter()
        table_bytes = key.encryption_key.precompute() + key.precompute()
        results.append(
            record(
                f"paillier.tables.{bits}",
                time.perf_counter() - start,
                "s",
                None,
                None,
                {"bits": bits, "table_bytes": table_bytes},
            )
        )
        per_thread = {1: run_pinned(ours, bits, 1, key, 128), 2: ours(bits, 2, key, 256)}
        for threads, figures in per_thread.items():
            for op in OPS:
                results.append(
                    record(
                        f"paillier.{op}.{bits}.t{threads}",
                        figures[op],
                        "ops/s",
                        "phe",
                        anchor[op],
                        {"bits": bits, "threads": threads},
                    )
                )
        for op in OPS:
            results.append(
                record(
                    f"paillier.{op}.{bits}.scaling",
                    per_thread[2][op] / per_thread[1][op],
                    "x",
                    None,
                    None,
                    {"bits": bits, "note": "2 threads / 1 thread"},
                )
            )
        for r in results[-len(OPS) * 3 - 2 :]:
            print(
                f"  {r['name']:<38} {r['value']:>14,.1f} {r['unit']:<9}"
                + (f" phe {r['anchor_value']:>12,.1f}  x{r['ratio']:.2f}" if r["anchor_value"] else ""),
                flush=True,
            )
    if 2048 in sizes:
        key = DecryptionKey.generate(2048)
        key.precompute()
        key.encryption_key.precompute()
        for r in packed(key, phe_by_bits[2048]["encrypt.public"], phe_by_bits[2048]["decrypt"]):
            results.append(r)
            print(f"  {r['name']:<38} {r['value']:>14,.2f} {r['unit']}", flush=True)
        if not args.skip_heu:
            heu = heu_rates()
            ours_t1 = {r["name"]: r["value"] for r in results}
            for scheme, op, name in (
                ("ZPaillier", "encrypt", "paillier.encrypt.public.2048.t1"),
                ("IPCL", "decrypt", "paillier.decrypt.2048.t1"),
            ):
                value = heu.get(scheme)
                if isinstance(value, float):
                    results.append(
                        record(
                            f"{name}.vs_heu_{scheme.lower()}",
                            ours_t1[name],
                            "ops/s",
                            f"heu {scheme} numpy batch, 1 core",
                            value,
                            {"bits": 2048},
                        )
                    )
                    if op == "encrypt":
                        results.append(
                            record(
                                f"paillier.encrypt.holder.2048.t1.vs_heu_{scheme.lower()}",
                                ours_t1["paillier.encrypt.holder.2048.t1"],
                                "ops/s",
                                f"heu {scheme} numpy batch, 1 core",
                                value,
                                {"bits": 2048},
                            )
                        )
                else:
                    print(f"  HEU {scheme}: not measured ({value or heu.get('error')})")
                    note = f"heu {scheme}: {value or heu.get('error')}"
                    if note not in info.setdefault("skipped", []):
                        info["skipped"].append(note)
            for r in results:
                if ".vs_heu_" in r["name"]:
                    print(f"  {r['name']:<50} {r['value']:>10,.1f} vs {r['anchor_value']:>10,.1f}  x{r['ratio']:.2f}")
    if args.portable:
        results += portable_cost(Path(args.portable).resolve())
    return results


#: Rates of one process: (op -> ops/s) at 2048 bits, one thread, the engine it runs on.
_RATES = """
import json, statistics, time
import numpy as np
from confide.crypto import ENGINE, DecryptionKey
key = DecryptionKey.generate(2048); key.precompute(); key.encryption_key.precompute()
values = np.full(64, 123456789, dtype=np.int64)
cipher = key.encrypt(values)
def rate(call):
    times = []
    for _ in range(7):
        start = time.perf_counter(); call(); times.append(time.perf_counter() - start)
    return values.size / statistics.median(times)
print(json.dumps({"engine": ENGINE,
    "encrypt.public": rate(lambda: key.encryption_key.encrypt(values, threads=1)),
    "encrypt.holder": rate(lambda: key.encrypt(values, threads=1)),
    "decrypt": rate(lambda: key.decrypt(cipher, threads=1))}))
"""


def portable_cost(venv: Path) -> list[dict]:
    """The installed wheel (portable GMP) against this build (tuned GMP), per engine, same run.

    ``venv`` holds the wheel (``make wheel``; tests/integration/test_wheel.py installs it the
    same way). Both run the same code in a child process, with the IFMA engine on and forced off
    (GMP does the modular arithmetic then: where the GMP build matters).
    """
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"  portable build: no {python}; skipped")
        return []
    out = []
    for forced in (False, True):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        if forced:
            env["CONFIDE_DISABLE_IFMA"] = "1"
        runs = {}
        for build, interpreter in (("tuned", sys.executable), ("portable", str(python))):
            done = subprocess.run([interpreter, "-c", _RATES], capture_output=True, text=True, env=env, cwd="/")
            if done.returncode != 0:
                raise SystemExit(f"portable build ({build}): {done.stderr[-2000:]}")
            runs[build] = json.loads(done.stdout.splitlines()[-1])
        engine = runs["tuned"]["engine"]
        for op in ("encrypt.public", "encrypt.holder", "decrypt"):
            out.append(
                record(
                    f"paillier.portable.{op}.2048.t1.{engine}",
                    runs["portable"][op],
                    "ops/s",
                    "this build (GMP tuned for the host)",
                    runs["tuned"][op],
                    {"bits": 2048, "threads": 1, "engine": engine, "portable_engine": runs["portable"]["engine"]},
                )
            )
            print(f"  {out[-1]['name']:<50} {out[-1]['value']:>10,.1f} vs tuned {out[-1]['anchor_value']:>10,.1f}")
    return out


def write_markdown(info: dict, results: list[dict]) -> None:
    lines = [
        f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), "
        f"engine {info['engine']}, GMP {info['gmp']}, "
        f"commit {info['commit']}; anchors phe {info['anchors']['phe']} with gmpy2 {info['anchors']['gmpy2']} "
        f"({info['anchors']['gmpy2_gmp']}), same run; each figure the median of {info.get('runs', 1)} runs.",
        "",
        *results_table(results),
    ]
    for skipped in info.get("skipped", []):
        lines.append(f"\nNot measured: {skipped}")
    write_markdown_block("crypto_bench", "Crypto core (latest run)", lines)


if __name__ == "__main__":
    main()
