"""Aggregator data-plane benchmark: the primitive, and one node end to end (Jupiter, seed 000 §5).

1. Primitive: weighted float32 accumulate ``acc += w * x`` on 64 KiB slices (16,384 values),
   one thread, in Rust (``confide-agg``; the loop runs in Rust, no Python call per slice), next
   to numpy doing the same in a Python loop (``np.multiply(x, w, out=tmp); np.add(acc, tmp,
   out=acc)``) on the same slices in the same run: "stream" cycles over 256 MiB of distinct
   slices (DRAM speed), "hot" over 1 MiB (cache).
2. One aggregator node end to end: ``confide aggregator`` as one process, the slice generator
   (benchmarks/dataplane_gen.py) as another, 200 participants, each with its own mutual-TLS
   connection and PushSlices stream over loopback, both processes sharing the machine's cores.
   The update follows VGG-19's layer layout scaled down (the full model is 575 MB per
   participant, 115 GB per round), 64 KiB slices, 16 per message. Orders: synchronized, and
   asynchronized with tolerance distance 10 and 50. Modes: plain (weighted mean), tee
   (AES-256-GCM slices opened by the simulated enclave), paillier (128 ciphertexts of 512 B
   per slice, multiplied mod n^2). Throughput counts slice payload bytes the node received and
   folded, from the first slice sent to the last reply; staged memory is the node's peak of
   partial sums held (Health). Combined slices go to one participant each (round-robin
   routing) and nobody subscribes: the fan-out of results is the relay's cost, not measured.
   Slices go to the node's data port (the Rust data path, crates/confide-aggnet). "Before":
   the same plain run through the node's Python gRPC server (``sync.python``), and with one
   slice per message (``sync.unbatched``). Each node is started once per configuration, runs
   one untimed warm-up round (its heap grows to working size, as on an aggregator that has
   served a round before), then the timed rounds. Also reported: CPU seconds per GB of the
   node and of the generator (they share the cores) and the node's peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import machine, record, results_table, write, write_markdown_block  # noqa: E402
from dataplane_gen import SLICE_VALUES, vgg19_layout  # noqa: E402

from confide import _native  # noqa: E402
from confide.transport import tls  # noqa: E402
from confide.transport.certs import Identity, init_federation  # noqa: E402
from confide.v1 import runtime_pb2 as pb  # noqa: E402
from confide.v1 import runtime_pb2_grpc as rpc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SLICE_BYTES = SLICE_VALUES * 4


def numpy_rate(slices: np.ndarray, weights: np.ndarray, iterations: int) -> float:
    acc = np.zeros(SLICE_VALUES, dtype=np.float32)
    tmp = np.empty_like(acc)
    k = len(slices)
    began = time.perf_counter()
    for i in range(iterations):
        np.multiply(slices[i % k], weights[i % k], out=tmp)
        np.add(acc, tmp, out=acc)
    return iterations / (time.perf_counter() - began)


def primitive(repeats: int) -> list[dict]:
    out = []
    rng = np.random.default_rng(3)
    for label, count, iterations in (("", 4096, 200_000), (".hot", 16, 400_000)):
        slices = rng.standard_normal((count, SLICE_VALUES), dtype=np.float32)
        weights = rng.uniform(0.5, 2.0, count).astype(np.float32)
        flat = slices.reshape(-1)
        ours, theirs = [], []
        for _ in range(repeats):
            ours.append(iterations / _native.agg_bench_primitive(flat, SLICE_VALUES, weights, iterations))
            theirs.append(numpy_rate(slices, weights, iterations // 2))
        value, anchor = statistics.median(ours), statistics.median(theirs)
        params = {
            "slice_bytes": SLICE_BYTES,
            "distinct_slices": count,
            "working_set_mib": count * SLICE_BYTES / 2**20,
            "iterations": iterations,
            "repeats": repeats,
            "simd": _native.agg_simd_level(),
            "input_gbps": value * SLICE_BYTES / 1e9,
        }
        out.append(
            record(
                f"dataplane.primitive.64k{label}.t1", value, "aggregations/s", "numpy multiply+add out=", anchor, params
            )
        )
        print(
            f"primitive{label or '.stream'}: {value:,.0f}/s  numpy {anchor:,.0f}/s  ({value / anchor:.2f}x)", flush=True
        )
    return out


def start_node(certs: Path, workdir: Path, workers: int) -> tuple[subprocess.Popen, str]:
    port_file = workdir / "node.port"
    port_file.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "confide", "aggregator", "--listen", "127.0.0.1:0", "--certs", str(certs),
        "--port-file", str(port_file), "--workers", str(workers), "--max-streams", "512",
        "--round-timeout", "600",
    ]  # fmt: skip
    with open(workdir / "node.log", "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not port_file.exists() or not port_file.read_text().strip():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"aggregator did not start: {(workdir / 'node.log').read_text()[-2000:]}")
        time.sleep(0.05)
    return process, f"127.0.0.1:{int(port_file.read_text())}"


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def health(target: str, identity: Identity) -> pb.HealthReply:
    channel = tls.channel(target, identity)
    try:
        return rpc.AggregationStub(channel).Health(pb.HealthRequest(), timeout=30, wait_for_ready=True)
    finally:
        channel.close()


def node_runs(
    certs, workdir, *, mode, tolerance, slices, participants, workers, repeats, unbatched=False, path="rust"
) -> list[dict]:
    """Rounds through one long-lived node: one untimed warm-up round, then ``repeats`` timed ones.

    ``path``: "rust" (the node's data port) or "python" (PushSlices through its Python gRPC
    server, the path before the Rust data path). The warm-up lets the node's heap reach its
    working size, as it has on an aggregator that has served a round before.
    """
    process, control = start_node(certs, workdir, workers)
    try:
        probe = Identity.load(certs, "p000")
        before = health(control, probe)
        target = f"127.0.0.1:{before.data_port}" if path == "rust" else control
        runs = []
        for attempt in range(repeats + 1):
            cpu_before = process_cpu_s(process.pid)
            command = [
                sys.executable, str(ROOT / "benchmarks" / "dataplane_gen.py"), "--target", target,
                "--certs", str(certs), "--mode", mode, "--participants", str(participants), "--slices", str(slices),
                "--tolerance", str(tolerance), "--enclave-key", before.enclave_public_key.hex(),
                "--job", f"bench-{attempt}", "--seed", str(attempt + 1),
            ] + (["--unbatched"] if unbatched else [])  # fmt: skip
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                raise RuntimeError(f"generator failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-3000:]}")
            result = json.loads(done.stdout.strip().splitlines()[-1])
            node_cpu = process_cpu_s(process.pid) - cpu_before
            after = health(control, probe)
            if attempt == 0:
                continue  # warm-up
            gigabytes = result["wire_bytes"] / 1e9
            result["node_cpu_s_per_gb"] = node_cpu / gigabytes
            result["generator_cpu_s_per_gb"] = result["generator_cpu_s"] / gigabytes
            result["node_rss_peak_mb"] = peak_rss_mb(process.pid)
            result["peak_staged_mb"] = after.peak_staged_bytes / 2**20
            result["simd"] = after.simd
            result["workers"] = after.workers
            result["path"] = path
            result["enclave"] = json.loads(after.enclave_report) if mode == "tee" else None
            runs.append(result)
        return runs
    finally:
        process.terminate()
        process.wait(timeout=10)


def peak_rss_mb(pid: int) -> float:
    """Peak resident memory of a running process, MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--participants", type=int, default=200)
    parser.add_argument("--scale", type=float, default=1 / 110, help="VGG-19 layout scale (1: 575 MB per party)")
    parser.add_argument("--quick", action="store_true", help="small run (smoke test)")
    parser.add_argument("--write", action="store_true", help="write results JSON and docs/benchmarks.md")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.participants, args.scale = 1, 20, 1 / 400
    results = primitive(args.repeats)
    layout = vgg19_layout(args.scale)
    slices = sum(layout)
    print(
        f"node: {args.participants} participants x {slices} slices of 64 KiB "
        f"({args.participants * slices * SLICE_BYTES / 2**30:.2f} GiB per round; VGG-19 layout x {args.scale:.4f})",
        flush=True,
    )
    numpy_stream = results[0]["anchor_value"] * SLICE_BYTES / 1e6  # MB/s of input numpy folds from DRAM
    with tempfile.TemporaryDirectory(prefix="confide-dataplane-") as tmp:
        certs = Path(tmp) / "certs"
        init_federation(certs, parties=[f"p{p:03d}" for p in range(args.participants)])
        workdir = Path(tmp)
        paillier_slices = max(4, slices // 16)
        # (mode, pattern, tolerance, node workers, one slice per message, path, slices per participant)
        configs = [
            ("plain", "sync", 0, 2, False, "rust", slices),
            ("plain", "async10", 10, 2, False, "rust", slices),
            ("plain", "async50", 50, 2, False, "rust", slices),
            ("tee", "sync", 0, 2, False, "rust", slices),
            ("tee", "async10", 10, 2, False, "rust", slices),
            ("tee", "async50", 50, 2, False, "rust", slices),
            ("plain", "sync.w1", 0, 1, False, "rust", slices),
            ("plain", "sync.unbatched", 0, 2, True, "rust", slices),
            ("plain", "sync.python", 0, 2, False, "python", slices),
            ("paillier", "sync", 0, 2, False, "rust", paillier_slices),
        ]
        measured: dict[str, list[dict]] = {}
        for mode, pattern, tolerance, workers, unbatched, path, count in configs:
            runs = node_runs(
                certs, workdir, mode=mode, tolerance=tolerance, slices=count, participants=args.participants,
                workers=workers, repeats=args.repeats, unbatched=unbatched, path=path,
            )  # fmt: skip
            measured[f"{mode}.{pattern}"] = runs
            for run in runs:
                print(
                    f"{mode:8s} {pattern:15s} {run['mbps']:8.0f} MB/s  {run['aggregations_per_s']:9,.0f} slices/s  "
                    f"node {run['node_cpu_s_per_gb']:.2f} CPU-s/GB, generator {run['generator_cpu_s_per_gb']:.2f}  "
                    f"peak staged {run['peak_staged_mb']:.1f} MiB, node RSS {run['node_rss_peak_mb']:.0f} MiB",
                    flush=True,
                )

    def med(key: str, field: str) -> float:
        return statistics.median(r[field] for r in measured[key])

    for key, runs in measured.items():
        mode, pattern = key.split(".", 1)
        first = runs[0]
        params = {
            "participants": first["participants"],
            "slices_per_participant": first["slices"],
            "slice_values": first["slice_values"],
            "slices_per_message": first["batch"],
            "tolerance": first["tolerance"],
            "node_workers": first["workers"],
            "simd": first["simd"],
            "repeats": len(runs),
            "runs_mbps": [round(r["mbps"], 1) for r in runs],
            "aggregations_per_s": round(med(key, "aggregations_per_s")),
            "peak_staged_mib": round(max(r["peak_staged_mb"] for r in runs), 2),
            "node_rss_peak_mib": round(max(r["node_rss_peak_mb"] for r in runs), 1),
            "node_cpu_s_per_gb": round(med(key, "node_cpu_s_per_gb"), 3),
            "generator_cpu_s_per_gb": round(med(key, "generator_cpu_s_per_gb"), 3),
            "path": first["path"],
            "warm_up_rounds": 1,
            "transport": "gRPC over loopback, mutual TLS, one connection per participant",
            "cores_shared_with_generator": os.cpu_count(),
        }
        if first["enclave"]:
            params["enclave"] = first["enclave"]
        mbps = med(key, "mbps")
        results.append(
            record(
                f"dataplane.node.{key}.mbps", mbps, "MB/s", "numpy in-memory fold rate (stream)", numpy_stream, params
            )
        )
        results.append(
            record(f"dataplane.node.{key}.staged_mib", max(r["peak_staged_mb"] for r in runs), "MiB", params=params)
        )
        base = f"plain.{pattern}" if f"plain.{pattern}" in measured else "plain.sync"
        if key != base:
            plain = med(base, "mbps")
            results.append(
                record(
                    f"dataplane.node.{key}.vs_plain",
                    mbps / plain,
                    "ratio",
                    f"{key} MB/s over {base} MB/s (medians)",
                    params={"mbps": round(mbps, 1), "base_mbps": round(plain, 1)},
                )
            )
    rust, python = med("plain.sync", "mbps"), med("plain.sync.python", "mbps")
    results.append(
        record(
            "dataplane.node.plain.sync.rust_vs_python",
            rust / python,
            "ratio",
            "plain.sync MB/s through the Python gRPC server (before)",
            python,
            params={"mbps": round(rust, 1), "python_mbps": round(python, 1)},
        )
    )
    for mode in ("plain", "tee"):
        sync = med(f"{mode}.sync", "mbps")
        for tolerance in ("async10", "async50"):
            value = med(f"{mode}.{tolerance}", "mbps")
            results.append(
                record(
                    f"dataplane.node.{mode}.{tolerance}.vs_sync",
                    value / sync,
                    "ratio",
                    f"{mode}.{tolerance} MB/s over {mode}.sync MB/s (medians)",
                    params={"mbps": round(value, 1), "sync_mbps": round(sync, 1)},
                )
            )
    for r in results:
        if r["unit"] == "ratio":
            print(f"{r['name']}: {r['value']:.2f}")
    if args.write:
        info = machine()
        write("dataplane", info, results)
        write_markdown_block(
            "dataplane_bench",
            "Aggregator data plane (dataplane_bench)",
            [
                f"One run, {info.get('cpu', 'this machine')}; medians of {args.repeats} runs per figure. "
                "Node figures: aggregator and slice generator are separate processes sharing the cores, "
                f"{args.participants} participants over loopback gRPC with mutual TLS, "
                f"VGG-19 layout x {args.scale:.4f}.",
                "",
                *results_table(results, value=",.2f", anchor=",.0f"),
            ],
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
