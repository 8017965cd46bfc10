"""Federated runtime benchmark: Homo LR rounds per protection mode, and the slice pipeline.

Two shapes of synthetic data (algorithms.md §7.1, binary), 4 parties, every party and the
aggregator a separate process on loopback with mutual TLS:

(a) 100,000 samples x 1,000 dense features, 5 local epochs per round;
(b) 20,000 samples x 100,000 sparse features (density 0.001, ~100 non-zeros per row), 1 epoch;
(peer_1_25m, with ``--shapes``) 8,000 x 1,250,000 sparse: 1,250,001 values, the size of the side
by side comparison with Flower's SecAgg+ (4 parties; ``runtime.<mode>.peer_1_25m.vs_plain``).

Per mode: seconds per round (median over the rounds after the first), the crypto part of it
(mean over parties of the time spent protecting and decoding, measured inside the parties),
and bytes per round on the wire (all parties, both directions, serialized protobuf sizes).

Anchor, same run: python-paillier (phe 1.5.0 + gmpy2) encrypting each value separately, as
FATE's HE aggregation does. Running it on a whole update of shape (b) would take ~20 minutes
per round, so its per-value costs (encrypt, add, decrypt) are measured on a sample of the
same update and scaled linearly: baseline round = plain round + n * (t_encrypt + t_decrypt)
+ (m - 1) * n * t_add, each party encrypting and decrypting its own copy in parallel, as on
separate machines. The output says so.

Pipeline: one party pushes a large paillier update to the aggregator process with encryption
of the next slices (one per core, single-threaded each) overlapped with sending slice i-1, then
without overlap (encrypt all with every core per slice, then send); also encryption alone and
sending alone, so the achieved overlap can be read off. Twice: over loopback as is, and with
the sender paced to 100 Mbit/s (sleeping each slice's transmission time: a party on another
continent), where sending is no longer negligible next to encryption.

Repeats: a single job of either mode swings by tens of percent on a shared 2-core machine, so
each shape runs ``--repeats`` times with the modes interleaved (plain, secagg, paillier,
groupmask, plain, ...); every figure is the median over the runs of each run's median round.

Crypto bound: the crypto a ``paillier`` round must do, from one core's cost per ciphertext
measured in the same run (E to encrypt, D to decrypt): every party encrypts its C ciphertexts and
the m parties share the C decryptions, so on this machine, where all parties share its cores,
a round cannot take less than plain + (m·E + D)·C / cores. ``runtime.paillier.<shape>.bound_vs_plain``
is that floor over plain: what ``vs_plain`` could reach with no overhead at all.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import (  # noqa: E402
    crypto_bound,
    machine,
    merged,
    per_ciphertext_costs,
    phe_per_value,
    print_costs,
    record,
    results_table,
    write,
    write_markdown_block,
)

from confide.crypto import BatchCryptCodec, DecryptionKey, encrypt_packed  # noqa: E402
from confide.local import LocalFederation, run_local  # noqa: E402
from confide.spec import parse_job  # noqa: E402
from confide.transport.certs import Identity  # noqa: E402
from confide.transport.client import AggregatorClient  # noqa: E402
from confide.transport.slicing import pipelined, slice_length_for  # noqa: E402
from confide.v1 import runtime_pb2 as pb  # noqa: E402

MODES = ["plain", "secagg", "paillier", "groupmask"]
PARTIES = ["party-1", "party-2", "party-3", "party-4"]
SHAPES = {
    "a": {
        "data": {"dataset": "synthetic", "samples": 100_000, "features": 1_000, "test_fraction": 0.05},
        "model": {"learning_rate": 0.05, "local_epochs": 5, "batch_size": 256},
        "label": "100,000 x 1,000 dense, 5 local epochs",
    },
    "b": {
        "data": {
            "dataset": "synthetic",
            "samples": 20_000,
            "features": 100_000,
            "density": 0.001,
            "test_fraction": 0.05,
        },
        "model": {"learning_rate": 0.5, "local_epochs": 1, "batch_size": 256},
        "label": "20,000 x 100,000 sparse (density 0.001), 1 local epoch",
    },
    # The size of the side-by-side comparison with Flower's SecAgg+ (1.25M values, 4 parties).
    "peer_1_25m": {
        "data": {
            "dataset": "synthetic",
            "samples": 8_000,
            "features": 1_250_000,
            "density": 0.0001,
            "test_fraction": 0.05,
        },
        "model": {"learning_rate": 0.5, "local_epochs": 1, "batch_size": 256},
        "label": "8,000 x 1,250,000 sparse (density 0.0001), 1 local epoch: 1,250,001 values",
    },
}


def job_spec(shape: str, job_id: str, rounds: int, protection: dict):
    """The bench's Homo LR job on ``shape`` (SHAPES) for PARTIES under ``protection``."""
    config = SHAPES[shape]
    return parse_job(
        {
            "job_id": job_id,
            "rounds": rounds,
            "parties": PARTIES,
            "model": {"algorithm": "homo_lr", **config["model"]},
            "data": config["data"],
            "protection": protection,
            "seed": 1,
        }
    )


