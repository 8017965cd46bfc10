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

SecureBoost host histograms: one layer of a host's encrypted histograms (``--hist-rows`` rows,
``--hist-features`` features, 32 bins, four nodes) built in the party process with every core,
against the same rows cut into ranges held by Ray actors (:mod:`confide.vertical.histograms`) and
multiplied together; the ciphertexts must be equal bit for bit. Not at 10M rows: the guest's
ciphertexts alone would be 5 GB and take minutes to make, so the default is 400,000 rows.

A partitioned SecureBoost host (``--host-rows`` rows x ``--host-features`` in ``--host-files``
Parquet files, 90 % of them aligned by PSI in a shuffled order): the exact binning across holders
and one layer of encrypted histograms and counts (:mod:`confide.vertical.columns`), on inline
holders and on the Ray cluster, against the same rows in one matrix in the party process
(``MatrixRows``, every core); cut points, histograms and counts must be equal bit for bit. The
layer's ciphertexts are 20,000 encryptions repeated over the rows: its cost does not depend on
the values. Default 1M rows: at 10M rows the ciphertexts of one tree are 4.6 GB per copy, more
than this 24 GiB machine holds across the copies the run makes.
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


def histogram_layer(engine, rows: int, features: int, repeats: int = 3) -> dict:
    """One layer of host histograms in-process (all cores) and on ``engine``'s holders; equal?"""
    from confide import _native
    from confide.vertical.histograms import HostHistograms

    rng = np.random.default_rng(3)
    n_bins = 32
    key = _native.generate_keypair(2048)
    bins = rng.integers(0, n_bins, (features, rows)).astype(np.uint8)
    started = time.perf_counter()
    gh = key.encrypt_raw([int(v).to_bytes(16, "big") for v in rng.integers(0, 2**62, rows)], "fixed_base", 0)
    encrypt = time.perf_counter() - started
    node_of_row = rng.integers(0, 4, rows).astype(np.int32)
    nodes = [0, 1, 2, 3]
    here = []
    for _ in range(repeats):
        started = time.perf_counter()
        direct = [gh.histogram(bins, np.flatnonzero(node_of_row == n).astype(np.uint32), n_bins, 0) for n in nodes]
        here.append(time.perf_counter() - started)
    started = time.perf_counter()
    remote = HostHistograms(engine, bins)
    remote.set_gradients(key.encryption_key, gh)
    setup = time.perf_counter() - started
    there = []
    for _ in range(repeats):
        started = time.perf_counter()
        built = remote.histograms(node_of_row, nodes, n_bins, key.encryption_key)
        there.append(time.perf_counter() - started)
    pids = remote.holders.pids()
    remote.close()
    equal = all(a.to_bytes() == b.to_bytes() for a, b in zip(direct, built, strict=True))
    return {
        "inline": statistics.median(here),
        "ray": statistics.median(there),
        "setup": setup,
        "encrypt": encrypt,
        "equal": equal,
        "holders": len(set(pids)),
    }


