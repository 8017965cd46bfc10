"""A party's local compute on Ray against inline: Homo LR on 10M rows of partitioned Parquet.

A local Ray cluster as a silo's operator runs one: a head node that schedules nothing
(``ray start --head --num-cpus=0``) and 2 worker nodes (``ray start --address ... --num-cpus=1``),
each a separate set of processes. The party's holders (one Ray actor per Parquet file) train
Homo LR full batch: each step sends the weights to every holder and adds the per-partition
gradient sums. The anchor is the same holders inline, one after another in one process, in the
same run.

Per engine and partition count: seconds to load (read + provision every file), seconds per
full-batch step (median of the steps), the peak resident memory of the process holding each
partition, and how far the weights after the steps are from inline's. The sums are added in the
same order, but a worker's BLAS may split a product over another number of threads than the party
process's, so they are equal within float tolerance, not always bit for bit. On this 2-core
machine the speedup is bounded by the 2 cores and by Ray's per-call overhead; what must show is
that the work splits by partition, that memory per worker falls with more partitions, and that
the results equal inline's.

Not yet measured here: SecureBoost host histograms on partitions (the vertical runner does not
run on partitioned data yet; docs/compute.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchutil import machine, record, results_table, write, write_markdown_block  # noqa: E402

from confide.compute import open_compute  # noqa: E402
from confide.compute.partitions import PartitionedData, PartitionRows, PartitionTask, list_partitions  # noqa: E402
from confide.data.fldata import FLData  # noqa: E402
from confide.ml.homo_lr import HomoLR  # noqa: E402
from tests.fixtures.partitions import write_partitions  # noqa: E402

RAY = str(Path(sys.executable).parent / "ray")


def start_cluster(workers: int) -> str:
    """Head (no CPUs) plus ``workers`` worker nodes of one CPU each; returns the address."""
    os.environ.setdefault("RAY_AUTH_MODE", "token")  # `ray start` turns on token authentication
    subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
    started = subprocess.run(
        [RAY, "start", "--head", "--port=6390", "--num-cpus=0", "--include-dashboard=false", "--disable-usage-stats"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if started.returncode:
        raise SystemExit(f"ray start --head failed:\n{started.stderr[-2000:]}")
    address = "127.0.0.1:6390"
    for _ in range(workers):
        joined = subprocess.run(
            [RAY, "start", f"--address={address}", "--num-cpus=1", "--disable-usage-stats"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if joined.returncode:
            raise SystemExit(f"ray start --address failed:\n{joined.stderr[-2000:]}")
    return address


def measure(engine, root: Path, steps: int, features: int) -> dict:
    partitions = list_partitions(root, "rows")
    fl_data = FLData.create({"bench": {"dataset": "rows", "test_fraction": 0.0}}, "label").to_dict()
    task = PartitionTask(party="bench", dataset="rows", fl_data=fl_data)
    started = time.perf_counter()
    holders = engine.hold(PartitionRows, [(task, p) for p in partitions])
    data = PartitionedData(holders, holders.call("shape"))
    load = time.perf_counter() - started
    model = HomoLR(learning_rate=0.5, local_epochs=1, batch_size=0)
    model.initialize(features)
    times = []
    for _ in range(steps):
        started = time.perf_counter()
        model.train_partitioned(data)
        times.append(time.perf_counter() - started)
    memory = holders.call("memory")
    pids = holders.pids()
    holders.close()
    return {
        "load": load,
        "step": statistics.median(times),
        "weights": model.get_weights(),
        "rows": data.rows,
        "partitions": len(partitions),
        "worker_peak_rss_mb": max(m["peak_rss_mb"] for m in memory),
        "processes": len(set(pids)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--partitions", default="4,8", help="partition counts to run (memory per worker)")
    parser.add_argument("--steps", type=int, default=5, help="full-batch steps per run (median)")
    parser.add_argument("--workers", type=int, default=2, help="Ray worker nodes")
    parser.add_argument("--write", action="store_true", help="write results/scaleout.json and docs/benchmarks.md")
    args = parser.parse_args()
    info = machine()
    results: list[dict] = []
    notes: list[str] = []
    directory = Path(tempfile.mkdtemp(prefix="confide-scaleout-"))
    try:
        roots = {}
        for count in (int(c) for c in args.partitions.split(",")):
            sizes = [args.rows // count + (1 if i < args.rows % count else 0) for i in range(count)]
            started = time.perf_counter()
            roots[count] = write_partitions(
                directory / f"p{count}", sizes, features=args.features, text=False, dtype=np.float32
            )
            print(
                f"wrote {args.rows:,} rows x {args.features} in {count} files [{time.perf_counter() - started:.0f} s]"
            )
        address = start_cluster(args.workers)
        ray_engine = open_compute(f"ray:{address}")
        print(f"Ray cluster: {ray_engine.describe()}")
        for count, root in roots.items():
            inline = measure(open_compute("inline"), root, args.steps, args.features)
            on_ray = measure(ray_engine, root, args.steps, args.features)
            difference = float(np.max(np.abs(inline["weights"] - on_ray["weights"])))
            equal = bool(np.allclose(inline["weights"], on_ray["weights"], rtol=1e-12, atol=1e-12))
            params = {
                "rows": args.rows,
                "features": args.features,
                "partitions": count,
                "workers": args.workers,
                "steps": args.steps,
                "equal_to_inline": equal,
                "max_abs_difference": difference,
                "ray_processes": on_ray["processes"],
            }
            for engine, m in (("inline", inline), ("ray", on_ray)):
                print(
                    f"{count} partitions, {engine:<6}: load {m['load']:.1f} s, {m['step']:.3f} s per full-batch step, "
                    f"peak RSS per holder process {m['worker_peak_rss_mb']:.0f} MiB ({m['processes']} processes)"
                )
                results.append(
                    record(f"scaleout.homo_lr.{engine}.p{count}.seconds_per_step", m["step"], "s", params=params)
                )
                results.append(
                    record(f"scaleout.homo_lr.{engine}.p{count}.load_seconds", m["load"], "s", params=params)
                )
            results.append(
                record(
                    f"scaleout.homo_lr.ray.p{count}.worker_peak_rss_mb",
                    on_ray["worker_peak_rss_mb"],
                    "MiB",
                    params=params,
                )
            )
            speedup = record(
                f"scaleout.homo_lr.p{count}.speedup", inline["step"], "ratio", "inline", inline["step"], params
            )
            speedup["value"] = speedup["ratio"] = inline["step"] / on_ray["step"]
            speedup["anchor_value"] = inline["step"]
            results.append(speedup)
            notes.append(
                f"{count} partitions: Ray {inline['step'] / on_ray['step']:.2f}x inline per step; weights "
                f"{'equal to' if equal else 'DIFFER from'} inline's within 1e-12 (largest difference "
                f"{difference:.1e}); {on_ray['processes']} holder processes, peak "
                f"{on_ray['worker_peak_rss_mb']:.0f} MiB each"
            )
        ray_engine.close()
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(directory, ignore_errors=True)
    for note in notes:
        print("note:", note)
    if args.write:
        path = write("scaleout", info, results)
        lines = [
            f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}; a local "
            f"Ray cluster of {args.workers} worker nodes (one CPU each) started with `ray start`, against the same "
            "holders inline in one process.",
            "",
            *results_table(results, value=",.4g", anchor=",.4g", ratio=".3g"),
            "",
            *[f"- {note}" for note in notes],
        ]
        write_markdown_block("scaleout_bench", "Scale-out: a party's compute on Ray (latest run)", lines)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
