"""Rounds over real links: aggregator and parties on separate hosts joined by shaped links.

Every process lives in its own network namespace (tests/fixtures/netns.py): each host's link is
a veth pair shaped both ways by ``tc tbf``, and Toxiproxy in front of the aggregator's gRPC and
data ports adds half the round trip to each direction. Two links:

- ``100mbit``: 100 Mbit/s, 20 ms round trip (a party on another continent);
- ``1gbit``: 1 Gbit/s, 2 ms round trip (Jupiter's dedicated lines).

Every host has its own link, the aggregator included, so the parties' uploads share the
aggregator's 100 Mbit/s. The job: Homo LR on synthetic sparse data with ``--features`` weights
(300,000 by default: 1.3 MB of paillier ciphertexts per party per round), 3 parties, 1 local
epoch. Per link and mode, seconds per round is the median over the rounds after the first;
the anchor is the same mode on loopback (``confide run``'s federation, no namespaces) in the same
run; ``wan.<link>.lattice.vs_plain`` is ``lattice`` over ``plain`` on the same link. ``paillier``
runs with the slice pipeline on and off (``transport.pipeline``); ``wan.<link>.pipeline.speedup``
is off / on (and the one-party upload overlap runs only where paillier does). With
``--repeats`` every figure is the median over the runs (modes interleaved). ``threshold`` is
left out: its rounds decrypt without CRT and would take minutes at this size.

Needs root, iproute2 and Toxiproxy (scripts/ensure-toxiproxy.sh); without them it says why and
writes nothing.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))
from benchutil import machine, merged, merged_lines, record, results_table, write, write_markdown_block  # noqa: E402

from confide.local import run_local  # noqa: E402
from confide.spec import parse_job  # noqa: E402
from tests.fixtures.netns import DATA_PORT, GRPC_PORT, Link, run_federation, unavailable, wan_network  # noqa: E402

LINKS = {
    "100mbit": Link("100mbit", rate_mbit=100, rtt_ms=20),
    "1gbit": Link("1gbit", rate_mbit=1000, rtt_ms=2),
}
MODES = ["plain", "secagg", "groupmask", "tee", "lattice", "paillier"]
PARTIES = ["party-1", "party-2", "party-3"]


def job(mode: str, pipeline: bool, args) -> object:
    return parse_job(
        {
            "job_id": f"wan-{mode}-{'pipe' if pipeline else 'nopipe'}",
            "rounds": args.rounds,
            "parties": PARTIES,
            "model": {"algorithm": "homo_lr", "learning_rate": 0.5, "local_epochs": 1, "batch_size": 256},
            "data": {
                "dataset": "synthetic",
                "samples": args.samples,
                "features": args.features,
                "density": args.density,
                "test_fraction": 0.1,
            },
            "protection": {"mode": mode, "key_bits": 2048, "bits": 16},
            "transport": {
                "pipeline": pipeline,
                "slice_bytes": args.slice_bytes,
                "round_timeout_s": 300.0,
                "message_timeout_s": 600.0,
            },
            "checkpoint_interval": 0,
            "seed": 1,
        }
    )


def summary(report: dict) -> dict:
    later = report["rounds"][1:] or report["rounds"]
    return {
        "seconds": statistics.median(r["seconds"] for r in later),
        "crypto": statistics.median(r["crypto_s"] for r in later),
        "train": statistics.median(r["train_s"] for r in later),
        "bytes": statistics.median(r["bytes_sent"] + r["bytes_received"] for r in later),
        "auc": report["final_auc"],
    }


def upload_child(args) -> int:
    """In a party's namespace: push one paillier update to the aggregator, pipelined and not; print JSON."""
    import json
    import os

    import numpy as np

    from confide.crypto import BatchCryptCodec, DecryptionKey, encrypt_packed
    from confide.transport.certs import Identity
    from confide.transport.client import AggregatorClient
    from confide.transport.slicing import pipelined, slice_length_for
    from confide.v1 import runtime_pb2 as pb

    identity = Identity.load(args.certs, "party-1")
    client = AggregatorClient(args.target, identity, "wan-upload")
    key = DecryptionKey.generate(2048)
    key.precompute()
    vector = np.random.default_rng(0).normal(0, 0.01, args.features)
    codec = BatchCryptCodec(bits=16, max_parties=len(PARTIES), alpha=0.04)
    length = slice_length_for(args.slice_bytes)
    count = -(-args.features // length)
    workers = os.cpu_count() or 1

    def produce(index: int, threads: int = 0) -> pb.Slice:
        chunk = vector[index * length : (index + 1) * length]
        payload = encrypt_packed(chunk, codec, key, threads=threads).to_bytes()
        return pb.Slice(index=index, n_valid=chunk.size, payload=payload)

    def push(number: int, slices) -> float:
        header = pb.RoundHeader(
            job_id="wan-upload",
            round=number,
            party_id="party-1",
            participants=["party-1"],
            kind=pb.AGGREGATION_KIND_PAILLIER_PRODUCT,
            num_slices=count,
            slice_length=length,
            vector_length=args.features,
            routing=pb.RESULT_ROUTING_ROUND_ROBIN,
            encryption_key=key.encryption_key.to_bytes(),
            mode="paillier",
        )
        start = time.perf_counter()
        reply = client.push(header, slices)
        if reply.accepted != count:
            raise SystemExit(f"the aggregator accepted {reply.accepted} of {count} slices")
        return time.perf_counter() - start

    import resource

    timings: dict[str, list[float]] = {
        "pipelined": [],
        "pipelined_one_worker": [],
        "sequential": [],
        "encrypt_only": [],
        "send_only": [],
        "send_cpu": [],
    }
    client.connect()
    try:
        cached = [produce(i) for i in range(count)]
        push(1, cached)  # warm-up: channels, data port, windows
        for repeat in range(3):
            number = 10 * (repeat + 1)
            single = pipelined(lambda i: produce(i, 1), count, depth=4, enabled=True, workers=workers)
            timings["pipelined"].append(push(number, single))
            one = pipelined(lambda i: produce(i, 1), count, depth=4, enabled=True, workers=1)
            timings["pipelined_one_worker"].append(push(number + 1, one))
            timings["sequential"].append(push(number + 2, pipelined(produce, count, enabled=False)))
            start = time.perf_counter()
            cached = [produce(i) for i in range(count)]
            timings["encrypt_only"].append(time.perf_counter() - start)
            cpu = resource.getrusage(resource.RUSAGE_SELF)
            timings["send_only"].append(push(number + 3, cached))
            after = resource.getrusage(resource.RUSAGE_SELF)
            timings["send_cpu"].append(after.ru_utime + after.ru_stime - cpu.ru_utime - cpu.ru_stime)
    finally:
        client.close()
    out = {name: statistics.median(values) for name, values in timings.items()}
    out["bytes"] = sum(item.ByteSize() for item in cached)
    out["slices"] = count
    print(json.dumps(out))
    return 0


def upload_overlap(network, work: Path, args) -> dict:
    """One party alone pushes a paillier update over the link: the pipeline's overlap, nothing else."""
    import json
    import subprocess

    from confide.transport.certs import init_federation

    work.mkdir(parents=True, exist_ok=True)
    certs = work / "certs"
    address = network.address("aggregator")
    init_federation(certs, parties=PARTIES, services=["aggregator"], hosts=["127.0.0.1", address])
    port_file = work / "port"
    network.spawn(
        "aggregator",
        "upload-aggregator",
        [
            sys.executable, "-m", "confide", "aggregator", "--listen", f"127.0.0.1:{GRPC_PORT}",
            "--data-port", str(DATA_PORT), "--certs", str(certs), "--port-file", str(port_file),
        ],
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        child = subprocess.run(
            [
                "ip", "netns", "exec", network.hosts["party-1"], sys.executable, __file__, "--upload-child",
                "--certs", str(certs), "--target", f"{address}:{GRPC_PORT}", "--features", str(args.features),
                "--slice-bytes", str(args.slice_bytes),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )  # fmt: skip
        if child.returncode:
            raise SystemExit(f"upload child failed:\n{child.stdout}\n{child.stderr}")
        return json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        network.stop("upload-aggregator")


def runs() -> list[tuple[str, bool]]:
    out = [(mode, True) for mode in MODES]
    if ("paillier", True) in out:
        out.insert(out.index(("paillier", True)), ("paillier", False))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--features", type=int, default=300_000)
    parser.add_argument("--samples", type=int, default=3_000)
    parser.add_argument("--density", type=float, default=0.001)
    parser.add_argument("--slice-bytes", type=int, default=64 * 1024)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--links", default=",".join(LINKS))
    parser.add_argument("--modes", default=None, help="only these modes (comma-separated); paillier adds pipeline off")
    parser.add_argument("--no-loopback", action="store_true", help="skip the loopback anchor")
    parser.add_argument("--write", action="store_true", help="write results/wan.json and docs/benchmarks.md")
    parser.add_argument(
        "--merge",
        action="store_true",
        help="with --write: keep the records of results/wan.json this run does not measure (other modes)",
    )
    parser.add_argument("--upload-only", action="store_true", help="only the one-party upload overlap")
    parser.add_argument("--upload-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--certs", help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upload_child:
        return upload_child(args)
    reason = unavailable()
    if reason:
        print(f"wan_bench: skipped: {reason}")
        return 0
    global MODES
    if args.modes:
        MODES = args.modes.split(",")
    links = args.links.split(",")
    work = Path(tempfile.mkdtemp(prefix="confide-wan-"))
    measured: dict[tuple[str, str, bool], list[dict]] = {}
    uploads: dict[str, dict] = {}
    started = time.perf_counter()
    try:
        for repeat in range(args.repeats):
            if not args.no_loopback:
                for mode, pipeline in runs():
                    report = run_local(
                        job(mode, pipeline, args), work / f"lo-{mode}-{pipeline}", progress=False, echo=lambda *_: None
                    )
                    _keep(measured, ("loopback", mode, pipeline), summary(report), repeat)
            for name in links:
                with wan_network(
                    ["aggregator", *PARTIES],
                    LINKS[name],
                    proxied_host="aggregator",
                    ports=(GRPC_PORT, DATA_PORT),
                    logs=work / f"logs-{name}-{repeat}",
                ) as network:
                    if repeat == 0 and ("paillier" in MODES or args.upload_only):
                        uploads[name] = upload_overlap(network, work / f"upload-{name}", args)
                        shown = {k: round(v, 3) for k, v in uploads[name].items()}
                        print(f"     {name} one-party upload: {shown}", flush=True)
                    if args.upload_only:
                        continue
                    for mode, pipeline in runs():
                        run = run_federation(
                            network, job(mode, pipeline, args), work / f"{name}-{mode}-{pipeline}", timeout_s=900
                        )
                        _keep(measured, (name, mode, pipeline), summary(run.report), repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - started

    def median(key, field="seconds"):
        return statistics.median(m[field] for m in measured[key]) if key in measured else None

    params = {
        "parties": len(PARTIES),
        "features": args.features,
        "samples": args.samples,
        "density": args.density,
        "rounds": args.rounds,
        "slice_bytes": args.slice_bytes,
        "repeats": args.repeats,
        "statistic": "median over rounds 2.. of each job, then over repeats",
    }
    results = []
    for name in links if not args.upload_only else []:
        link = LINKS[name]
        where = {**params, "rate_mbit": link.rate_mbit, "rtt_ms": link.rtt_ms}
        for mode in MODES:
            seconds = median((name, mode, True))
            anchor = median(("loopback", mode, True))
            results.append(
                record(
                    f"wan.{name}.{mode}.seconds_per_round",
                    seconds,
                    "s",
                    anchor=f"{mode} on loopback, same run" if anchor else None,
                    anchor_value=anchor,
                    params={**where, "bytes_per_round": median((name, mode, True), "bytes")},
                )
            )
        if "plain" in MODES and "lattice" in MODES:
            plain, lattice = median((name, "plain", True)), median((name, "lattice", True))
            versus = record(
                f"wan.{name}.lattice.vs_plain",
                lattice,
                "ratio",
                f"plain over the same {name} link, same run",
                plain,
                params={**where, "lattice_s": round(lattice, 4)},
            )
            versus["value"] = versus["ratio"]  # the record is the ratio, as runtime_bench's vs_plain
            results.append(versus)
        if "paillier" in MODES:
            on, off = median((name, "paillier", True)), median((name, "paillier", False))
            results.append(
                record(
                    f"wan.{name}.paillier.no_pipeline.seconds_per_round",
                    off,
                    "s",
                    anchor="paillier, pipeline off, loopback" if not args.no_loopback else None,
                    anchor_value=median(("loopback", "paillier", False)),
                    params=where,
                )
            )
            results.append(
                record(
                    f"wan.{name}.pipeline.speedup",
                    off / on,
                    "x",
                    anchor="paillier round, pipeline off / on",
                    params={**where, "off_s": round(off, 4), "on_s": round(on, 4)},
                )
            )
    for name, upload in uploads.items():
        link = LINKS[name]
        results.append(
            record(
                f"wan.{name}.pipeline.upload_speedup",
                upload["sequential"] / upload["pipelined"],
                "x",
                anchor="one party's paillier upload alone, pipeline off / on",
                params={
                    "rate_mbit": link.rate_mbit,
                    "rtt_ms": link.rtt_ms,
                    "values": args.features,
                    "repeats": 3,
                    **{k: round(v, 4) for k, v in upload.items()},
                },
            )
        )
    if not args.no_loopback and "paillier" in MODES:
        on, off = median(("loopback", "paillier", True)), median(("loopback", "paillier", False))
        results.append(
            record("wan.loopback.pipeline.speedup", off / on, "x", anchor="paillier round, pipeline off / on")
        )
    lines = results_table(results, value=",.4g", anchor=",.4g", ratio=".3g")
    print("\n".join(lines))
    print(f"({total:.0f} s in all)")
    if args.write:
        info = machine()
        if args.merge:
            results, info = merged("wan", results, info, f"modes {','.join(MODES)}")
            lines = results_table(results, value=",.4g", anchor=",.4g", ratio=".3g")
        write("wan", info, results)
        write_markdown_block(
            "wan_bench",
            "Real links (latest run)",
            [
                f"{len(PARTIES)} parties + aggregator, each in its own network namespace; Homo LR, "
                f"{args.features:,} weights, {args.samples:,} samples (density {args.density}); "
                f"{args.rounds} rounds per job, {args.repeats} run(s); machine {machine()['cpu']} "
                f"({machine()['cores']} cores, shared by every process).",
                "",
                *lines,
                *merged_lines(info),
            ],
        )
    return 0


def _keep(measured: dict, key: tuple, figures: dict, repeat: int) -> None:
    measured.setdefault(key, []).append(figures)
    print(
        f"[{repeat}] {key[0]:>8} {key[1]:>9} pipeline={'on ' if key[2] else 'off'} "
        f"{figures['seconds']:.3f} s/round (crypto {figures['crypto']:.3f}, train {figures['train']:.3f}, "
        f"{figures['bytes'] / 1e6:.1f} MB, AUC {figures['auc']:.3f})",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