def run_mode(shape: str, mode: str, rounds: int, workdir: Path) -> dict:
    spec = job_spec(shape, f"bench-{shape}-{mode}", rounds, {"mode": mode, "key_bits": 2048, "bits": 16})
    target = workdir / f"{shape}-{mode}"
    if target.exists():
        shutil.rmtree(target)
    report = run_local(spec, target, progress=False, echo=lambda *_: None)
    later = report["rounds"][1:] or report["rounds"]
    return {
        "seconds": statistics.median(r["seconds"] for r in later),
        "crypto": statistics.median(r["crypto_s"] for r in later),
        "train": statistics.median(r["train_s"] for r in later),
        "bytes": statistics.median(r["bytes_sent"] + r["bytes_received"] for r in later),
        "auc": report["final_auc"],
        "length": SHAPES[shape]["data"]["features"] + 1,
        "setup": report["setup_seconds"],
    }


def median_of_runs(runs: list[dict]) -> dict:
    """Each figure's median over the runs; the runs' round times are kept for the record."""
    out = {key: statistics.median(r[key] for r in runs) for key in ("seconds", "crypto", "train", "bytes", "auc")}
    return {**runs[0], **out, "runs_seconds": [round(r["seconds"], 4) for r in runs]}


def over_link(slices, mbps: float | None):
    """Hand slices to the stream no faster than a link of ``mbps`` would carry them (None: as fast as it takes)."""
    for item in slices:
        yield item
        if mbps:
            time.sleep(len(item.payload) * 8 / (mbps * 1e6))


