"""ECDH-PSI benchmark: one guest and one or more hosts with N ids each, in threads of one process.

The parties talk through :class:`~confide.vertical.channel.LocalChannel` (in memory, messages
encoded and chunked as on the relay), each running in its own thread with ``--threads`` rayon
threads (0 = every core). On one machine the parties share its cores, so the wall time is
about twice what each party would see on a machine of its own with the same cores. Prints
seconds per phase for every party, wall time, bytes on the wire, and the per-element cost of
the two primitives on one core for the engine this CPU runs (``ifma-8-lane`` with AVX-512 IFMA)
and, in a child process with ``CONFIDE_DISABLE_IFMA=1``, for curve25519-dalek (the anchor: the
same bytes from the library we would otherwise use).

    .venv/bin/python benchmarks/psi_bench.py                # 1,000,000 ids a side, 50 % common
    .venv/bin/python benchmarks/psi_bench.py --ids 100000 --hosts 2 --write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchutil import machine, record, write  # noqa: E402

from confide._native import PsiKey  # noqa: E402
from confide.vertical.channel import LocalChannel  # noqa: E402
from confide.vertical.psi import intersect  # noqa: E402


def make_ids(n: int, hosts: int, overlap: float, seed: int) -> list[list[str]]:
    """Guest ids first, then one list per host; ``overlap`` of each list is common to all."""
    rng = np.random.default_rng(seed)
    common = int(n * overlap)
    total = common + (hosts + 1) * (n - common)
    numbers = rng.choice(10**11, total, replace=False)
    lists = []
    for party in range(hosts + 1):
        start = common + party * (n - common)
        mine = np.concatenate([numbers[:common], numbers[start : start + n - common]])
        rng.shuffle(mine)
        lists.append([f"customer-{v:011d}" for v in mine.tolist()])
    return lists


def primitive_rates(threads: int = 1, n: int = 20_000) -> dict[str, float]:
    """Microseconds per element of hash_and_blind and blind on ``threads`` threads."""
    ids = [f"customer-{i:011d}".encode() for i in range(n)]
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.uint64)
    data = b"".join(ids)
    key = PsiKey.generate()
    start = time.perf_counter()
    points = key.hash_and_blind(b"bench", data, offsets, threads)
    hash_blind = time.perf_counter() - start
    start = time.perf_counter()
    key.blind(points, threads)
    blind = time.perf_counter() - start
    return {"hash_and_blind_us": hash_blind / n * 1e6, "blind_us": blind / n * 1e6}


def dalek_rates() -> dict[str, float]:
    """:func:`primitive_rates` with the lane engine turned off, in a child process (the engine is
    chosen once per process)."""
    env = dict(os.environ, CONFIDE_DISABLE_IFMA="1")
    out = subprocess.run(
        [sys.executable, __file__, "--primitives-only"], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ids", type=int, default=1_000_000, help="ids per party")
    parser.add_argument("--overlap", type=float, default=0.5, help="fraction of each party's ids common to all")
    parser.add_argument("--hosts", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="rayon threads per party (0 = every core)")
    parser.add_argument("--write", action="store_true", help="write benchmarks/results/psi.json")
    parser.add_argument("--primitives-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.primitives_only:
        print(json.dumps(dict(primitive_rates(), engine=PsiKey.engine())))
        return

    engine = PsiKey.engine()
    rates = primitive_rates()
    anchor = dalek_rates()
    for name, r in ((engine, rates), ("dalek (anchor)", anchor)):
        print(
            f"one core, {name}: hash_and_blind {r['hash_and_blind_us']:.1f} us/id, blind {r['blind_us']:.1f} us/point",
            flush=True,
        )
    start = time.perf_counter()
    lists = make_ids(args.ids, args.hosts, args.overlap, seed=7)
    print(f"made {args.hosts + 1} x {args.ids:,} ids in {time.perf_counter() - start:.1f} s", flush=True)

    hosts = [f"host{i + 1}" for i in range(args.hosts)]
    parties = ["guest", *hosts]
    channels = LocalChannel.group(parties, timeout_s=1800)
    stats: dict[str, dict] = {p: {} for p in parties}
    results: dict[str, np.ndarray] = {}
    errors: dict[str, BaseException] = {}

    def work(index: int, party: str) -> None:
        try:
            results[party] = intersect(
                channels[party],
                lists[index],
                role="guest" if party == "guest" else "host",
                guest="guest",
                hosts=hosts,
                session="bench",
                threads=args.threads,
                stats=stats[party],
            )
        except BaseException as error:  # noqa: BLE001 - printed below
            errors[party] = error

    start = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i, p)) for i, p in enumerate(parties)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    if errors:
        raise SystemExit(f"failed: {errors}")
    rows = [lists[0][i] for i in results["guest"][:1000]]
    for index, party in enumerate(hosts, start=1):
        assert [lists[index][i] for i in results[party][:1000]] == rows, party
    expected = int(args.ids * args.overlap)
    assert len(results["guest"]) == expected, (len(results["guest"]), expected)

    print(f"\n{args.hosts + 1} parties x {args.ids:,} ids, {args.overlap:.0%} common -> {expected:,} rows")
    print(f"wall time {wall:.1f} s (all parties in one process on {machine()['cores']} cores)")
    for party in parties:
        s = stats[party]
        phases = ", ".join(f"{k} {v:.2f}" for k, v in s["seconds"].items())
        print(f"  {party:6s} seconds: {phases}")
        print(f"  {party:6s} bytes sent {s['bytes_sent']:,}, received {s['bytes_received']:,}")
    sent = sum(s["bytes_sent"] for s in stats.values())
    print(f"bytes on the wire (all parties): {sent:,} ({sent / args.ids:.1f} per id per party)")

    if args.write:
        params = {
            "ids": args.ids,
            "overlap": args.overlap,
            "hosts": args.hosts,
            "threads": args.threads,
            "engine": engine,
        }
        dalek = "curve25519-dalek 4.1 (AVX2 backend), same run"
        out = [
            record(f"vertical.psi.{args.ids}.wall_seconds", wall, "s", params=params),
            record(f"vertical.psi.{args.ids}.bytes_total", sent, "bytes", params=params),
            record(
                "vertical.psi.hash_and_blind.t1",
                rates["hash_and_blind_us"],
                "us/id",
                anchor=dalek,
                anchor_value=anchor["hash_and_blind_us"],
                params={"engine": engine},
            ),
            record(
                "vertical.psi.blind.t1",
                rates["blind_us"],
                "us/point",
                anchor=dalek,
                anchor_value=anchor["blind_us"],
                params={"engine": engine},
            ),
        ]
        for party in parties:
            for phase, seconds in stats[party]["seconds"].items():
                out.append(record(f"vertical.psi.{args.ids}.{party}.{phase}_seconds", seconds, "s", params=params))
        print(f"wrote {write('psi', machine(), out)}")


if __name__ == "__main__":
    main()
