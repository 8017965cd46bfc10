"""Metrics overhead: a round with every process serving /metrics and scraped each second, against none.

The runtime benchmark's shape (b) (20,000 x 100,000 sparse Homo LR, 4 parties, secagg; every
party and the aggregator a separate process on loopback with mutual TLS), run ``--repeats``
times with metrics off and on interleaved (off, on, off, on, ...). With metrics on, the
aggregator and every party serve ``/metrics`` (``--metrics``, ``CONFIDE_METRICS``) and a scraper
thread in this process fetches all five once a second, as a Prometheus server with a 1 s
interval would (a production interval is 15-60 s). Every figure is the median over the runs of
each run's median round (rounds after the first).

Record (``benchmarks/results/metrics.json``): ``metrics.overhead.b.vs_off``, the round with
metrics on, its anchor the round with metrics off in the same run, and their ratio; and
``metrics.scrape.bytes``, one scrape of a party's endpoint.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import machine, record, results_table, write, write_markdown_block  # noqa: E402
from runtime_bench import PARTIES, SHAPES, job_spec  # noqa: E402

from confide.local import run_local  # noqa: E402


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _scraper(ports: list[int], stop: threading.Event, sizes: list[int]) -> None:
    while not stop.wait(1.0):
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
                    sizes.append(len(reply.read()))
            except OSError:
                pass  # not up yet, or gone: a scrape that fails costs the process nothing


def run(shape: str, rounds: int, workdir: Path, metrics_on: bool) -> tuple[float, list[int]]:
    spec = job_spec(shape, f"metrics-{shape}-{'on' if metrics_on else 'off'}", rounds, {"mode": "secagg", "bits": 16})
    party_env: dict[str, dict[str, str]] = {}
    aggregator_args: list[str] = []
    stop, sizes, scraper = threading.Event(), [], None
    if metrics_on:
        ports = {name: _free_port() for name in ["aggregator", *PARTIES]}
        party_env = {p: {"CONFIDE_METRICS": f"127.0.0.1:{ports[p]}"} for p in PARTIES}
        aggregator_args = ["--metrics", f"127.0.0.1:{ports['aggregator']}"]
        scraper = threading.Thread(target=_scraper, args=(list(ports.values()), stop, sizes), daemon=True)
        scraper.start()
    try:
        report = run_local(
            spec,
            workdir / spec.job_id,
            progress=False,
            echo=lambda *_: None,
            party_env=party_env,
            aggregator_args=aggregator_args,
            baseline=False,
        )
    finally:
        stop.set()
        if scraper is not None:
            scraper.join()
    later = report["rounds"][1:] or report["rounds"]
    return statistics.median(r["seconds"] for r in later), sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="b", choices=sorted(SHAPES))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--write", action="store_true", help="also update docs/benchmarks.md")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="confide-metrics-bench-"))
    seconds: dict[bool, list[float]] = {False: [], True: []}
    scrapes: list[int] = []
    for repeat in range(args.repeats):
        for metrics_on in (False, True):
            value, sizes = run(args.shape, args.rounds, workdir, metrics_on)
            seconds[metrics_on].append(value)
            scrapes += sizes
            print(f"run {repeat + 1}/{args.repeats} metrics {'on ' if metrics_on else 'off'}: {value:.3f} s a round")
    on, off = statistics.median(seconds[True]), statistics.median(seconds[False])
    params = {"shape": args.shape, "mode": "secagg", "parties": len(PARTIES), "rounds": args.rounds}
    params |= {"repeats": args.repeats, "scrape_interval_s": 1.0, "off_runs": seconds[False], "on_runs": seconds[True]}
    results = [
        record("metrics.overhead.b.vs_off", on, "s", "metrics off (same run)", off, params=params),
        record(
            "metrics.scrape.bytes",
            statistics.median(scrapes) if scrapes else 0,
            "bytes",
            params={"scrapes": len(scrapes)},
        ),
    ]
    info = machine()
    path = write("metrics", info, results)
    lines = results_table(results, value=",.3f", anchor=",.3f")
    print("\n".join(lines))
    print(f"wrote {path}")
    if args.write:
        said = (
            f"Measured {info['date']} on {info['cpu']} ({info['cores']} cores), commit {info['commit']}: shape "
            f"({args.shape}), secagg, {len(PARTIES)} parties, {args.rounds} rounds, {args.repeats} runs each way "
            "interleaved, every endpoint scraped once a second while on; medians of each run's median round."
        )
        heading = "Metrics overhead (Prometheus /metrics on every process)"
        write_markdown_block("metrics", heading, [said, "", *lines], "metrics_bench")


if __name__ == "__main__":
    main()