def pipeline_overlap(workdir: Path, values: int, links: list[float | None]) -> dict[str, dict[str, float]]:
    """One party pushes ``values`` paillier-packed values to the aggregator process, per link speed."""
    spec = parse_job({"job_id": "bench-pipeline", "parties": ["party-1", "party-2"], "rounds": 1})
    federation = LocalFederation(spec, workdir / "pipeline")
    federation.prepare()
    federation.start_aggregator()
    identity = Identity.load(federation.certs, "party-1")
    client = AggregatorClient(f"127.0.0.1:{federation.port}", identity, "bench-pipeline")
    key = DecryptionKey.generate(2048)
    key.precompute()
    vector = np.random.default_rng(0).normal(0, 0.01, values)
    codec = BatchCryptCodec(bits=16, max_parties=4, alpha=0.04)
    length = slice_length_for(64 * 1024)
    count = -(-values // length)

    workers = os.cpu_count() or 1

    def produce(index: int, threads: int = 0) -> pb.Slice:
        chunk = vector[index * length : (index + 1) * length]
        payload = encrypt_packed(chunk, codec, key, threads=threads).to_bytes()
        return pb.Slice(index=index, n_valid=chunk.size, payload=payload)

    def produce_single(index: int) -> pb.Slice:
        return produce(index, 1)

    def push(round_number: int, slices) -> float:
        header = pb.RoundHeader(
            job_id="bench-pipeline",
            round=round_number,
            party_id="party-1",
            participants=["party-1"],
            kind=pb.AGGREGATION_KIND_PAILLIER_PRODUCT,
            num_slices=count,
            slice_length=length,
            vector_length=values,
            routing=pb.RESULT_ROUTING_ROUND_ROBIN,
            encryption_key=key.encryption_key.to_bytes(),
            mode="paillier",
        )
        start = time.perf_counter()
        reply = client.push(header, slices)
        assert reply.accepted == count, reply
        return time.perf_counter() - start

    out = {}
    round_number = 1
    try:
        client.connect()
        push(round_number, [produce(i) for i in range(count)])  # warm-up
        for link in links:
            timings = {"pipelined": [], "sequential": [], "encrypt_only": [], "send_only": []}
            for _ in range(3):
                round_number += 10
                overlapped = pipelined(produce_single, count, depth=4, enabled=True, workers=workers)
                timings["pipelined"].append(push(round_number, over_link(overlapped, link)))
                sequential = pipelined(produce, count, enabled=False)
                timings["sequential"].append(push(round_number + 1, over_link(sequential, link)))
                start = time.perf_counter()
                cached = [produce(i) for i in range(count)]
                timings["encrypt_only"].append(time.perf_counter() - start)
                timings["send_only"].append(push(round_number + 2, over_link(cached, link)))
            out["loopback" if link is None else f"link{link:g}mbps"] = {
                name: statistics.median(samples) for name, samples in timings.items()
            } | {"slices": count}
    finally:
        client.close()
        federation.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each mode per shape, interleaved")
    parser.add_argument("--shapes", default="a,b")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--phe-sample", type=int, default=200)
    parser.add_argument("--pipeline-values", type=int, default=2_000_000)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep the records of results/runtime.json that this run does not measure (other modes): each "
        "record keeps the anchor of the run that measured it, and the machine block names both runs",
    )
    args = parser.parse_args()
    info = machine()
    results: list[dict] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="confide-runtime-bench-") as directory:
        workdir = Path(directory)
        sample = np.random.default_rng(1).normal(0, 0.01, args.phe_sample)
        per_value = phe_per_value(sample)
        print(
            f"phe per value (2048-bit, measured on {args.phe_sample} values of an update): "
            f"encrypt {per_value['encrypt'] * 1e3:.2f} ms, add {per_value['add'] * 1e6:.1f} us, "
            f"decrypt {per_value['decrypt'] * 1e3:.2f} ms; the per-value baseline is scaled linearly from these"
        )
        costs = per_ciphertext_costs(len(PARTIES))
        print_costs(costs)
        for shape in args.shapes.split(","):
            runs: dict[str, list[dict]] = {mode: [] for mode in args.modes.split(",")}
            for repeat in range(args.repeats):
                for mode in runs:
                    started = time.perf_counter()
                    m = run_mode(shape, mode, args.rounds, workdir)
                    runs[mode].append(m)
                    print(
                        f"shape {shape} {mode:<9} run {repeat + 1}: {m['seconds']:.3f} s/round (crypto "
                        f"{m['crypto']:.3f} s, train {m['train']:.3f} s), {m['bytes'] / 1e6:.2f} MB/round, "
                        f"AUC {m['auc']:.4f} [{time.perf_counter() - started:.0f} s incl. set-up]"
                    )
            measured = {mode: median_of_runs(done) for mode, done in runs.items()}
            results.extend(shape_records(shape, measured, per_value, costs, args, notes))
        pipelines = pipeline_overlap(workdir, args.pipeline_values, [None, 100.0])
    for link, pipeline in pipelines.items():
        results.extend(pipeline_records(link, pipeline, args.pipeline_values))
        print(
            f"pipeline ({link}), {args.pipeline_values:,} values in {pipeline['slices']} slices of 64 KiB: "
            f"pipelined {pipeline['pipelined']:.3f} s, sequential {pipeline['sequential']:.3f} s "
            f"(encrypt alone {pipeline['encrypt_only']:.3f} s, send alone {pipeline['send_only']:.3f} s)"
        )
    for note in notes:
        print("note:", note)
    info["anchors"] = {"phe": "1.5.0 (per value, scaled linearly from a sample; see docstring)"}
    if args.merge:
        results, info = merged("runtime", results, info, f"modes {args.modes} and the pipeline")
    path = write("runtime", info, results)
    print(f"wrote {path}")
    write_markdown(info, results, notes)