def partitioned_host(engine, directory: Path, rows: int, features: int, files: int) -> dict:
    """A SecureBoost host's columns in ``files`` Parquet files: binning and one layer on ``engine``'s
    holders against the same rows in one matrix (``MatrixRows``); equal?"""
    from confide import _native
    from confide.compute.partitions import PartitionTask
    from confide.vertical.columns import PartitionedColumns
    from confide.vertical.secureboost import MatrixRows
    from tests.fixtures.partitions import host_fl_data, write_columns

    rng = np.random.default_rng(5)
    X = np.round(rng.normal(0, 1, (rows, features)), 3)
    ids = rng.permutation(rows * 2)[:rows]
    root = write_columns(
        directory / "host" / "cols", ids, X, [rows // files] * (files - 1) + [rows - rows // files * (files - 1)]
    )
    task = PartitionTask(party="lab", dataset="cols", fl_data=FLData.create(**host_fl_data()).to_dict())
    aligned = rng.permutation(rows)[: rows * 9 // 10]  # the rows PSI kept, in the guest's order
    key = _native.generate_keypair(2048)
    distinct = key.encrypt_raw([int(v).to_bytes(16, "big") for v in rng.integers(0, 2**62, 20_000)], "fixed_base", 0)
    # a layer's cost does not depend on the values: 20,000 ciphertexts repeated over the rows
    gh = distinct.take((np.arange(len(aligned)) % 20_000).astype(np.uint32))
    node_of_row = rng.integers(0, 4, len(aligned)).astype(np.int32)
    nodes, n_bins = [0, 1, 2, 3], 32
    out: dict = {}

    def run(rows_object, prefix: str):
        # the same steps on either side: bins, the tree's gradients, one layer
        started = time.perf_counter()
        fitted = rows_object.fit(n_bins, "lab")
        out[f"{prefix}binning"] = time.perf_counter() - started
        rows_object.set_gradients(key.encryption_key, gh)
        started = time.perf_counter()
        hists, counted = rows_object.layer(node_of_row, nodes, n_bins, key.encryption_key)
        out[f"{prefix}layer"] = time.perf_counter() - started
        return fitted, hists, counted

    expected, direct, direct_counts = run(MatrixRows(X[aligned]), "matrix_")
    columns = PartitionedColumns.open(engine, task, list_partitions(root, "cols"), "id")
    binner, built, counts = run(columns.view("train", aligned), "")
    columns.close()
    out["equal"] = (
        all(np.array_equal(a, b) for a, b in zip(binner.cuts, expected.cuts, strict=True))
        and all(a.to_bytes() == b.to_bytes() for a, b in zip(direct, built, strict=True))
        and np.array_equal(np.asarray(counts), np.asarray(direct_counts))
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--features", type=int, default=10)
    parser.add_argument("--partitions", default="4,8", help="partition counts to run (memory per worker)")
    parser.add_argument("--steps", type=int, default=5, help="full-batch steps per run (median)")
    parser.add_argument("--workers", type=int, default=2, help="Ray worker nodes")
    parser.add_argument("--hist-rows", type=int, default=400_000, help="rows of the host histogram layer (0: skip)")
    parser.add_argument("--hist-features", type=int, default=20)
    parser.add_argument("--host-rows", type=int, default=1_000_000, help="rows of the partitioned host (0: skip)")
    parser.add_argument("--host-features", type=int, default=8)
    parser.add_argument("--host-files", type=int, default=4)
    parser.add_argument("--skip-lr", action="store_true", help="leave out the Homo LR runs")
    parser.add_argument("--write", action="store_true", help="write results/scaleout.json and docs/benchmarks.md")
    args = parser.parse_args()
    info = machine()
    results: list[dict] = []
    notes: list[str] = []
    directory = Path(tempfile.mkdtemp(prefix="confide-scaleout-"))
    try:
        roots = {}
        for count in () if args.skip_lr else (int(c) for c in args.partitions.split(",")):
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
        if args.hist_rows:
            h = histogram_layer(ray_engine, args.hist_rows, args.hist_features)
            params = {
                "rows": args.hist_rows,
                "features": args.hist_features,
                "bins": 32,
                "nodes": 4,
                "workers": args.workers,
                "holders": h["holders"],
                "bit_exact": h["equal"],
                "setup_seconds": round(h["setup"], 2),
            }
            print(
                f"host histograms, {args.hist_rows:,} rows x {args.hist_features}: in-process {h['inline']:.2f} s, "
                f"{h['holders']} Ray holders {h['ray']:.2f} s per layer (set-up {h['setup']:.1f} s, GH encryption "
                f"{h['encrypt']:.1f} s); ciphertexts {'equal' if h['equal'] else 'DIFFERENT'}"
            )
            for engine, value in (("inline", h["inline"]), ("ray", h["ray"])):
                results.append(
                    record(f"scaleout.host_histograms.{engine}.seconds_per_layer", value, "s", params=params)
                )
            speedup = record("scaleout.host_histograms.speedup", h["inline"], "ratio", "inline", h["inline"], params)
            speedup["value"] = speedup["ratio"] = h["inline"] / h["ray"]
            results.append(speedup)
            notes.append(
                f"host histograms: Ray {h['inline'] / h['ray']:.2f}x in-process per layer; ciphertexts "
                f"{'equal bit for bit' if h['equal'] else 'DIFFERENT'}"
            )
        if args.host_rows:
            params = {
                "rows": args.host_rows,
                "aligned": args.host_rows * 9 // 10,
                "features": args.host_features,
                "files": args.host_files,
                "bins": 32,
                "nodes": 4,
                "workers": args.workers,
            }
            timings = {}
            for name, engine in (("inline", open_compute("inline")), ("ray", ray_engine)):
                h = partitioned_host(engine, directory / name, args.host_rows, args.host_features, args.host_files)
                timings[name] = h
                params[f"{name}_equal_to_one_matrix"] = bool(h["equal"])
                print(
                    f"partitioned host on {name}, {args.host_rows:,} rows x {args.host_features} in {args.host_files} "
                    f"files: binning {h['binning']:.2f} s (one matrix {h['matrix_binning']:.2f} s), one layer "
                    f"{h['layer']:.2f} s (one matrix {h['matrix_layer']:.2f} s); cuts, histograms and counts "
                    f"{'equal' if h['equal'] else 'DIFFERENT'}"
                )
                for what in ("binning", "layer"):
                    results.append(
                        record(
                            f"scaleout.partitioned_host.{what}.{name}.seconds",
                            h[what],
                            "s",
                            "one matrix in-process",
                            h[f"matrix_{what}"],
                            params,
                        )
                    )
            speedup = record(
                "scaleout.partitioned_host.layer.speedup",
                timings["ray"]["layer"],
                "ratio",
                "inline holders",
                timings["inline"]["layer"],
                params,
            )
            speedup["value"] = speedup["ratio"] = timings["inline"]["layer"] / timings["ray"]["layer"]
            results.append(speedup)
            notes.append(
                f"partitioned host: Ray {speedup['value']:.2f}x inline holders per layer; binning and histograms "
                f"{'equal to one matrix bit for bit' if all(t['equal'] for t in timings.values()) else 'DIFFERENT'}"
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
