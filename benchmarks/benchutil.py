"""Shared helpers for benchmarks: timing medians, machine description, result files."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def rate(call: Callable[[], object], items: int, *, repeats: int = 3, min_seconds: float = 0.3) -> float:
    """Median items/s over ``repeats`` runs; each run calls ``call`` until ``min_seconds`` pass."""
    call()  # warm-up (tables, pools, caches)
    rates = []
    for _ in range(repeats):
        done = 0
        start = time.perf_counter()
        while True:
            call()
            done += items
            elapsed = time.perf_counter() - start
            if elapsed >= min_seconds:
                break
        rates.append(done / elapsed)
    return statistics.median(rates)


def machine() -> dict:
    """What the figures were measured on."""
    model, flags = "unknown", set()
    family = model_number = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            if line.startswith("cpu family") and not family:
                family = line.split(":", 1)[1].strip()
            if line.startswith("model\t") and not model_number:
                model_number = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": model,
        "cpu_family": family,
        "cpu_model": model_number,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "kernel": platform.release(),
        # The CPU features the kernels choose between (hosts of one machine kind differ in these).
        "flags": sorted(flags & {"avx2", "fma", "adx", "bmi2", "avx512f", "avx512ifma", "avx512vl", "vaes"}),
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def record(name, value, unit, anchor=None, anchor_value=None, params=None, digits: int = 4) -> dict:
    """One result record in the format of DEVELOPERS.md (``digits``: decimals kept of the value)."""
    ratio = value / anchor_value if anchor_value else None
    return {
        "name": name,
        "value": round(value, digits),
        "unit": unit,
        "anchor": anchor,
        "anchor_value": round(anchor_value, 4) if anchor_value is not None else None,
        "ratio": round(ratio, 3) if ratio is not None else None,
        "params": params or {},
    }


def median_of_runs(runs: list[list[dict]]) -> list[dict]:
    """One record per name: the median value and anchor value over ``runs`` (whole runs of a bench).

    Hosts of one machine kind share their cores with others: one run can be a quarter off the
    next. The ratio is the median value over the median anchor; ``params.runs`` holds each run's value.
    """
    import statistics

    if len(runs) == 1:
        return runs[0]
    out = []
    for first in runs[0]:
        same = [r for run in runs for r in run if r["name"] == first["name"]]
        values = [r["value"] for r in same]
        anchors = [r["anchor_value"] for r in same if r["anchor_value"] is not None]
        merged = record(
            first["name"],
            statistics.median(values),
            first["unit"],
            first["anchor"],
            statistics.median(anchors) if anchors else None,
            {**first["params"], "runs": values},
            digits=7,
        )
        out.append(merged)
    return out


def write(bench: str, machine_info: dict, results: list[dict]) -> Path:
    """Write benchmarks/results/<bench>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{bench}.json"
    path.write_text(json.dumps({"machine": machine_info, "results": results}, indent=2) + "\n")
    return path


def merged(bench: str, results: list[dict], info: dict, measured: str) -> tuple[list[dict], dict]:
    """This run's records, then the earlier ``results/<bench>.json`` records of what it did not measure.

    ``measured`` says what this run re-measured (for the machine block); the kept records keep the
    anchors measured in their own run, and ``kept_from`` names that run.
    """
    path = RESULTS / f"{bench}.json"
    if not path.exists():
        return results, info
    earlier = json.loads(path.read_text())
    fresh = {r["name"] for r in results}
    kept = [r for r in earlier["results"] if r["name"] not in fresh]
    info = {
        **info,
        "merged": f"records of {measured} from this run; the others ({len(kept)}) kept from the run described in "
        "'kept_from', each with the anchor measured in its own run",
        "kept_from": earlier["machine"].get("kept_from", earlier["machine"]),
    }
    return results + kept, info


def merged_lines(info: dict) -> list[str]:
    """A markdown block's note on the records a merged run kept (none for a whole run)."""
    if "merged" not in info:
        return []
    kept = info["kept_from"]
    return [
        "",
        f"Merged: {info['merged']}; kept records measured {kept.get('date')} on {kept.get('cpu')}, commit "
        f"{kept.get('commit')}.",
    ]


def results_table(results: list[dict], value: str = ",.2f", anchor: str = ",.1f", ratio: str = ".2f") -> list[str]:
    """Markdown table lines of result records (format specs for value, anchor value and ratio)."""
    lines = ["| record | value | unit | anchor | anchor value | ratio |", "|---|---:|---|---|---:|---:|"]
    for r in results:
        anchor_value = format(r["anchor_value"], anchor) if r["anchor_value"] is not None else ""
        shown_ratio = format(r["ratio"], ratio) if r["ratio"] is not None else ""
        lines.append(
            f"| `{r['name']}` | {format(r['value'], value)} | {r['unit']} | {r['anchor'] or ''} "
            f"| {anchor_value} | {shown_ratio} |"
        )
    return lines