def shape_records(shape: str, measured: dict, per_value: dict, costs: dict, args, notes: list[str]) -> list[dict]:
    params = {"parties": len(PARTIES), "rounds": args.rounds, "repeats": args.repeats, "shape": SHAPES[shape]["label"]}
    out = []
    plain = measured.get("plain")
    for mode, m in measured.items():
        out.append(
            record(
                f"runtime.{mode}.{shape}.seconds_per_round",
                m["seconds"],
                "s",
                params={**params, "runs_seconds": m["runs_seconds"]},
            )
        )
        out.append(record(f"runtime.{mode}.{shape}.crypto_seconds_per_round", m["crypto"], "s", params=params))
        out.append(record(f"runtime.{mode}.{shape}.bytes_per_round", m["bytes"], "B", params=params))
        out.append(record(f"runtime.{mode}.{shape}.auc", m["auc"], "AUC", params=params))
        if plain is None or mode == "plain":
            continue
        out.append(record(f"runtime.{mode}.{shape}.vs_plain", m["seconds"], "ratio", "plain", plain["seconds"], params))
        out.append(
            record(f"runtime.{mode}.{shape}.bytes_vs_plain", m["bytes"], "ratio", "plain", plain["bytes"], params)
        )
        for r in out[-2:]:
            r["value"] = r["ratio"]
    if plain is not None and "paillier" in measured:
        paillier = measured["paillier"]
        n, m = paillier["length"], len(PARTIES)
        crypto = n * (per_value["encrypt"] + per_value["decrypt"]) + (m - 1) * n * per_value["add"]
        baseline = plain["seconds"] + crypto
        out.append(
            record(
                f"runtime.paillier.{shape}.vs_phe",
                baseline / paillier["seconds"],
                "ratio",
                "phe per value (scaled)",
                baseline,
                {**params, "baseline_seconds": round(baseline, 2), "ours_seconds": round(paillier["seconds"], 4)},
            )
        )
        out[-1]["ratio"] = out[-1]["value"]
        cores = os.cpu_count() or 1
        bound, figures = crypto_bound(
            f"runtime.paillier.{shape}.bound_vs_plain", plain["seconds"], costs, m, n, params, cores
        )
        out.append(bound)
        floor, ciphertexts = figures["floor"], figures["ciphertexts"]
        notes.append(
            f"shape {shape}: paillier {paillier['seconds']:.3f} s = "
            f"{paillier['seconds'] / plain['seconds']:.2f}x plain "
            f"({plain['seconds']:.3f} s); the crypto alone, {m} parties x {ciphertexts:,} encryptions at "
            f"{costs['encrypt'] * 1e3:.3f} ms + {ciphertexts:,} decryptions at {costs['decrypt'] * 1e3:.3f} ms on "
            f"{cores} cores, bounds it at {floor:.3f} s = {floor / plain['seconds']:.2f}x plain; "
            f"{(paillier['seconds'] - floor) / paillier['seconds']:.0%} of the round is above that bound"
        )
    return out


def pipeline_records(link: str, pipeline: dict, values: int) -> list[dict]:
    params = {"values": values, "slices": pipeline["slices"], "slice_bytes": 65536, "mode": "paillier", "link": link}
    prefix = f"runtime.pipeline.paillier.{link}"
    out = [
        record(f"{prefix}.{name}_seconds", pipeline[name], "s", params=params)
        for name in ("pipelined", "sequential", "encrypt_only", "send_only")
    ]
    speedup = record(f"{prefix}.speedup", pipeline["sequential"], "ratio", "pipelined", pipeline["pipelined"], params)
    speedup["value"] = speedup["ratio"]
    # Share of the shorter stage that the overlap hid (1.0 = pipelined took max(encrypt, send)).
    hidden = (pipeline["sequential"] - pipeline["pipelined"]) / min(pipeline["encrypt_only"], pipeline["send_only"])
    out.append(speedup)
    out.append(record(f"{prefix}.hidden_fraction", hidden, "fraction", params=params))
    return out


def write_markdown(info: dict, results: list[dict], notes: list[str]) -> None:
    lines = [
        f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}; "
        "4 parties + aggregator as separate processes on loopback (mTLS); anchor phe 1.5.0 per value, "
        "scaled linearly from a sample measured in the same run.",
        "",
        *results_table(results, value=",.4g", anchor=",.4g", ratio=".3g"),
    ]
    if "merged" in info:
        kept = info["kept_from"]
        lines[1:1] = [
            "",
            f"Merged: {info['merged']}; kept records measured {kept.get('date')} on {kept.get('cpu')}, commit "
            f"{kept.get('commit')}.",
        ]
    lines.extend(["", *[f"- {note}" for note in notes]])
    write_markdown_block("runtime_bench", "Federated runtime (latest run)", lines)


if __name__ == "__main__":
    main()
