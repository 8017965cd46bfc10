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
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def record(name, value, unit, anchor=None, anchor_value=None, params=None) -> dict:
    """One result record in the format of DEVELOPERS.md."""
    ratio = value / anchor_value if anchor_value else None
    return {
        "name": name,
        "value": round(value, 4),
        "unit": unit,
        "anchor": anchor,
        "anchor_value": round(anchor_value, 4) if anchor_value is not None else None,
        "ratio": round(ratio, 3) if ratio is not None else None,
        "params": params or {},
    }


def write(bench: str, machine_info: dict, results: list[dict]) -> Path:
    """Write benchmarks/results/<bench>.json."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{bench}.json"
    path.write_text(json.dumps({"machine": machine_info, "results": results}, indent=2) + "\n")
    return path