def write_markdown_block(bench: str, heading: str, lines: list[str], script: str | None = None) -> Path:
    """Replace (or append) the generated block of ``bench`` in docs/benchmarks.md (made by ``script``)."""
    docs = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
    start = f"<!-- {bench}:start"
    end = f"<!-- {bench}:end -->"
    block = "\n".join([f"{start} (generated by benchmarks/{script or bench}.py; do not edit by hand) -->", *lines, end])
    text = docs.read_text() if docs.exists() else "# Benchmarks\n\n"
    if start in text and end in text:
        text = text[: text.index(start)] + block + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip() + f"\n\n## {heading}\n\n" + block + "\n"
    docs.write_text(text)
    return docs


def phe_per_value(sample) -> dict[str, float]:
    """Seconds per value for python-paillier (2048-bit) encryption, addition and decryption on ``sample``.

    The anchor of the per-value baselines: FATE-style HE aggregation encrypts every value alone.
    """
    import numpy as np
    from phe import paillier

    public, private = paillier.generate_paillier_keypair(n_length=2048)
    start = time.perf_counter()
    encrypted = [public.encrypt(float(v)) for v in sample]
    t_encrypt = (time.perf_counter() - start) / sample.size
    start = time.perf_counter()
    summed = [a + b for a, b in zip(encrypted, encrypted, strict=True)]
    t_add = (time.perf_counter() - start) / sample.size
    start = time.perf_counter()
    decrypted = np.array([private.decrypt(c) for c in summed])
    t_decrypt = (time.perf_counter() - start) / sample.size
    if not np.allclose(decrypted, 2 * sample, atol=1e-9):
        raise SystemExit("python-paillier sample did not decrypt to its sum")
    return {"encrypt": t_encrypt, "add": t_add, "decrypt": t_decrypt}


def per_ciphertext_costs(parties: int, count: int = 400) -> dict:
    """One core's seconds to encrypt and to decrypt one packed 2048-bit ciphertext (16-bit codes).

    The E and D of the benches' crypto bound: with every party encrypting its C ciphertexts and
    the m parties sharing the C decryptions on one machine's cores, a ``paillier`` round cannot
    take less than plain + (m·E + D)·C / cores.
    """
    import numpy as np

    from confide.crypto import BatchCryptCodec, DecryptionKey, decrypt_packed, encrypt_packed

    key = DecryptionKey.generate(2048)
    key.precompute()
    codec = BatchCryptCodec(bits=16, max_parties=parties, alpha=0.04)
    probe = encrypt_packed(np.zeros(1000), codec, key, threads=1)
    per = -(-1000 // probe.num_ciphertexts)
    values = np.random.default_rng(2).normal(0, 0.01, per * count)
    started = time.perf_counter()
    vector = encrypt_packed(values, codec, key, threads=1)
    encrypt = (time.perf_counter() - started) / vector.num_ciphertexts
    started = time.perf_counter()
    decrypt_packed(vector, key, threads=1)
    decrypt = (time.perf_counter() - started) / vector.num_ciphertexts
    return {"encrypt": encrypt, "decrypt": decrypt, "values_per_ciphertext": vector.length // vector.num_ciphertexts}


def crypto_floor(costs: dict, parties: int, values: int, cores: int | None = None) -> tuple[int, float]:
    """(ciphertexts per party, seconds of crypto a paillier round needs on ``cores`` shared cores)."""
    ciphertexts = -(-values // costs["values_per_ciphertext"])
    cores = cores or os.cpu_count() or 1
    return ciphertexts, (parties * costs["encrypt"] + costs["decrypt"]) * ciphertexts / cores


def print_costs(costs: dict) -> None:
    """Print :func:`per_ciphertext_costs` as the benches do."""
    print(
        f"one core, 2048-bit key: {costs['values_per_ciphertext']} values per ciphertext, encrypt "
        f"{costs['encrypt'] * 1e3:.3f} ms and decrypt {costs['decrypt'] * 1e3:.3f} ms per ciphertext"
    )


def crypto_bound(
    name: str,
    plain_seconds: float,
    costs: dict,
    parties: int,
    values: int,
    params: dict,
    cores: int | None = None,
) -> tuple[dict, dict]:
    """The ``<name>`` record of the crypto bound on a paillier round, and its figures.

    The record's value is the bound as a ratio to plain: plain + :func:`crypto_floor`, over plain.
    ``cores`` (recorded when given): the shared cores the floor divides by. Returns the record and
    ``{"floor", "ciphertexts", "crypto_seconds"}`` for the bench's note.
    """
    ciphertexts, crypto_seconds = crypto_floor(costs, parties, values, cores)
    floor = plain_seconds + crypto_seconds
    bound = record(
        name,
        floor,
        "ratio",
        "plain",
        plain_seconds,
        {
            **params,
            "ciphertexts_per_party": ciphertexts,
            "encrypt_ms": round(costs["encrypt"] * 1e3, 4),
            "decrypt_ms": round(costs["decrypt"] * 1e3, 4),
            **({"cores": cores} if cores is not None else {}),
            "crypto_floor_seconds": round(crypto_seconds, 4),
        },
    )
    bound["value"] = bound["ratio"]
    return bound, {"floor": floor, "ciphertexts": ciphertexts, "crypto_seconds": crypto_seconds}
